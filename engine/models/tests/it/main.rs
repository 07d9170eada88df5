//! The model families' integration tests, one binary. Each family's outputs on the CPU are compared with
//! fixtures recorded by `scripts/reference/` from independent implementations (diffusers, transformers, torch),
//! within a relative error of 1e-4 in f32.

mod animate2;
mod brownian;
mod chroma;
mod clip_text;
mod clip_vision;
mod comfy_sampling;
mod common;
mod dancer;
mod esrgan;
mod flux;
mod flux2;
mod flux2_vae;
mod flux_tokens;
mod flux_vae;
mod hidream;
mod infinite_talk;
mod llama3;
mod longcat_image;
mod lotus;
mod mistral3;
mod music_features;
mod noise;
mod quant;
mod qwen25vl;
mod qwen25vl_vision;
mod qwen3;
mod qwen3_klein;
mod qwen_image;
mod qwen_image_blockwise;
mod qwen_image_controlnet;
mod sampling;
mod sd3;
mod sdxl;
mod synth;
mod t5;
mod umt5;
mod wan;
mod wan_vae;
mod wan_vae_video;
mod wav2vec2;
mod whisper;
mod zimage;
mod zimage_fun_controlnet;
mod zimage_lora;
