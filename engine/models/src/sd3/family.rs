//! SD3's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages (SD3 Medium's and SD3.5 Large's MMDiT).
pub const NAME: &str = "SD3";
/// The name `kiln model synth --family` writes the all-in-one checkpoint under.
pub const SYNTH_NAME: &str = "sd3.5";
/// The name a LoRA for it would be written under (Kiln applies none to SD3 yet).
pub const SYNTH_LORA_NAME: &str = "sd3.5-lora";
/// It denoises in SD3's VAE's latent space (ComfyUI's `latent_formats.SD3`).
pub const LATENT: LatentFormat = LatentFormat::SD3;
/// ComfyUI's `sampling_settings` for SD3: `ModelSamplingDiscreteFlow` with shift 3.
pub const SHIFT: f64 = 3.0;
/// The timestep multiplier (the MMDiT reads σ·1000).
pub const MULTIPLIER: f64 = 1000.0;
/// Where SD3's checkpoints keep CLIP-L (transformers' layout).
pub const CHECKPOINT_CLIP_L_PREFIX: &str = "text_encoders.clip_l.transformer.";
/// Where they keep CLIP-G (transformers' layout).
pub const CHECKPOINT_CLIP_G_PREFIX: &str = "text_encoders.clip_g.transformer.";
/// Where they keep T5-XXL.
pub const CHECKPOINT_T5_PREFIX: &str = "text_encoders.t5xxl.transformer.";
/// Where they keep the VAE.
pub const CHECKPOINT_VAE_PREFIX: &str = "first_stage_model.";
