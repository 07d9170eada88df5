//! The two ways the API touches the file roots (the engine's `Roots`): `/view` reads a file (or a preview of
//! it) and `/upload/image` stores one, with ComfyUI's rules; and [`write_atomically`], how the server writes a
//! file readers may be reading.
//!
//! Invariant: nothing is read or written outside a root. Names with `..` or a leading `/`, subfolders that
//! leave the root, and symlinks pointing out of it are refused by `kiln_engine::exec::within` before any file
//! is opened.

mod upload;
mod view;

pub(crate) use upload::{Upload, UploadError, store_upload};
pub(crate) use view::{Extent, ViewError, ViewRequest, view_stored};

/// Writes `bytes` to `path` through a temporary file of its own renamed into place, so that a reader never sees
/// half a file and two writers of one path each rename only their own temporary; nothing is left behind when
/// the rename fails (e.g. when `path` is a directory).
pub(crate) fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temporary =
        path.with_file_name(format!(".{name}.{}.kiln-tmp", uuid::Uuid::new_v4().simple()));
    std::fs::write(&temporary, bytes)?;
    std::fs::rename(&temporary, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&temporary);
    })
}

#[cfg(test)]
mod tests;
