//! HiDream's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "HiDream";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "hidream";
/// The name `kiln model synth --family` writes a LoRA for the DiT under.
pub const SYNTH_LORA_NAME: &str = "hidream-lora";
/// It denoises in the FLUX.1 VAE's latent space (ComfyUI's `latent_formats.Flux`).
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's model sampling for the family: `ModelSamplingDiscreteFlow` with its defaults (its
/// `sampling_settings` are empty: the shift 3.0 written first is overwritten), shift 1 and multiplier 1000; the
/// templates' `ModelSamplingSD3` sets the shift.
pub const SHIFT: f64 = 1.0;
/// The timestep multiplier (the DiT reads σ·1000).
pub const MULTIPLIER: f64 = 1000.0;
