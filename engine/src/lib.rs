//! Kiln's workflow engine.
//!
//! It will accept ComfyUI API-format prompts, validate them with ComfyUI's error types, execute them with
//! ComfyUI's caching semantics, and run models through the pinned-memory executor (see ARCHITECTURE.md).
//! The engine knows nothing of HTTP: the server converts its errors and events into wire types.
//!
//! For now it holds the one thing the server already needs: a description of the compute backend.

#![deny(missing_docs)]

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

#[cfg(test)]
mod tests {
    use super::Backend;

    #[test]
    fn cpu_backend_is_named_cpu() {
        assert_eq!(Backend::detect().name(), "cpu");
    }
}
