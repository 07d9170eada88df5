//! HunyuanVideo 1.5's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "HunyuanVideo 1.5";
/// The name `kiln model synth --family` writes the 720p model under (Capybara has its shape).
pub const SYNTH_NAME: &str = "hunyuan-video15";
/// The name a LoRA for it would be written under (Kiln applies none to HunyuanVideo 1.5 yet).
pub const SYNTH_LORA_NAME: &str = "hunyuan-video15-lora";
/// It denoises in the HunyuanVideo 1.5 VAE's latent space (ComfyUI's `HunyuanVideo15.latent_format`).
pub const LATENT: LatentFormat = LatentFormat::HUNYUAN_VIDEO15;
/// ComfyUI's `sampling_settings`: `ModelSamplingDiscreteFlow` with shift 7 (the templates' `ModelSamplingSD3`
/// sets it again).
pub const SHIFT: f64 = 7.0;
/// The timestep multiplier (the DiT reads σ·1000).
pub const MULTIPLIER: f64 = 1000.0;
/// Where a combined checkpoint would keep the VAE (ComfyUI's `HunyuanVideo.vae_key_prefix`; none is released).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
/// The image latent and mask channels the image-to-video conditioning adds (32 + 1): a 1.5 DiT reads
/// `in_channels` = 32 + this.
pub const CONCAT_CHANNELS: usize = 33;

/// HunyuanVideo 1.0's name in messages.
pub const V1_NAME: &str = "HunyuanVideo";
/// The name `kiln model synth --family` writes HunyuanVideo 1.0's 720p text-to-video model under.
pub const V1_SYNTH_NAME: &str = "hunyuan-video";
/// The name a LoRA for HunyuanVideo 1.0 would be written under (Kiln applies none yet).
pub const V1_SYNTH_LORA_NAME: &str = "hunyuan-video-lora";
/// HunyuanVideo 1.0 denoises in its VAE's latent space (ComfyUI's `HunyuanVideo.latent_format`).
pub const V1_LATENT: LatentFormat = LatentFormat::HUNYUAN_VIDEO;
/// The distilled guidance HunyuanVideo 1.0's conditioning carries where none is set (ComfyUI's
/// `HunyuanVideo.extra_conds` default; `FluxGuidance` sets another).
pub const DEFAULT_GUIDANCE: f32 = 6.0;
