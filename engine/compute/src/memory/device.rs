//! [`DeviceMemory`]: the thin interface between the memory manager and a device (the `gpu::driver` of the
//! memory-manager brief, §12).
//!
//! Everything above it (budget, VBARs, scratch, transfers, pins) talks to this trait, so the policies run in
//! CPU-only tests against [`super::SimDevice`] and on a GPU against the CUDA implementation unchanged. It
//! offers exactly what the policies need: virtual address reservations with physical pages mapped on demand
//! (CUDA's VMM), plain allocations, streams and events, asynchronous copies from host memory, and host
//! memory registration (page-locking).
//!
//! Copies read from [`HostSlice`]s, which keep their host memory alive (an `Arc`) until the device has
//! finished with them, so an asynchronous copy can never read freed memory.

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::Arc;

use super::loader::FileSource;
use crate::error::{Error, Result};

/// A device virtual address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevPtr(pub u64);

impl DevPtr {
    /// The address `bytes` further on.
    pub fn offset(self, bytes: u64) -> DevPtr {
        DevPtr(self.0 + bytes)
    }
}

/// A stream of device work, executed in order. [`StreamId::COMPUTE`] is the stream ops run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(pub u32);

impl StreamId {
    /// The stream the backend's ops run on.
    pub const COMPUTE: StreamId = StreamId(0);
}

/// A point in a stream's work, recorded by [`DeviceMemory::record`].
pub trait DeviceEvent: Send + Sync {
    /// Whether the work before the event has finished (never blocks).
    fn is_done(&self) -> Result<bool>;
    /// Blocks the calling thread until the work before the event has finished.
    fn wait(&self) -> Result<()>;
    /// For the device that recorded it, to get its own event type back.
    fn as_any(&self) -> &dyn Any;
}

/// Host memory a device can copy from: the pinned pool's buffers and the staging ring's slots.
///
/// # Safety
///
/// Devices read and register the memory through [`HostMemory::as_ptr`] and [`HostMemory::len`], by DMA and
/// asynchronously: an implementation promises that `as_ptr()` points to `len()` bytes that stay allocated and
/// readable for as long as the value lives (a [`HostSlice`] keeps it alive until its copy is done).
#[allow(unsafe_code, reason = "implementations make a promise devices rely on for DMA")]
pub unsafe trait HostMemory: Send + Sync {
    /// Length in bytes.
    fn len(&self) -> usize;

    /// Whether it is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Address of the first byte (for the driver; only read through while a copy is in flight).
    fn as_ptr(&self) -> *const u8;

    /// Copies `out.len()` bytes starting at `offset` into `out` (the simulated device's "DMA").
    fn read(&self, offset: usize, out: &mut [u8]);
}

/// A byte range of host memory, holding the memory alive.
#[derive(Clone)]
pub struct HostSlice {
    /// The memory.
    pub mem: Arc<dyn HostMemory>,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

impl std::fmt::Debug for HostSlice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostSlice({}..{})", self.offset, self.offset + self.len)
    }
}

/// What a device reports about its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemInfo {
    /// Bytes free according to the driver (all processes' allocations counted).
    pub free: u64,
    /// Bytes the device has.
    pub total: u64,
}

/// Where a backend's plain device allocations (activations, per-op scratch) come from.
///
/// By default a backend allocates from its own [`DeviceMemory::alloc`]; the memory manager routes them
/// through its VRAM arbiter instead ([`crate::Backend::set_allocator`] with the manager's
/// [`crate::memory::vram::Arbiter`]), so activations count against the budget and an allocation the device
/// refuses evicts weights first. An allocator must allocate from the device the backend computes on.
pub trait DeviceAllocator: Send + Sync + 'static {
    /// `bytes` of device memory (at least one byte is allocated), usable on [`StreamId::COMPUTE`] at once.
    /// Fails with [`crate::Error::OutOfMemory`] when there is no room.
    fn alloc(&self, bytes: u64) -> Result<DevPtr>;

    /// Frees an allocation this allocator made, ordered after the work queued on [`StreamId::COMPUTE`].
    fn free(&self, ptr: DevPtr) -> Result<()>;
}

