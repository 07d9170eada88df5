//! Kandinsky 5's facts as a family (read through [`crate::family::DiffusionFamily`]): the Lite image model's
//! (ComfyUI's `Kandinsky5Image`) and the video models' (ComfyUI's `Kandinsky5`: `kandinsky5lite_t2v_sft_5s`,
//! `kandinsky5lite_i2v_5s`), told apart by [`super::Config::is_video`].

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
/// The timestep multiplier (the DiT reads σ·1000), image and video models alike.
pub const MULTIPLIER: f64 = 1000.0;

/// The video models' name in messages.
pub const VIDEO_NAME: &str = "Kandinsky 5 video";
/// The name `kiln model synth --family` writes a video model under.
pub const VIDEO_SYNTH_NAME: &str = "kandinsky5-video";
/// The name a LoRA for a video model would be written under (Kiln applies none to Kandinsky 5 yet).
pub const VIDEO_SYNTH_LORA_NAME: &str = "kandinsky5-video-lora";
/// The video models denoise in the HunyuanVideo 1.0 VAE's latent space (ComfyUI's `Kandinsky5.latent_format`:
/// 16 channels, 8× in space, 4× in time, scale 0.476986); `time_dim_replace` is mapped into it too (ComfyUI's
/// `process_latent_in` in `Kandinsky5.extra_conds`).
pub const VIDEO_LATENT: LatentFormat = LatentFormat::HUNYUAN_VIDEO;
/// ComfyUI's `sampling_settings` for the video models: `ModelSamplingDiscreteFlow` with shift 10 (the templates
/// override it with `ModelSamplingSD3` shift 5).
pub const VIDEO_SHIFT: f64 = 10.0;
