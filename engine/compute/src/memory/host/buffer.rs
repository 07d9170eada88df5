//! [`HostBuffer`]: the growable host buffer that pins (and the staging ring) are slices of.
//!
//! Address space is reserved on the first grow and only committed as the buffer grows, with a prewarmed
//! headroom so that the next grow finds its pages already faulted and registering them with the device is
//! cheap (memory-manager.md §3). Shrinking decommits in the background.
//!
//! The invariant everything here rests on: **bytes are written only through a [`WriteRange`], and the
//! buffer's claim table never holds two overlapping ranges.** A claim is made under the buffer's lock and
//! only inside the in-use length; [`HostBuffer::truncate`] refuses to cut a claimed range, and
//! [`HostMemory::read`] refuses to read one. So a `&mut [u8]` handed out by [`WriteRange::as_mut_slice`] is
//! the only reference to committed memory, and reader threads can fill disjoint ranges of one buffer at once.
//! A device reading the buffer by address (DMA) is outside Rust's view: callers only copy ranges they have
//! finished writing, and only shrink a buffer after the copies reading it have completed.

#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::decommit::{DECOMMIT_QUEUE_LIMIT, Decommitter, Op, Pending};
use super::prefault::PrefaultPool;
use super::vm;
use crate::error::{Error, Result};
use crate::memory::device::{DevPtr, DeviceMemory, HostMemory, HostSlice, StreamId};

const MIB: usize = 1 << 20;

/// Commits, decommits and reservations are multiples of this (a multiple of every page size, and the size of
/// a transparent huge page).
pub const COMMIT_GRANULE: usize = 2 * MIB;

/// How a [`HostBuffer`] grows and registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostBufferConfig {
    /// Bytes committed and prefaulted past the in-use length on each grow (`hostbuf.prewarm`).
    pub prewarm: usize,
    /// Largest range handed to [`DeviceMemory::register`] in one call; bigger registrations are split.
    pub register_chunk: usize,
}

impl HostBufferConfig {
    /// The weights' buffers: 64 MiB of prewarm (memory-manager.md §10).
    pub fn weights() -> HostBufferConfig {
        HostBufferConfig { prewarm: 64 * MIB, register_chunk: 1024 * MIB }
    }

    /// The LoRA patches' buffers: 8 MiB of prewarm.
    pub fn patches() -> HostBufferConfig {
        HostBufferConfig { prewarm: 8 * MIB, ..HostBufferConfig::weights() }
    }
}

impl Default for HostBufferConfig {
    fn default() -> HostBufferConfig {
        HostBufferConfig::weights()
    }
}

/// One [`HostBuffer::register`] call: its device and the ranges registered with it, in order.
struct Registration {
    len: usize,
    device: Arc<dyn DeviceMemory>,
    /// `(offset, len)` of each device registration.
    chunks: Vec<(usize, usize)>,
}

#[derive(Default)]
struct State {
    /// Start of the reservation; 0 while none is held.
    base: usize,
    /// In-use length.
    size: usize,
    /// Committed bytes from `base` (in-use plus prewarmed headroom).
    committed: usize,
    /// Length of the range the last [`HostBuffer::extend`] added (0 after a truncation).
    last_chunk: usize,
    /// Job number of this buffer's last background prewarm.
    prewarm_job: u64,
    /// Claimed ranges, start → end; never overlapping.
    claims: BTreeMap<usize, usize>,
    /// Registered ranges by start; never overlapping.
    registrations: BTreeMap<usize, Registration>,
}

impl State {
    fn claimed(&self, start: usize, end: usize) -> bool {
        start < end && self.claims.range(..end).next_back().is_some_and(|(_, &e)| e > start)
    }

    /// The registration holding byte `at`: its start and record.
    fn registration_at(&self, at: usize) -> Option<(usize, &Registration)> {
        let (&start, r) = self.registrations.range(..=at).next_back()?;
        (at < start + r.len).then_some((start, r))
    }
}

