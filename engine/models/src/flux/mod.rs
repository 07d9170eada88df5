//! FLUX.1's DiT (`flux1-dev`, `flux1-schnell`, Kontext, Fill; ComfyUI's names are Black Forest Labs'):
//! double-stream blocks over text and image tokens, then single-stream blocks over both, per-block adaLN
//! modulation from the timestep, the distilled guidance and CLIP-L's pooled vector, and a 3-axis RoPE
//! (models-flux.md §3, §4).
//!
//! - [`detect`] recognises the file in ComfyUI's or diffusers' layout and derives its [`Config`] from shapes;
//!   [`load_plan`] names the weights in ComfyUI's layout whatever the file's.
//! - [`Flux::forward`]: ComfyUI's model output v = ε − x₀, with Kontext's reference latents placed by each of
//!   ComfyUI's methods.

mod config;
pub mod family;
pub mod lora;
mod model;

pub(crate) use config::expected;

/// Every weight of `cfg` with its shape, by ComfyUI's name (the slots a loaded model has).
pub fn expected_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    config::expected(cfg)
        .into_iter()
        .map(|(name, shape)| (name.replace("_norm.scale", "_norm.weight"), shape))
        .collect()
}
pub use config::{
    AXES_DIMS, Config, DEFAULT_REFERENCE_METHOD, EPS, HEAD_DIM, LATENT_CHANNELS, Layout, PATCH,
    ROPE_THETA, T_FREQ_DIM, detect, load_plan,
};
pub use model::{Flux, FluxInput};
