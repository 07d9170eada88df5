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
use std::sync::Arc;

use crate::error::Result;

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
}
