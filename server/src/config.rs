//! The server's validated configuration, built once from the command line in `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::api::Runtime;

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
