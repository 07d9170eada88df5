//! [`CudaMemory`]: [`DeviceMemory`] on the CUDA driver API.
//!
//! - Reservations and mappings are CUDA's virtual memory management: `cuMemAddressReserve` for the address
//!   range, and per mapped range one physical allocation (`cuMemCreate`) mapped with `cuMemMap` and made
//!   readable and writable with `cuMemSetAccess`; unmapping releases it (`cuMemUnmap` + `cuMemRelease`).
//! - Plain allocations come from the device's default memory pool, stream-ordered on the compute stream
//!   (`cuMemAllocAsync` / `cuMemFreeAsync`). They are ready for the compute stream at once; another stream must
//!   first wait (an event recorded on the compute stream after the allocation), because the pool may hand out
//!   memory that compute work queued before the allocation still uses. The pool keeps freed memory for reuse
//!   (release threshold at its maximum); [`CudaMemory::trim_pool`] gives it back to the driver, which
//!   `alloc` and `map` do by themselves when the device refuses them, before trying once more, so memory the
//!   pool caches never starves an allocation or a `cuMemCreate`.
//! - Asynchronous host-to-device copies keep their [`HostSlice`] (and so the host memory) alive in a per-stream
//!   list until an event recorded after the copy reports it done; every call that queues work reaps the list.
//!
//! - Every operation at a caller's address (copies, `free`, `unmap`, and the backend's `store`) is checked first
//!   against the ranges this device mapped or allocated (`ranges::LiveRanges`); an address it did not hand out
//!   is an error the driver never sees, as on [`crate::memory::SimDevice`]. Copies queue their driver call under
//!   the same lock as the check, so no `free` or `unmap` on another thread can slip in between.
//!
//! Invariant: every driver call runs with this device's context current (`bind` first), and host slices whose
//! copies are reaped are dropped after the state lock is released (a host buffer's drop may call back in).

#![allow(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};

use super::ranges::{Kind, LiveRanges};
use crate::error::{Error, Result};
use crate::memory::device::{DeviceAllocator, check_map, check_unreserve};
use crate::memory::{DevPtr, DeviceEvent, DeviceMemory, HostMemory, HostSlice, MemInfo, StreamId};

/// The smallest plain allocation, and what sizes are rounded up to.
const ALLOC_ALIGN: u64 = 256;

/// Device memory, streams and transfers of one CUDA device.
pub struct CudaMemory {
    ctx: Arc<CudaContext>,
    ordinal: i32,
    granularity: u64,
    compute: Arc<CudaStream>,
    state: Mutex<State>,
}

struct Registration {
    ptr: usize,
    len: usize,
}

#[derive(Default)]
struct State {
    /// Streams by [`StreamId`] (index 0 is the compute stream).
    streams: Vec<Arc<CudaStream>>,
    /// Per stream: copies in flight, each with an event recorded after it and the host memory it reads.
    in_flight: Vec<VecDeque<(CudaEvent, HostSlice)>>,
    /// Reservations: base → length.
    reservations: BTreeMap<u64, u64>,
    /// Mapped ranges and plain allocations: what a caller's address is checked against.
    live: LiveRanges,
    /// Registered host ranges by (memory address, offset).
    registered: BTreeMap<(usize, usize), Registration>,
}

/// An event recorded on one of this device's streams.
struct Event {
    event: CudaEvent,
}

impl DeviceEvent for Event {
    fn is_done(&self) -> Result<bool> {
        self.event.context().bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
        self.event.try_is_complete().map_err(|e| drv("cuEventQuery", e))
    }

