//! JoyAI Image Edit's DiT (ComfyUI's `JoyImageTransformer3DModel`, `comfy/ldm/joyimage/model.py`): a
//! double-stream MMDiT over the latent's 1 × 2 × 2 patches (and those of reference latents, appended after them)
//! and Qwen3-VL 8B's text states; each block gives both streams their own modulation table added to one timestep
//! vector, LayerNorms, per-head q/k RMS norms, projections and tanh-GELU MLPs around one joint attention, the
//! image side's q and k rotated by a per-component 3-axis RoPE. The last layer is a plain LayerNorm and Linear.
//!
//! - [`detect`] recognises the file (ComfyUI's key layout, under any prefix the [`crate::Header`] strips) and
//!   derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`JoyImage::forward`]: ComfyUI's model output for a latent, its timestep (σ · 1000), text and references.
//! - [`family`]: the name, latent format and model sampling.

mod config;
pub mod family;
mod model;

pub use config::{
    Config, EPS, IMG_IN, MARKERS, ROPE_FRAME_DIM, ROPE_THETA, TIME_DIM, detect, expected,
    load_plan, rope_axes,
};
pub use model::JoyImage;
