//! The two ways the API touches the file roots (the engine's `Roots`): `/view` reads a file (or a preview of
//! it) and `/upload/image` stores one, with ComfyUI's rules.
//!
//! Invariant: nothing is read or written outside a root. Names with `..` or a leading `/`, subfolders that
//! leave the root, and symlinks pointing out of it are refused by `kiln_engine::exec::within` before any file
//! is opened.

mod upload;
mod view;

pub(crate) use upload::{Upload, UploadError, store_upload};
pub(crate) use view::{Extent, ViewError, ViewRequest, view_stored};

#[cfg(test)]
mod tests;
