//! Mage-Flow's facts as a family (ComfyUI's `supported_models.MageFlow`, read through
//! [`crate::family::DiffusionFamily`] once it is listed there).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Mage-Flow";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "mage-flow";
/// The name `kiln model synth --family` writes a LoRA for the DiT under.
pub const SYNTH_LORA_NAME: &str = "mage-flow-lora";
/// It denoises in the FLUX.2 VAE's latent space (ComfyUI's `latent_formats.Flux2`), one token a latent pixel.
pub const LATENT: LatentFormat = LatentFormat::FLUX2;
/// ComfyUI's `sampling_settings`: shift 6 of `ModelSamplingDiscreteFlow` (the model is `ModelType.FLOW`,
/// where Qwen-Image's is `ModelType.FLUX` and takes `ModelSamplingFlux`) ...
pub const SHIFT: f64 = 6.0;
/// ... and timestep multiplier 1: the DiT receives σ itself, which ComfyUI's `MageFlow.process_timestep`
/// then rounds to bf16 (see [`super::MageFlow::forward`]).
pub const MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint keeps the text encoder: `text_encoders.` and the Qwen3-VL 4B's
/// `qwen3vl_4b.transformer.` its `clip_target` reads.
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen3vl_4b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