/// A growable host buffer whose ranges can be registered with devices (memory-manager.md §3).
///
/// Shared as `Arc<HostBuffer>`: device copies hold it through [`HostSlice`], loader threads through
/// [`WriteRange`]. Its address ([`HostMemory::as_ptr`]) is fixed from the first grow until it is truncated to
/// zero; its [`HostMemory::len`] is the in-use length.
pub struct HostBuffer {
    config: HostBufferConfig,
    max_size: usize,
    reserved: usize,
    /// Mirrors of `State::base` and `State::size` for the lock-free [`HostMemory`] accessors.
    base: AtomicUsize,
    size: AtomicUsize,
    state: Mutex<State>,
    pending: Arc<Pending>,
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.lock();
        f.debug_struct("HostBuffer")
            .field("size", &state.size)
            .field("committed", &state.committed)
            .field("reserved", &self.reserved)
            .field("registered", &state.registrations.values().map(|r| r.len).sum::<usize>())
            .finish()
    }
}

fn align_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

fn host_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Host(format!("{what}: {e}"))
}

impl HostBuffer {
    /// A buffer that may grow to `max_size` bytes; nothing is reserved until the first grow.
    ///
    /// Pass the real need (ComfyUI passes `2 · min(model bytes, pin cap)`): reserving far more per buffer
    /// has exhausted address space on some systems.
    pub fn new(max_size: usize, config: HostBufferConfig) -> Arc<HostBuffer> {
        Arc::new(HostBuffer {
            config,
            max_size,
            reserved: align_up(max_size.saturating_add(config.prewarm), COMMIT_GRANULE),
            base: AtomicUsize::new(0),
            size: AtomicUsize::new(0),
            state: Mutex::new(State::default()),
            pending: Arc::new(Pending::default()),
        })
    }

    /// The largest in-use length the buffer can grow to.
    pub fn max_size(&self) -> usize {
        self.max_size
    }

    /// Bytes of address space the buffer reserves while it holds memory (`max_size` plus prewarm, aligned).
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Bytes committed: the in-use length plus prewarmed headroom, a multiple of [`COMMIT_GRANULE`].
    pub fn committed(&self) -> usize {
        self.lock().committed
    }

    /// Grows the in-use length to `size` (never shrinks it).
    ///
    /// Commits `align_up(size + prewarm)` unless that is less than a quarter of the prewarm beyond what is
    /// committed already (hysteresis), prefaults the newly used range before returning, and prefaults the
    /// rest of the new commit in the background.
    pub fn grow(&self, size: usize) -> Result<()> {
        let mut state = self.lock();
        self.grow_locked(&mut state, size)
    }

    /// Appends `len` bytes and returns the offset where they start. With `reallocate`, the range the previous
    /// `extend` added is dropped first (and unregistered where a registration starts in it), so a resized
    /// last pin reuses its place.
    pub fn extend(&self, len: usize, reallocate: bool) -> Result<usize> {
        let mut state = self.lock();
        if reallocate && state.last_chunk > 0 {
            let start = state.size - state.last_chunk;
            self.release_tail(&mut state, start)?;
            state.size = start;
            self.size.store(start, Ordering::Release);
        }
        let offset = state.size;
        let size = offset.checked_add(len).ok_or_else(|| host_err("extend", "length overflows"))?;
        self.grow_locked(&mut state, size)?;
        state.last_chunk = len;
        Ok(offset)
    }

    /// Shrinks the in-use length to `size`.
    ///
    /// Registrations starting at or after `size` are unregistered; one that `size` would cut is an error, as
    /// is a claimed range beyond `size` (truncate at pin boundaries, after the loads into them). Committed
    /// memory past `align_up(size)` is decommitted in the background; at `size == 0` the address space is
    /// released too, and the buffer can grow again. Device copies reading the dropped range must have
    /// completed.
    pub fn truncate(&self, size: usize) -> Result<()> {
        let mut state = self.lock();
        if size > state.size {
            return Err(Error::Host(format!(
                "truncate to {size} bytes, beyond the in-use {}",
                state.size
            )));
        }
        self.release_tail(&mut state, size)?;
        self.join_prewarm_locked(&state);
        let committed = align_up(size, COMMIT_GRANULE).min(state.committed);
        self.decommit_locked(&state, committed, state.committed);
        state.committed = committed;
        state.size = size;
        state.last_chunk = 0;
        self.size.store(size, Ordering::Release);
        if size == 0 && state.base != 0 {
            Decommitter::global().submit(Op::Release, state.base, self.reserved, &self.pending);
            state.base = 0;
            state.committed = 0;
            self.base.store(0, Ordering::Release);
        }
        tracing::debug!(size, committed = state.committed, "host buffer truncated");
        Ok(())
    }

