//! Kandinsky 5.0 (`kandinsky5lite_t2i.safetensors`; ComfyUI's `Kandinsky5`, `comfy/ldm/kandinsky5/model.py`): a
//! DiT whose text tokens (Qwen2.5-VL's states) first run through their own self-attention blocks, then condition the
//! image tokens by cross-attention; every block is adaLN-modulated by the timestep embedding plus CLIP-L's pooled
//! vector, and RoPE positions the text (one axis) and the image (frame, row, column).
//!
//! - [`detect`] recognises the file and derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`Kandinsky5::forward`]: ComfyUI's `Kandinsky5._forward` for an image latent: patches of 2×2 (channels last),
//!   the text blocks, the visual blocks, the modulated output layer, channel-major unpatchify.
//!
//! Kiln runs the Lite image model; the video models (their latent joined with an image latent and a mask, the
//! HunyuanVideo VAE) are refused by name.

mod config;
pub mod family;
mod model;

pub use config::{Config, LN_EPS, MARKER, PATCH, detect, expected, load_plan};
pub use model::{Kandinsky5, Kandinsky5Input};
