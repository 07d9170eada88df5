//! Disk to device: the per-device staging ring (memory-manager.md §4.3) and the windowed pin-on-the-way path
//! (§4.2).
//!
//! The ring is three 64 MiB slots of one registered [`HostBuffer`], allocated as they are first used. A copy
//! appends to the active slot: the reader threads fill it from the file and an asynchronous copy takes it to
//! the device. The ring rotates to the next slot when the stream changes, or when the active slot already
//! holds at least the 48 MiB lead-in and the request would overflow it; a smaller fill is topped up first.
//! On rotation it records one event on the retired slot's stream, and before reusing a slot the CPU waits
//! on that slot's event only, the copy from three rotations ago: never on a stream, never on compute
//! (target T11).
//!
//! The invariant: a slot's bytes are rewritten only after the event recorded behind its last copy is done.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::{Error, Result};
use crate::memory::device::{DevPtr, DeviceEvent, DeviceMemory, StreamId};
use crate::memory::host::{HostBuffer, HostBufferConfig};
use crate::memory::loader::FileSource;

const MIB: usize = 1 << 20;

/// The staging ring's and the pin-on-the-way path's sizes (`io.*` in memory-manager.md §10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingConfig {
    /// Slots in the ring.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_bytes: usize,
    /// Fill from which a request that would overflow the slot starts in the next one instead.
    pub lead_in: usize,
    /// Window of the pin-on-the-way path.
    pub pin_window: usize,
    /// Drop what is read from the page cache.
    pub mark_cold: bool,
}

impl Default for RingConfig {
    fn default() -> RingConfig {
        RingConfig {
            slots: 3,
            slot_bytes: 64 * MIB,
            lead_in: 48 * MIB,
            pin_window: 64 * MIB,
            mark_cold: true,
        }
    }
}

struct Slot {
    /// Bytes appended since the slot was last taken.
    fill: usize,
    /// The stream its copies went to.
    stream: StreamId,
    /// Recorded behind its copies when it was retired; waited on before it is refilled.
    event: Option<Arc<dyn DeviceEvent>>,
}

struct RingState {
    /// Slots allocated (and registered) so far.
    slots: Vec<Slot>,
    active: Option<usize>,
}

/// One device's staging ring: copies file bytes to device memory through registered host slots.
pub struct StagingRing {
    device: Arc<dyn DeviceMemory>,
    config: RingConfig,
    buf: Arc<HostBuffer>,
    state: Mutex<RingState>,
}

impl std::fmt::Debug for StagingRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StagingRing").field("config", &self.config).field("buf", &self.buf).finish()
    }
}

impl StagingRing {
    /// A ring for `device`; no memory is taken until the first copy.
    pub fn new(device: Arc<dyn DeviceMemory>, config: RingConfig) -> Result<StagingRing> {
        if config.slots == 0 || config.slot_bytes == 0 {
            return Err(Error::Host(format!("a staging ring needs slots, not {config:?}")));
        }
        // The next slot is prewarmed while the current one is in use.
        let host =
            HostBufferConfig { prewarm: config.slot_bytes, register_chunk: config.slot_bytes };
        let buf = HostBuffer::new(config.slots * config.slot_bytes, host);
        Ok(StagingRing {
            device,
            config,
            buf,
            state: Mutex::new(RingState { slots: Vec::new(), active: None }),
        })
    }

    /// The ring's sizes.
    pub fn config(&self) -> &RingConfig {
        &self.config
    }

    /// Host bytes the ring holds registered (one slot per slot used so far).
    pub fn registered_bytes(&self) -> usize {
        self.buf.registered_bytes()
    }

