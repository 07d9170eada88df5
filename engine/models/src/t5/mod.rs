//! The T5 v1.1 encoder Flux.1 conditions on (T5-XXL in ComfyUI's `DualCLIPLoader` type `flux`), and its
//! tokenizer (models-flux.md §5.1); umT5-XXL, Wan's encoder, on the same code (models-wan-video.md §2.4, §5).
//!
//! - [`Tokenizer`]: the bundled T5 SentencePiece unigram model; [`Tokenizer::word_ids`] gives a text's ids as
//!   ComfyUI's `T5XXLTokenizer` takes them from its HF tokenizer (no EOS; weighting and padding are the
//!   caller's).
//! - [`detect`] recognises a T5 v1.1 encoder by its keys and reads every width from its shapes; [`load_plan`]
//!   names the weights to load.
//! - [`T5::hidden_state`]: the last hidden state after the final norm, in f32 as ComfyUI computes it.
//! - umT5 (`umt5.rs`): [`Umt5File`] ([`detect_umt5`], [`umt5_load_plan`]) with the file's own SentencePiece
//!   tokenizer ([`SentencePiece`], `spiece/`), [`T5::umt5`] (a position bias table per block) and
//!   [`T5::masked_hidden_state`] under [`attention_mask`], prompts laid out by [`umt5_tokens`].

mod byt5;
mod config;
pub mod family;
mod model;
mod spiece;
mod tokenizer;
mod umt5;

pub use byt5::{BYT5_PROMPT_LAYOUT, byt5_tokens, byt5_word_ids, quoted_text};
pub use config::{
    Config, MAX_DISTANCE, RMS_EPS, UMT5_VOCAB, detect, detect_umt5, load_plan, umt5_load_plan,
};
pub use model::{T5, relative_position_bucket};
pub use spiece::{SYNTH_BPE_PIECES, SYNTH_PIECES, SentencePiece, synth_bpe_model, synth_model};
pub use tokenizer::Tokenizer;
pub(crate) use umt5::file_spiece;
pub use umt5::{
    SPIECE_MODEL, UMT5_PROMPT_LAYOUT, Umt5File, attention_mask, umt5_tokens, umt5_tokens_in,
};

/// `</s>`: the end of a prompt's ids (ComfyUI's `special_tokens["end"]`).
pub const EOS: u32 = 1;
/// `<pad>`: what ComfyUI pads a prompt's ids with (`special_tokens["pad"]`).
pub const PAD: u32 = 0;

/// T5-XXL's prompt layout in ComfyUI's PixArt tokenizer, which CLIPLoader types `chroma` and `pixart` use: no
/// start token, EOS, one section never truncated nor padded (`min_length` 1).
pub const CHROMA_PROMPT_LAYOUT: crate::prompt_weights::Layout =
    crate::prompt_weights::Layout { min_length: Some(1), ..FLUX_PROMPT_LAYOUT };

/// T5-XXL's prompt layout in ComfyUI's HiDream tokenizer (`T5XXLTokenizer(min_length=128, max_length=128)`):
/// no start token, sections of 127 tokens and EOS, the last padded with [`PAD`] to 128; HiDream keeps the first.
pub const HIDREAM_PROMPT_LAYOUT: crate::prompt_weights::Layout =
    crate::prompt_weights::Layout { max_length: 128, min_length: Some(128), ..FLUX_PROMPT_LAYOUT };

/// T5-XXL's prompt layout in ComfyUI's FLUX.1 tokenizer ([`crate::prompt_weights`]): no start token, EOS, one
/// section padded with [`PAD`] to 256 tokens, never truncated.
pub const FLUX_PROMPT_LAYOUT: crate::prompt_weights::Layout = crate::prompt_weights::Layout {
    start: None,
    end: Some(EOS),
    pad: PAD,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(256),
    min_padding: None,
};
