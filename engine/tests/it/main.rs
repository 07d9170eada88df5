//! The engine's integration tests: validation, execution semantics, caches, files, and malformed input.

mod clip_vision;
mod exec;
mod files;
mod flux;
mod flux2;
mod fuzz;
mod harness;
mod memory;
mod qwen_image;
mod utility;
mod vae;
mod validation;
mod zimage;
