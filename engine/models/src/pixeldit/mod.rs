//! PixelDiT's text-to-image DiT (ComfyUI's `PixDiT_T2I`, `comfy/ldm/pixeldit/`): a DiT in pixel space, no VAE.
//! An MMDiT over `p × p` patches (16 released) and Gemma 2 2B's text, each stream with its own weights, RMS norms
//! and SwiGLU MLPs, a 2-D RoPE on the patches and a 1-D one on the text, modulated by the timestep; then pixel
//! blocks on a narrow token per pixel, modulated per pixel by the patch's token, whose attention runs on one token
//! a patch (the patch's pixels squeezed by a Linear and expanded back); a per-pixel head to RGB.
//!
//! - [`detect`] recognises the file (ComfyUI's key layout under `core.`, and ComfyUI's processed one: see
//!   [`Layout`]) and derives its [`Config`] from shapes; [`load_plan`] names the weights; [`expected`] lists them.
//! - [`PixelDit::forward`]: ComfyUI's model output for pixels, their timestep (σ · 1000) and the text;
//!   [`PixelDit::forward_with_rope`] with `ScaleROPE`'s options.
//! - [`family`]: the name, latent format (pixels) and model sampling.

mod config;
pub mod family;
mod model;

pub use config::{
    CHANNELS, Config, EPS, Layout, MARKER, ROPE_SPAN, ROPE_THETA, TIME_FREQS, TIME_MAX_PERIOD,
    detect, expected, load_plan,
};
pub use model::{DEFAULT_PIXEL_TILE, PixelDit};