    fn wait(&self) -> Result<()> {
        self.event.synchronize().map_err(|e| drv("cuEventSynchronize", e))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A driver error as the crate's error.
pub(crate) fn drv(call: &'static str, e: DriverError) -> Error {
    Error::driver(call, e)
}

fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    r.result().map_err(|e| drv(call, e))
}

impl CudaMemory {
    /// The memory of the device `ctx` belongs to, with `compute` as [`StreamId::COMPUTE`].
    pub(crate) fn new(ctx: Arc<CudaContext>, compute: Arc<CudaStream>) -> Result<CudaMemory> {
        ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))?;
        let ordinal = ctx.ordinal() as i32;
        let prop = allocation_prop(ordinal);
        let mut granularity = 0usize;
        // SAFETY: `prop` describes pinned device memory on this device and `granularity` is a valid out pointer;
        // the context is current.
        let r = unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        };
        check("cuMemGetAllocationGranularity", r)?;
        // SAFETY: the device handle comes from a live context.
        let pool = unsafe { cudarc::driver::result::device::get_default_mem_pool(ctx.cu_device()) }
            .map_err(|e| drv("cuDeviceGetDefaultMemPool", e))?;
        let mut threshold = u64::MAX;
        // SAFETY: the release threshold attribute takes a u64, which `threshold` is; the pool is the device's
        // default pool, alive as long as the device.
        unsafe {
            cudarc::driver::result::mem_pool::set_attribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        }
        .map_err(|e| drv("cuMemPoolSetAttribute", e))?;
        let state = State {
            streams: vec![compute.clone()],
            in_flight: vec![VecDeque::new()],
            ..State::default()
        };
        Ok(CudaMemory {
            ctx,
            ordinal,
            granularity: granularity as u64,
            compute,
            state: Mutex::new(state),
        })
    }

    /// The compute stream.
    pub(crate) fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.compute
    }

    /// Gives the memory the pool keeps for reuse back to the driver. Waits for the compute stream first:
    /// memory freed stream-ordered counts as in use until the host has seen its free complete.
    pub fn trim_pool(&self) -> Result<()> {
        self.bind()?;
        self.sync_compute()?;
        // SAFETY: the device handle comes from a live context.
        let pool =
            unsafe { cudarc::driver::result::device::get_default_mem_pool(self.ctx.cu_device()) }
                .map_err(|e| drv("cuDeviceGetDefaultMemPool", e))?;
        // SAFETY: the pool is the device's default pool; trimming only releases memory no allocation holds.
        unsafe { cudarc::driver::result::mem_pool::trim_to(pool, 0) }
            .map_err(|e| drv("cuMemPoolTrimTo", e))
    }

    /// Copies host bytes to `dst` on the compute stream, asynchronously: `src` stays alive until the copy is done.
    pub(crate) fn upload(&self, dst: DevPtr, src: Vec<u8>) -> Result<()> {
        let len = src.len();
        let mem: Arc<dyn HostMemory> = Arc::new(OwnedHost(src));
        self.copy_h2d(dst, &HostSlice { mem, offset: 0, len }, StreamId::COMPUTE)
    }

    /// Checks that `[at, at + len)` is memory this device mapped or allocated and has not taken back; `call`
    /// names the operation in the error.
    pub(crate) fn check_live(&self, call: &'static str, at: DevPtr, len: u64) -> Result<()> {
        self.lock().live.check(call, at, len)
    }

    fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().map_err(|e| drv("cuCtxSetCurrent", e))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stream(&self, state: &State, id: StreamId) -> Result<Arc<CudaStream>> {
        state
            .streams
            .get(id.0 as usize)
            .cloned()
            .ok_or_else(|| Error::driver("stream", format!("no stream {} on this device", id.0)))
    }

    /// Takes the finished copies off every stream's list; the caller drops them after unlocking.
    fn reap(state: &mut State) -> Vec<HostSlice> {
        let mut done = Vec::new();
        for list in &mut state.in_flight {
            while let Some((event, _)) = list.front() {
                if !matches!(event.try_is_complete(), Ok(true)) {
                    break;
                }
                if let Some((_, slice)) = list.pop_front() {
                    done.push(slice);
                }
            }
        }
        done
    }

    /// `cuMemAllocAsync` of `len` bytes on the compute stream (the context is current).
    fn malloc_async(&self, len: u64) -> Result<sys::CUdeviceptr, DriverError> {
        // SAFETY: the compute stream is alive (we hold it); the returned memory is only handed out as bytes.
        unsafe { cudarc::driver::result::malloc_async(self.compute.cu_stream(), len as usize) }
    }

    /// `cuMemCreate` of `bytes` (a multiple of the granularity) of pinned memory on this device (the context
    /// is current): the handle, or the driver's answer.
    fn mem_create(&self, bytes: u64) -> Result<sys::CUmemGenericAllocationHandle, sys::CUresult> {
        let prop = allocation_prop(self.ordinal);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out pointer and `prop` describes pinned memory on this device; the size is
        // a multiple of the granularity (the caller checked).
        let r = unsafe { sys::cuMemCreate(&mut handle, bytes as usize, &prop, 0) };
        if r == sys::CUresult::CUDA_SUCCESS { Ok(handle) } else { Err(r) }
    }

    /// A synchronous copy between pageable host memory and `len` bytes of device memory at `at`, on the compute
    /// stream: waits for the stream's work (a pageable copy would wait for it anyway, and not under the lock),
    /// checks the device range and queues `copy` under the lock that `free` and `unmap` take, then waits for
    /// the copy. `call` names the operation in a refusal; an empty copy does nothing.
    fn copy_pageable(
        &self,
        call: &'static str,
        at: DevPtr,
        len: usize,
        copy: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        self.sync_compute()?;
        {
            let state = self.lock();
            state.live.check(call, at, len as u64)?;
            copy(self.compute.cu_stream())?;
        }
        self.sync_compute()
    }

    fn sync_compute(&self) -> Result<()> {
        self.compute.synchronize().map_err(|e| drv("cuStreamSynchronize", e))
    }

    fn free_bytes(&self) -> u64 {
        self.ctx.mem_get_info().map(|(free, _)| free as u64).unwrap_or(0)
    }
}

