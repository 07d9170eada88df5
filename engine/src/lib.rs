//! Kiln's workflow engine: it accepts ComfyUI API-format prompts, validates them with ComfyUI's error types,
//! and executes them with ComfyUI's caching semantics.
//!
//! - [`graph`]: the prompt model and validation.
//! - [`nodes`]: the node API, the registry and the built-in nodes.
//! - [`exec`]: the executor and its events.
//! - [`cache`]: cache keys and the classic, LRU, RAM-pressure and none caches.
//! - [`queue`]: the prompt queue with a persistence trait.
//! - [`media`]: video and audio values (`VIDEO`, `AUDIO`), H.264 and MP4.
//! - [`roots`]: the input/output/temp folders and the one path check every file access uses.
//! - [`preview`]: the images nodes show while they run, and latent previews.
//! - [`models`]: the model values on links (`MODEL`, `CLIP`, `VAE`, `CONDITIONING`) and how loader nodes find
//!   and load model files (the networks are in `kiln_models`).
//! - [`compute`]: the device nodes compute on (from [`kiln_compute`], the layer below: tensors, backends and
//!   the memory manager).
//!
//! The engine knows nothing of HTTP or of the wire types: the server converts prompts in and events out.

#![deny(missing_docs)]

pub mod cache;
pub mod compute;
pub mod exec;
#[cfg(test)]
mod fixtures;
pub mod graph;
pub mod media;
pub mod models;
pub mod nodes;
pub mod preview;
pub mod queue;
pub mod roots;
pub mod shader;
pub mod tensor;
pub mod value;

pub use kiln_compute;
