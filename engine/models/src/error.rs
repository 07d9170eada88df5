//! The model families' one error type.

use std::path::PathBuf;

/// What went wrong reading, detecting or running a model.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor op, a device call, the memory manager or a safetensors file failed.
    #[error(transparent)]
    Compute(#[from] kiln_compute::Error),
    /// A file Kiln cannot run (another family, a quantisation it lacks, a tensor missing or of the wrong
    /// shape): names the file and what was found.
    #[error("{}: {msg}", path.display())]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// What was found, and why it cannot run.
        msg: String,
    },
    /// Input a model cannot take (a latent of the wrong channel count, an empty prompt batch, ...).
    #[error("{0}")]
    Invalid(String),
    /// The tokenizer failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
