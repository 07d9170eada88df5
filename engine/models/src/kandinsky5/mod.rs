//! Kandinsky 5.0 (ComfyUI's `Kandinsky5`, `comfy/ldm/kandinsky5/model.py`): the Lite image model
//! (`kandinsky5lite_t2i.safetensors`) and the video models (`kandinsky5lite_t2v_sft_5s.safetensors`,
//! `kandinsky5lite_i2v_5s.safetensors`): a DiT whose text tokens (Qwen2.5-VL's states) first run through their own
//! self-attention blocks, then condition the visual tokens by cross-attention; every block is adaLN-modulated by the
//! timestep embedding plus CLIP-L's pooled vector, and RoPE positions the text (one axis) and the latent (frame,
//! row, column).
//!
//! - [`detect`] recognises the file and derives its [`Config`] from shapes (image or video:
//!   [`Config::is_video`]); [`load_plan`] names the weights.
//! - [`Kandinsky5::forward`]: ComfyUI's `Kandinsky5._forward` for a latent of one or more frames: the video models'
//!   input joined with [`Config::concat_channels`] more (a zero image latent and a mask, ComfyUI's `concat_cond`),
//!   the first frames overwritten by `time_dim_replace` (an encoded start image), patches of 1×2×2 (channels
//!   last), the text blocks, the visual blocks (full attention), the modulated output layer, channel-major
//!   unpatchify.
//! - [`family`]: the image and video models' latent formats, shifts and names.
//!
//! The image editing model (2560 wide with channels joined) is refused by [`detect`].

mod config;
pub mod family;
mod model;

pub use config::{Config, LN_EPS, MARKER, PATCH, detect, expected, load_plan};
pub use model::{Kandinsky5, Kandinsky5Input};
