//! Qwen-Image's facts as a family (read through [`crate::family::DiffusionFamily`]; models-qwen-image.md §2.2).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Qwen-Image";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "qwen-image";
/// The name `kiln model synth --family` writes a LoRA for the DiT under.
pub const SYNTH_LORA_NAME: &str = "qwen-image-lora";
/// It denoises in the Wan 2.1 VAE's latent space (ComfyUI's `latent_formats.Wan21`).
pub const LATENT: LatentFormat = LatentFormat::WAN21;
/// ComfyUI's `sampling_settings` for the family: `ModelSamplingFlux` with shift 1.15 (the templates'
/// `ModelSamplingAuraFlow` replaces it).
pub const FLUX_SHIFT: f64 = 1.15;
/// Where a combined checkpoint keeps the text encoder (ComfyUI's prefix for Qwen2.5-VL-7B).
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen25_7b.transformer.";
/// Where a combined checkpoint keeps the VAE.
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
