//! The `kiln` server: a ComfyUI-compatible workflow server on axum.
//!
//! `main.rs` reads the command line once into a [`Config`]; [`Server::start`] creates the local runtime and
//! its worker and builds the routes. Handlers are thin: they ask the engine, the queue, the history or the
//! file layer, and answer with the spec's generated wire types (`kiln_spec::types`), never hand-written JSON.
//!
//! The local runtime implements the generated `SharedApi` and `LocalApi` traits (`local/`), served by the
//! generated `local_router`, with a worker thread that runs queued prompts on the engine.

#![deny(missing_docs)]

mod accounts;
pub mod api;
mod app;
mod auth;
mod cloud;
mod cluster;
mod config;
mod convert;
mod drain;
mod extra_model_paths;
mod files;
mod frontend;
mod frontend_package;
mod logs;
mod mcp;
mod metrics;
mod model_folders;
mod oauth;
mod service;
mod storage;
mod store;
mod system;
mod templates;
mod wheel;
mod workspace;
mod ws;

pub use accounts::{
    API_KEY_PREFIX, AccountError, Accounts, ApiKeyId, ApiKeyInfo, ApiKeyPrincipal, Member,
    Membership, Role, SESSION_ABSOLUTE_SECONDS, SESSION_IDLE_SECONDS, Session, User, UserId,
    WorkspaceId, WorkspaceMembers, WorkspaceRecord, csrf_matches, csrf_token,
};
pub use api::Runtime;
pub use app::Server;
pub use config::{
    CacheMode, Claims, ComputeConfig, Config, Database, FrontEnd, ProcessRole, check_issuer,
    hide_password, is_loopback_http,
};
pub use extra_model_paths::{ExtraModelPath, ExtraModelPathsError, read_extra_model_paths};
pub use frontend_package::{FRONTEND_VERSION, FRONTEND_WHEEL_URL, FrontEndVersion};
pub use logs::{LogRing, RingLayer};
pub use storage::StorageError;
pub use templates::{TEMPLATES_VERSION, TemplatesSource};

/// `kiln keys rotate`: a new current signing key in `data_dir/keys`; the previous one keeps verifying (and stays
/// in the JWKS) until the next rotation. A running server picks the new key up by itself.
pub fn rotate_signing_keys(data_dir: &std::path::Path) -> Result<(), String> {
    auth::keys::run_rotate(data_dir).map_err(|e| e.to_string())
}
