//! The FLUX DiTs (ComfyUI's names are Black Forest Labs'): FLUX.1 (`flux1-dev`, `flux1-schnell`, Kontext,
//! Fill) and FLUX.2 (dev, Klein 4B/9B). Double-stream blocks over text and image tokens, then single-stream
//! blocks over both, adaLN modulation from the timestep (and the distilled guidance, and FLUX.1's CLIP-L pooled
//! vector) — per block in FLUX.1, three modulations shared by all blocks in FLUX.2 — and a multi-axis RoPE
//! (models-flux.md §3, §4). One code path; [`Generation`] holds what differs.
//!
//! - [`detect`] recognises the file in ComfyUI's or diffusers' layout and derives its [`Config`] from shapes;
//!   [`load_plan`] names the weights in ComfyUI's layout whatever the file's.
//! - [`Flux::forward`]: ComfyUI's model output v = ε − x₀, with Kontext's reference latents placed by each of
//!   ComfyUI's methods.

mod config;
pub mod family;
pub mod lora;
mod model;
mod uso;

pub(crate) use config::expected;

/// Every weight of `cfg` with its shape, by ComfyUI's name (the slots a loaded model has).
pub fn expected_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    config::expected(cfg)
        .into_iter()
        .map(|(name, shape)| (name.replace("_norm.scale", "_norm.weight"), shape))
        .collect()
}
pub use config::{
    Approximator, CHROMA_IN_DIM, CHROMA_MOD_ROWS, Config, DEFAULT_REFERENCE_METHOD, EPS,
    Generation, HEAD_DIM, LATENT_CHANNELS, LONGCAT_TEXT_DIM, Layout, T_FREQ_DIM, detect, load_plan,
};
pub use model::{Flux, FluxInput, KvCache};
pub(crate) use uso::uso_expected;
pub use uso::{USO_PREFIX, UsoConfig, UsoProjector, detect_uso, uso_load_plan};
