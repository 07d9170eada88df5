//! The three file roots (input, output, temp) and the two ways the API touches them: `/view` reads a file (or a
//! preview of it) and `/upload/image` stores one, with ComfyUI's rules.
//!
//! Invariant: nothing is read or written outside a root. Names with `..` or a leading `/`, subfolders that
//! leave the root, and symlinks pointing out of it are refused before any file is opened.

mod upload;
mod view;

use std::path::{Component, Path, PathBuf};

pub(crate) use upload::{Upload, UploadError, store_upload};
pub(crate) use view::{ViewError, ViewRequest, view};

/// `root/relative` if `relative` is a plain relative path (no `..`, not absolute) that, once symlinks are
/// resolved as far as the path exists, stays inside `root`.
pub(crate) fn within(root: &Path, relative: &str) -> Option<PathBuf> {
    let rel = Path::new(relative);
    if rel.is_absolute()
        || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return None;
    }
    let joined = root.join(rel);
    let real_root = root.canonicalize().ok()?;
    // Resolve the longest existing prefix: a symlink anywhere along it must not lead out of the root.
    let mut existing = joined.as_path();
    while !existing.exists() {
        existing = existing.parent()?;
    }
    let real = existing.canonicalize().ok()?;
    real.starts_with(&real_root).then_some(joined)
}

#[cfg(test)]
mod tests;
