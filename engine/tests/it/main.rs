//! The engine's integration tests: validation, execution semantics, caches, files, and malformed input.

mod audio;
mod clip_vision;
mod exec;
mod files;
mod flux;
mod flux2;
mod fuzz;
mod glsl;
mod harness;
mod memory;
mod qwen_image;
mod umt5;
mod utility;
mod vae;
mod validation;
mod video;
mod wan;
mod wan_vae_video;
mod webm;
mod zimage;
