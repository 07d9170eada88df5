//! The CPU backend: f32 compute, GEMM with the `gemm` crate, rayon for the rest; device memory simulated by
//! [`SimDevice`].

use std::sync::Arc;

use crate::memory::{DeviceMemory, SimDevice};

/// The CPU backend.
pub struct Cpu {
    sim: Arc<SimDevice>,
    memory: Arc<dyn DeviceMemory>,
}

impl Cpu {
    /// A CPU backend whose simulated device memory holds `capacity` bytes.
    pub fn new(capacity: u64) -> Cpu {
        let sim = Arc::new(SimDevice::new(capacity));
        let memory: Arc<dyn DeviceMemory> = sim.clone();
        Cpu { sim, memory }
    }

    /// The simulated device memory (for tests that inspect it).
    pub fn sim(&self) -> &Arc<SimDevice> {
        &self.sim
    }
}
