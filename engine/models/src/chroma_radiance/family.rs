//! Chroma Radiance's facts as a family: ComfyUI's `supported_models.ChromaRadiance`, which inherits Chroma's
//! sampling settings, with `model_base.ChromaRadiance` (`ModelType.FLUX`).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Chroma Radiance";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "chroma-radiance";
/// The name a LoRA for it would be written under (Kiln applies none yet, so none is written).
pub const SYNTH_LORA_NAME: &str = "chroma-radiance-lora";
/// It denoises RGB pixels (ComfyUI's `latent_formats.ChromaRadiance`), the `pixel_space` VAE's space.
pub const LATENT: LatentFormat = LatentFormat::PIXELS;
/// The `ModelSamplingFlux` μ: Chroma's `sampling_settings` name no shift, so ComfyUI's default 1.15 applies.
pub const SHIFT: f64 = 1.15;
/// Chroma's `sampling_settings` multiplier, 1: the timestep is σ and the DiT scales it by 1000 itself.
pub const MULTIPLIER: f64 = 1.0;
/// The guidance a conditioning carries where none is set (`model_base.Chroma.extra_conds`).
pub const DEFAULT_GUIDANCE: f32 = 0.0;
