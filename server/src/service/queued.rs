//! A queued prompt: what the queue keeps, the store writes and the worker runs. Its own module, so the store
//! (`storage.rs`) depends on it and not on the runtime that depends on the store.

use std::sync::Arc;

use kiln_engine::graph::ValidatedPrompt;
use serde_json::{Map, Value};

use crate::workspace::Workspace;

/// A queued prompt, as the worker needs it and the queue and jobs views show it.
#[derive(Clone)]
pub(crate) struct Queued {
    /// The workspace it was submitted in, and runs in.
    pub(crate) workspace: Arc<Workspace>,
    /// The validated graph the worker runs.
    pub(crate) prompt: Arc<ValidatedPrompt>,
    /// The prompt as the client sent it (echoed, stored, written into PNG metadata).
    pub(crate) prompt_json: Value,
    /// `extra_data`, with `client_id` and `create_time` filled in.
    pub(crate) extra_data: Map<String, Value>,
    /// The websocket client that receives its events.
    pub(crate) client_id: Option<String>,
    /// The output nodes to run.
    pub(crate) outputs: Vec<String>,
}

impl Queued {
    /// Whether it was submitted in `workspace`.
    pub(crate) fn in_workspace(&self, workspace: &str) -> bool {
        &*self.workspace.id == workspace
    }
}
