//! Kandinsky 5's facts as a family (read through [`crate::family::DiffusionFamily`]).

use crate::latent::LatentFormat;

/// The family's name in messages.
pub const NAME: &str = "Kandinsky 5";
/// The name `kiln model synth --family` writes the Lite image model under.
pub const SYNTH_NAME: &str = "kandinsky5-image";
/// The name a LoRA for it would be written under (Kiln applies none to Kandinsky 5 yet).
pub const SYNTH_LORA_NAME: &str = "kandinsky5-image-lora";
/// The Lite image model denoises in the Flux VAE's latent space (ComfyUI's `Kandinsky5Image.latent_format`).
pub const LATENT: LatentFormat = LatentFormat::FLUX;
/// ComfyUI's `sampling_settings` for the image model: `ModelSamplingDiscreteFlow` with shift 3.
pub const SHIFT: f64 = 3.0;
/// The timestep multiplier (the DiT reads σ·1000).
pub const MULTIPLIER: f64 = 1000.0;
