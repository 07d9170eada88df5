//! Llama 3.1 8B Instruct as HiDream's fourth text encoder (ComfyUI's `comfy/text_encoders/hidream.py`,
//! `hunyuan_video.LLAMA3Tokenizer`, `llama.Llama2`).
//!
//! - [`Tokenizer`]: Meta's Llama 3 BPE (the tiktoken ranks Kiln ships) and ComfyUI's HiDream prompt layout.

mod config;
mod tokenizer;

pub use config::{HEAD_DIM, NAME, NORM, RMS_EPS, ROPE_THETA, SYNTH_NAME, detect, load_plan};
pub use tokenizer::*;
