//! Execution events, in the order ComfyUI sends them; the server turns them into websocket messages and
//! history status messages (adding timestamps).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::graph::NodeId;
use crate::nodes::{ErrorKind, Preview, ProgressSink, UiOutput};

/// A node that failed while running (`execution_error`).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeFailure {
    /// The failing node.
    pub node: NodeId,
    /// Its class.
    pub class_type: String,
    /// Nodes that ran before.
    pub executed: Vec<NodeId>,
    /// What went wrong.
    pub message: String,
    /// What kind of failure it is.
    pub kind: ErrorKind,
    /// The failing node's inputs, each as a list of value representations.
    pub current_inputs: BTreeMap<String, Vec<String>>,
    /// The nodes the output cache tracks for this prompt, as upstream reports them: every node of the prompt,
    /// whether or not it ran, or none under [`CachePolicy::None`](crate::cache::CachePolicy::None).
    pub current_outputs: Vec<NodeId>,
}

/// What happens during a run.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The prompt started.
    ExecutionStart,
    /// These nodes' results are in the cache (sent on every run, possibly empty).
    ExecutionCached {
        /// The cached nodes.
        nodes: Vec<NodeId>,
    },
    /// A node starts running.
    Executing {
        /// The node.
        node: NodeId,
    },
    /// Progress inside a node.
    Progress {
        /// The node.
        node: NodeId,
        /// Steps done.
        value: f64,
        /// Steps in all.
        max: f64,
    },
    /// A node showed an image while running (a websocket preview frame).
    Preview {
        /// The node.
        node: NodeId,
        /// The encoded image.
        preview: Arc<Preview>,
    },
    /// A node showed something in the UI (also for cached output nodes).
    Executed {
        /// The node.
        node: NodeId,
        /// What it showed.
        ui: UiOutput,
    },
    /// A node finished running.
    NodeFinished {
        /// The node.
        node: NodeId,
    },
    /// Every output ran.
    ExecutionSuccess,
    /// A node failed; the prompt stops.
    ExecutionError(Box<NodeFailure>),
    /// The prompt was interrupted.
    ExecutionInterrupted {
        /// The node that was running or about to run.
        node: NodeId,
        /// Its class.
        class_type: String,
        /// Nodes that ran before.
        executed: Vec<NodeId>,
    },
}

/// Receives the events of runs.
pub trait EventSink: Send + Sync {
    /// An event of prompt `prompt_id`.
    fn emit(&self, prompt_id: &str, event: Event);
}

/// Forwards node progress as [`Event::Progress`].
pub(super) struct Progress {
    pub(super) prompt_id: String,
    pub(super) sink: Arc<dyn EventSink>,
}

impl ProgressSink for Progress {
    fn progress(&self, node: &NodeId, value: f64, max: f64) {
        self.sink.emit(&self.prompt_id, Event::Progress { node: node.clone(), value, max });
    }

    fn preview(&self, node: &NodeId, preview: Preview) {
        let event = Event::Preview { node: node.clone(), preview: Arc::new(preview) };
        self.sink.emit(&self.prompt_id, event);
    }
}
