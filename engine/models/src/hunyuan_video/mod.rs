//! The HunyuanVideo DiT as ComfyUI runs it (`comfy.ldm.hunyuan_video.model.HunyuanVideo`): HunyuanVideo 1.5
//! (text and image to video, and its step-distilled "meanflow" models), and HunyuanVideo 1.0's pieces (the
//! pooled CLIP-L vector, the distilled guidance). FLUX.1's double- and single-stream blocks over
//! [text side, video] with a 3-axis RoPE, a token refiner on the text features, and 1.5's byT5 glyph mapper
//! and vision projection.
//!
//! - [`detect`] tells a HunyuanVideo file (ComfyUI's key layout) from other families and derives its [`Config`]
//!   from shapes (the caller applies [`crate::header::diffusion_prefix`] first).
//! - [`load_plan`] names the weights as the file does; [`expected`] lists them for `kiln model synth`.
//! - [`HunyuanVideo::forward`] is ComfyUI's forward for a [`HunyuanVideoInput`], one block's weights at a time.
//!
//! Not supported: 1.0's `guiding_frame_index` (image-to-video v2's per-frame modulation) and `ref_latent`, the
//! text attention mask (Kiln runs conditionings of different lengths apart), HunyuanImage 2.1 (2-D patches),
//! and the original (non-ComfyUI) key layout.

mod blocks;
mod config;
pub mod family;
mod keys;
mod model;
mod text;

pub use config::{AXES_DIMS, ByT5Widths, Config, HEAD_DIM, ROPE_THETA, detect};
pub use keys::{expected, load_plan};
pub use model::{HunyuanVideo, HunyuanVideoInput};
