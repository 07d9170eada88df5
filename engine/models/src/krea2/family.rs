//! Krea 2's facts as a family (read through [`crate::family::DiffusionFamily`]): ComfyUI's `supported_models.Krea2`
//! with `model_base.Krea2` (`ModelType.FLUX`).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Krea 2";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "krea2";
/// The name `kiln model synth --family` writes a LoRA for it under.
pub const SYNTH_LORA_NAME: &str = "krea2-lora";
/// It denoises in the Wan 2.1 VAE's latent space (ComfyUI's `latent_formats.Wan21`).
pub const LATENT: LatentFormat = LatentFormat::WAN21;
/// ComfyUI's `sampling_settings` shift: `ModelType.FLUX` makes the model sampling `ModelSamplingFlux`, so this
/// is Flux's μ (`FlowSampling::flux`), not a discrete-flow shift.
pub const SHIFT: f64 = 1.15;
/// ComfyUI's `sampling_settings` multiplier, 1: `ModelSamplingFlux` reads none, its timestep is σ, and the DiT
/// scales σ by 1000 itself.
pub const MULTIPLIER: f64 = 1.0;
