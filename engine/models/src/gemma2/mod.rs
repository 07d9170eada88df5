//! Gemma 2 2B as Lumina 2's text encoder (ComfyUI's `comfy/text_encoders/lumina2.py` `Gemma2_2BModel` on
//! `llama.Gemma2_2B`): the Qwen3 decoder code in [`qwen3::Variant::Gemma2`](crate::qwen3::Variant::Gemma2)
//! and the SentencePiece BPE tokenizer of the file's own `spiece_model` tensor.
//!
//! - [`Gemma2File`]: detection ([`Gemma2File::detect`]), the load plan and the tokenizer;
//! - [`Tokenizer`]: ComfyUI's `LuminaTokenizer` (start token, weights, `<end_of_turn>` handled as ComfyUI's
//!   `SPieceTokenizer` does) and [`attended_keys`], its padding mask.

mod config;
mod tokenizer;

pub use config::{
    CHECKPOINT_SPIECE_MODEL, Gemma2File, HEAD_DIM, NAME, NORM, RMS_EPS, ROPE_THETA, SYNTH_NAME,
    load_plan,
};
pub use tokenizer::{
    END_OF_TURN, PAD, PIXELDIT_MAX_LENGTH, PROMPT_LAYOUT, START, Tokenizer, attended_keys,
};
