//! The Qwen3 text encoder Z-Image conditions on (Qwen3-4B in ComfyUI's `lumina2` CLIPLoader), and its
//! tokenizer (models.md §2.4, §4).
//!
//! - [`Tokenizer`]: the bundled Qwen3 byte-level BPE and [`Tokenizer::zimage_prompt`], the chat-templated ids
//!   ComfyUI feeds the encoder.
//! - [`detect`] recognises a Qwen3 file by its keys and reads every width from its shapes;
//!   [`load_plan`] names the weights to load.
//! - [`Qwen3::hidden_state`]: the output of layer `layers − 2`, un-normalised, as ComfyUI's conditioning.
//! - [`Qwen3::generate`]: the whole decoder with a key/value cache, for `TextGenerate`.
//!
//! The same decoder runs Qwen2.5-VL's language model, Qwen-Image's text encoder ([`Variant::Qwen25Vl`],
//! [`detect_qwen25vl`]): q/k/v biases instead of q/k norms, the final norm's output as the hidden state.

mod config;
pub mod family;
pub mod lora;
mod model;
mod tokenizer;

pub use config::{
    Config, QWEN25_HEAD_DIM, RMS_EPS, ROPE_THETA, Variant, detect, detect_qwen25vl, layer_names,
    load_plan,
};
pub(crate) use config::{check_shape, dims};
pub use model::{IMAGE_PAD, ImageTokens, Qwen3};
pub use tokenizer::{Tokenizer, qwen_image_conditioning_start};

/// The tokens that end generation: `<|endoftext|>` and `<|im_end|>` (ComfyUI's Qwen3 `stop_tokens`).
pub const STOP_TOKENS: [u32; 2] = [151_643, 151_645];
