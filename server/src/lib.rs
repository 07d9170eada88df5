//! The `kiln` server: a ComfyUI-compatible workflow server on axum.
//!
//! `main.rs` reads the command line once into a [`Config`]; [`Server::start`] creates the local runtime and
//! its worker and builds the routes. Handlers are thin: they ask the engine, the queue, the history or the
//! file layer, and answer with the spec's generated wire types (`kiln_spec::types`), never hand-written JSON.
//!
//! The local runtime implements the generated `SharedApi` and `LocalApi` traits (`local/`), served by the
//! generated `local_router`, with a worker thread that runs queued prompts on the engine.

#![deny(missing_docs)]

pub mod api;
mod app;
mod config;
mod convert;
mod extra_model_paths;
mod files;
mod frontend;
mod frontend_package;
mod local;
mod logs;
mod model_folders;
mod storage;
mod system;
mod workspace;
mod ws;

pub use api::Runtime;
pub use app::Server;
pub use config::{CacheMode, ComputeConfig, Config, FrontEnd};
pub use extra_model_paths::{ExtraModelPath, ExtraModelPathsError, read_extra_model_paths};
pub use frontend_package::{FRONTEND_VERSION, FRONTEND_WHEEL_URL, FrontEndVersion};
pub use logs::{LogRing, RingLayer};
pub use storage::StorageError;
