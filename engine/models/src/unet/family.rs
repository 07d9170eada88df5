//! Lotus depth's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Lotus depth";
/// The name `kiln model synth --family` writes the UNet under.
pub const SYNTH_NAME: &str = "lotus-depth";
/// It works in SD's latent space (ComfyUI's `LotusD` is an `SD20` config: `latent_formats.SD15`).
pub const LATENT: LatentFormat = LatentFormat::SD15;
/// The name `kiln model synth --family` would write a LoRA for it under (Kiln has no Lotus LoRA: the family
/// refuses LoRAs).
pub const SYNTH_LORA_NAME: &str = "lotus-depth-lora";
/// Where an SD checkpoint keeps its VAE (`first_stage_model.`).
pub const CHECKPOINT_VAE_PREFIX: &str = "first_stage_model.";
