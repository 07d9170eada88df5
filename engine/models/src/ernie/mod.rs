//! ERNIE-Image's DiT (ComfyUI's `ErnieImageModel`, `comfy/ldm/ernie/model.py`): a single-stream DiT over the
//! latent's 1 × 1 patches followed by the projected text tokens, every layer modulated by one shared AdaLN
//! table (shift, scale, gate of the attention and of the MLP) from the timestep embedding; RMSNorms with weights
//! before both sub-layers, per-head q/k RMS norms, a 3-axis RoPE in comfy-kitchen's split-half layout (the two
//! halves of a rotate-half pair turned by different angles), a GELU-gated MLP, and a LayerNorm with a
//! scale/shift of the timestep embedding before the last Linear.
//!
//! - [`detect`] recognises the file (ComfyUI's key layout, under any prefix the [`crate::Header`] strips) and
//!   derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`ErnieImage::forward`]: ComfyUI's model output for a latent, its timestep (σ · 1000) and the text;
//!   [`ErnieImage::forward_with_rope`] with `ScaleROPE`'s options.
//! - [`family`]: the name, latent format and model sampling.

mod config;
pub mod family;
mod model;

pub use config::{Config, EPS, MARKER, ROPE_THETA, detect, expected, load_plan, rope_axes};
pub use model::ErnieImage;
