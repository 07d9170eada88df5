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
    let mut name = upload.filename.to_owned();
    let mut n = 1;
    loop {
        let path = folder.join(&name);
        let stored_as = relative(&name);
        if !upload.overwrite {
            let held = match stored {
                Some(files) => files.compare(upload.kind, &stored_as, upload.bytes).map_err(io)?,
                None => StoredRead::Absent,
            };
            // A local file the store does not hold (written before there was a store) counts too.
            let held = match held {
                StoredRead::Absent if path.exists() => {
                    if same_content(&path, upload.bytes) {
                        StoredRead::Same
                    } else {
                        StoredRead::Different
                    }
                }
                held => held,
            };
            match held {
                StoredRead::Same => break,
                StoredRead::Different => {
                    name = format!("{stem} ({n}){ext}");
                    n += 1;
                    continue;
                }
                StoredRead::Absent => {}
            }
        }
        match stored {
            // Created only if still free: another API node may have taken the name meanwhile.
            Some(files) => {
                if !files
                    .put(upload.kind, &stored_as, upload.bytes, !upload.overwrite)
                    .map_err(io)?
                {
                    continue;
                }
            }
            None => {
                let temporary = folder.join(format!(".{name}.kiln-upload"));
                std::fs::write(&temporary, upload.bytes).map_err(io)?;
                std::fs::rename(&temporary, &path).map_err(io)?;
            }
        }
        break;
    }
    Ok(Stored { name, subfolder: upload.subfolder.to_owned(), kind: upload.kind })
}

fn io(e: impl std::fmt::Display) -> UploadError {
    UploadError::Io(e.to_string())
}

fn same_content(path: &Path, bytes: &[u8]) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == bytes.len() as u64)
        && std::fs::read(path).is_ok_and(|existing| existing == bytes)
}
