//! [`Scratch`]: one offload stream's scratch (cast) buffer (§2.4), where weights that are not resident are
//! copied for each use.
//!
//! It reserves [`super::VramConfig::scratch_va`] of address space once and backs it with physical memory in
//! [`super::VramConfig::scratch_chunk`] pieces as uses need more, each growth first evicting the budget's
//! `deficit(growth)` through the [`Arbiter`]. Uses take bump slices ([`Scratch::take`]); [`Scratch::reset`]
//! starts over at offset zero and keeps the physical memory (upstream stopped shrinking cast buffers in
//! #14372).
//!
//! Invariant: the physical memory is `[base, base + mapped)`, counted by the arbiter, and every slice handed
//! out lies inside it. Reusing a slice after a reset is safe only in stream order: the offload stream waits
//! on the compute stream before it writes again (§4.4), which the caster arranges.

use std::sync::Arc;

use super::arbiter::Arbiter;
use crate::error::{Error, Result};
use crate::memory::device::{DevPtr, StreamId};

/// Alignment of each slice [`Scratch::take`] hands out (ComfyUI's slot alignment).
pub const SCRATCH_ALIGN: u64 = 1024;

/// One offload stream's growable scratch buffer.
pub struct Scratch {
    arbiter: Arc<Arbiter>,
    stream: StreamId,
    base: DevPtr,
    reserved: u64,
    chunk: u64,
    /// Sizes of the mapped chunks, in address order from `base`.
    chunks: Vec<u64>,
    mapped: u64,
    used: u64,
}

impl Scratch {
    /// A scratch buffer for `stream`: reserves the configured address space (rounded up to the device's
    /// granularity); nothing is mapped yet.
    pub fn new(arbiter: Arc<Arbiter>, stream: StreamId) -> Result<Scratch> {
        let granularity = arbiter.device().granularity();
        let reserved = arbiter.config().scratch_va.div_ceil(granularity) * granularity;
        let chunk = arbiter.config().scratch_chunk;
        let base = arbiter.device().reserve(reserved)?;
        Ok(Scratch {
            arbiter,
            stream,
            base,
            reserved,
            chunk,
            chunks: Vec::new(),
            mapped: 0,
            used: 0,
        })
    }

    /// The offload stream it serves.
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// First address of the buffer.
    pub fn base(&self) -> DevPtr {
        self.base
    }

    /// Bytes of address space reserved (the most it can grow to).
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Bytes of physical memory behind it.
    pub fn mapped(&self) -> u64 {
        self.mapped
    }

    /// Bytes handed out since the last reset (the bump offset).
    pub fn used(&self) -> u64 {
        self.used
    }

    /// A slice of `bytes` after the ones already taken (aligned to [`SCRATCH_ALIGN`]), growing the buffer
    /// as needed. Fails with [`Error::OutOfMemory`] beyond the reservation or when the device has no room.
    pub fn take(&mut self, bytes: u64) -> Result<DevPtr> {
        let start = self.used.next_multiple_of(SCRATCH_ALIGN);
        let end =
            start.checked_add(bytes).filter(|&e| e <= self.reserved).ok_or(Error::OutOfMemory {
                requested: bytes,
                free: self.reserved.saturating_sub(start),
            })?;
        self.grow(end)?;
        self.used = end;
        Ok(self.base.offset(start))
    }

    /// Makes sure at least `required` bytes are backed: rounds up to whole chunks (at most the
    /// reservation), evicts the budget's deficit for the growth, then maps chunk by chunk.
    pub fn grow(&mut self, required: u64) -> Result<()> {
        if required <= self.mapped {
            return Ok(());
        }
        if required > self.reserved {
            return Err(Error::OutOfMemory {
                requested: required - self.mapped,
                free: self.reserved - self.mapped,
            });
        }
        let target = required.next_multiple_of(self.chunk).min(self.reserved);
        self.arbiter.prepare_growth(target - self.mapped)?;
        while self.mapped < target {
            let n = self.chunk.min(target - self.mapped);
            self.arbiter.map_chunk(self.base.offset(self.mapped), n)?;
            self.chunks.push(n);
            self.mapped += n;
        }
        tracing::trace!(stream = self.stream.0, mapped = self.mapped, "scratch grew");
        Ok(())
    }

    /// Starts handing out slices from the beginning again; the memory stays mapped (per use and per node).
    pub fn reset(&mut self) {
        self.used = 0;
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let dev = self.arbiter.device().clone();
        if self.mapped > 0
            && let Err(e) = dev.synchronize()
        {
            tracing::warn!(error = %e, "scratch drop: synchronize failed");
        }
        let mut at = 0;
        for &n in &self.chunks {
            if let Err(e) = self.arbiter.unmap_chunk(self.base.offset(at), n) {
                tracing::warn!(error = %e, "scratch drop: unmap failed");
            }
            at += n;
        }
        if let Err(e) = dev.unreserve(self.base, self.reserved) {
            tracing::warn!(error = %e, "scratch drop: unreserve failed");
        }
    }
}
