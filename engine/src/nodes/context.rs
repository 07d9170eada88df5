//! What a running node can reach: its id, the prompt and `extra_pnginfo` (for file metadata), the file roots,
//! progress and preview reporting, and the interrupt flag.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::NodeId;
use crate::preview::{Preview, PreviewMethod};
use crate::roots::{FileKind, SharedFiles};

/// Receives progress and previews from inside nodes.
pub trait ProgressSink: Send + Sync {
    /// `value` of `max` steps of node `node` are done.
    fn progress(&self, node: &NodeId, value: f64, max: f64);
    /// Node `node` shows an image while it runs (a websocket preview frame, not a saved file).
    fn preview(&self, node: &NodeId, preview: Preview);
}

/// The prompt was interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

/// A running node's view of the run.
pub struct Context {
    /// The node's id.
    pub node: NodeId,
    /// The prompt in its JSON form (`PROMPT` hidden input).
    pub prompt: Arc<serde_json::Value>,
    /// `extra_data.extra_pnginfo` (`EXTRA_PNGINFO` hidden input), or null.
    pub extra_pnginfo: Arc<serde_json::Value>,
    /// The input directory.
    pub input_dir: PathBuf,
    /// The output directory.
    pub output_dir: PathBuf,
    /// The temp directory.
    pub temp_dir: PathBuf,
    /// Where saved files are shared beyond this machine (an object store), if anywhere.
    pub shared: Option<Arc<dyn SharedFiles>>,
    /// How to show latent previews.
    pub preview_method: PreviewMethod,
    pub(crate) interrupt: Arc<AtomicBool>,
    pub(crate) progress: Arc<dyn ProgressSink>,
}

impl Context {
    /// The directory of one kind of file.
    pub fn dir(&self, kind: FileKind) -> &Path {
        match kind {
            FileKind::Input => &self.input_dir,
            FileKind::Output => &self.output_dir,
            FileKind::Temp => &self.temp_dir,
        }
    }

    /// Reports progress; long nodes call it as they go.
    pub fn progress(&self, value: f64, max: f64) {
        self.progress.progress(&self.node, value, max);
    }

    /// Shows an encoded image while the node runs (ComfyUI's progress-bar preview).
    pub fn preview(&self, preview: Preview) {
        self.progress.preview(&self.node, preview);
    }

    /// Fails with [`Interrupted`] once the prompt has been interrupted; long nodes call it between steps.
    pub fn check_interrupt(&self) -> Result<(), Interrupted> {
        if self.interrupt.load(Ordering::Relaxed) { Err(Interrupted) } else { Ok(()) }
    }
}
