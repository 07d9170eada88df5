//! The server's validated configuration, built once from the command line in `main.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::api::Runtime;

/// Everything the server needs to start.
#[derive(Debug, Clone)]
pub struct Config {
    /// The addresses to listen on.
    pub listen: Vec<SocketAddr>,
    /// Where Kiln keeps its own state.
    pub data_dir: PathBuf,
    /// Input files (uploads, LoadImage).
    pub input_dir: PathBuf,
    /// Output files (SaveImage).
    pub output_dir: PathBuf,
    /// Temporary files (PreviewImage).
    pub temp_dir: PathBuf,
    /// User data and settings.
    pub user_dir: PathBuf,
    /// Model folders (`checkpoints/`, `loras/`, ...).
    pub models_dir: PathBuf,
    /// The request body limit in bytes.
    pub max_upload_size: u64,
    /// The API surface to mount.
    pub runtime: Runtime,
    /// The command line, reported by `/api/system_stats`.
    pub argv: Vec<String>,
}

impl Config {
    /// A configuration with every directory under `data_dir` (as `kiln --data-dir` lays them out).
    pub fn under(data_dir: PathBuf, listen: Vec<SocketAddr>, argv: Vec<String>) -> Config {
        Config {
            listen,
            input_dir: data_dir.join("input"),
            output_dir: data_dir.join("output"),
            temp_dir: data_dir.join("temp"),
            user_dir: data_dir.join("user"),
            models_dir: data_dir.join("models"),
            data_dir,
            max_upload_size: 100 * 1024 * 1024,
            runtime: Runtime::Local,
            argv,
        }
    }
}
