//! Chroma Radiance (ComfyUI's `ChromaRadiance`, `comfy/ldm/chroma_radiance`): Chroma in pixel space. A strided
//! convolution cuts the RGB image into patches (16 pixels a side released) for Chroma's trunk — its double and
//! single blocks modulated by the distilled guidance MLP, its RoPE — and a NeRF head turns each patch's token
//! back into pixels: every pixel's value and DCT-encoded place in the patch through MLP blocks whose weights the
//! patch's token generates, then a linear or 3×3 convolutional head to RGB.
//!
//! - [`detect`] recognises the file (a NeRF block beside Chroma's guidance layer: see [`is_radiance`] on how it
//!   differs from Chroma) and derives its [`Config`] from shapes and the `__x0__` and `__sequential__` marker keys;
//!   [`load_plan`] names the weights.
//! - [`ChromaRadiance::forward`]: ComfyUI's model output, with [`RadianceOptions`] as `ChromaRadianceOptions`
//!   sets them.
//! - [`family`]: the name, latent format (pixels) and model sampling.

mod config;
pub mod family;
mod model;
mod nerf;

pub use config::{
    CHANNELS, Config, DEFAULT_NERF_TILE, FinalHead, SEQUENTIAL_MARKER, X0_MARKER, detect, expected,
    is_radiance, load_plan,
};
pub use model::{ChromaRadiance, RadianceOptions};
