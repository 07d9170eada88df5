//! What a running node can reach: its id, the prompt and `extra_pnginfo` (for file metadata), the file roots,
//! progress and preview reporting, and the interrupt flag.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::graph::NodeId;

/// Receives progress and previews from inside nodes.
pub trait ProgressSink: Send + Sync {
    /// `value` of `max` steps of node `node` are done.
    fn progress(&self, node: &NodeId, value: f64, max: f64);
    /// Node `node` shows an image while it runs (a websocket preview frame, not a saved file).
    fn preview(&self, node: &NodeId, preview: Preview);
}

/// How a preview image is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewFormat {
    /// `image/jpeg`.
    Jpeg,
    /// `image/png`.
    Png,
}

impl PreviewFormat {
    /// The media type.
    pub fn media_type(self) -> &'static str {
        match self {
            PreviewFormat::Jpeg => "image/jpeg",
            PreviewFormat::Png => "image/png",
        }
    }
}

/// An encoded preview image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The encoding of `bytes`.
    pub format: PreviewFormat,
    /// The encoded image.
    pub bytes: Vec<u8>,
}

/// Whether and how sampling nodes show latent previews while they run (ComfyUI's `--preview-method`,
/// overridden per prompt by `extra_data.preview_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreviewMethod {
    /// No previews (ComfyUI's default).
    #[default]
    None,
    /// A linear projection of the denoised latent to RGB, one preview per step.
    Latent2Rgb,
}

impl PreviewMethod {
    /// A method by ComfyUI's name: `none`, `auto`, `latent2rgb`, `taesd`. Kiln has no TAESD decoders, so `auto`
    /// and `taesd` mean `latent2rgb`, as they do in ComfyUI when no TAESD file is installed. `default` and
    /// unknown names are `None` (the caller keeps its setting).
    pub fn from_name(name: &str) -> Option<PreviewMethod> {
        match name {
            "none" => Some(PreviewMethod::None),
            "auto" | "latent2rgb" | "taesd" => Some(PreviewMethod::Latent2Rgb),
            _ => None,
        }
    }
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
    /// How to show latent previews.
    pub preview_method: PreviewMethod,
    pub(crate) interrupt: Arc<AtomicBool>,
    pub(crate) progress: Arc<dyn ProgressSink>,
}

impl Context {
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
