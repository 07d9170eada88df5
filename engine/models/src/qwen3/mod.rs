//! The Qwen3 text encoder Z-Image conditions on (Qwen3-4B in ComfyUI's `lumina2` CLIPLoader) and FLUX.2 Klein
//! does (Qwen3-4B or Qwen3-8B, CLIPLoader type `flux2`), and its tokenizer (models.md §2.4, §4;
//! models-flux.md §5.3).
//!
//! - [`Tokenizer`]: the bundled Qwen3 byte-level BPE and [`Tokenizer::zimage_prompt`] /
//!   [`Tokenizer::klein_prompt`], the chat-templated ids ComfyUI feeds the encoder.
//! - [`detect`] recognises a Qwen3 file by its keys and reads every width from its shapes (4B, 8B, tiny);
//!   [`load_plan`] names the weights to load.
//! - [`Qwen3::hidden_state`]: the output of layer `layers − 2`, un-normalised, as Z-Image's conditioning;
//!   [`Qwen3::tapped_hidden_states`]: hidden states 9, 18 and 27 side by side over a padded prompt, as
//!   Klein's ([`KLEIN_TAPS`]).
//! - [`Qwen3::generate`]: the whole decoder with a key/value cache, for `TextGenerate`.
//!
//! The same decoder runs Qwen2.5-VL's language model, Qwen-Image's text encoder ([`Variant::Qwen25Vl`],
//! [`detect_qwen25vl`]): q/k/v biases instead of q/k norms, the final norm's output as the hidden state; and
//! Qwen3-VL's ([`Variant::Qwen3Vl`], [`detect_qwen3vl`]), which reads images with their DeepStack features
//! ([`Qwen3::tapped_hidden_states_with_images`]).

mod config;
pub mod family;
pub mod lora;
mod model;
mod tokenizer;

pub use config::{
    Config, QWEN25_HEAD_DIM, RMS_EPS, ROPE_THETA, Variant, detect, detect_qwen3vl, detect_qwen25vl,
    layer_names, load_plan,
};
pub(crate) use config::{check_layers, check_shape, count_layers, dims, fixed_head_dims};
pub use model::{IMAGE_PAD, ImageLayout, ImageTokens, Qwen3};
pub use tokenizer::{
    ENDOFTEXT, IMAGE_SLOT, JOYIMAGE_DROP, KLEIN_MIN_LENGTH, LONGCAT_PROMPT_LENGTH,
    OMNIGEN2_PROMPT_LAYOUT, OVIS_MIN_LENGTH, Tokenizer, attended_keys, is_templated,
    longcat_conditioning_window, ovis_conditioning_start, qwen_image_conditioning_start,
};

/// The hidden states FLUX.2 Klein conditions on, in Hugging Face's numbering (0 the embeddings, `i` the output
/// of layer `i − 1`): ComfyUI's `Qwen3_4BModel`/`Qwen3_8BModel` `layer=[9, 18, 27]`.
pub const KLEIN_TAPS: [usize; 3] = [9, 18, 27];

/// The tokens that end generation: `<|endoftext|>` and `<|im_end|>` (ComfyUI's Qwen3 `stop_tokens`).
pub const STOP_TOKENS: [u32; 2] = [151_643, 151_645];
