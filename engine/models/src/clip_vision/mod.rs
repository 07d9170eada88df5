//! CLIP vision towers (ComfyUI's `CLIPVisionLoader` / `CLIPVisionEncode`: OpenCLIP ViT-H/14 `clip_vision_h`,
//! SigLIP so400m `sigclip_vision_patch14_384`, OpenAI ViT-L, ViT-bigG) and FLUX.1 Redux, the style model that
//! turns SigLIP's output into prompt tokens (`StyleModelLoader` / `StyleModelApply`); models-wan-video.md §6,
//! ComfyUI's `comfy/clip_vision.py`, `comfy/clip_model.py`, `comfy/ldm/flux/redux.py`.
//!
//! - [`detect`] recognises a vision tower in the Hugging Face `vision_model.*` layout and reads every width from
//!   its shapes; [`load_plan`] names the weights to load.
//! - [`ClipVision::preprocess`]: ComfyUI's `clip_preprocess` (antialiased bicubic resize, crop "center" or
//!   "none", 8-bit rounding, the tower's mean and deviation); [`ClipVision::encode`]: the tower, giving
//!   `last_hidden_state`, `penultimate_hidden_states` and `image_embeds` in f32.
//! - [`detect_redux`], [`redux_load_plan`], [`Redux::encode`]: FLUX.1 Redux.
//!
//! The encoder layers are CLIP's text tower's ([`crate::clip_text`]), run without a mask.

mod config;
mod model;
mod preprocess;
mod redux;

pub use config::{
    CLIP_MEAN, CLIP_STD, Config, HEADS, LAYER_NORM_EPS, SIGLIP_NORM, Variant, detect, load_plan,
};
pub use model::{ClipVision, VisionOutput};
pub use preprocess::{patches, preprocess};
pub use redux::{Redux, ReduxConfig, detect_redux, redux_load_plan};
