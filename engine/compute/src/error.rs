//! The compute layer's one error type.

/// What went wrong in a tensor op, a device call or the memory manager.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes (or dtypes) an op cannot take; names the op.
    #[error("{op}: {msg}")]
    Shape {
        /// The op.
        op: &'static str,
        /// What is wrong with its inputs.
        msg: String,
    },
    /// The device (or the simulated device) has no memory for the request, even after eviction.
    #[error("out of device memory: {requested} bytes requested, {free} free")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes free at the time.
        free: u64,
    },
    /// Host memory could not be reserved, committed or registered.
    #[error("host memory: {0}")]
    Host(String),
    /// A driver, cuBLASLt or NVRTC call failed.
    #[error("{call}: {msg}")]
    Driver {
        /// The call that failed.
        call: &'static str,
        /// The driver's message.
        msg: String,
    },
    /// Something the backend does not implement (an op on a dtype it lacks, CUDA without the feature).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A safetensors file that cannot be read; names the file.
    #[error("{path}: {msg}")]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        msg: String,
    },
    /// Reading a file failed.
    #[error("reading {path}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A shape error of `op`.
    pub fn shape(op: &'static str, msg: impl Into<String>) -> Error {
        Error::Shape { op, msg: msg.into() }
    }

    /// A failed driver call.
    pub fn driver(call: &'static str, msg: impl std::fmt::Display) -> Error {
        Error::Driver { call, msg: msg.to_string() }
    }
}

/// `Result` with the compute layer's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
