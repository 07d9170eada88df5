//! JoyAI Image Edit's facts as a family (ComfyUI's `supported_models.JoyImage` with `model_base.JoyImage`,
//! `ModelType.FLOW`; read through [`crate::family::DiffusionFamily`] once it is listed there).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "JoyAI Image Edit";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "joyimage";
/// The name `kiln model synth --family` writes a LoRA for the DiT under.
pub const SYNTH_LORA_NAME: &str = "joyimage-lora";
/// It denoises in the Wan 2.1 VAE's latent space (ComfyUI's `latent_formats.Wan21`).
pub const LATENT: LatentFormat = LatentFormat::WAN21;
/// ComfyUI's `sampling_settings` shift: `ModelType.FLOW` makes the model sampling `ModelSamplingDiscreteFlow`,
/// shifted by 1.5 ...
pub const SHIFT: f64 = 1.5;
/// ... with timestep multiplier 1000: the DiT receives σ · 1000.
pub const MULTIPLIER: f64 = 1000.0;
/// Where a combined checkpoint keeps the text encoder: `text_encoders.` and the Qwen3-VL 8B's
/// `qwen3vl.transformer.` its `clip_target` reads.
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen3vl.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
