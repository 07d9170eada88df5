//! Krea 2 (K2; ComfyUI's `SingleStreamDiT`, `comfy/ldm/krea2/model.py`): a single-stream DiT whose text tokens
//! come from a text adapter over 12 tapped Qwen3-VL 4B layers and, joined with the latent's patch tokens, run
//! through shared blocks with AdaLN-single modulation, grouped-query attention with per-head q/k RMS norms and a
//! sigmoid output gate, a SwiGLU MLP and a 3-axis RoPE.
//!
//! - [`detect`] recognises the file (ComfyUI's key layout, under any prefix the [`crate::Header`] strips) and
//!   derives its [`Config`] from shapes; [`load_plan`] names the weights.
//! - [`Krea2::forward`]: ComfyUI's model output for text-to-image; [`Krea2::forward_with_references`] adds
//!   reference latents by ComfyUI's `ref_latents_method` ([`INDEX_TIMESTEP_ZERO`] or any other name).
//! - [`family`]: the name, latent format and model sampling; [`lora`]: the names a LoRA may give its weights.
//!
//! Every RMSNorm weight is stored zero-centred (`scale`) and applied as `1 + scale`.

mod config;
pub mod family;
pub mod lora;
mod model;

pub use config::{
    Config, EPS, HEAD_DIM, INDEX_TIMESTEP_ZERO, MARKER, PATCH, ROPE_THETA, TEXT_FUSION_BLOCKS,
    detect, expected, load_plan,
};
pub use model::Krea2;