    /// Waits for this buffer's background prewarm; fails if it could not fault its pages.
    pub fn join_prewarm(&self) -> Result<()> {
        let state = self.lock();
        PrefaultPool::global().join(state.prewarm_job).map_err(|e| host_err("prewarm", e))
    }

    /// Waits until the memory this buffer's truncations gave back has been decommitted.
    pub fn wait_decommits(&self) {
        self.pending.wait_idle();
    }

    /// Registers `[offset, offset + len)` of the in-use range with `device` (page-locks it for DMA), in calls
    /// of at most `register_chunk` bytes. [`HostBuffer::unregister`] of `offset` undoes it.
    pub fn register(
        self: &Arc<Self>,
        device: &Arc<dyn DeviceMemory>,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        let mut state = self.lock();
        let end =
            offset.checked_add(len).filter(|&e| len > 0 && e <= state.size).ok_or_else(|| {
                Error::Host(format!(
                    "register {offset}+{len}: not a non-empty range of the in-use {} bytes",
                    state.size
                ))
            })?;
        let overlapping =
            state.registrations.range(..end).next_back().is_some_and(|(&s, r)| s + r.len > offset);
        if overlapping {
            return Err(Error::Host(format!(
                "register {offset}+{len} overlaps a registered range"
            )));
        }
        let mem: Arc<dyn HostMemory> = self.clone();
        let step = self.config.register_chunk.max(1);
        let mut chunks = Vec::with_capacity(len.div_ceil(step));
        let mut at = offset;
        while at < end {
            let n = step.min(end - at);
            if let Err(e) = device.register(&mem, at, n) {
                for &(o, _) in &chunks {
                    if let Err(undo) = device.unregister(&mem, o) {
                        tracing::warn!("undoing a partial registration at {o}: {undo}");
                    }
                }
                return Err(e);
            }
            chunks.push((at, n));
            at += n;
        }
        state.registrations.insert(offset, Registration { len, device: device.clone(), chunks });
        Ok(())
    }

    /// Unregisters the range a [`HostBuffer::register`] call started at `offset` (exactly that start).
    pub fn unregister(&self, offset: usize) -> Result<()> {
        let mut state = self.lock();
        self.unregister_locked(&mut state, offset)
    }

    /// Bytes currently registered.
    pub fn registered_bytes(&self) -> usize {
        self.lock().registrations.values().map(|r| r.len).sum()
    }

    /// The registered ranges, `(offset, len)` in order.
    pub fn registrations(&self) -> Vec<(usize, usize)> {
        self.lock().registrations.iter().map(|(&o, r)| (o, r.len)).collect()
    }

    /// Claims `[offset, offset + len)` of the in-use range for writing; fails if any of it is claimed already.
    pub fn claim(self: &Arc<Self>, offset: usize, len: usize) -> Result<WriteRange> {
        let mut state = self.lock();
        let end = offset.checked_add(len).filter(|&e| e <= state.size).ok_or_else(|| {
            Error::Host(format!("claim {offset}+{len} beyond the in-use {} bytes", state.size))
        })?;
        if state.claimed(offset, end) {
            return Err(Error::Host(format!(
                "claim {offset}+{len} overlaps a range being written"
            )));
        }
        if len > 0 {
            state.claims.insert(offset, end);
        }
        Ok(WriteRange { buf: self.clone(), offset, len })
    }

    /// Copies `bytes` into the buffer at `offset` (which must be in use and not being written).
    pub fn write_at(self: &Arc<Self>, offset: usize, bytes: &[u8]) -> Result<()> {
        self.claim(offset, bytes.len())?.as_mut_slice().copy_from_slice(bytes);
        Ok(())
    }

    /// A [`HostSlice`] of `[offset, offset + len)` for a device copy.
    pub fn slice(self: &Arc<Self>, offset: usize, len: usize) -> Result<HostSlice> {
        self.check_readable(&self.lock(), offset, len)?;
        Ok(HostSlice { mem: self.clone(), offset, len })
    }

