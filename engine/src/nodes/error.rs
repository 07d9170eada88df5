//! A node's failure: what went wrong, in words, and what kind of failure it is.
//!
//! The kind is the engine's own vocabulary. Clients of ComfyUI match on the Python exception name in
//! `execution_error.exception_type`, so the server turns each kind into the name ComfyUI would send, in one place
//! (`server/src/convert.rs`); nothing here knows those names. Adding a kind fails the build there until it is
//! given one.

use super::context::Interrupted;

/// What kind of failure a [`NodeError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The node could not do its work, for a reason no other kind names (the default).
    Failed,
    /// An input has a value the node cannot use (a negative size, an unknown method, an empty prefix).
    InvalidValue,
    /// An input is missing or holds another type than the node declares.
    WrongType,
    /// A file the node reads does not exist.
    FileNotFound,
    /// Reading or writing a file failed.
    Io,
    /// A file is not an image the node can decode.
    ImageDecode,
    /// Memory for a result could not be allocated.
    OutOfMemory,
    /// The prompt was interrupted while the node ran; the run ends as interrupted, not failed.
    Interrupted,
    /// The prompt links to a node, or names a node class, that does not exist.
    MissingNode,
    /// The node depends on its own output.
    DependencyCycle,
}

/// A node failed while running.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NodeError {
    /// What went wrong.
    pub message: String,
    /// What kind of failure it is.
    pub kind: ErrorKind,
}

impl NodeError {
    /// A failure of the generic kind [`ErrorKind::Failed`].
    pub fn new(message: impl Into<String>) -> NodeError {
        NodeError::of_kind(ErrorKind::Failed, message)
    }

    /// A failure of a given kind.
    pub fn of_kind(kind: ErrorKind, message: impl Into<String>) -> NodeError {
        NodeError { message: message.into(), kind }
    }
}

impl From<Interrupted> for NodeError {
    fn from(_: Interrupted) -> NodeError {
        NodeError::of_kind(ErrorKind::Interrupted, "interrupted")
    }
}

/// A model error as a node failure: out-of-memory keeps its kind (ComfyUI's `torch.OutOfMemoryError`), the
/// rest fail the node with the error's message.
pub(crate) fn node_error(e: kiln_models::Error) -> NodeError {
    match e {
        kiln_models::Error::Compute(kiln_compute::Error::OutOfMemory { .. }) => {
            NodeError::of_kind(ErrorKind::OutOfMemory, e.to_string())
        }
        other => NodeError::new(other.to_string()),
    }
}
