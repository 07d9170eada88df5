//! Settings and user data files under the user directory (single user: `<user dir>/default`).
//!
//! Invariant: every path is checked against the user's root before it is touched. Writes go to a temporary file
//! of their own, then are renamed into place, so requests writing the same file at once never see each other's
//! half-written or vanished temporary; settings are changed under one lock, so two merges keep each other's keys.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kiln_spec::types;
use serde_json::{Map, Value};

use kiln_engine::roots::within;

use crate::files::write_atomically;

/// Why a user data request failed, with ComfyUI's status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum UserDataError {
    BadRequest(String),
    Forbidden(String),
    NotFound(String),
    Conflict(String),
}

/// The single user's directory.
pub(crate) fn user_root(user_dir: &Path) -> PathBuf {
    user_dir.join("default")
}

fn resolve(root: &Path, relative: &str) -> Result<PathBuf, UserDataError> {
    if relative.is_empty() {
        return Err(UserDataError::BadRequest("Invalid file name".to_owned()));
    }
    std::fs::create_dir_all(root).map_err(|e| UserDataError::Forbidden(e.to_string()))?;
    within(root, relative).ok_or_else(|| {
        UserDataError::Forbidden(format!("{relative} is outside the user directory"))
    })
}

/// The settings object (`{}` when none were saved).
pub(crate) fn settings(user_dir: &Path) -> Map<String, Value> {
    std::fs::read(user_root(user_dir).join("comfy.settings.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<Map<String, Value>>(&bytes).ok())
        .unwrap_or_default()
}

/// Serializes the read-modify-write of the settings file (handlers run in parallel).
static SETTINGS_CHANGE: Mutex<()> = Mutex::new(());

/// Changes the settings object with `change` and writes it, one change at a time.
pub(crate) fn update_settings(
    user_dir: &Path,
    change: impl FnOnce(&mut Map<String, Value>),
) -> Result<(), String> {
    let _one_at_a_time = SETTINGS_CHANGE.lock().unwrap_or_else(|p| p.into_inner());
    let mut current = settings(user_dir);
    change(&mut current);
    let root = user_root(user_dir);
    std::fs::create_dir_all(&root).map_err(|e| e.to_string())?;
    let bytes = serde_json::to_vec_pretty(&current).map_err(|e| e.to_string())?;
    write_atomically(&root.join("comfy.settings.json"), &bytes).map_err(|e| e.to_string())
}

fn millis(time: std::io::Result<std::time::SystemTime>) -> Option<f64> {
    time.ok()?.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_millis() as f64)
}

fn info(path: &Path, shown: &str) -> Option<types::UserDataFileInfo> {
    let meta = std::fs::metadata(path).ok()?;
    Some(types::UserDataFileInfo {
        created: millis(meta.created()),
        modified: millis(meta.modified()).unwrap_or(0.0),
        path: shown.to_owned(),
        size: meta.len() as i64,
    })
}

/// `GET /userdata?dir=...`: files under a directory.
pub(crate) fn list(
    user_dir: &Path,
    dir: &str,
    recurse: bool,
    full_info: bool,
    split: bool,
) -> Result<types::UserDataListing, UserDataError> {
    let root = user_root(user_dir);
    let base = resolve(&root, dir.trim_end_matches('/'))?;
    if !base.is_dir() {
        return Err(UserDataError::NotFound("Directory not found".to_owned()));
    }
    let mut files = Vec::new();
    let mut stack = vec![base.clone()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if recurse {
                    stack.push(path);
                }
            } else if let Ok(relative) = path.strip_prefix(&base) {
                files.push((relative.to_string_lossy().replace('\\', "/"), path));
            }
        }
    }
    files.sort();
    Ok(if full_info {
        types::UserDataListing::Variant1(
            files.iter().filter_map(|(rel, path)| info(path, rel)).collect(),
        )
    } else if split {
        types::UserDataListing::Variant2(
            files
                .iter()
                .map(|(rel, _)| {
                    types::StringList(
                        std::iter::once(rel.clone())
                            .chain(rel.split('/').map(str::to_owned))
                            .collect(),
                    )
                })
                .collect(),
        )
    } else {
        types::UserDataListing::Variant0(files.into_iter().map(|(rel, _)| rel).collect())
    })
}

