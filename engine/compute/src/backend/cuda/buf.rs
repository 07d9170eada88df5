//! Device allocations owned by the backend: tensor buffers and per-op scratch, freed stream-ordered on drop.
//!
//! Each allocation remembers the [`DeviceAllocator`] it came from (the device memory itself, or the memory
//! manager's VRAM arbiter once [`crate::Backend::set_allocator`] was called) and is freed there, so changing
//! the allocator never sends a pointer to an allocator that did not make it.

use std::sync::Arc;

use crate::error::Result;
use crate::memory::DevPtr;
use crate::memory::device::DeviceAllocator;

/// A plain device allocation, freed when dropped. The free is ordered after the work queued on the compute
/// stream, so dropping a buffer that queued kernels still read is safe.
pub(crate) struct Allocation {
    ptr: DevPtr,
    bytes: u64,
    allocator: Arc<dyn DeviceAllocator>,
}

impl Allocation {
    /// `bytes` (at least 1) from `allocator`.
    pub(crate) fn new(allocator: &Arc<dyn DeviceAllocator>, bytes: u64) -> Result<Allocation> {
        let ptr = allocator.alloc(bytes)?;
        Ok(Allocation { ptr, bytes, allocator: allocator.clone() })
    }

    /// Device address of the first byte.
    pub(crate) fn ptr(&self) -> DevPtr {
        self.ptr
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if let Err(e) = self.allocator.free(self.ptr) {
            tracing::warn!(error = %e, bytes = self.bytes, "freeing a CUDA buffer failed");
        }
    }
}

/// A tensor's storage on the CUDA backend (cheap to clone; the last clone frees it).
#[derive(Clone)]
pub struct CudaBuf(Arc<Allocation>);

impl CudaBuf {
    pub(crate) fn new(alloc: Allocation) -> CudaBuf {
        CudaBuf(Arc::new(alloc))
    }

    /// Device address of the first element.
    pub fn ptr(&self) -> DevPtr {
        self.0.ptr
    }

    /// Size of the allocation in bytes.
    pub fn bytes(&self) -> u64 {
        self.0.bytes
    }
}
