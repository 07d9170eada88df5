//! The CLIP text encoder (Flux.1's CLIP-L; CLIP-H and CLIP-G detected too) and its tokenizer
//! (models-flux.md §5.1; ComfyUI's `comfy/clip_model.py`, `comfy/sd1_clip.py`).
//!
//! - [`Tokenizer`]: CLIP's byte-level BPE built from the bundled merges; [`Tokenizer::word_ids`] gives the ids
//!   ComfyUI's SDTokenizer keeps of a piece of prompt (no [`BOS`] or [`EOS`]; weighting, 77-chunking and
//!   padding are the caller's).
//! - [`detect`] recognises a CLIP text file by ComfyUI's key `text_model.encoder.layers.1.mlp.fc1.weight` and
//!   reads every width from its shapes; [`load_plan`] names the weights to load.
//! - [`ClipText::encode`]: the final-normed states, the pooled vector (at the first EOS, unprojected) and
//!   optionally one layer's output, all in f32 as ComfyUI computes CLIP.

mod config;
pub mod family;
mod model;
mod tokenizer;

pub use config::{
    Activation, Config, HEAD_DIM, LAYER_NORM_EPS, Layout, Variant, detect, load_plan,
};
pub(crate) use config::{LAYER_TENSORS, layer_shapes};
pub use model::{ClipOutput, ClipText};
pub(crate) use model::{LayerShape, encoder_layer};
pub use tokenizer::{BOS, EOS, Tokenizer};

/// CLIP-L's prompt layout in ComfyUI's `SDTokenizer` ([`crate::prompt_weights`]): BOS, the prompt, EOS, EOS
/// padding to 77 tokens per section.
pub const PROMPT_LAYOUT: crate::prompt_weights::Layout = crate::prompt_weights::Layout {
    start: Some(BOS),
    end: Some(EOS),
    pad: EOS,
    max_length: 77,
    pad_to_max_length: true,
    min_length: None,
    min_padding: None,
};