/// Host bytes owned by an in-flight upload.
struct OwnedHost(Vec<u8>);

// SAFETY: the vector's buffer is `len()` bytes at `as_ptr()` and is freed only when the value drops.
unsafe impl HostMemory for OwnedHost {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn as_ptr(&self) -> *const u8 {
        self.0.as_ptr()
    }
    fn read(&self, offset: usize, out: &mut [u8]) {
        out.copy_from_slice(&self.0[offset..offset + out.len()]);
    }
}

fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        requestedHandleTypes: sys::CUmemAllocationHandleType(0),
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: ordinal,
        },
        win32HandleMetaData: std::ptr::null_mut(),
        allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
            compressionType: 0,
            gpuDirectRDMACapable: 0,
            usage: 0,
            reserved: [0; 4],
        },
    }
}

/// The backend's default allocator: plain stream-ordered allocations, outside any budget.
impl DeviceAllocator for CudaMemory {
    fn alloc(&self, bytes: u64) -> Result<DevPtr> {
        DeviceMemory::alloc(self, bytes)
    }

    fn free(&self, ptr: DevPtr) -> Result<()> {
        DeviceMemory::free(self, ptr)
    }
}

impl DeviceMemory for CudaMemory {
    fn mem_info(&self) -> Result<MemInfo> {
        let (free, total) = self.ctx.mem_get_info().map_err(|e| drv("cuMemGetInfo", e))?;
        Ok(MemInfo { free: free as u64, total: total as u64 })
    }

    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn reserve(&self, bytes: u64) -> Result<DevPtr> {
        if bytes == 0 || !bytes.is_multiple_of(self.granularity) {
            return Err(Error::driver(
                "reserve",
                format!("{bytes} bytes is not a multiple of the granularity"),
            ));
        }
        self.bind()?;
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: `base` is a valid out pointer; a fresh reservation (no fixed address) of a granularity multiple
        // touches no existing memory.
        let r = unsafe { sys::cuMemAddressReserve(&mut base, bytes as usize, 0, 0, 0) };
        check("cuMemAddressReserve", r)?;
        self.lock().reservations.insert(base, bytes);
        Ok(DevPtr(base))
    }

