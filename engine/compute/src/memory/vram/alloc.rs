//! The activation allocator's front door (§2.3, a Kiln addition) and the scratch buffers' growth, both on the
//! [`Arbiter`]: evict what the budget says is missing, allocate, and on refusal evict the size once more and
//! retry once.
//!
//! The arbiter is also a [`DeviceAllocator`], which is how a backend's activations reach it
//! ([`crate::Backend::set_allocator`]).
//!
//! Invariant: every byte allocated or mapped here is added to the budget's usage when it succeeds and
//! subtracted when it is given back, so the budget sees activations and scratch as well as weights.

use super::arbiter::Arbiter;
use super::budget::accounted_activation_bytes;
use crate::error::{Error, Result};
use crate::memory::device::{DevPtr, DeviceAllocator};

impl Arbiter {
    /// Allocates `bytes` for activations: evicts `deficit(bytes + alloc_headroom)` first, allocates, and
    /// when the device refuses evicts `bytes + alloc_headroom` and tries once more. The allocation counts
    /// [`accounted_activation_bytes`]`(bytes)` against the budget until [`Arbiter::free`].
    pub fn alloc(&self, bytes: u64) -> Result<DevPtr> {
        let dev = self.dev.as_ref();
        let wanted = bytes.saturating_add(self.config.alloc_headroom);
        let mut st = self.lock();
        st.evict_deficit(dev, wanted)?;
        let ptr = match dev.alloc(bytes) {
            Ok(ptr) => ptr,
            Err(Error::OutOfMemory { .. }) => {
                st.evict(dev, wanted)?;
                dev.alloc(bytes)?
            }
            Err(e) => return Err(e),
        };
        let accounted = accounted_activation_bytes(bytes);
        st.budget.add(accounted);
        st.allocs.insert(ptr.0, accounted);
        Ok(ptr)
    }

    /// Frees an allocation made by [`Arbiter::alloc`] (after the work queued on the compute stream).
    pub fn free(&self, ptr: DevPtr) -> Result<()> {
        let mut st = self.lock();
        let Some(&accounted) = st.allocs.get(&ptr.0) else {
            return Err(Error::driver("vram free", format!("{:#x} was not allocated here", ptr.0)));
        };
        self.dev.free(ptr)?;
        st.allocs.remove(&ptr.0);
        st.budget.sub(accounted);
        Ok(())
    }

    /// Live activation allocations.
    pub fn allocation_count(&self) -> usize {
        self.lock().allocs.len()
    }

    /// Before a scratch buffer grows by `growth` bytes: evicts `deficit(growth)`.
    pub(super) fn prepare_growth(&self, growth: u64) -> Result<()> {
        self.lock().evict_deficit(self.dev.as_ref(), growth)
    }

    /// Maps `[at, at + bytes)` of a scratch reservation, once more after evicting `bytes` when the device
    /// refuses, and counts it.
    pub(super) fn map_chunk(&self, at: DevPtr, bytes: u64) -> Result<()> {
        let dev = self.dev.as_ref();
        let mut st = self.lock();
        match dev.map(at, bytes) {
            Ok(()) => {}
            Err(Error::OutOfMemory { .. }) => {
                st.evict(dev, bytes)?;
                dev.map(at, bytes)?;
            }
            Err(e) => return Err(e),
        }
        st.budget.add(bytes);
        Ok(())
    }

    /// Unmaps a chunk [`Arbiter::map_chunk`] mapped (the caller synchronised) and stops counting it.
    pub(super) fn unmap_chunk(&self, at: DevPtr, bytes: u64) -> Result<()> {
        let mut st = self.lock();
        self.dev.unmap(at, bytes)?;
        st.budget.sub(bytes);
        Ok(())
    }
}

/// A backend given the arbiter allocates its activations through [`Arbiter::alloc`] and [`Arbiter::free`].
impl DeviceAllocator for Arbiter {
    fn alloc(&self, bytes: u64) -> Result<DevPtr> {
        Arbiter::alloc(self, bytes)
    }

    fn free(&self, ptr: DevPtr) -> Result<()> {
        Arbiter::free(self, ptr)
    }
}