    /// Queues copies of `[offset, offset + len)` to `dst` on `stream`, split where the range crosses from
    /// one device registration to the next (a copy spanning two registrations may not be DMA).
    pub fn copy_h2d(
        self: &Arc<Self>,
        device: &dyn DeviceMemory,
        offset: usize,
        len: usize,
        dst: DevPtr,
        stream: StreamId,
    ) -> Result<()> {
        let pieces = {
            let state = self.lock();
            self.check_readable(&state, offset, len)?;
            copy_pieces(&state, offset, len)
        };
        for (at, n) in pieces {
            let src = HostSlice { mem: self.clone(), offset: at, len: n };
            device.copy_h2d(dst.offset((at - offset) as u64), &src, stream)?;
        }
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn check_readable(&self, state: &State, offset: usize, len: usize) -> Result<()> {
        let end = offset.checked_add(len).filter(|&e| e <= state.size).ok_or_else(|| {
            Error::Host(format!("{offset}+{len} lies beyond the in-use {} bytes", state.size))
        })?;
        if state.claimed(offset, end) {
            return Err(Error::Host(format!("{offset}+{len} is still being written")));
        }
        Ok(())
    }

    fn grow_locked(&self, state: &mut State, size: usize) -> Result<()> {
        if size <= state.size {
            return Ok(());
        }
        if size > self.max_size {
            return Err(Error::Host(format!(
                "grow to {size} bytes, beyond the buffer's maximum of {}",
                self.max_size
            )));
        }
        // A decommit still queued for this buffer must not land on memory committed below.
        self.pending.wait_idle();
        let prewarm = self.config.prewarm;
        let mut target = align_up(size + prewarm, COMMIT_GRANULE).min(self.reserved);
        if target < state.committed + prewarm / 4 {
            // Not worth a commit and a prewarm job; `size` fits (see memory-manager.md §3).
            target = state.committed;
        }
        if state.base == 0 {
            state.base =
                vm::reserve(self.reserved).map_err(|e| host_err("reserve address space", e))?;
            self.base.store(state.base, Ordering::Release);
        }
        self.join_prewarm_locked(state);
        let old = state.committed;
        if target > old {
            vm::commit(state.base + old, target - old).map_err(|e| host_err("commit", e))?;
        }
        if size > old {
            // Prefault the range handed out now, on the pool's threads, and wait: faster than faulting lazily.
            let pool = PrefaultPool::global();
            if let Err(e) = pool.join(pool.start(state.base + old, size - old)) {
                if let Err(undo) = vm::decommit(state.base + old, target - old) {
                    tracing::warn!("undoing a commit after a failed prefault: {undo}");
                }
                return Err(host_err("prefault", e));
            }
        }
        let prewarm_start = old.max(size);
        if target > prewarm_start {
            state.prewarm_job =
                PrefaultPool::global().start(state.base + prewarm_start, target - prewarm_start);
        }
        state.committed = target;
        state.size = size;
        self.size.store(size, Ordering::Release);
        tracing::debug!(size, committed = target, "host buffer grown");
        Ok(())
    }

    /// Waits for this buffer's prewarm; its failure only means the pages fault later, so it is logged.
    fn join_prewarm_locked(&self, state: &State) {
        if let Err(e) = PrefaultPool::global().join(state.prewarm_job) {
            tracing::debug!("host buffer prewarm failed, pages will fault on use: {e}");
        }
    }

    /// Readies `[from, size)` to leave use: no claims in it, and its registrations unregistered.
    fn release_tail(&self, state: &mut State, from: usize) -> Result<()> {
        if state.claimed(from, state.size) {
            return Err(Error::Host(format!("bytes past {from} are still being written")));
        }
        if let Some((start, r)) = state.registration_at(from)
            && start < from
        {
            return Err(Error::Host(format!(
                "{from} cuts the registered range {start}..{}; shrink at a registration's start",
                start + r.len
            )));
        }
        let doomed: Vec<usize> = state.registrations.range(from..).map(|(&o, _)| o).collect();
        for offset in doomed {
            self.unregister_locked(state, offset)?;
        }
        Ok(())
    }

    fn unregister_locked(&self, state: &mut State, offset: usize) -> Result<()> {
        let Some(mut reg) = state.registrations.remove(&offset) else {
            return Err(Error::Host(format!("no registered range starts at {offset}")));
        };
        let view = AddressView::of(self);
        let mut result = Ok(());
        while let Some(&(o, _)) = reg.chunks.first() {
            if let Err(e) = reg.device.unregister(&view, o) {
                result = Err(e);
                break;
            }
            reg.chunks.remove(0);
        }
        if !reg.chunks.is_empty() {
            // Keep what is still registered on record, so a retry can finish it.
            let start = reg.chunks[0].0;
            reg.len = reg.chunks.iter().map(|&(_, n)| n).sum();
            state.registrations.insert(start, reg);
        }
        result
    }

    /// Queues the decommit of `[from, to)` in chunks the decommit queue accepts.
    fn decommit_locked(&self, state: &State, from: usize, to: usize) {
        let mut at = from;
        while at < to {
            let n = DECOMMIT_QUEUE_LIMIT.min(to - at);
            Decommitter::global().submit(Op::Decommit, state.base + at, n, &self.pending);
            at += n;
        }
    }
}

/// Splits `[offset, offset + len)` into pieces that each lie in one device registration or in none.
fn copy_pieces(state: &State, offset: usize, len: usize) -> Vec<(usize, usize)> {
    let end = offset + len;
    let mut pieces = Vec::new();
    let mut at = offset;
    while at < end {
        let piece_end = match state.registration_at(at) {
            Some((_, r)) => {
                let chunk = r.chunks.iter().find(|&&(o, n)| o <= at && at < o + n);
                chunk.map_or(end, |&(o, n)| (o + n).min(end))
            }
            None => {
                let next = state.registrations.range(at..).next().map_or(end, |(&o, _)| o);
                next.min(end)
            }
        };
        pieces.push((at, piece_end - at));
        at = piece_end;
    }
    pieces
}

// SAFETY: `as_ptr()` is the base of the committed mapping and `len()` the in-use length, which stays committed
// until a truncation, and truncations refuse ranges being read and unregister before they decommit; the mapping
// itself lives as long as the buffer.
unsafe impl HostMemory for HostBuffer {
    fn len(&self) -> usize {
        self.size.load(Ordering::Acquire)
    }