    fn unreserve(&self, base: DevPtr, bytes: u64) -> Result<()> {
        let mut state = self.lock();
        check_unreserve(&state.reservations, base, bytes, || state.live.overlaps(base, bytes))?;
        self.bind()?;
        // SAFETY: the range is exactly a reservation this device made, and no mapping is left inside it.
        check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(base.0, bytes as usize) })?;
        state.reservations.remove(&base.0);
        Ok(())
    }

    fn map(&self, at: DevPtr, bytes: u64) -> Result<()> {
        let mut state = self.lock();
        check_map(&state.reservations, self.granularity, at, bytes)?;
        if state.live.overlaps(at, bytes) {
            return Err(Error::driver("map", format!("{:#x} is already mapped", at.0)));
        }
        self.bind()?;
        let created = match self.mem_create(bytes) {
            Err(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
                // Memory the stream-ordered pool caches is invisible to cuMemCreate: give it back, retry once.
                self.trim_pool()?;
                self.mem_create(bytes)
            }
            other => other,
        };
        let handle = match created {
            Ok(handle) => handle,
            Err(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) => {
                return Err(Error::OutOfMemory { requested: bytes, free: self.free_bytes() });
            }
            Err(r) => return Err(drv("cuMemCreate", DriverError(r))),
        };
        // SAFETY: [at, at + bytes) lies inside a reservation of this device and no mapping overlaps it (checked
        // above under the lock); the handle is a fresh allocation of exactly `bytes`.
        let r = unsafe { sys::cuMemMap(at.0, bytes as usize, 0, handle, 0) };
        if let Err(e) = r.result() {
            // SAFETY: the handle was created above and is mapped nowhere.
            unsafe { sys::cuMemRelease(handle) };
            return Err(drv("cuMemMap", e));
        }
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; `desc` is one valid access descriptor.
        let r = unsafe { sys::cuMemSetAccess(at.0, bytes as usize, &desc, 1) };
        if let Err(e) = r.result() {
            // SAFETY: the range was mapped above with this handle and nothing has used it yet.
            unsafe {
                sys::cuMemUnmap(at.0, bytes as usize);
                sys::cuMemRelease(handle);
            }
            return Err(drv("cuMemSetAccess", e));
        }
        state.live.insert(at, bytes, Kind::Mapped(handle));
        Ok(())
    }

    fn unmap(&self, at: DevPtr, bytes: u64) -> Result<()> {
        let mut state = self.lock();
        let handle = state.live.remove_mapping(at, bytes)?;
        let unmapped = self.bind().and_then(|()| {
            // SAFETY: the range is exactly one mapping made by `map` (just taken out of the live ranges); the
            // caller promises no queued work still reads it (the trait's contract).
            check("cuMemUnmap", unsafe { sys::cuMemUnmap(at.0, bytes as usize) })
        });
        if let Err(e) = unmapped {
            // Still mapped: keep it live, so that it can be unmapped again and is released on drop.
            state.live.insert(at, bytes, Kind::Mapped(handle));
            return Err(e);
        }
        // SAFETY: the handle's only mapping was just removed.
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr> {
        let len = bytes.max(1).div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN;
        self.bind()?;
        let ptr = match self.malloc_async(len) {
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                // The pool may hold freed memory in a form this request cannot use: give it back, retry once.
                self.trim_pool()?;
                self.malloc_async(len)
            }
            other => other,
        };
        let ptr = match ptr {
            Ok(ptr) => ptr,
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                return Err(Error::OutOfMemory { requested: len, free: self.free_bytes() });
            }
            Err(e) => return Err(drv("cuMemAllocAsync", e)),
        };
        self.lock().live.insert(DevPtr(ptr), len, Kind::Plain);
        Ok(DevPtr(ptr))
    }

    fn free(&self, ptr: DevPtr) -> Result<()> {
        self.lock().live.remove_plain(ptr)?;
        self.bind()?;
        // SAFETY: the pointer came from `alloc` and was taken out of the live ranges, so it is freed once; the free
        // is ordered after the work queued on the compute stream, which is where the memory is used.
        unsafe { cudarc::driver::result::free_async(ptr.0, self.compute.cu_stream()) }
            .map_err(|e| drv("cuMemFreeAsync", e))
    }

    fn new_stream(&self) -> Result<StreamId> {
        let stream = self.ctx.new_stream().map_err(|e| drv("cuStreamCreate", e))?;
        // A new stream starts after the compute stream's current work, so memory the pool hands out is safe on it.
        stream.join(&self.compute).map_err(|e| drv("cuStreamWaitEvent", e))?;
        let mut state = self.lock();
        state.streams.push(stream);
        state.in_flight.push(VecDeque::new());
        Ok(StreamId((state.streams.len() - 1) as u32))
    }

    fn copy_h2d(&self, dst: DevPtr, src: &HostSlice, stream: StreamId) -> Result<()> {
        let end = src.offset.checked_add(src.len).filter(|&e| e <= src.mem.len());
        if end.is_none() {
            return Err(Error::Host(format!(
                "copy of {}+{} from a {}-byte buffer",
                src.offset,
                src.len,
                src.mem.len()
            )));
        }
        if src.len == 0 {
            return Ok(());
        }
        self.bind()?;
        let done;
        {
            let mut state = self.lock();
            state.live.check("copy_h2d", dst, src.len as u64)?;
            let s = self.stream(&state, stream)?;
            // SAFETY: offset + len ≤ the memory's length (checked above), so the pointer stays inside it.
            let host = unsafe { src.mem.as_ptr().add(src.offset) };
            // SAFETY: `host` points at `len` readable bytes that stay alive until the event recorded next reports
            // the copy done (the slice is kept in `in_flight` until then); `dst` is `len` bytes of live device
            // memory (checked above, under the lock that `free` and `unmap` take).
            let r =
                unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, host.cast(), src.len, s.cu_stream()) };
            check("cuMemcpyHtoDAsync", r)?;
            let event = match s.record_event(None) {
                Ok(event) => event,
                Err(e) => {
                    // The copy is queued but no event can say when it is done, and the caller may drop `src` as
                    // soon as this returns: wait for the copy here.
                    if let Err(sync) = s.synchronize() {
                        // Not even that: keep the host memory alive for good rather than free it under the DMA.
                        tracing::error!(error = %sync, bytes = src.len, "copy_h2d: cannot wait for a queued copy; its host memory is leaked");
                        std::mem::forget(src.clone());
                    }
                    return Err(drv("cuEventRecord", e));
                }
            };
            state.in_flight[stream.0 as usize].push_back((event, src.clone()));
            done = Self::reap(&mut state);
        }
        drop(done);
        Ok(())
    }

    fn copy_h2d_pageable(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.copy_pageable("copy_h2d_pageable", dst, src.len(), |stream| {
            // SAFETY: `src` is borrowed for this whole call and `copy_pageable` waits for the copy before
            // returning, so the driver has finished reading it; `dst` holds `src.len()` bytes of live device
            // memory (`copy_pageable` checked it), ordered on the compute stream after its `alloc`.
            let r =
                unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, src.as_ptr().cast(), src.len(), stream) };
            check("cuMemcpyHtoDAsync", r)
        })
    }

    fn copy_d2d(&self, dst: DevPtr, src: DevPtr, bytes: u64, stream: StreamId) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        let state = self.lock();
        state.live.check("copy_d2d", src, bytes)?;
        state.live.check("copy_d2d", dst, bytes)?;
        let s = self.stream(&state, stream)?;
        // SAFETY: both ranges are `bytes` of live device memory (checked above, under the lock that `free` and
        // `unmap` take); the caller orders the copy after their writers and before their release.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes as usize, s.cu_stream())
        })
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        self.copy_pageable("copy_d2h", src, dst.len(), |stream| {
            // SAFETY: `dst` is borrowed mutably for this whole call and `copy_pageable` waits for the copy before
            // returning, so the driver has finished writing it; `src` holds `dst.len()` bytes of live device
            // memory (`copy_pageable` checked it).
            let r = unsafe {
                sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src.0, dst.len(), stream)
            };
            check("cuMemcpyDtoHAsync", r)
        })
    }

    fn record(&self, stream: StreamId) -> Result<Arc<dyn DeviceEvent>> {
        let done;
        let event = {
            let mut state = self.lock();
            let s = self.stream(&state, stream)?;
            let event = s.record_event(None).map_err(|e| drv("cuEventRecord", e))?;
            done = Self::reap(&mut state);
            event
        };
        drop(done);
        Ok(Arc::new(Event { event }))
    }

    fn wait_event(&self, stream: StreamId, event: &dyn DeviceEvent) -> Result<()> {
        let Some(event) = event.as_any().downcast_ref::<Event>() else {
            return Err(Error::driver(
                "wait_event",
                "the event was not recorded by this CUDA device",
            ));
        };
        let s = self.stream(&self.lock(), stream)?;
        s.wait(&event.event).map_err(|e| drv("cuStreamWaitEvent", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.ctx.synchronize().map_err(|e| drv("cuCtxSynchronize", e))?;
        let done: Vec<_> = {
            let mut state = self.lock();
            state.in_flight.iter_mut().flat_map(|l| l.drain(..)).collect()
        };
        drop(done);
        Ok(())
    }

    fn register(&self, mem: &Arc<dyn HostMemory>, offset: usize, len: usize) -> Result<()> {
        if len == 0 || offset.checked_add(len).is_none_or(|end| end > mem.len()) {
            return Err(Error::Host(format!(
                "register {offset}+{len} of a {}-byte buffer",
                mem.len()
            )));
        }
        let addr = mem.as_ptr() as usize;
        let mut state = self.lock();
        let overlaps = state
            .registered
            .iter()
            .any(|(&(a, o), r)| a == addr && o < offset + len && offset < o + r.len);
        if overlaps {
            return Err(Error::Host(format!("{offset}+{len} overlaps a registered range")));
        }
        self.bind()?;
        // SAFETY: offset + len ≤ the memory's length (checked above).
        let ptr = unsafe { mem.as_ptr().add(offset) };
        // SAFETY: [ptr, ptr + len) is host memory the caller keeps alive while registered (it unregisters before
        // freeing); no registered range overlaps it (checked above under the lock).
        let r = unsafe {
            sys::cuMemHostRegister_v2(ptr as *mut _, len, sys::CU_MEMHOSTREGISTER_PORTABLE)
        };
        r.result().map_err(|e| Error::Host(format!("cuMemHostRegister of {len} bytes: {e}")))?;
        state.registered.insert((addr, offset), Registration { ptr: ptr as usize, len });
        Ok(())
    }

    fn unregister(&self, mem: &Arc<dyn HostMemory>, offset: usize) -> Result<()> {
        let mut state = self.lock();
        let key = (mem.as_ptr() as usize, offset);
        let Some(reg) = state.registered.get(&key) else {
            return Err(Error::Host(format!("no registered range starts at {offset}")));
        };
        self.bind()?;
        // SAFETY: the pointer is exactly the start of a range this device registered.
        let r = unsafe { sys::cuMemHostUnregister(reg.ptr as *mut _) };
        r.result().map_err(|e| Error::Host(format!("cuMemHostUnregister: {e}")))?;
        state.registered.remove(&key);
        Ok(())
    }
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        // Best effort: wait for the device, then give back what is still mapped, reserved or registered.
        if self.ctx.bind_to_thread().is_err() || self.ctx.synchronize().is_err() {
            return;
        }
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (at, len, handle) in state.live.mappings() {
            // SAFETY: the device is idle and each range is a live mapping with its handle.
            unsafe {
                sys::cuMemUnmap(at, len as usize);
                sys::cuMemRelease(handle);
            }
        }
        for (&base, &len) in &state.reservations {
            // SAFETY: the device is idle and the reservation's mappings were removed above.
            unsafe { sys::cuMemAddressFree(base, len as usize) };
        }
        for r in state.registered.values() {
            // SAFETY: the pointer starts a range this device registered; the device is idle.
            unsafe { sys::cuMemHostUnregister(r.ptr as *mut _) };
        }
        for ptr in state.live.plains() {
            // SAFETY: the pointer came from `alloc` and was never freed; the device is idle.
            unsafe { sys::cuMemFreeAsync(ptr, self.compute.cu_stream()) };
        }
        state.in_flight.clear();
    }
}
