//! ERNIE-Image's facts as a family (ComfyUI's `supported_models.ErnieImage` with `model_base.ErnieImage`,
//! `ModelType.FLOW`; read through [`crate::family::DiffusionFamily`]). ComfyUI runs it
//! in bf16 or f32 (`supported_inference_dtypes`), never f16.

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "ERNIE-Image";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "ernie-image";
/// The name a LoRA for it would be written under (Kiln maps no ERNIE-Image LoRA keys yet, so none is).
pub const SYNTH_LORA_NAME: &str = "ernie-image-lora";
/// It denoises in the FLUX.2 VAE's latent space (ComfyUI's `latent_formats.Flux2`: 128 channels).
pub const LATENT: LatentFormat = LatentFormat::FLUX2;
/// ComfyUI's `sampling_settings` shift: `ModelType.FLOW` makes the model sampling `ModelSamplingDiscreteFlow`,
/// shifted by 3 ...
pub const SHIFT: f64 = 3.0;
/// ... with timestep multiplier 1000: the DiT receives σ · 1000.
pub const MULTIPLIER: f64 = 1000.0;
/// Where a combined checkpoint keeps the text encoder: `text_encoders.` and the Ministral 3 3B's
/// `ministral3_3b.transformer.` its `clip_target` reads.
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.ministral3_3b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
