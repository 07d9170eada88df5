//! OmniGen2's facts as a family (ComfyUI's `supported_models.Omnigen2`).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "OmniGen2";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "omnigen2";
/// It denoises in the Flux VAE's latent space (ComfyUI's `latent_formats.Flux`).
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `sampling_settings` for the family: flow shift 2.6 ...
pub const SHIFT: f64 = 2.6;
/// ... and timestep multiplier 1.
pub const MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint keeps the text encoder: `text_encoders.` (ComfyUI's `text_encoder_key_prefix`)
/// and the Qwen2.5-VL 3B's `qwen25_3b.transformer.` its `clip_target` reads.
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen25_3b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
/// The name a LoRA for OmniGen2 would be written under by `kiln model synth` (Kiln applies none yet).
pub const SYNTH_LORA_NAME: &str = "omnigen2-lora";