    fn as_ptr(&self) -> *const u8 {
        self.base.load(Ordering::Acquire) as *const u8
    }

    /// # Panics
    /// If the range is not in use or is being written (a caller copying bytes it has not finished loading).
    fn read(&self, offset: usize, out: &mut [u8]) {
        let state = self.lock();
        if let Err(e) = self.check_readable(&state, offset, out.len()) {
            panic!("HostBuffer::read: {e}");
        }
        if out.is_empty() {
            return;
        }
        // SAFETY: the range is in use, hence committed; no claim covers it and new claims wait for the lock we
        // hold, so nothing writes it; truncation also waits for the lock, so it stays committed during the copy.
        unsafe { vm::copy_out(state.base + offset, out) };
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = PrefaultPool::global().join(state.prewarm_job) {
            tracing::debug!("host buffer prewarm failed: {e}");
        }
        let view: Arc<dyn HostMemory> = Arc::new(AddressView { base: state.base, len: state.size });
        for (_, reg) in std::mem::take(&mut state.registrations) {
            for (o, _) in reg.chunks {
                if let Err(e) = reg.device.unregister(&view, o) {
                    tracing::warn!("unregistering a dropped host buffer at {o}: {e}");
                }
            }
        }
        if state.base == 0 {
            return;
        }
        let base = state.base;
        let mut at = 0;
        while at < state.committed {
            let n = DECOMMIT_QUEUE_LIMIT.min(state.committed - at);
            Decommitter::global().submit(Op::Decommit, base + at, n, &self.pending);
            at += n;
        }
        Decommitter::global().submit(Op::Release, base, self.reserved, &self.pending);
    }
}

/// The address and length of a buffer, for naming it to [`DeviceMemory::unregister`] where no `Arc` of the
/// buffer exists (its `Drop`) or where taking one is not needed. Devices key registrations by address.
struct AddressView {
    base: usize,
    len: usize,
}

impl AddressView {
    fn of(buf: &HostBuffer) -> Arc<dyn HostMemory> {
        Arc::new(AddressView {
            base: buf.base.load(Ordering::Acquire),
            len: buf.size.load(Ordering::Acquire),
        })
    }
}

// SAFETY: an `AddressView` names a buffer's registered range only to unregister it; it is never the source
// of a copy, and its bytes are the buffer's, valid while the buffer that made it lives (it dies first).
unsafe impl HostMemory for AddressView {
    fn len(&self) -> usize {
        self.len
    }

    fn as_ptr(&self) -> *const u8 {
        self.base as *const u8
    }

