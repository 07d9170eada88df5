//! What the family layer needs to know of FLUX.1 and FLUX.2 beside the network: their names, latent spaces,
//! default model sampling and what a combined checkpoint holds.

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "FLUX.1";
/// The name `kiln model synth --family` writes it under.
pub const SYNTH_NAME: &str = "flux1";
/// The name `kiln model synth --family` writes a LoRA for it under.
pub const SYNTH_LORA_NAME: &str = "flux1-lora";
/// FLUX.1 denoises in the Flux VAE's latent space.
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `ModelSamplingFlux` μ for the guidance-distilled models (dev, Kontext, Fill).
pub const FLUX_SHIFT: f64 = 1.15;
/// schnell's `ModelSamplingDiscreteFlow` shift and multiplier.
pub const SCHNELL_SHIFT: f64 = 1.0;
/// schnell's timestep multiplier (the net scales σ by 1000 itself).
pub const SCHNELL_MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint (`flux1-schnell-fp8.safetensors`) keeps its CLIP-L.
pub const CHECKPOINT_CLIP_L_PREFIX: &str = "text_encoders.clip_l.transformer.";
/// Where a combined checkpoint keeps its T5-XXL.
pub const CHECKPOINT_T5_PREFIX: &str = "text_encoders.t5xxl.transformer.";
/// Where a combined checkpoint keeps its VAE.
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
/// The guidance a guidance-distilled model gets from a conditioning that sets none (ComfyUI's
/// `Flux.extra_conds`).
pub const DEFAULT_GUIDANCE: f32 = 3.5;
/// FLUX.2's name in messages.
pub const FLUX2_NAME: &str = "FLUX.2";
/// The name `kiln model synth --family` writes a FLUX.2 Klein 4B DiT under.
pub const FLUX2_SYNTH_NAME: &str = "flux2";
/// The name `kiln model synth --family` writes a LoRA for FLUX.2 under.
pub const FLUX2_SYNTH_LORA_NAME: &str = "flux2-lora";
/// FLUX.2 denoises in the FLUX.2 VAE's latent space (already normalised by the VAE: identity here).
pub const FLUX2_LATENT: LatentFormat = LatentFormat::FLUX2;
/// ComfyUI's `ModelSamplingFlux` μ for FLUX.2 (`Flux2Scheduler` computes its own shift).
pub const FLUX2_SHIFT: f64 = 2.02;
/// Where a combined checkpoint keeps FLUX.2 Klein 4B's Qwen3 (ComfyUI's `text_encoders.qwen3_4b.transformer.`).
pub const CHECKPOINT_QWEN3_4B_PREFIX: &str = "text_encoders.qwen3_4b.transformer.";
/// LongCat-Image's name in messages.
pub const LONGCAT_NAME: &str = "LongCat-Image";
/// The name `kiln model synth --family` writes a LongCat-Image DiT under.
pub const LONGCAT_SYNTH_NAME: &str = "longcat-image";
/// The name `kiln model synth --family` writes a LoRA for LongCat-Image under.
pub const LONGCAT_SYNTH_LORA_NAME: &str = "longcat-image-lora";
/// Ovis-Image's name in messages.
pub const OVIS_NAME: &str = "Ovis-Image";
/// The name `kiln model synth --family` writes Ovis-Image's DiT under.
pub const OVIS_SYNTH_NAME: &str = "ovis-image";
/// The name a LoRA for Ovis-Image would be written under (Kiln has none to write).
pub const OVIS_SYNTH_LORA_NAME: &str = "ovis-image-lora";
/// Where a combined LongCat-Image checkpoint keeps its Qwen2.5-VL (ComfyUI's `text_encoders.qwen25_7b.transformer.`).
pub const CHECKPOINT_QWEN25_7B_PREFIX: &str = "text_encoders.qwen25_7b.transformer.";
/// Chroma's name in messages.
pub const CHROMA_NAME: &str = "Chroma";
/// The name `kiln model synth --family` writes a Chroma DiT under.
pub const CHROMA_SYNTH_NAME: &str = "chroma";
/// The name `kiln model synth --family` writes a LoRA for Chroma under.
pub const CHROMA_SYNTH_LORA_NAME: &str = "chroma-lora";
/// The guidance Chroma's conditioning carries where none is set (`model_base.Chroma.extra_conds`).
pub const CHROMA_DEFAULT_GUIDANCE: f32 = 0.0;
