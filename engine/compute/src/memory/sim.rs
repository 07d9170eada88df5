//! [`SimDevice`]: device memory simulated in host RAM, with a GPU's semantics.
//!
//! It is the CPU backend's device and the fake driver the memory manager's tests run against: virtual address
//! reservations, mappings that succeed only while the simulated capacity has room, plain allocations, streams
//! whose work completes at once (so every event is already done), registration bookkeeping, and counters
//! (copies, pageable fallbacks, bytes moved, synchronisations) that tests assert on. A test can also make
//! "another process" take memory ([`SimDevice::set_external_usage`]) to exercise the budget's driver poll.
//!
//! As the CPU backend's device ([`SimDevice::reading_files_in_place`]) it also maps weight files
//! ([`DeviceMemory::map_file`]): such a range is the file's memory map (the page cache's pages), so the CPU
//! computes on weights where they lie instead of copying them into simulated device memory first, and
//! [`SimDevice::with_bytes`] hands them to a kernel without a copy.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use memmap2::Mmap;

use super::device::{
    DevPtr, DeviceEvent, DeviceMemory, HostMemory, HostSlice, MemInfo, StreamId, check_map,
    check_unreserve,
};
use super::loader::FileSource;
use crate::error::{Error, Result};

/// Granularity of the simulated device's reservations and mappings.
pub const SIM_GRANULARITY: u64 = 2 << 20;

/// Counters of what the simulated device was asked to do.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SimCounters {
    /// Asynchronous host-to-device copies.
    pub h2d_copies: u64,
    /// Bytes moved by them.
    pub h2d_bytes: u64,
    /// Of those, copies whose source was not registered (they would be slow on a GPU).
    pub h2d_unregistered: u64,
    /// Synchronous pageable copies.
    pub pageable_copies: u64,
    /// Whole-device synchronisations.
    pub syncs: u64,
    /// Ranges mapped.
    pub maps: u64,
    /// Ranges unmapped.
    pub unmaps: u64,
    /// Files mapped in place ([`DeviceMemory::map_file`]).
    pub file_maps: u64,
    /// Calls of [`SimDevice::with_bytes`] that did not lend the bytes where they lie (the range crossed
    /// regions, lay in a file the system would not map, or was not mapped at all) and read them instead.
    pub copied_reads: u64,
}

struct Region {
    len: u64,
    data: Backing,
    /// Plain allocation (from `alloc`) rather than a mapping inside a reservation.
    plain: bool,
}

/// What holds a region's bytes.
#[derive(Clone)]
enum Backing {
    /// Simulated device memory.
    Memory(Arc<RwLock<Vec<u8>>>),
    /// A file mapped in place: read-only, its byte i is the region's byte i. Read through a memory map of the
    /// file where the system gives one (the page cache's pages themselves, no copy), else by positional reads.
    File(FileSource, Option<Arc<Mmap>>),
}

#[derive(Default)]
struct State {
    /// Mapped regions and plain allocations by start address.
    regions: BTreeMap<u64, Region>,
    /// Reservations: start → length.
    reservations: BTreeMap<u64, u64>,
    /// Next free virtual address.
    next_va: u64,
    /// Physical bytes in use.
    used: u64,
    /// Registered host ranges: (memory address, offset) → length.
    registered: BTreeMap<(usize, usize), usize>,
    counters: SimCounters,
}

/// Device memory simulated in host RAM.
pub struct SimDevice {
    capacity: u64,
    /// Whether [`DeviceMemory::map_file`] maps files (the CPU backend's device) or declines (a simulated GPU).
    maps_files: bool,
    external: AtomicU64,
    streams: AtomicU32,
    state: Mutex<State>,
}

struct DoneEvent;