/// Device memory, streams and transfers.
///
/// Thread-safe: the loader, the prefetcher and the compute thread call it concurrently.
pub trait DeviceMemory: Send + Sync + 'static {
    /// Free and total memory as the driver reports them.
    fn mem_info(&self) -> Result<MemInfo>;

    /// Granularity of reservations and mappings (2 MiB on an H200).
    fn granularity(&self) -> u64;

    /// Reserves `bytes` of virtual address space (a multiple of [`DeviceMemory::granularity`]); nothing is
    /// backed until [`DeviceMemory::map`].
    fn reserve(&self, bytes: u64) -> Result<DevPtr>;

    /// Releases a reservation made by [`DeviceMemory::reserve`]; every mapping in it must be gone.
    fn unreserve(&self, base: DevPtr, bytes: u64) -> Result<()>;

    /// Backs `[at, at + bytes)` inside a reservation with new physical memory, readable and writable by the
    /// device. Fails with [`crate::Error::OutOfMemory`] when the device has no room.
    fn map(&self, at: DevPtr, bytes: u64) -> Result<()>;

    /// Unmaps `[at, at + bytes)` (exactly a range given to [`DeviceMemory::map`]) and frees its memory.
    /// Work already queued that reads it must have finished (callers synchronise first).
    fn unmap(&self, at: DevPtr, bytes: u64) -> Result<()>;

    /// A plain allocation of `bytes` (activations, scratch, force-cast tiny weights).
    fn alloc(&self, bytes: u64) -> Result<DevPtr>;

    /// Frees an allocation made by [`DeviceMemory::alloc`], after the work queued on the compute stream.
    fn free(&self, ptr: DevPtr) -> Result<()>;

    /// A new stream (the offload streams).
    fn new_stream(&self) -> Result<StreamId>;

    /// Queues a copy of `src` to `dst` on `stream`. Fast (DMA, asynchronous) when `src` lies in registered
    /// memory; `src` is kept alive until the copy is done.
    fn copy_h2d(&self, dst: DevPtr, src: &HostSlice, stream: StreamId) -> Result<()>;

    /// Copies pageable host bytes to `dst`, synchronously (the counted, logged fallback).
    fn copy_h2d_pageable(&self, dst: DevPtr, src: &[u8]) -> Result<()>;

    /// Queues a device-to-device copy on `stream`.
    fn copy_d2d(&self, dst: DevPtr, src: DevPtr, bytes: u64, stream: StreamId) -> Result<()>;

    /// Copies device bytes back to the host, synchronously (after the compute stream's work).
    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<()>;

    /// Records an event at the current end of `stream`.
    fn record(&self, stream: StreamId) -> Result<Arc<dyn DeviceEvent>>;

    /// Makes `stream` wait (on the device, not the CPU) for `event`.
    fn wait_event(&self, stream: StreamId, event: &dyn DeviceEvent) -> Result<()>;

    /// Waits on the CPU for every stream of the device.
    fn synchronize(&self) -> Result<()>;

    /// Page-locks `[offset, offset + len)` of `mem` so copies from it are DMA (`cuMemHostRegister`).
    fn register(&self, mem: &Arc<dyn HostMemory>, offset: usize, len: usize) -> Result<()>;

    /// Undoes a [`DeviceMemory::register`] that started at `offset`.
    fn unregister(&self, mem: &Arc<dyn HostMemory>, offset: usize) -> Result<()>;

    /// Makes a whole weight file readable by the device where it lies, when the device reads host memory
    /// itself (the CPU): byte i of the returned range is byte i of the file, read-only, with nothing copied
    /// and nothing taken from the device's capacity. A device that must copy weights in (a GPU) returns
    /// `None`, which is the default; its weights are then copied or streamed as usual.
    fn map_file(&self, _file: &FileSource) -> Result<Option<DevPtr>> {
        Ok(None)
    }

    /// Forgets a range [`DeviceMemory::map_file`] returned (once nothing reads it any more).
    fn unmap_file(&self, at: DevPtr) -> Result<()> {
        Err(Error::driver("unmap_file", format!("this device maps no files ({:#x})", at.0)))
    }
}

