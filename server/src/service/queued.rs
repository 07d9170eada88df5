//! A queued prompt: what the queue keeps, the store writes and the worker runs. Its own module, so the store
//! (`storage.rs`) depends on it and not on the runtime that depends on the store.

use std::sync::Arc;

use kiln_engine::graph::{NodeId, Prompt, ValidatedPrompt, validate};
use serde_json::{Map, Value};

use crate::workspace::{Workspace, Workspaces};

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

    /// The model files the prompt names (its inputs that are file names with a model file's extension), sorted:
    /// what a worker of a cluster that loaded them runs sooner.
    pub(crate) fn model_files(&self) -> Vec<String> {
        let mut files: Vec<String> = string_inputs(&self.prompt_json)
            .filter(|value| is_model_file(value))
            .map(str::to_owned)
            .collect();
        files.sort_unstable();
        files.dedup();
        files
    }

    /// The queue row's payload: what [`Queued::from_stored`] reads back.
    pub(crate) fn stored_payload(&self) -> String {
        serde_json::json!({
            "prompt": self.prompt_json,
            "extra_data": self.extra_data,
            "client_id": self.client_id,
            "outputs": self.outputs,
        })
        .to_string()
    }

    /// A stored prompt of `workspace` back from its payload, validated again in its workspace (whose nodes may
    /// have changed since it was queued); the error says why it cannot run.
    /// Blocks (on the object store, when the workspace has one): call it from a blocking thread.
    pub(crate) fn from_stored(
        workspaces: &Workspaces,
        workspace: &str,
        payload: &str,
    ) -> Result<Queued, String> {
        let stored = StoredPrompt::parse(payload);
        let prompt = Prompt::from_json(&stored.prompt)
            .map_err(|_| "the stored prompt is not an object".to_owned())?;
        let workspace = workspaces
            .get(workspace)
            .map_err(|error| format!("its workspace cannot open: {error}"))?;
        if let Some(files) = &workspace.stored
            && let Err(error) = files.bring_named(&stored.prompt)
        {
            // A file that did not come fails validation below, naming it; the others may all be here.
            tracing::warn!(%error, "cannot bring in a queued prompt's files");
        }
        let outputs: Vec<NodeId> = stored.outputs.iter().cloned().map(NodeId).collect();
        let validated = validate(&prompt, workspace.registry(), Some(&outputs))
            .map_err(|rejection| format!("it no longer validates: {}", rejection.error.message))?;
        Ok(Queued {
            workspace,
            prompt_json: stored.prompt,
            prompt: Arc::new(validated),
            extra_data: stored.extra_data,
            client_id: stored.client_id,
            outputs: stored.outputs,
        })
    }
}

/// A queue row's payload as stored, not validated: enough to record what became of a prompt that never ran.
pub(crate) struct StoredPrompt {
    /// The prompt as the client sent it.
    pub(crate) prompt: Value,
    /// Its `extra_data`.
    pub(crate) extra_data: Map<String, Value>,
    /// Its owner.
    pub(crate) client_id: Option<String>,
    /// The output nodes to run.
    pub(crate) outputs: Vec<String>,
}

impl StoredPrompt {
    /// Reads a payload; what is missing or malformed reads as empty.
    pub(crate) fn parse(payload: &str) -> StoredPrompt {
        let mut payload: Value = serde_json::from_str(payload).unwrap_or_default();
        StoredPrompt {
            prompt: payload["prompt"].take(),
            extra_data: payload["extra_data"].as_object().cloned().unwrap_or_default(),
            client_id: payload["client_id"].as_str().map(str::to_owned),
            outputs: payload["outputs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|o| o.as_str().map(str::to_owned))
                .collect(),
        }
    }
}

/// The string values of a prompt's (API format) node inputs.
pub(crate) fn string_inputs(prompt: &Value) -> impl Iterator<Item = &str> {
    prompt
        .as_object()
        .into_iter()
        .flat_map(|nodes| nodes.values())
        .filter_map(|node| node.get("inputs")?.as_object())
        .flat_map(|inputs| inputs.values())
        .filter_map(Value::as_str)
}

/// Whether a string input names a model file (by its extension): what a worker holds for model affinity, and
/// what is never looked for among the input files.
pub(crate) fn is_model_file(name: &str) -> bool {
    const EXTENSIONS: [&str; 7] = ["safetensors", "sft", "ckpt", "pt", "pth", "bin", "gguf"];
    name.rsplit_once('.')
        .is_some_and(|(_, extension)| EXTENSIONS.contains(&extension.to_ascii_lowercase().as_str()))
}