    /// # Panics
    /// Always: the view only names a buffer to a device; copies go through the buffer itself.
    fn read(&self, offset: usize, _out: &mut [u8]) {
        panic!("a host buffer's address view cannot be read (offset {offset})");
    }
}

/// An exclusive claim on a range of a [`HostBuffer`], for writing it (a loader thread's destination).
///
/// While it lives, no other claim, read or truncation touches the range; dropping it releases the range.
pub struct WriteRange {
    buf: Arc<HostBuffer>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for WriteRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteRange({}..{})", self.offset, self.offset + self.len)
    }
}

impl WriteRange {
    /// Offset of the range in its buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer the range belongs to.
    pub fn buffer(&self) -> &Arc<HostBuffer> {
        &self.buf
    }

    /// The range's bytes.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        let base = self.buf.base.load(Ordering::Acquire);
        // SAFETY: the claim table holds exactly this range for this `WriteRange` and never overlapping ranges,
        // so no other `WriteRange` writes it and `HostMemory::read` refuses it; it was inside the in-use length
        // when claimed and truncation refuses claimed ranges, so it stays committed and `base` (which changes
        // only when the buffer is truncated to zero) stays valid. The borrow of `self` keeps the slice unique.
        unsafe { vm::slice_mut(base + self.offset, self.len) }
    }

    /// Splits the claim at `at` (clamped to the length): `self` keeps `[offset, offset + at)` and the rest is
    /// returned as its own claim.
    pub fn split_off(&mut self, at: usize) -> WriteRange {
        let at = at.min(self.len);
        let tail =
            WriteRange { buf: self.buf.clone(), offset: self.offset + at, len: self.len - at };
        if at > 0 && tail.len > 0 {
            let mut state = self.buf.lock();
            state.claims.insert(self.offset, tail.offset);
            state.claims.insert(tail.offset, tail.offset + tail.len);
        }
        // With `at == 0` the table's entry (keyed by the shared start) now belongs to the tail.
        self.len = at;
        tail
    }
}

