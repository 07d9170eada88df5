//! What the family layer needs to know of FLUX.1 beside the network: its names, latent space, default model
//! sampling and what a combined checkpoint holds.

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "FLUX.1";
/// The name `kiln model synth --family` writes it under.
pub const SYNTH_NAME: &str = "flux1";
/// The name `kiln model synth --family` writes a LoRA for it under.
pub const SYNTH_LORA_NAME: &str = "flux1-lora";
/// FLUX.1 denoises in the Flux VAE's latent space.
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `ModelSamplingFlux` μ for the guidance-distilled models (dev, Kontext, Fill).
pub const FLUX_SHIFT: f64 = 1.15;
/// schnell's `ModelSamplingDiscreteFlow` shift and multiplier.
pub const SCHNELL_SHIFT: f64 = 1.0;
/// schnell's timestep multiplier (the net scales σ by 1000 itself).
pub const SCHNELL_MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint (`flux1-schnell-fp8.safetensors`) keeps its CLIP-L.
pub const CHECKPOINT_CLIP_L_PREFIX: &str = "text_encoders.clip_l.transformer.";
/// Where a combined checkpoint keeps its T5-XXL.
pub const CHECKPOINT_T5_PREFIX: &str = "text_encoders.t5xxl.transformer.";
/// Where a combined checkpoint keeps its VAE.
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
/// The guidance a guidance-distilled model gets from a conditioning that sets none (ComfyUI's
/// `Flux.extra_conds`).
pub const DEFAULT_GUIDANCE: f32 = 3.5;
