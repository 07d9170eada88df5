//! Anima's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Anima";
/// The name `kiln model synth --family` writes the DiT under.
pub const SYNTH_NAME: &str = "anima";
/// The name a LoRA for it would be written under.
pub const SYNTH_LORA_NAME: &str = "anima-lora";
/// It denoises in the Wan 2.1 VAE's latent space (ComfyUI's `Anima.latent_format`).
pub const LATENT: LatentFormat = LatentFormat::WAN21;
/// ComfyUI's `sampling_settings`: `ModelSamplingDiscreteFlow` with shift 3.
pub const SHIFT: f64 = 3.0;
/// The timestep multiplier (the DiT reads σ itself).
pub const MULTIPLIER: f64 = 1.0;
/// The width of Qwen3 0.6B, the file ComfyUI makes Anima's text encoder whatever `CLIPLoader`'s type (`sd.py`'s
/// `detect_te_model`).
pub const QWEN3_06B_HIDDEN: usize = 1024;
