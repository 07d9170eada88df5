//! `POST /upload/image`: stores an uploaded file under a root, as ComfyUI does: without `overwrite`, a name that
//! exists with the same content is reused without writing and one with other content becomes `name (1).ext`,
//! `name (2).ext`, ...; the subfolder is created; the content is not checked. With an object store, names are
//! taken there (the store holds what every node uploaded) and the local file is its copy.

use std::path::Path;

use kiln_engine::nodes::FileKind;
use kiln_engine::roots::{Roots, within};

use crate::store::{StoredRead, WorkspaceFiles};

/// An upload.
#[derive(Debug, Clone)]
pub(crate) struct Upload<'a> {
    pub(crate) filename: &'a str,
    pub(crate) bytes: &'a [u8],
    pub(crate) kind: FileKind,
    pub(crate) subfolder: &'a str,
    pub(crate) overwrite: bool,
}

/// Where an upload was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) name: String,
    pub(crate) subfolder: String,
    pub(crate) kind: FileKind,
}

/// Why an upload was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UploadError {
    #[error("the file name is empty")]
    EmptyName,
    #[error("`{0}` would be stored outside the {1} directory")]
    OutsideRoot(String, &'static str),
    #[error("cannot store the file: {0}")]
    Io(String),
}

/// Stores an upload, named against the object store too when there is one (`stored`) and put there.
pub(crate) fn store_upload(
    roots: &Roots,
    upload: &Upload<'_>,
    stored: Option<&WorkspaceFiles>,
) -> Result<Stored, UploadError> {
    if upload.filename.is_empty() {
        return Err(UploadError::EmptyName);
    }
    let root = roots.get(upload.kind);
    let subfolder = upload.subfolder.trim_end_matches('/');
    let folder_rel = if subfolder.is_empty() { ".".to_owned() } else { subfolder.to_owned() };
    let outside =
        || UploadError::OutsideRoot(format!("{subfolder}/{}", upload.filename), upload.kind.name());
    // An absolute subfolder would replace the root when joined, `/` included (as in ComfyUI); a relative one is
    // checked by `within` below.
    if upload.subfolder.starts_with('/') {
        return Err(outside());
    }
    let folder = within(root, &folder_rel).ok_or_else(outside)?;
    let relative = |name: &str| {
        if subfolder.is_empty() { name.to_owned() } else { format!("{subfolder}/{name}") }
    };
    within(root, &relative(upload.filename)).ok_or_else(outside)?;
    std::fs::create_dir_all(&folder).map_err(|e| UploadError::Io(e.to_string()))?;
    // Creating the folder must not have followed a symlink out of the root.
    within(root, &folder_rel).ok_or_else(outside)?;

    let (stem, ext) = match upload.filename.rsplit_once('.') {
        Some((stem, ext)) if !stem.is_empty() => (stem.to_owned(), format!(".{ext}")),
        _ => (upload.filename.to_owned(), String::new()),
    };
    let stored_as = |name: &str| Stored {
        name: name.to_owned(),
        subfolder: upload.subfolder.to_owned(),
        kind: upload.kind,
    };
    let mut name = upload.filename.to_owned();
    for n in 1..=MAX_NAMES {
        let path = folder.join(&name);
        let key = relative(&name);
        let in_store = match stored {
            Some(files) if !upload.overwrite => {
                files.compare(upload.kind, &key, upload.bytes).map_err(io)?
            }
            _ => StoredRead::Absent,
        };
        // A local file the store does not hold (written before there was a store) counts too.
        let held = match in_store {
            StoredRead::Absent if !upload.overwrite && path.exists() => {
                if same_content(&path, upload.bytes) {
                    StoredRead::Same
                } else {
                    StoredRead::Different
                }
            }
            held => held,
        };
        let taken = match (held, stored) {
            (StoredRead::Different, _) => true,
            (StoredRead::Same, _) if in_store == StoredRead::Same => false,
            (StoredRead::Same, None) => false,
            // Absent, or the same bytes only here: into the store (created only if still free: another node
            // may have taken the name meanwhile, or a folder holds it).
            (_, Some(files)) => {
                !files.put(upload.kind, &key, upload.bytes, !upload.overwrite).map_err(io)?
            }
            (StoredRead::Absent, None) => {
                super::write_atomically(&path, upload.bytes).map_err(io)?;
                false
            }
        };
        if !taken {
            return Ok(stored_as(&name));
        }
        name = format!("{stem} ({n}){ext}");
    }
    Err(UploadError::Io(format!("no free name for {} in {MAX_NAMES} tries", upload.filename)))
}

/// How many names an upload tries (`name.ext`, `name (1).ext`, …) before it gives up.
const MAX_NAMES: usize = 10_000;

fn io(e: impl std::fmt::Display) -> UploadError {
    UploadError::Io(e.to_string())
}

fn same_content(path: &Path, bytes: &[u8]) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == bytes.len() as u64)
        && std::fs::read(path).is_ok_and(|existing| existing == bytes)
}
