//! The Qwen2.5-VL vision tower: images in a Qwen-Image Edit prompt (models-qwen-image.md §4.1).
//!
//! - [`VisionInput::of_image`]: an image resized and cut into patches as ComfyUI's `process_qwen2vl_images`
//!   ([`VisionInput::patched`] with another tower's [`Patching`]: Qwen3-VL's).
//! - [`detect`] reads a tower's widths from the `visual.*` shapes of a `qwen_2.5_vl_7b` file.
//! - [`embed_image`]: the patches through the tower (window and full attention, 2-D RoPE, the 2 × 2 merger) to
//!   the tokens [`crate::qwen3::Qwen3::hidden_state_with_images`] puts where the prompt's `<|image_pad|>` is.

mod config;
mod model;
mod preprocess;

pub use config::{FULL_ATTENTION_BLOCKS, HEADS, MERGE, VisionConfig, detect};
pub use model::embed_image;
pub use preprocess::{
    CLIP_MEAN, CLIP_STD, MAX_PIXELS, MIN_PIXELS, Patching, Resample, VisionInput,
};