    /// Copies `len` bytes of `source` at `offset` to `dst` on `stream`: the reader threads fill ring slots
    /// and each filled piece is queued as an asynchronous copy. Returns once every copy is queued; the CPU
    /// waits only when a slot it reuses still has a copy in flight.
    pub fn copy_file(
        &self,
        source: &FileSource,
        offset: u64,
        len: u64,
        dst: DevPtr,
        stream: StreamId,
    ) -> Result<()> {
        let mut state = self.lock();
        let (mut offset, mut dst) = (offset, dst);
        let mut left =
            usize::try_from(len).map_err(|_| Error::Host(format!("a {len}-byte copy")))?;
        while left > 0 {
            let slot_bytes = self.config.slot_bytes;
            let rotate = match state.active {
                None => true,
                Some(i) => {
                    let s = &state.slots[i];
                    // A retired slot (its event recorded) takes no more copies, even if a rotation failed.
                    s.event.is_some()
                        || s.stream != stream
                        || s.fill == slot_bytes
                        || (s.fill + left > slot_bytes && s.fill >= self.config.lead_in)
                }
            };
            let index =
                if rotate { self.rotate(&mut state, stream)? } else { state.active.unwrap_or(0) };
            let fill = state.slots[index].fill;
            let chunk = left.min(slot_bytes - fill);
            let at = index * slot_bytes + fill;
            source.read_into(offset, self.buf.claim(at, chunk)?, self.config.mark_cold)?;
            self.buf.copy_h2d(self.device.as_ref(), at, chunk, dst, stream)?;
            state.slots[index].fill += chunk;
            offset += chunk as u64;
            dst = dst.offset(chunk as u64);
            left -= chunk;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Retires the active slot (an event behind its copies) and readies the next for `stream`, waiting for
    /// that slot's own event if it was used before. Returns the new active slot.
    ///
    /// On an error the active slot stays as it was (retired if its event was recorded), so the next copy
    /// retries the same rotation.
    fn rotate(&self, state: &mut RingState, stream: StreamId) -> Result<usize> {
        if let Some(i) = state.active {
            let slot = &mut state.slots[i];
            if slot.fill > 0 && slot.event.is_none() {
                slot.event = Some(self.device.record(slot.stream)?);
            }
        }
        let next = state.active.map_or(0, |i| (i + 1) % self.config.slots);
        if next == state.slots.len() {
            self.allocate_slot(next)?;
            state.slots.push(Slot { fill: 0, stream, event: None });
        }
        let slot = &mut state.slots[next];
        if let Some(event) = &slot.event {
            event.wait()?;
            slot.event = None;
        }
        slot.fill = 0;
        slot.stream = stream;
        state.active = Some(next);
        Ok(next)
    }

    /// Grows the ring's buffer over slot `index` and registers the slot.
    fn allocate_slot(&self, index: usize) -> Result<()> {
        let slot_bytes = self.config.slot_bytes;
        self.buf.grow((index + 1) * slot_bytes)?;
        self.buf.register(&self.device, index * slot_bytes, slot_bytes)
    }
}

/// A range of a pinned buffer that a windowed read fills.
#[derive(Debug, Clone, Copy)]
pub struct PinRange<'a> {
    /// The buffer.
    pub buf: &'a Arc<HostBuffer>,
    /// First byte.
    pub offset: usize,
    /// Length in bytes.
    pub len: usize,
}

/// Pin on the way (memory-manager.md §4.2): reads `pin.len` bytes of `source` at `file_offset` into the pin,
/// one `config.pin_window` window at a time, and queues each window's copy to `dst` on `stream` as soon as it
/// is read, so the next window's disk read overlaps this window's copy. The pin should be registered; the
/// bytes stay in it afterwards (the weight's RAM copy).
pub fn read_through_pin(
    device: &dyn DeviceMemory,
    source: &FileSource,
    file_offset: u64,
    pin: PinRange<'_>,
    dst: DevPtr,
    stream: StreamId,
    config: &RingConfig,
) -> Result<()> {
    let window = config.pin_window.max(1);
    let mut done = 0;
    while done < pin.len {
        let n = window.min(pin.len - done);
        let at = pin.offset + done;
        source.read_into(file_offset + done as u64, pin.buf.claim(at, n)?, config.mark_cold)?;
        pin.buf.copy_h2d(device, at, n, dst.offset(done as u64), stream)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::memory::device::{HostMemory, HostSlice, MemInfo};
    use crate::memory::loader::tests::{TempFile, noise};
    use crate::memory::sim::SimDevice;

    const K: usize = 1 << 10;

    /// What the ring asked of the device, in order.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Call {
        Copy { src: usize, len: usize, stream: u32 },
        Record { event: usize, stream: u32 },
        Wait { event: usize },
    }

    /// A [`SimDevice`] that logs copies, event records and CPU waits on events.
    struct Recorder {
        sim: Arc<SimDevice>,
        log: Arc<Mutex<Vec<Call>>>,
        events: AtomicUsize,
    }

    struct Event {
        id: usize,
        log: Arc<Mutex<Vec<Call>>>,
    }

    impl DeviceEvent for Event {
        fn is_done(&self) -> Result<bool> {
            Ok(true)
        }
        fn wait(&self) -> Result<()> {
            self.log.lock().expect("log").push(Call::Wait { event: self.id });
            Ok(())
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    impl DeviceMemory for Recorder {
        fn mem_info(&self) -> Result<MemInfo> {
            self.sim.mem_info()
        }
        fn granularity(&self) -> u64 {
            self.sim.granularity()
        }
        fn reserve(&self, bytes: u64) -> Result<DevPtr> {
            self.sim.reserve(bytes)
        }
        fn unreserve(&self, base: DevPtr, bytes: u64) -> Result<()> {
            self.sim.unreserve(base, bytes)
        }
        fn map(&self, at: DevPtr, bytes: u64) -> Result<()> {
            self.sim.map(at, bytes)
        }
        fn unmap(&self, at: DevPtr, bytes: u64) -> Result<()> {
            self.sim.unmap(at, bytes)
        }
        fn alloc(&self, bytes: u64) -> Result<DevPtr> {
            self.sim.alloc(bytes)
        }
        fn free(&self, ptr: DevPtr) -> Result<()> {
            self.sim.free(ptr)
        }
        fn new_stream(&self) -> Result<StreamId> {
            self.sim.new_stream()
        }
        fn copy_h2d(&self, dst: DevPtr, src: &HostSlice, stream: StreamId) -> Result<()> {
            self.log.lock().expect("log").push(Call::Copy {
                src: src.offset,
                len: src.len,
                stream: stream.0,
            });
            self.sim.copy_h2d(dst, src, stream)
        }
        fn copy_h2d_pageable(&self, dst: DevPtr, src: &[u8]) -> Result<()> {
            self.sim.copy_h2d_pageable(dst, src)
        }
        fn copy_d2d(&self, dst: DevPtr, src: DevPtr, bytes: u64, stream: StreamId) -> Result<()> {
            self.sim.copy_d2d(dst, src, bytes, stream)
        }
        fn copy_d2h(&self, dst: &mut [u8], src: DevPtr) -> Result<()> {
            self.sim.copy_d2h(dst, src)
        }
        fn record(&self, stream: StreamId) -> Result<Arc<dyn DeviceEvent>> {
            let id = self.events.fetch_add(1, Ordering::Relaxed);
            self.log.lock().expect("log").push(Call::Record { event: id, stream: stream.0 });
            Ok(Arc::new(Event { id, log: self.log.clone() }))
        }
        fn wait_event(&self, stream: StreamId, event: &dyn DeviceEvent) -> Result<()> {
            self.sim.wait_event(stream, event)
        }
        fn synchronize(&self) -> Result<()> {
            self.sim.synchronize()
        }
        fn register(&self, mem: &Arc<dyn HostMemory>, offset: usize, len: usize) -> Result<()> {
            self.sim.register(mem, offset, len)
        }
        fn unregister(&self, mem: &Arc<dyn HostMemory>, offset: usize) -> Result<()> {
            self.sim.unregister(mem, offset)
        }
    }

    fn recorder() -> (Arc<SimDevice>, Arc<Recorder>) {
        let sim = Arc::new(SimDevice::new(64 << 20));
        let rec = Arc::new(Recorder {
            sim: sim.clone(),
            log: Arc::default(),
            events: AtomicUsize::new(0),
        });
        (sim, rec)
    }

    fn file_of(bytes: &[u8], tag: &str) -> (TempFile, FileSource) {
        let file = TempFile::new(tag);
        std::fs::write(&file.0, bytes).expect("write");
        let source = FileSource::open(&file.0).expect("open");
        (file, source)
    }

    #[test]
    fn the_ring_appends_rotates_and_waits_only_on_the_reused_slots_event() {
        let (sim, rec) = recorder();
        let device: Arc<dyn DeviceMemory> = rec.clone();
        let config = RingConfig {
            slots: 3,
            slot_bytes: 1024 * K,
            lead_in: 768 * K,
            pin_window: 256 * K,
            mark_cold: true,
        };
        let ring = StagingRing::new(device.clone(), config).expect("ring");
        let (s1, s2) = (device.new_stream().expect("stream"), device.new_stream().expect("stream"));
        let requests = [
            (600 * K, s1),
            (300 * K, s1),
            (200 * K, s1),
            (100 * K, s2),
            (2560 * K, s2),
            (100 * K, s2),
            (500 * K, s2),
        ];
        let total: usize = requests.iter().map(|r| r.0).sum();
        let bytes = noise(total, 42);
        let (_file, source) = file_of(&bytes, "ring.bin");
        let dst = sim.alloc(total as u64).expect("alloc");
        let mut offset = 0;
        for (len, stream) in requests {
            ring.copy_file(&source, offset as u64, len as u64, dst.offset(offset as u64), stream)
                .expect("copy");
            offset += len;
        }

        let (a, b) = (s1.0, s2.0);
        let copy = |src: usize, len: usize, stream: u32| Call::Copy { src, len, stream };
        let expected = [
            copy(0, 600 * K, a),                  // slot 0, new
            copy(600 * K, 300 * K, a),            // appended: 900 KiB fit in the slot
            Call::Record { event: 0, stream: a }, // 900 KiB ≥ lead-in and 200 more overflow: rotate
            copy(1024 * K, 200 * K, a),           // slot 1, new
            Call::Record { event: 1, stream: a }, // the stream changed: rotate
            copy(2048 * K, 100 * K, b),           // slot 2, new
            copy(2148 * K, 924 * K, b),           // 100 KiB < lead-in: top the slot up first
            Call::Record { event: 2, stream: b }, // full: rotate back to slot 0 ...
            Call::Wait { event: 0 },              // ... after its own event only
            copy(0, 1024 * K, b),
            Call::Record { event: 3, stream: b },
            Call::Wait { event: 1 },
            copy(1024 * K, 612 * K, b), // the 2.5 MiB request's tail
            copy(1636 * K, 100 * K, b), // appended
            copy(1736 * K, 312 * K, b), // 712 KiB < lead-in: top up, then rotate
            Call::Record { event: 4, stream: b },
            Call::Wait { event: 2 },
            copy(2048 * K, 188 * K, b),
        ];
        assert_eq!(*rec.log.lock().expect("log"), expected);

        let mut back = vec![0u8; total];
        sim.read(dst, &mut back).expect("read");
        assert!(back == bytes, "device bytes equal the file");
        assert_eq!(ring.registered_bytes(), 3 * 1024 * K, "three slots, registered once each");
        assert_eq!(sim.registered_bytes(), 3 * 1024 * K as u64);
        assert_eq!(sim.counters().h2d_unregistered, 0, "every copy is from registered memory");
    }

    #[test]
    fn a_ring_takes_its_slots_only_as_it_needs_them() {
        let (_sim, rec) = recorder();
        let device: Arc<dyn DeviceMemory> = rec.clone();
        let config =
            RingConfig { slot_bytes: 2048 * K, lead_in: 1536 * K, ..RingConfig::default() };
        let ring = StagingRing::new(device, config).expect("ring");
        assert_eq!(ring.registered_bytes(), 0);
        let bytes = noise(1000, 1);
        let (_file, source) = file_of(&bytes, "lazy.bin");
        let dst = rec.sim.alloc(1000).expect("alloc");
        ring.copy_file(&source, 0, 1000, dst, StreamId::COMPUTE).expect("copy");
        assert_eq!(ring.registered_bytes(), 2048 * K, "one slot");
        assert!(StagingRing::new(rec.clone(), RingConfig { slots: 0, ..config }).is_err());
    }

    #[test]
    fn pin_on_the_way_copies_each_window_as_soon_as_it_is_read() {
        let (sim, rec) = recorder();
        let device: Arc<dyn DeviceMemory> = rec.clone();
        let len = 1024 * K + 100;
        let bytes = noise(len + 5000, 7);
        let (_file, source) = file_of(&bytes, "pin.bin");
        let pin = HostBuffer::new(2048 * K, HostBufferConfig::patches());
        pin.grow(4096 + len).expect("grow");
        pin.register(&device, 4096, len).expect("register the pin");
        let dst = sim.alloc(len as u64).expect("alloc");
        let config = RingConfig { pin_window: 256 * K, ..RingConfig::default() };
        let range = PinRange { buf: &pin, offset: 4096, len };
        read_through_pin(device.as_ref(), &source, 5000, range, dst, StreamId::COMPUTE, &config)
            .expect("read");

        let windows: Vec<Call> = (0..5)
            .map(|i| Call::Copy {
                src: 4096 + i * 256 * K,
                len: if i < 4 { 256 * K } else { 100 },
                stream: 0,
            })
            .collect();
        assert_eq!(
            *rec.log.lock().expect("log"),
            windows,
            "one copy per window, in order, no waits"
        );
        let mut back = vec![0u8; len];
        sim.read(dst, &mut back).expect("read");
        assert!(back == bytes[5000..], "device bytes equal the file");
        let mut kept = vec![0u8; len];
        pin.read(4096, &mut kept);
        assert!(kept == bytes[5000..], "the pin keeps the bytes");
        assert_eq!(sim.counters().h2d_unregistered, 0);
    }
}
