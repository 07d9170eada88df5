//! PixelDiT's facts as a family (ComfyUI's `supported_models.PixelDiTT2I` with `model_base.PixelDiTT2I`,
//! `ModelType.FLOW`; read through [`crate::family::DiffusionFamily`]). ComfyUI runs it in bf16 or f32
//! (`supported_inference_dtypes`), never f16.

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "PixelDiT";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "pixeldit";
/// The name a LoRA for it would be written under (Kiln maps no PixelDiT LoRA keys yet, so none is).
pub const SYNTH_LORA_NAME: &str = "pixeldit-lora";
/// It denoises RGB pixels (ComfyUI's `latent_formats.PixelDiTPixel`, `ChromaRadiance`'s format unchanged), the
/// `pixel_space` VAE's space.
pub const LATENT: LatentFormat = LatentFormat::PIXELS;
/// ComfyUI's `sampling_settings` shift (the released 1024 px stage-3 model's; 2.0 suits 512 px):
/// `ModelType.FLOW` makes the model sampling `ModelSamplingDiscreteFlow`, shifted by 4 ...
pub const SHIFT: f64 = 4.0;
/// ... with its default timestep multiplier 1000 (`sampling_settings` names none): the DiT receives σ · 1000.
pub const MULTIPLIER: f64 = 1000.0;
/// Where a combined checkpoint keeps the text encoder: `text_encoders.` and the Gemma 2 2B's
/// `gemma2_2b.transformer.` its `clip_target` reads.
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.gemma2_2b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
