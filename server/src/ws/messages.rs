//! Engine events as websocket messages, and who receives each (comfy-api.md §8.2).
//!
//! Owner-only events go to the socket whose id was sent as the prompt's `client_id` and are dropped when the
//! prompt has none; `progress` and `execution_interrupted` go to every socket when it has none; `status` and
//! `progress_state` always go to every socket.

use kiln_engine::exec::{Event, NodeFailure};
use kiln_engine::graph::NodeId;
use kiln_engine::nodes::{Preview, PreviewFormat, UiOutput};
use kiln_spec::types;

use crate::convert;

/// Who receives a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Audience {
    /// Only the prompt's owner; dropped when the prompt has no `client_id`.
    Owner,
    /// The owner, or every socket when the prompt has no `client_id`.
    OwnerOrAll,
    /// Every socket.
    All,
}

/// A UI output in the wire shape.
pub(crate) fn node_output(ui: &UiOutput) -> types::NodeOutput {
    let file = |f: &kiln_engine::nodes::FileRef| types::FileRef {
        filename: f.filename.clone(),
        subfolder: f.subfolder.clone(),
        type_: convert::file_type(f.kind),
    };
    let extra = ui
        .named
        .iter()
        .map(|(name, files)| {
            let files: Vec<types::FileRef> = files.iter().map(file).collect();
            (name.clone(), serde_json::to_value(files).unwrap_or_default())
        })
        .chain(ui.data.iter().cloned())
        .collect();
    types::NodeOutput {
        animated: ui.animated.clone(),
        extra,
        images: ui.images.iter().map(file).collect(),
        text: ui.text.clone(),
    }
}

fn ids(nodes: &[kiln_engine::graph::NodeId]) -> Vec<String> {
    nodes.iter().map(|n| n.0.clone()).collect()
}

/// The `execution_error` data of a failure.
pub(crate) fn execution_error(
    prompt_id: uuid::Uuid,
    failure: &NodeFailure,
    timestamp: i64,
) -> types::WsExecutionError {
    types::WsExecutionError {
        current_inputs: failure
            .current_inputs
            .iter()
            .map(|(k, v)| (k.clone(), types::StringList(v.clone())))
            .collect(),
        current_outputs: ids(&failure.current_outputs),
        exception_message: convert::exception_message(failure.kind, &failure.message),
        exception_type: convert::exception_type(failure.kind).to_owned(),
        executed: ids(&failure.executed),
        node_id: failure.node.0.clone(),
        node_type: failure.class_type.clone(),
        prompt_id,
        timestamp: Some(timestamp),
        traceback: vec![format!("node {} ({})", failure.node, failure.class_type)],
    }
}

/// The websocket message of an engine event and its audience; `None` for events with no message of their own
/// (`NodeFinished` only updates `progress_state`, which the caller tracks).
pub(crate) fn message(
    prompt_id: uuid::Uuid,
    event: &Event,
    timestamp: i64,
) -> Option<(types::WsMessage, Audience)> {
    use types::WsMessage as M;
    Some(match event {
        Event::ExecutionStart => (
            M::ExecutionStartMessage(types::WsExecutionStartMessage {
                data: types::WsExecutionStart { prompt_id, timestamp },
                type_: types::WsExecutionStartMessageType::ExecutionStart,
            }),
            Audience::Owner,
        ),
        Event::ExecutionCached { nodes } => (
            M::ExecutionCachedMessage(types::WsExecutionCachedMessage {
                data: types::WsExecutionCached { nodes: ids(nodes), prompt_id, timestamp },
                type_: types::WsExecutionCachedMessageType::ExecutionCached,
            }),
            Audience::Owner,
        ),
        Event::Executing { node } => (executing(Some(&node.0), Some(prompt_id)), Audience::Owner),
        Event::Progress { node, value, max } => (
            M::ProgressMessage(types::WsProgressMessage {
                data: types::WsProgress {
                    max: *max,
                    node: node.0.clone(),
                    prompt_id,
                    value: *value,
                },
                type_: types::WsProgressMessageType::Progress,
            }),
            Audience::OwnerOrAll,
        ),
        Event::Executed { node, ui } => (
            M::ExecutedMessage(types::WsExecutedMessage {
                data: types::WsExecuted {
                    display_node: node.0.clone(),
                    node: node.0.clone(),
                    output: node_output(ui),
                    prompt_id,
                },
                type_: types::WsExecutedMessageType::Executed,
            }),
            Audience::Owner,
        ),
        // Previews are binary frames, chosen per socket: see `preview_frames`.
        Event::NodeFinished { .. } | Event::Preview { .. } => return None,
        Event::ExecutionSuccess => (
            M::ExecutionSuccessMessage(types::WsExecutionSuccessMessage {
                data: types::WsExecutionSuccess { prompt_id, timestamp },
                type_: types::WsExecutionSuccessMessageType::ExecutionSuccess,
            }),
            Audience::Owner,
        ),
        Event::ExecutionError(failure) => (
            M::ExecutionErrorMessage(types::WsExecutionErrorMessage {
                data: execution_error(prompt_id, failure, timestamp),
                type_: types::WsExecutionErrorMessageType::ExecutionError,
            }),
            Audience::Owner,
        ),
        Event::ExecutionInterrupted { node, class_type, executed } => (
            M::ExecutionInterruptedMessage(types::WsExecutionInterruptedMessage {
                data: types::WsExecutionInterrupted {
                    executed: ids(executed),
                    node_id: node.0.clone(),
                    node_type: class_type.clone(),
                    prompt_id,
                    timestamp,
                },
                type_: types::WsExecutionInterruptedMessageType::ExecutionInterrupted,
            }),
            Audience::OwnerOrAll,
        ),
    })
}