impl DeviceEvent for DoneEvent {
    fn is_done(&self) -> Result<bool> {
        Ok(true)
    }
    fn wait(&self) -> Result<()> {
        Ok(())
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl SimDevice {
    /// A simulated device with `capacity` bytes of memory.
    pub fn new(capacity: u64) -> SimDevice {
        SimDevice {
            capacity,
            maps_files: false,
            external: AtomicU64::new(0),
            streams: AtomicU32::new(1),
            state: Mutex::new(State { next_va: 1 << 32, ..State::default() }),
        }
    }

    /// The CPU backend's device: as [`SimDevice::new`], and it maps weight files in place
    /// ([`DeviceMemory::map_file`]), since the CPU reads host memory directly.
    pub fn reading_files_in_place(capacity: u64) -> SimDevice {
        SimDevice { maps_files: true, ..SimDevice::new(capacity) }
    }

    /// Pretends another process holds `bytes` of the device (they count against free memory).
    pub fn set_external_usage(&self, bytes: u64) {
        self.external.store(bytes, Ordering::Relaxed);
    }

    /// What the device was asked to do so far.
    pub fn counters(&self) -> SimCounters {
        self.lock().counters
    }

    /// Physical bytes mapped or allocated.
    pub fn used(&self) -> u64 {
        self.lock().used
    }

    /// Bytes of host memory currently registered.
    pub fn registered_bytes(&self) -> u64 {
        self.lock().registered.values().map(|&l| l as u64).sum()
    }

    /// Whether `[ptr, ptr + len)` is backed by device memory.
    pub fn is_mapped(&self, ptr: DevPtr, len: u64) -> bool {
        let state = self.lock();
        let mut at = ptr.0;
        let end = ptr.0 + len;
        while at < end {
            match region_at(&state, at) {
                Some((start, r)) => at = start + r.len,
                None => return false,
            }
        }
        true
    }

    /// Copies device bytes at `ptr` into `out` (what a kernel reading the memory sees).
    pub fn read(&self, ptr: DevPtr, out: &mut [u8]) -> Result<()> {
        self.visit(ptr, out.len() as u64, |at, chunk_len, data, data_off| {
            let o = (at - ptr.0) as usize;
            let out = &mut out[o..o + chunk_len];
            match data {
                Backing::Memory(data) => {
                    let guard = data.read().unwrap_or_else(|p| p.into_inner());
                    out.copy_from_slice(&guard[data_off..data_off + chunk_len]);
                    Ok(())
                }
                Backing::File(_, Some(map)) => {
                    out.copy_from_slice(&map[data_off..data_off + chunk_len]);
                    Ok(())
                }
                Backing::File(file, None) => file.read_at(data_off as u64, out),
            }
        })
    }

    /// Calls `f` with the device bytes `[ptr, ptr + len)` (what a kernel reading the memory sees): borrowed
    /// where they lie in one region held in memory or in a file's memory map, so nothing is copied; else read
    /// into a buffer first.
    ///
    /// Bytes of simulated memory are lent under the region's read lock, held until `f` returns. So `f` must
    /// not write device memory, and should not wait on other rayon tasks (a task stolen meanwhile could ask
    /// for the same lock again behind a waiting writer): borrow per task, inside the parallel loop.
    pub fn with_bytes(
        &self,
        ptr: DevPtr,
        len: usize,
        f: &mut dyn FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let lent = {
            let mut state = self.lock();
            let within = region_at(&state, ptr.0)
                .filter(|(start, r)| ptr.0 + len as u64 <= start + r.len)
                .map(|(start, r)| (r.data.clone(), (ptr.0 - start) as usize))
                .filter(|(data, _)| !matches!(data, Backing::File(_, None)));
            if within.is_none() {
                state.counters.copied_reads += 1;
            }
            within
        };
        match lent {
            Some((Backing::Memory(data), at)) => {
                let guard = data.read().unwrap_or_else(|p| p.into_inner());
                f(&guard[at..at + len])
            }
            Some((Backing::File(_, Some(map)), at)) => f(&map[at..at + len]),
            _ => {
                let mut bytes = vec![0u8; len];
                self.read(ptr, &mut bytes)?;
                f(&bytes)
            }
        }
    }

    /// Writes `bytes` to device memory at `ptr`.
    pub fn write(&self, ptr: DevPtr, bytes: &[u8]) -> Result<()> {
        self.visit(ptr, bytes.len() as u64, |at, chunk_len, data, data_off| {
            let o = (at - ptr.0) as usize;
            match data {
                Backing::Memory(data) => {
                    let mut guard = data.write().unwrap_or_else(|p| p.into_inner());
                    guard[data_off..data_off + chunk_len].copy_from_slice(&bytes[o..o + chunk_len]);
                    Ok(())
                }
                Backing::File(file, _) => Err(Error::driver(
                    "sim write",
                    format!("{at:#x} lies in {}, mapped read-only", file.path().display()),
                )),
            }
        })
    }

    /// Lets `f` write device memory `[ptr, ptr + len)` in place, where it lies in one allocation (an op that
    /// builds a weight there, without a host copy to [`SimDevice::write`]); elsewhere `f` fills a zeroed
    /// buffer that is then written. `f` may read other allocations, not the one it fills (its write lock is
    /// held).
    pub fn fill(
        &self,
        ptr: DevPtr,
        len: usize,
        f: &mut dyn FnMut(&mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let lent = {
            let state = self.lock();
            region_at(&state, ptr.0)
                .filter(|(start, r)| ptr.0 + len as u64 <= start + r.len)
                .and_then(|(start, r)| match &r.data {
                    Backing::Memory(data) => Some((data.clone(), (ptr.0 - start) as usize)),
                    Backing::File(..) => None,
                })
        };
        match lent {
            Some((data, at)) => {
                let mut guard = data.write().unwrap_or_else(|p| p.into_inner());
                f(&mut guard[at..at + len])
            }
            None => {
                let mut bytes = vec![0u8; len];
                f(&mut bytes)?;
                self.write(ptr, &bytes)
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Calls `f(address, length, region data, offset in region)` for each mapped piece of `[ptr, ptr + len)`;
    /// an unmapped byte is an error (what a GPU would report as an illegal address).
    fn visit(
        &self,
        ptr: DevPtr,
        len: u64,
        mut f: impl FnMut(u64, usize, &Backing, usize) -> Result<()>,
    ) -> Result<()> {
        let pieces: Vec<Piece> = {
            let state = self.lock();
            let mut pieces = Vec::new();
            let mut at = ptr.0;
            let end = ptr.0 + len;
            while at < end {
                let Some((start, r)) = region_at(&state, at) else {
                    return Err(Error::driver(
                        "sim access",
                        format!("address {at:#x} is not mapped"),
                    ));
                };
                let chunk = (start + r.len).min(end) - at;
                pieces.push((at, chunk as usize, r.data.clone(), (at - start) as usize));
                at += chunk;
            }
            pieces
        };
        for (at, chunk, data, off) in pieces {
            f(at, chunk, &data, off)?;
        }
        Ok(())
    }

    fn take_physical(&self, state: &mut State, bytes: u64) -> Result<()> {
        let external = self.external.load(Ordering::Relaxed);
        let free = self.capacity.saturating_sub(state.used + external);
        if bytes > free {
            return Err(Error::OutOfMemory { requested: bytes, free });
        }
        state.used += bytes;
        Ok(())
    }
}

/// A mapped piece of an access: its address, length, region data and offset in the region.
type Piece = (u64, usize, Backing, usize);

fn region_at(state: &State, at: u64) -> Option<(u64, &Region)> {
    let (&start, r) = state.regions.range(..=at).next_back()?;
    (at < start + r.len).then_some((start, r))
}

fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a) * a
}

impl DeviceMemory for SimDevice {
    fn mem_info(&self) -> Result<MemInfo> {
        let state = self.lock();
        let taken = state.used + self.external.load(Ordering::Relaxed);
        Ok(MemInfo { free: self.capacity.saturating_sub(taken), total: self.capacity })
    }

    fn granularity(&self) -> u64 {
        SIM_GRANULARITY
    }

    fn reserve(&self, bytes: u64) -> Result<DevPtr> {
        if bytes == 0 || !bytes.is_multiple_of(SIM_GRANULARITY) {
            return Err(Error::driver(
                "reserve",
                format!("{bytes} bytes is not a multiple of the granularity"),
            ));
        }
        let mut state = self.lock();
        let base = state.next_va;
        state.next_va += bytes + SIM_GRANULARITY;
        state.reservations.insert(base, bytes);
        Ok(DevPtr(base))
    }

    fn unreserve(&self, base: DevPtr, bytes: u64) -> Result<()> {
        let mut state = self.lock();
        check_unreserve(&state.reservations, base, bytes, || {
            state.regions.range(base.0..base.0 + bytes).next().is_some()
        })?;
        state.reservations.remove(&base.0);
        Ok(())
    }

    fn map(&self, at: DevPtr, bytes: u64) -> Result<()> {
        let mut state = self.lock();
        check_map(&state.reservations, SIM_GRANULARITY, at, bytes)?;
        if state.regions.range(at.0..at.0 + bytes).next().is_some()
            || region_at(&state, at.0).is_some()
        {
            return Err(Error::driver("map", format!("{:#x} is already mapped", at.0)));
        }
        self.take_physical(&mut state, bytes)?;
        let data = Backing::Memory(Arc::new(RwLock::new(vec![0u8; bytes as usize])));
        state.regions.insert(at.0, Region { len: bytes, data, plain: false });
        state.counters.maps += 1;
        Ok(())
    }

    fn unmap(&self, at: DevPtr, bytes: u64) -> Result<()> {
        let mut state = self.lock();
        match state.regions.get(&at.0) {
            Some(r) if r.len == bytes && !r.plain && matches!(r.data, Backing::Memory(_)) => {}
            _ => {
                return Err(Error::driver(
                    "unmap",
                    format!("no mapping of {bytes} bytes at {:#x}", at.0),
                ));
            }
        }
        state.regions.remove(&at.0);
        state.used -= bytes;
        state.counters.unmaps += 1;
        Ok(())
    }

    fn alloc(&self, bytes: u64) -> Result<DevPtr> {
        let len = align_up(bytes.max(1), 256);
        let mut state = self.lock();
        self.take_physical(&mut state, len)?;
        let base = state.next_va;
        state.next_va += align_up(len, SIM_GRANULARITY);
        let data = Backing::Memory(Arc::new(RwLock::new(vec![0u8; len as usize])));
        state.regions.insert(base, Region { len, data, plain: true });
        Ok(DevPtr(base))
    }

    fn free(&self, ptr: DevPtr) -> Result<()> {
        let mut state = self.lock();
        match state.regions.get(&ptr.0) {
            Some(r) if r.plain && matches!(r.data, Backing::Memory(_)) => {
                let len = r.len;
                state.regions.remove(&ptr.0);
                state.used -= len;
                Ok(())
            }
            _ => Err(Error::driver("free", format!("no allocation at {:#x}", ptr.0))),
        }
    }

    fn new_stream(&self) -> Result<StreamId> {
        Ok(StreamId(self.streams.fetch_add(1, Ordering::Relaxed)))
    }

    fn copy_h2d(&self, dst: DevPtr, src: &HostSlice, _stream: StreamId) -> Result<()> {
        let mut bytes = vec![0u8; src.len];
        src.mem.read(src.offset, &mut bytes);
        self.write(dst, &bytes)?;
        let key = (src.mem.as_ptr() as usize, 0);
        let mut state = self.lock();
        let registered = state.registered.iter().any(|(&(addr, off), &len)| {
            addr == key.0 && off <= src.offset && src.offset + src.len <= off + len
        });
        state.counters.h2d_copies += 1;
        state.counters.h2d_bytes += src.len as u64;
        if !registered {
            state.counters.h2d_unregistered += 1;
        }
        Ok(())
    }

    fn copy_h2d_pageable(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
        self.write(dst, src)?;
        self.lock().counters.pageable_copies += 1;
        Ok(())
    }

    fn copy_d2d(&self, dst: DevPtr, src: DevPtr, bytes: u64, _stream: StreamId) -> Result<()> {
        let mut buf = vec![0u8; bytes as usize];
        self.read(src, &mut buf)?;
        self.write(dst, &buf)
    }

    fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
        self.read(src, dst)
    }

    fn record(&self, _stream: StreamId) -> Result<Arc<dyn DeviceEvent>> {
        Ok(Arc::new(DoneEvent))
    }

    fn wait_event(&self, _stream: StreamId, _event: &dyn DeviceEvent) -> Result<()> {
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.lock().counters.syncs += 1;
        Ok(())
    }

    fn register(&self, mem: &Arc<dyn HostMemory>, offset: usize, len: usize) -> Result<()> {
        if offset + len > mem.len() {
            return Err(Error::Host(format!(
                "register {offset}+{len} beyond a {}-byte buffer",
                mem.len()
            )));
        }
        let mut state = self.lock();
        let addr = mem.as_ptr() as usize;
        let overlaps = state
            .registered
            .iter()
            .any(|(&(a, o), &l)| a == addr && o < offset + len && offset < o + l);
        if overlaps {
            return Err(Error::Host(format!("{offset}+{len} overlaps a registered range")));
        }
        state.registered.insert((addr, offset), len);
        Ok(())
    }

    fn unregister(&self, mem: &Arc<dyn HostMemory>, offset: usize) -> Result<()> {
        let mut state = self.lock();
        match state.registered.remove(&(mem.as_ptr() as usize, offset)) {
            Some(_) => Ok(()),
            None => Err(Error::Host(format!("no registered range starts at {offset}"))),
        }
    }

    fn map_file(&self, file: &FileSource) -> Result<Option<DevPtr>> {
        if !self.maps_files {
            return Ok(None);
        }
        let len = file.size()?.max(1);
        let map = file.map().filter(|map| map.len() as u64 == len).map(Arc::new);
        let mut state = self.lock();
        let base = state.next_va;
        state.next_va += align_up(len, SIM_GRANULARITY) + SIM_GRANULARITY;
        // The page cache holds the bytes: nothing is taken from the simulated capacity.
        let data = Backing::File(file.clone(), map);
        state.regions.insert(base, Region { len, data, plain: false });
        state.counters.file_maps += 1;
        Ok(Some(DevPtr(base)))
    }

    fn unmap_file(&self, at: DevPtr) -> Result<()> {
        let mut state = self.lock();
        match state.regions.get(&at.0) {
            Some(Region { data: Backing::File(..), .. }) => {
                state.regions.remove(&at.0);
                Ok(())
            }
            _ => Err(Error::driver("unmap_file", format!("no file is mapped at {:#x}", at.0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn mappings_take_capacity_and_give_it_back() {
        let dev = SimDevice::new(8 * MIB);
        let base = dev.reserve(64 * MIB).expect("reserve");
        dev.map(base, 4 * MIB).expect("first map fits");
        dev.map(base.offset(4 * MIB), 4 * MIB).expect("second map fits");
        let err = dev.map(base.offset(8 * MIB), 2 * MIB).expect_err("device full");
        assert!(matches!(err, Error::OutOfMemory { requested, free: 0 } if requested == 2 * MIB));
        assert_eq!(dev.mem_info().expect("info").free, 0);
        dev.unmap(base, 4 * MIB).expect("unmap");
        assert_eq!(dev.mem_info().expect("info").free, 4 * MIB);
        assert!(dev.unreserve(base, 64 * MIB).is_err(), "still has a mapping");
        dev.unmap(base.offset(4 * MIB), 4 * MIB).expect("unmap");
        dev.unreserve(base, 64 * MIB).expect("unreserve");
    }

    #[test]
    fn bytes_written_across_mappings_read_back() {
        let dev = SimDevice::new(16 * MIB);
        let base = dev.reserve(8 * MIB).expect("reserve");
        dev.map(base, 2 * MIB).expect("map");
        dev.map(base.offset(2 * MIB), 2 * MIB).expect("map");
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let at = base.offset(2 * MIB - 1000);
        dev.write(at, &data).expect("write");
        let mut back = vec![0u8; data.len()];
        dev.read(at, &mut back).expect("read");
        assert_eq!(back, data);
        assert!(dev.read(base.offset(4 * MIB), &mut back).is_err(), "unmapped memory is an error");

        // Bytes within one mapping are lent where they lie; bytes across two are copied first. Both read the
        // same, and unmapped bytes are an error either way.
        let lent = |at: DevPtr, len: usize| {
            let mut got = Vec::new();
            dev.with_bytes(at, len, &mut |bytes| {
                got = bytes.to_vec();
                Ok(())
            })
            .map(|()| got)
        };
        assert!(lent(at.offset(1000), data.len() - 1000).expect("within") == data[1000..]);
        assert_eq!(dev.counters().copied_reads, 0);
        assert!(lent(at, data.len()).expect("across") == data);
        assert_eq!(dev.counters().copied_reads, 1);
        assert!(lent(base.offset(4 * MIB), 16).is_err(), "unmapped memory is an error");
    }

    #[test]
    fn external_usage_counts_against_free_memory() {
        let dev = SimDevice::new(8 * MIB);
        dev.set_external_usage(6 * MIB);
        assert_eq!(dev.mem_info().expect("info").free, 2 * MIB);
        assert!(dev.alloc(4 * MIB).is_err());
    }
}