/// What every [`DeviceMemory::map`] checks of `[at, at + bytes)` before backing it: a non-empty multiple of
/// `granularity`, aligned to it, inside one of `reservations` (base → length).
pub(crate) fn check_map(
    reservations: &BTreeMap<u64, u64>,
    granularity: u64,
    at: DevPtr,
    bytes: u64,
) -> Result<()> {
    if bytes == 0 || !bytes.is_multiple_of(granularity) || !at.0.is_multiple_of(granularity) {
        return Err(Error::driver("map", "range not aligned to the granularity"));
    }
    let inside = reservations.range(..=at.0).next_back().is_some_and(|(&start, &len)| {
        at.0.checked_add(bytes).is_some_and(|end| end <= start + len)
    });
    if !inside {
        return Err(Error::driver(
            "map",
            format!("{:#x}+{bytes} is outside every reservation", at.0),
        ));
    }
    Ok(())
}

/// What every [`DeviceMemory::unreserve`] checks before releasing `[base, base + bytes)`: it is exactly one of
/// `reservations` (base → length), and `has_mappings` (asked only then) says no mapping is left inside it.
pub(crate) fn check_unreserve(
    reservations: &BTreeMap<u64, u64>,
    base: DevPtr,
    bytes: u64,
    has_mappings: impl FnOnce() -> bool,
) -> Result<()> {
    if reservations.get(&base.0) != Some(&bytes) {
        return Err(Error::driver(
            "unreserve",
            format!("no reservation of {bytes} bytes at {:#x}", base.0),
        ));
    }
    if has_mappings() {
        return Err(Error::driver("unreserve", "the reservation still has mappings"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 2 << 20;

    fn reservations() -> BTreeMap<u64, u64> {
        BTreeMap::from([(16 * G, 4 * G), (32 * G, 2 * G)])
    }

    #[test]
    fn map_needs_an_aligned_range_inside_one_reservation() {
        let r = reservations();
        assert!(check_map(&r, G, DevPtr(16 * G), 4 * G).is_ok(), "a whole reservation");
        assert!(check_map(&r, G, DevPtr(19 * G), G).is_ok(), "its last page");
        assert!(check_map(&r, G, DevPtr(16 * G), 0).is_err(), "empty");
        assert!(
            check_map(&r, G, DevPtr(16 * G), G / 2).is_err(),
            "not a multiple of the granularity"
        );
        assert!(check_map(&r, G, DevPtr(16 * G + 4096), G).is_err(), "unaligned");
        assert!(check_map(&r, G, DevPtr(19 * G), 2 * G).is_err(), "runs off the reservation");
        assert!(check_map(&r, G, DevPtr(20 * G), G).is_err(), "between reservations");
        assert!(check_map(&r, G, DevPtr(8 * G), G).is_err(), "below every reservation");
        assert!(check_map(&r, G, DevPtr(32 * G), u64::MAX - G + 1).is_err(), "wraps around");
    }

    #[test]
    fn unreserve_needs_exactly_a_reservation_with_no_mappings() {
        let r = reservations();
        assert!(check_unreserve(&r, DevPtr(16 * G), 4 * G, || false).is_ok());
        assert!(check_unreserve(&r, DevPtr(16 * G), 2 * G, || false).is_err(), "part of one");
        assert!(check_unreserve(&r, DevPtr(17 * G), 3 * G, || false).is_err(), "not its base");
        let err = check_unreserve(&r, DevPtr(32 * G), 2 * G, || true).expect_err("mapped");
        assert!(err.to_string().contains("still has mappings"), "{err}");
        let mut asked = false;
        let _ = check_unreserve(&r, DevPtr(8 * G), G, || {
            asked = true;
            false
        });
        assert!(!asked, "mappings are looked for only inside a real reservation");
    }
}
