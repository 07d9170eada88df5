//! OmniGen2's facts as a family (ComfyUI's `supported_models.Omnigen2`), and Boogu-Image's
//! (`supported_models.Boogu`, a subclass: the same latent format, timestep multiplier and VAE prefix, its own
//! shift and text encoder).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "OmniGen2";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "omnigen2";
/// It denoises in the Flux VAE's latent space (ComfyUI's `latent_formats.Flux`), Boogu-Image too.
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `sampling_settings` for the family: flow shift 2.6 ...
pub const SHIFT: f64 = 2.6;
/// ... and timestep multiplier 1 (Boogu-Image's too).
pub const MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint keeps the text encoder: `text_encoders.` (ComfyUI's `text_encoder_key_prefix`)
/// and the Qwen2.5-VL 3B's `qwen25_3b.transformer.` its `clip_target` reads.
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen25_3b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`), Boogu-Image's too.
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";
/// The name a LoRA for OmniGen2 would be written under by `kiln model synth` (Kiln applies none yet).
pub const SYNTH_LORA_NAME: &str = "omnigen2-lora";

/// Boogu-Image's name in messages.
pub const BOOGU_NAME: &str = "Boogu-Image";
/// The name `kiln model synth --family` writes Boogu-Image's DiT under.
pub const BOOGU_SYNTH_NAME: &str = "boogu";
/// The name a LoRA for Boogu-Image would be written under by `kiln model synth` (Kiln applies none yet).
pub const BOOGU_SYNTH_LORA_NAME: &str = "boogu-lora";
/// Boogu-Image's flow shift (`supported_models.Boogu.sampling_settings`: shift 3.16, multiplier 1 as
/// [`MULTIPLIER`]).
pub const BOOGU_SHIFT: f64 = 3.16;
/// Where a combined Boogu-Image checkpoint keeps the text encoder: `text_encoders.` and the Qwen3-VL 8B's
/// `qwen3vl_8b.transformer.` its `clip_target` reads.
pub const BOOGU_CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen3vl_8b.transformer.";
