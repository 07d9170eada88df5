//! The UNet families' facts (read through [`crate::family::DiffusionFamily`]): Lotus depth, SDXL and SDXL's
//! refiner.

use crate::latent::LatentFormat;

/// Lotus's name in messages.
pub const NAME: &str = "Lotus depth";
/// The name `kiln model synth --family` writes the Lotus UNet under.
pub const SYNTH_NAME: &str = "lotus-depth";
/// Lotus works in SD's latent space (ComfyUI's `LotusD` is an `SD20` config: `latent_formats.SD15`).
pub const LATENT: LatentFormat = LatentFormat::SD15;
/// The name `kiln model synth --family` would write a LoRA for Lotus under (Kiln has no Lotus LoRA: the family
/// refuses LoRAs).
pub const SYNTH_LORA_NAME: &str = "lotus-depth-lora";
/// Where an SD checkpoint keeps its VAE (`first_stage_model.`).
pub const CHECKPOINT_VAE_PREFIX: &str = "first_stage_model.";

/// SDXL's name in messages (the base model, and SDXL Turbo, which has its shape).
pub const SDXL_NAME: &str = "SDXL";
/// SDXL's refiner's name in messages.
pub const SDXL_REFINER_NAME: &str = "SDXL refiner";
/// Both work in SDXL's latent space (ComfyUI's `latent_formats.SDXL`).
pub const SDXL_LATENT: LatentFormat = LatentFormat::SDXL;
/// The name `kiln model synth --family` writes SDXL's all-in-one checkpoint under.
pub const SDXL_SYNTH_NAME: &str = "sdxl";
/// The name `kiln model synth --family` writes the refiner's all-in-one checkpoint under.
pub const SDXL_REFINER_SYNTH_NAME: &str = "sdxl-refiner";
/// The name a LoRA for SDXL would be written under (Kiln applies no LoRA to a UNet yet).
pub const SDXL_SYNTH_LORA_NAME: &str = "sdxl-lora";
/// The name a LoRA for the refiner would be written under (none yet).
pub const SDXL_REFINER_SYNTH_LORA_NAME: &str = "sdxl-refiner-lora";
/// Where SDXL's checkpoint keeps CLIP-L (transformers' layout under it).
pub const SDXL_CHECKPOINT_CLIP_L_PREFIX: &str = "conditioner.embedders.0.transformer.";
/// Where SDXL's checkpoint keeps CLIP-G (OpenCLIP's layout under it).
pub const SDXL_CHECKPOINT_CLIP_G_PREFIX: &str = "conditioner.embedders.1.model.";
/// Where the refiner's checkpoint keeps its CLIP-G (OpenCLIP's layout).
pub const REFINER_CHECKPOINT_CLIP_G_PREFIX: &str = "conditioner.embedders.0.model.";
