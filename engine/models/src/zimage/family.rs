//! Z-Image's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Z-Image";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "z-image";
/// The name `kiln model synth --family` writes a LoRA for the DiT under.
pub const SYNTH_LORA_NAME: &str = "z-image-lora";
/// It denoises in the Flux VAE's latent space (ComfyUI's `latent_formats.Flux`).
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `sampling_settings` for the family: flow shift 3.0 (`ModelSamplingAuraFlow` replaces it)...
pub const SHIFT: f64 = 3.0;
/// ... and timestep multiplier 1.
pub const MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint keeps the text encoder (ComfyUI's `text_encoder_key_prefix` for Lumina 2
/// models with the Qwen3-4B encoder).
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen3_4b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
