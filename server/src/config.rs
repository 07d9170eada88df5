//! The server's validated configuration, built once from the command line in `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

/// Which API surface the server mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// The single-user server, ComfyUI's local API.
    Local,
    /// The multi-user server with accounts and OAuth.
    Cloud,
}

/// Everything the server needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// The addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// Where Kiln keeps its own state (the SQLite database).
    pub data_dir: PathBuf,
    /// The API surface to mount.
    pub runtime: Runtime,
    /// The command line, reported by `/api/system_stats`.
    pub argv: Vec<String>,
}
