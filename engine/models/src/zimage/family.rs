//! Z-Image's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Z-Image";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "z-image";
/// The name `kiln model synth --family` writes a LoRA for the DiT under.
pub const SYNTH_LORA_NAME: &str = "z-image-lora";
/// It denoises in the Flux VAE's latent space (ComfyUI's `latent_formats.Flux`).
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `sampling_settings` for the family: flow shift 3.0 (`ModelSamplingAuraFlow` replaces it)...
pub const SHIFT: f64 = 3.0;
/// ... and timestep multiplier 1.
pub const MULTIPLIER: f64 = 1.0;
/// Where a combined checkpoint keeps the text encoder (ComfyUI's `text_encoder_key_prefix` for Lumina 2
/// models with the Qwen3-4B encoder).
pub const CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.qwen3_4b.transformer.";
/// Where a combined checkpoint keeps the VAE (`vae_key_prefix`).
pub const CHECKPOINT_VAE_PREFIX: &str = "vae.";

/// The original Lumina Image 2.0's name in messages (NetaYume Lumina is one).
pub const LUMINA2_NAME: &str = "Lumina 2";
/// The name `kiln model synth --family` writes a Lumina 2 all-in-one checkpoint under.
pub const LUMINA2_SYNTH_NAME: &str = "lumina2";
/// The name `kiln model synth --family` writes a LoRA for Lumina 2 under.
pub const LUMINA2_SYNTH_LORA_NAME: &str = "lumina2-lora";
/// ComfyUI's `Lumina2` sampling settings: flow shift 6.0 ...
pub const LUMINA2_SHIFT: f64 = 6.0;
/// ... and timestep multiplier 1.
pub const LUMINA2_MULTIPLIER: f64 = 1.0;
/// Where a Lumina 2 checkpoint keeps its Gemma 2 2B text encoder (`text_encoders.` + the `gemma2_2b` CLIP's
/// `transformer.`); its SentencePiece model is [`crate::gemma2::CHECKPOINT_SPIECE_MODEL`].
pub const LUMINA2_CHECKPOINT_TEXT_ENCODER_PREFIX: &str = "text_encoders.gemma2_2b.transformer.";
