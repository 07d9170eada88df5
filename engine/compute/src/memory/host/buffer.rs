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
            return Err(Error::Host(format!("truncate to {size} bytes, beyond the in-use {}", state.size)));
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
    pub fn register(self: &Arc<Self>, device: &Arc<dyn DeviceMemory>, offset: usize, len: usize) -> Result<()> {
        let mut state = self.lock();
        let end = offset.checked_add(len).filter(|&e| len > 0 && e <= state.size).ok_or_else(|| {
            Error::Host(format!("register {offset}+{len}: not a non-empty range of the in-use {} bytes", state.size))
        })?;
        let overlapping = state.registrations.range(..end).next_back().is_some_and(|(&s, r)| s + r.len > offset);
        if overlapping {
            return Err(Error::Host(format!("register {offset}+{len} overlaps a registered range")));
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
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= state.size)
            .ok_or_else(|| Error::Host(format!("claim {offset}+{len} beyond the in-use {} bytes", state.size)))?;
        if state.claimed(offset, end) {
            return Err(Error::Host(format!("claim {offset}+{len} overlaps a range being written")));
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
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= state.size)
            .ok_or_else(|| Error::Host(format!("{offset}+{len} lies beyond the in-use {} bytes", state.size)))?;
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
            return Err(Error::Host(format!("grow to {size} bytes, beyond the buffer's maximum of {}", self.max_size)));
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
            state.base = vm::reserve(self.reserved).map_err(|e| host_err("reserve address space", e))?;
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
            state.prewarm_job = PrefaultPool::global().start(state.base + prewarm_start, target - prewarm_start);
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
        if let Some((start, r)) = state.registration_at(from) {
            if start < from {
                return Err(Error::Host(format!(
                    "{from} cuts the registered range {start}..{}; shrink at a registration's start",
                    start + r.len
                )));
            }
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

impl HostMemory for HostBuffer {
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
        Arc::new(AddressView { base: buf.base.load(Ordering::Acquire), len: buf.size.load(Ordering::Acquire) })
    }
}

impl HostMemory for AddressView {
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
        let tail = WriteRange { buf: self.buf.clone(), offset: self.offset + at, len: self.len - at };
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
