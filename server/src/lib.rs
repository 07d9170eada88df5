//! The `kiln` server: a ComfyUI-compatible workflow server on axum.
//!
//! `main.rs` reads the command line once into a [`Config`]; [`app`] builds the router from it. Handlers are
//! thin: they gather data from the engine and the host and answer with the spec's generated wire types
//! (`kiln_spec::types`), never with hand-written JSON.
//!
//! Today the server answers `GET /api/system_stats` (and its bare alias `/system_stats`); the rest of the
//! ComfyUI surface arrives with the generated router.

#![deny(missing_docs)]

pub mod api;
mod app;
mod config;
#[allow(dead_code)]
// Used by the server's implementation of the generated trait (the server issue).
mod convert;
#[allow(dead_code)]
// Used by the server's implementation of the generated trait (the server issue).
mod files;
#[allow(dead_code)]
// Used by the server's implementation of the generated trait (the server issue).
mod local;
mod system;
#[allow(dead_code)]
// Wired into the server by its implementation of the generated trait (the server issue).
mod ws;

pub use api::Runtime;
pub use app::app;
pub use config::Config;
