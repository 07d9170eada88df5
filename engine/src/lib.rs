//! Kiln's workflow engine: it accepts ComfyUI API-format prompts, validates them with ComfyUI's error types,
//! and executes them with ComfyUI's caching semantics.
//!
//! - [`graph`]: the prompt model and validation.
//! - [`nodes`]: the node API, the registry and the built-in nodes.
//! - [`exec`]: the executor and its events.
//! - [`cache`]: cache keys and the classic, LRU, RAM-pressure and none caches.
//! - [`queue`]: the prompt queue with a persistence trait.
//!
//! The engine knows nothing of HTTP or of the wire types: the server converts prompts in and events out.
//! Models, the memory manager and the GPU backend come later (see ARCHITECTURE.md).

#![deny(missing_docs)]

pub mod cache;
pub mod exec;
pub mod graph;
pub mod nodes;
pub mod queue;
pub mod tensor;
pub mod value;

/// The compute backend the engine runs nodes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The CPU backend, always built; the reference implementation of every kernel.
    Cpu,
}

impl Backend {
    /// The backend this build uses when no GPU is available.
    pub fn detect() -> Backend {
        Backend::Cpu
    }

    /// A short name, as reported in `/api/system_stats` (`cpu`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Cpu => "cpu",
        }
    }
}
