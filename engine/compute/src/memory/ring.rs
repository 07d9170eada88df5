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
        RingConfig { slots: 3, slot_bytes: 64 * MIB, lead_in: 48 * MIB, pin_window: 64 * MIB, mark_cold: true }
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
        let host = HostBufferConfig { prewarm: config.slot_bytes, register_chunk: config.slot_bytes };
        let buf = HostBuffer::new(config.slots * config.slot_bytes, host);
        Ok(StagingRing { device, config, buf, state: Mutex::new(RingState { slots: Vec::new(), active: None }) })
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
    pub fn copy_file(&self, source: &FileSource, offset: u64, len: u64, dst: DevPtr, stream: StreamId) -> Result<()> {
        let mut state = self.lock();
        let (mut offset, mut dst) = (offset, dst);
        let mut left = usize::try_from(len).map_err(|_| Error::Host(format!("a {len}-byte copy")))?;
        while left > 0 {
            let slot_bytes = self.config.slot_bytes;
            let rotate = match state.active {
                None => true,
                Some(i) => {
                    let s = &state.slots[i];
                    s.stream != stream
                        || s.fill == slot_bytes
                        || (s.fill + left > slot_bytes && s.fill >= self.config.lead_in)
                }
            };
            let index = if rotate { self.rotate(&mut state, stream)? } else { state.active.unwrap_or(0) };
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
        if let Some(event) = slot.event.take() {
            event.wait()?;
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
