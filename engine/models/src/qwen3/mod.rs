//! The Qwen3 text encoder Z-Image conditions on (Qwen3-4B in ComfyUI's `lumina2` CLIPLoader), and its
//! tokenizer (models.md §2.4, §4).
//!
//! - [`Tokenizer`]: the bundled Qwen3 byte-level BPE and [`Tokenizer::zimage_prompt`], the chat-templated ids
//!   ComfyUI feeds the encoder.
//! - [`detect`] recognises a Qwen3 file by its keys and reads every width from its shapes;
//!   [`load_plan`] names the weights the hidden state needs.
//! - [`Qwen3::hidden_state`]: the output of layer `layers − 2`, un-normalised, as ComfyUI's conditioning.

mod config;
pub mod family;
mod model;
mod tokenizer;

pub use config::{Config, RMS_EPS, ROPE_THETA, detect, layer_names, load_plan};
pub use model::Qwen3;
pub use tokenizer::Tokenizer;