impl Drop for WriteRange {
    fn drop(&mut self) {
        if self.len > 0 {
            self.buf.lock().claims.remove(&self.offset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::sim::SimDevice;

    fn config(prewarm: usize) -> HostBufferConfig {
        HostBufferConfig { prewarm, register_chunk: 4 * MIB }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn read(buf: &HostBuffer, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        buf.read(offset, &mut out);
        out
    }

    #[test]
    fn nothing_is_reserved_before_the_first_grow() {
        let buf = HostBuffer::new(64 * MIB, config(16 * MIB));
        assert!(buf.as_ptr().is_null());
        assert_eq!((buf.len(), buf.committed()), (0, 0));
        assert_eq!(buf.reserved(), 80 * MIB, "max size plus prewarm");
    }

    #[test]
    fn grow_commits_prewarm_headroom_with_hysteresis() {
        let buf = HostBuffer::new(64 * MIB, config(16 * MIB));
        buf.grow(MIB).expect("grow");
        assert_eq!((buf.len(), buf.committed()), (MIB, 18 * MIB), "align_up(1 + 16) MiB committed");
        buf.write_at(0, &pattern(MIB, 1)).expect("write");
        buf.grow(2 * MIB).expect("grow within the prewarm");
        assert_eq!(buf.committed(), 18 * MIB, "18 MiB target is not a quarter prewarm beyond 18");
        buf.grow(4 * MIB).expect("grow within the prewarm");
        assert_eq!(buf.committed(), 18 * MIB, "20 MiB < 18 + 4: the commit is kept");
        buf.grow(6 * MIB).expect("grow past the hysteresis band");
        assert_eq!((buf.len(), buf.committed()), (6 * MIB, 22 * MIB));
        buf.grow(3 * MIB).expect("growing to less is a no-op");
        assert_eq!(buf.len(), 6 * MIB, "grow never shrinks");
        assert_eq!(read(&buf, 0, MIB), pattern(MIB, 1), "bytes survive growing");
        assert_eq!(read(&buf, MIB, MIB), vec![0u8; MIB], "new bytes are zero");
        let err = buf.grow(65 * MIB).expect_err("beyond the maximum");
        assert!(matches!(err, Error::Host(ref m) if m.contains("maximum")), "{err}");
        buf.grow(64 * MIB).expect("up to the maximum");
        assert_eq!(buf.committed(), 80 * MIB, "the commit stops at the reservation");
    }

    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[test]
    fn grow_prefaults_the_used_range_and_prewarms_the_headroom() {
        let buf = HostBuffer::new(64 * MIB, config(8 * MIB));
        buf.grow(3 * MIB).expect("grow");
        let base = buf.as_ptr() as usize;
        assert_eq!(
            vm::resident_pages(base, 3 * MIB),
            3 * MIB / 4096,
            "the used range is faulted before grow returns"
        );
        buf.join_prewarm().expect("prewarm");
        assert_eq!(buf.committed(), 12 * MIB);
        assert_eq!(
            vm::resident_pages(base, 12 * MIB),
            12 * MIB / 4096,
            "the headroom is prewarmed"
        );
        assert_eq!(vm::resident_pages(base + 12 * MIB, 8 * MIB), 0, "nothing past the commit");
    }

    #[test]
    fn truncate_decommits_and_the_buffer_grows_again() {
        let buf = HostBuffer::new(64 * MIB, config(4 * MIB));
        buf.grow(20 * MIB).expect("grow");
        buf.write_at(0, &pattern(5 * MIB, 3)).expect("write");
        buf.write_at(10 * MIB, &pattern(MIB, 4)).expect("write");
        assert_eq!(buf.committed(), 24 * MIB);
        let base = buf.as_ptr() as usize;
        buf.truncate(5 * MIB).expect("truncate");
        assert_eq!(
            (buf.len(), buf.committed()),
            (5 * MIB, 6 * MIB),
            "committed back to align_up(5 MiB)"
        );
        buf.wait_decommits();
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        assert_eq!(vm::resident_pages(base + 6 * MIB, 18 * MIB), 0, "the tail's pages are freed");
        assert!(buf.slice(5 * MIB, 1).is_err(), "past the in-use length");
        assert!(buf.truncate(6 * MIB).is_err(), "truncate cannot grow");
        buf.grow(30 * MIB).expect("grow again");
        assert_eq!(buf.as_ptr() as usize, base, "the address is kept");
        assert_eq!(read(&buf, 0, 5 * MIB), pattern(5 * MIB, 3), "kept bytes survive");
        assert_eq!(
            read(&buf, 10 * MIB, MIB),
            vec![0u8; MIB],
            "decommitted bytes come back as zeros"
        );

        buf.truncate(0).expect("truncate to zero");
        assert!(buf.as_ptr().is_null(), "the address space is released");
        assert_eq!((buf.len(), buf.committed()), (0, 0));
        buf.grow(2 * MIB).expect("a released buffer grows again");
        buf.write_at(0, &pattern(2 * MIB, 5)).expect("write");
        assert_eq!(read(&buf, 0, 2 * MIB), pattern(2 * MIB, 5));
    }

    #[test]
    fn registration_is_chunked_and_copies_from_it_count_as_registered() {
        let sim = Arc::new(SimDevice::new(64 * MIB as u64));
        let device: Arc<dyn DeviceMemory> = sim.clone();
        let buf = HostBuffer::new(32 * MIB, config(0));
        buf.grow(12 * MIB).expect("grow");
        let bytes = pattern(12 * MIB, 7);
        buf.write_at(0, &bytes).expect("write");
        buf.register(&device, 0, 10 * MIB).expect("register");
        assert_eq!((sim.registered_bytes(), buf.registered_bytes()), (10 * MIB as u64, 10 * MIB));
        assert!(buf.register(&device, 8 * MIB, 2 * MIB).is_err(), "overlaps");
        assert!(buf.register(&device, 10 * MIB, 4 * MIB).is_err(), "past the in-use length");

        let dst = sim.alloc(6 * MIB as u64).expect("alloc");
        // 2..8 MiB crosses the device registrations at 4 MiB and 8 MiB (4 MiB chunks): two copies.
        buf.copy_h2d(device.as_ref(), 2 * MIB, 6 * MIB, dst, StreamId::COMPUTE).expect("copy");
        let counters = sim.counters();
        assert_eq!(
            (counters.h2d_copies, counters.h2d_unregistered),
            (2, 0),
            "split at the chunk edge, all DMA"
        );
        let mut back = vec![0u8; 6 * MIB];
        sim.read(dst, &mut back).expect("read");
        assert_eq!(back, bytes[2 * MIB..8 * MIB]);

        // 9..11 MiB lies half outside the registration: the outside piece is an unregistered copy.
        buf.copy_h2d(device.as_ref(), 9 * MIB, 2 * MIB, dst, StreamId::COMPUTE).expect("copy");
        assert_eq!(sim.counters().h2d_unregistered, 1);

        assert!(buf.unregister(4 * MIB).is_err(), "not the start of a registration");
        buf.unregister(0).expect("unregister");
        assert_eq!((sim.registered_bytes(), buf.registered_bytes()), (0, 0));
    }

    #[test]
    fn truncation_unregisters_at_pin_boundaries_only() {
        let sim = Arc::new(SimDevice::new(0));
        let device: Arc<dyn DeviceMemory> = sim.clone();
        let buf = HostBuffer::new(32 * MIB, config(0));
        buf.grow(12 * MIB).expect("grow");
        buf.register(&device, 0, 4 * MIB).expect("first pin");
        buf.register(&device, 4 * MIB, 6 * MIB).expect("second pin");
        let err = buf.truncate(6 * MIB).expect_err("cuts the second pin");
        assert!(matches!(err, Error::Host(ref m) if m.contains("cuts")), "{err}");
        assert_eq!(buf.len(), 12 * MIB, "a refused truncation changes nothing");
        buf.truncate(4 * MIB).expect("truncate at the second pin's start");
        assert_eq!(buf.registrations(), vec![(0, 4 * MIB)]);
        assert_eq!(sim.registered_bytes(), 4 * MIB as u64);
        drop(buf);
        assert_eq!(sim.registered_bytes(), 0, "dropping a buffer unregisters it");
    }

    #[test]
    fn extend_appends_and_reallocates_the_last_range() {
        let sim = Arc::new(SimDevice::new(0));
        let device: Arc<dyn DeviceMemory> = sim.clone();
        let buf = HostBuffer::new(32 * MIB, config(2 * MIB));
        assert_eq!(buf.extend(3 * MIB, false).expect("extend"), 0);
        assert_eq!(buf.extend(2 * MIB, false).expect("extend"), 3 * MIB);
        buf.register(&device, 3 * MIB, 2 * MIB).expect("register the last range");
        assert_eq!(
            buf.extend(5 * MIB, true).expect("reallocate"),
            3 * MIB,
            "the last range is replaced"
        );
        assert_eq!(buf.len(), 8 * MIB);
        assert_eq!(sim.registered_bytes(), 0, "the replaced range was unregistered");
        assert_eq!(buf.extend(MIB, false).expect("extend"), 8 * MIB);
    }

    #[test]
    fn claims_are_exclusive_and_fill_disjoint_ranges_from_threads() {
        let buf = HostBuffer::new(16 * MIB, config(0));
        buf.grow(8 * MIB).expect("grow");
        let mut whole = buf.claim(0, 8 * MIB).expect("claim");
        assert!(buf.claim(MIB, 1).is_err(), "overlaps a claim");
        assert!(buf.slice(0, 16).is_err(), "a claimed range cannot be copied from");
        assert!(buf.truncate(0).is_err(), "a claimed range cannot be truncated");
        assert!(buf.claim(8 * MIB, 1).is_err(), "past the in-use length");
        let mut pieces = Vec::new();
        while whole.len() > MIB {
            let rest = whole.split_off(MIB);
            pieces.push(whole);
            whole = rest;
        }
        pieces.push(whole);
        assert_eq!(pieces.len(), 8);
        std::thread::scope(|s| {
            for (i, mut piece) in pieces.into_iter().enumerate() {
                s.spawn(move || piece.as_mut_slice().copy_from_slice(&pattern(MIB, i as u8)));
            }
        });
        for i in 0..8 {
            assert_eq!(read(&buf, i * MIB, MIB), pattern(MIB, i as u8), "piece {i}");
        }
        let mut head = buf.claim(0, 2 * MIB).expect("released claims can be claimed again");
        let tail = head.split_off(0);
        assert_eq!((head.len(), tail.offset(), tail.len()), (0, 0, 2 * MIB));
        drop(head);
        assert!(buf.claim(0, 1).is_err(), "the tail still holds the range");
        drop(tail);
        buf.slice(0, 2 * MIB).expect("free again");
    }
}
