//! The Qwen3-VL vision tower: images in the prompts of the Qwen3-VL text encoders (Krea 2, Mage-Flow, Boogu
//! edit prompts with reference images), as ComfyUI's `Qwen3VLVisionModel` runs them.
//!
//! - [`detect`] reads a tower's widths and DeepStack indexes from the `visual.*` shapes of a `qwen3vl_4b` /
//!   `qwen3vl_8b` file; [`load_plan`] names its weights.
//! - [`crate::qwen_vl::VisionInput::patched`] with [`Config::patching`]: an image resized and cut into 16-pixel
//!   patches normalised to [-1, 1] (ComfyUI's `process_qwen2vl_images` with `patch_size=16`, mean and std 0.5).
//! - [`embed_image`]: the patches through the tower (learned positions resampled to the grid, 2-D RoPE, full
//!   attention, the 2 × 2 merger) to the tokens [`crate::qwen3::Qwen3::tapped_hidden_states_with_images`] puts
//!   where the prompt's `<|image_pad|>` is, and the DeepStack features it adds after the first layers.

mod config;
mod model;

pub use config::{Config, HEADS, RELEASED_DEEPSTACK, deepstack_indexes, detect, load_plan};
pub use model::{ImageEmbeds, embed_image};
