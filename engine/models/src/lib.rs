//! Kiln's model families and the maths around them, between the compute layer (`kiln-compute`: backends,
//! tensors, the memory manager) and the workflow engine (`kiln-engine`: nodes).
//!
//! - [`family`]: the families Kiln runs, one enum per kind of network (`MODEL`, `CLIP`, `VAE`), each family
//!   described once; loading and `kiln model synth` read the same description.
//! - [`header`]: a safetensors file's tensors under a key prefix — what detection reads (never the weights).
//! - [`latent`]: a family's latent format.
//! - [`zimage`]: the NextDiT of Z-Image (ComfyUI's and diffusers' key layouts) and of Lumina 2.
//! - [`omnigen2`]: OmniGen2's DiT (a Lumina 2-style NextDiT that also reads reference-image latents), ComfyUI's
//!   `OmniGen2Transformer2DModel`.
//! - [`gemma2`]: Gemma 2 2B, Lumina 2's text encoder (the Qwen3 decoder code), with its file's SentencePiece
//!   tokenizer.
//! - [`qwen3`]: the Qwen3 text encoder (the hidden state ComfyUI conditions Z-Image on) and its bundled
//!   tokenizer.
//! - [`mistral3`]: FLUX.2 dev's Mistral Small 3.x text encoder (the Qwen3 decoder code) and the Tekken
//!   tokenizer its file carries.
//! - [`clip_vision`]: CLIP and SigLIP vision towers (`CLIPVisionEncode`) and FLUX.1 Redux (`StyleModelApply`).
//! - [`esrgan`]: ESRGAN upscale models (RRDBNet: ESRGAN, Real-ESRGAN, BSRGAN), `ImageUpscaleWithModel`'s.
//! - [`flux_vae`]: the Flux VAE (16-channel KL autoencoder) and the FLUX.2 VAE (its 128-channel, 16×
//!   patchified and normalised sibling), decoder and encoder.
//! - [`quant`]: ComfyUI's quantized weight files: which layers are quantized, and the scales weights carry.
//! - [`noise`]: torch's CPU `randn`, bit for bit, so a seed gives ComfyUI's noise.
//! - [`sampling`]: the flow model's sigma table, the schedulers and the samplers.
//!
//! Model code reads weights only through `kiln_compute::memory::Model::fetch`, one layer at a time, so a model
//! larger than the VRAM budget streams.

mod adaln;
pub mod anima;
pub mod audio_encoding;
pub mod brownian;
pub mod chroma_radiance;
pub mod clip_text;
pub mod clip_vision;
pub mod ernie;
pub mod esrgan;
pub mod family;
pub mod flux;
pub mod flux_vae;
mod fp16;
pub mod gaussian;
pub mod gemma2;
pub mod header;
pub mod hidream;
pub mod hunyuan_vae;
pub mod hunyuan_video;
mod interpolate;
pub mod joyimage;
pub mod kandinsky5;
pub mod kl_video_vae;
pub mod krea2;
pub mod latent;
mod latent_tokens;
pub mod llama3;
pub mod lora;
pub mod mage_flow;
pub mod mage_vae;
pub mod mistral3;
pub mod music_features;
mod named;
pub mod noise;
pub mod omnigen2;
pub mod pixeldit;
pub mod prompt_weights;
pub mod quant;
pub mod qwen3;
pub mod qwen3vl_vision;
pub mod qwen_image;
pub mod qwen_vl;
pub mod resample;
mod rope;
pub use rope::{RopeOptions, linspace};
pub mod sampling;
pub mod sd3;
pub mod synth;
pub mod t5;
pub mod textgen;
mod timestep;
pub mod unet;
mod vae_io;
pub mod wan;
pub mod wan_vae;
pub mod wav2vec2;
pub mod whisper;
pub mod zimage;
pub mod zimage_lora;

mod error;

pub use error::{Error, Result};
pub use header::Header;