/// The two binary frames of a preview (comfy-api.md §8.3): type 1 `PREVIEW_IMAGE` (`[u32 format: 1 JPEG,
/// 2 PNG][image]`) for clients that did not announce `supports_preview_metadata`, and type 4
/// `PREVIEW_IMAGE_WITH_METADATA` (`[u32 length][metadata JSON][image]`) for those that did.
pub(crate) fn preview_frames(
    prompt_id: uuid::Uuid,
    node: &NodeId,
    preview: &Preview,
) -> (bytes::Bytes, bytes::Bytes) {
    let format: u32 = match preview.format {
        PreviewFormat::Jpeg => 1,
        PreviewFormat::Png => 2,
    };
    let mut plain = Vec::with_capacity(8 + preview.bytes.len());
    plain.extend_from_slice(&1u32.to_be_bytes());
    plain.extend_from_slice(&format.to_be_bytes());
    plain.extend_from_slice(&preview.bytes);
    let metadata = serde_json::json!({
        "node_id": node.0,
        "prompt_id": prompt_id,
        "display_node_id": node.0,
        "parent_node_id": null,
        "real_node_id": node.0,
        "image_type": preview.format.media_type(),
    })
    .to_string();
    let mut with_metadata = Vec::with_capacity(8 + metadata.len() + preview.bytes.len());
    with_metadata.extend_from_slice(&4u32.to_be_bytes());
    with_metadata.extend_from_slice(&(metadata.len() as u32).to_be_bytes());
    with_metadata.extend_from_slice(metadata.as_bytes());
    with_metadata.extend_from_slice(&preview.bytes);
    (plain.into(), with_metadata.into())
}

/// `executing`: a node starts (`Some`), or the prompt is over (`None`, the last frame of a run).
pub(crate) fn executing(node: Option<&str>, prompt_id: Option<uuid::Uuid>) -> types::WsMessage {
    types::WsMessage::ExecutingMessage(types::WsExecutingMessage {
        data: types::WsExecuting {
            display_node: node.map(str::to_owned),
            node: node.map(str::to_owned),
            prompt_id,
        },
        type_: types::WsExecutingMessageType::Executing,
    })
}

/// `status` with the queue counter, and the socket's id on the first message after connecting.
pub(crate) fn status(queue_remaining: i64, sid: Option<&str>) -> types::WsMessage {
    types::WsMessage::StatusMessage(types::WsStatusMessage {
        data: types::WsStatus {
            sid: sid.map(str::to_owned),
            status: types::PromptInfo { exec_info: types::ExecInfo { queue_remaining } },
        },
        type_: types::WsStatusMessageType::Status,
    })
}

/// The per-node progress of a prompt, for `progress_state`: nodes in the order they started, as ComfyUI's
/// progress registry lists them.
#[derive(Debug, Default)]
pub(crate) struct ProgressState {
    nodes: kiln_spec::IndexMap<String, (types::WsNodeState, f64, f64)>,
}

impl ProgressState {
    /// Updates the state from an event; returns the `progress_state` message to broadcast when it changed.
    pub(crate) fn update(
        &mut self,
        prompt_id: uuid::Uuid,
        event: &Event,
    ) -> Option<types::WsMessage> {
        match event {
            Event::Executing { node } => {
                self.nodes.insert(node.0.clone(), (types::WsNodeState::Running, 0.0, 1.0));
            }
            Event::Progress { node, value, max } => {
                self.nodes.insert(node.0.clone(), (types::WsNodeState::Running, *value, *max));
            }
            Event::NodeFinished { node } => {
                let max = self.nodes.get(&node.0).map_or(1.0, |n| n.2);
                self.nodes.insert(node.0.clone(), (types::WsNodeState::Finished, max, max));
            }
            // ComfyUI sends no progress_state for a failing node: execution_error follows `executing`.
            _ => return None,
        }
        let nodes = self
            .nodes
            .iter()
            .map(|(id, (state, value, max))| {
                let progress = types::WsNodeProgress {
                    display_node_id: id.clone(),
                    max: *max,
                    node_id: id.clone(),
                    parent_node_id: None,
                    prompt_id,
                    real_node_id: id.clone(),
                    state: *state,
                    value: *value,
                };
                (id.clone(), progress)
            })
            .collect();
        Some(types::WsMessage::ProgressStateMessage(types::WsProgressStateMessage {
            data: types::WsProgressState { nodes, prompt_id },
            type_: types::WsProgressStateMessageType::ProgressState,
        }))
    }
}