/// `GET /v2/userdata?path=...`: one directory, directories first, then files, by case-insensitive name.
pub(crate) fn list_v2(
    user_dir: &Path,
    path: &str,
) -> Result<Vec<types::UserDataEntry>, UserDataError> {
    let root = user_root(user_dir);
    let relative = path.trim_matches('/');
    let base = if relative.is_empty() { root.clone() } else { resolve(&root, relative)? };
    if !base.exists() {
        return if relative.is_empty() {
            Ok(Vec::new())
        } else {
            Err(UserDataError::NotFound("Path not found".to_owned()))
        };
    }
    if !base.is_dir() {
        return Err(UserDataError::BadRequest("Path is not a directory".to_owned()));
    }
    let mut entries: Vec<types::UserDataEntry> = std::fs::read_dir(&base)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let shown =
                if relative.is_empty() { name.clone() } else { format!("{relative}/{name}") };
            let meta = entry.metadata().ok()?;
            let is_dir = meta.is_dir();
            Some(types::UserDataEntry {
                modified: if is_dir { None } else { millis(meta.modified()) },
                name,
                path: shown,
                size: if is_dir { None } else { Some(meta.len() as i64) },
                type_: if is_dir {
                    types::UserDataEntryType::Directory
                } else {
                    types::UserDataEntryType::File
                },
            })
        })
        .collect();
    entries
        .sort_by_key(|e| (e.type_ != types::UserDataEntryType::Directory, e.name.to_lowercase()));
    Ok(entries)
}

/// Reads a user data file.
pub(crate) fn read(user_dir: &Path, file: &str) -> Result<Vec<u8>, UserDataError> {
    let path = resolve(&user_root(user_dir), file)?;
    if !path.is_file() {
        return Err(UserDataError::NotFound("File not found".to_owned()));
    }
    std::fs::read(&path).map_err(|e| UserDataError::NotFound(e.to_string()))
}

fn written(path: &Path, relative: &str, full_info: bool) -> types::UserDataWriteResult {
    match info(path, relative).filter(|_| full_info) {
        Some(info) => types::UserDataWriteResult::UserDataFileInfo(info),
        None => types::UserDataWriteResult::String(relative.to_owned()),
    }
}

/// Writes a user data file atomically.
pub(crate) fn write(
    user_dir: &Path,
    file: &str,
    bytes: &[u8],
    overwrite: bool,
    full_info: bool,
) -> Result<types::UserDataWriteResult, UserDataError> {
    let path = resolve(&user_root(user_dir), file)?;
    if path.exists() && !overwrite {
        return Err(UserDataError::Conflict("File already exists".to_owned()));
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| UserDataError::Forbidden(e.to_string()))?;
    }
    write_atomically(&path, bytes).map_err(|e| UserDataError::Forbidden(e.to_string()))?;
    Ok(written(&path, file, full_info))
}

/// Deletes a user data file.
pub(crate) fn delete(user_dir: &Path, file: &str) -> Result<(), UserDataError> {
    let path = resolve(&user_root(user_dir), file)?;
    if !path.is_file() {
        return Err(UserDataError::NotFound("File not found".to_owned()));
    }
    std::fs::remove_file(&path).map_err(|e| UserDataError::Forbidden(e.to_string()))
}

/// Moves a user data file.
pub(crate) fn rename(
    user_dir: &Path,
    file: &str,
    dest: &str,
    overwrite: bool,
    full_info: bool,
) -> Result<types::UserDataWriteResult, UserDataError> {
    let root = user_root(user_dir);
    let source = resolve(&root, file)?;
    let target = resolve(&root, dest)?;
    if !source.is_file() {
        return Err(UserDataError::NotFound("Source file not found".to_owned()));
    }
    if target.exists() && !overwrite {
        return Err(UserDataError::Conflict("Destination file already exists".to_owned()));
    }
    if let Some(parent) = target.parent() {
        std::fs::create_dir_all(parent).map_err(|e| UserDataError::Forbidden(e.to_string()))?;
    }
    std::fs::rename(&source, &target).map_err(|e| UserDataError::Forbidden(e.to_string()))?;
    Ok(written(&target, dest, full_info))
}
