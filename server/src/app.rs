//! The axum application: routes and shared state.
//!
//! Every local route answers at `/api/X` and at the bare `/X`, as ComfyUI does.

use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use kiln_engine::Backend;
use kiln_spec::types::SystemStats;

use crate::config::Config;
use crate::system::{self, Memory};

/// State shared by every handler.
#[derive(Debug)]
struct AppState {
    argv: Vec<String>,
    backend: Backend,
}

/// Builds the router for a configuration.
pub fn app(config: &Config) -> Router {
    let state = Arc::new(AppState { argv: config.argv.clone(), backend: Backend::detect() });
    Router::new()
        .route("/api/system_stats", get(get_system_stats))
        .route("/system_stats", get(get_system_stats))
        .with_state(state)
}

async fn get_system_stats(State(state): State<Arc<AppState>>) -> Json<SystemStats> {
    Json(system::system_stats(&state.argv, state.backend, Memory::read()))
}
