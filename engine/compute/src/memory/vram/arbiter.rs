//! [`Arbiter`]: one device's VRAM arbiter (§2.2; as an entry point for every allocation, a Kiln addition to
//! §2.3). It owns the budget, the priority list and every VBAR, and it is the only place that frees VBAR pages.
//!
//! Everything that takes device memory goes through it: weight faults ([`Arbiter::fault`]), activations
//! ([`Arbiter::alloc`]) and scratch growth ([`super::Scratch`]); each first evicts what the budget says is
//! missing. Eviction walks the priority list from the lowest VBAR up and lowers each VBAR's watermark from
//! its top down to its limit, freeing unpinned pages; the watermark passes pinned pages, which are freed at
//! their last unpin. Everything above a lowered watermark then fails to fault ([`Fault::Offloaded`]) until
//! the VBAR is prioritised again, so callers may fault blindly on every layer without thrashing.
//!
//! Invariants: the tracked usage equals the bytes this arbiter has mapped or allocated on the device; a
//! pinned page is never unmapped (except when its VBAR is destroyed); a watermark only goes down, except
//! through [`Arbiter::prioritize`] and [`Arbiter::set_watermark`]. All methods take `&self`: one mutex
//! guards the state, and it is held across the device calls an operation makes, so operations are atomic.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::budget::{Budget, Clock, SystemClock};
use super::config::VramConfig;
use super::vbar::{Fault, PageState, Vbar, VbarId};
use crate::error::{Error, Result};
use crate::memory::device::{DevPtr, DeviceMemory};

/// One device's VRAM arbiter: budget, priority list, VBARs, activation allocations.
pub struct Arbiter {
    pub(super) dev: Arc<dyn DeviceMemory>,
    pub(super) config: VramConfig,
    state: Mutex<State>,
}

/// What the mutex guards.
pub(super) struct State {
    pub(super) budget: Budget,
    vbars: BTreeMap<VbarId, Vbar>,
    /// The priority list, lowest priority first.
    order: Vec<VbarId>,
    /// Live activation allocations: address → bytes accounted.
    pub(super) allocs: BTreeMap<u64, u64>,
    page_size: u64,
}

fn unknown(id: VbarId) -> Error {
    Error::driver("vbar", format!("{id} does not exist on this device"))
}

impl Arbiter {
    /// An arbiter for `dev` with the real clock. Fails when the configuration does not fit the device.
    pub fn new(dev: Arc<dyn DeviceMemory>, config: VramConfig) -> Result<Arbiter> {
        Arbiter::with_clock(dev, config, Arc::new(SystemClock::new()))
    }

    /// An arbiter whose budget polls the driver by `clock` (tests pass a [`super::ManualClock`]).
    pub fn with_clock(
        dev: Arc<dyn DeviceMemory>,
        config: VramConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<Arbiter> {
        config.validate(dev.granularity())?;
        let capacity = dev.mem_info()?.total;
        let state = State {
            budget: Budget::new(capacity, &config, clock),
            vbars: BTreeMap::new(),
            order: Vec::new(),
            allocs: BTreeMap::new(),
            page_size: config.page_size,
        };
        Ok(Arbiter { dev, config, state: Mutex::new(state) })
    }

    /// The device.
    pub fn device(&self) -> &Arc<dyn DeviceMemory> {
        &self.dev
    }

    /// The configuration it was made with (headrooms may have changed since, see [`Arbiter::headroom`]).
    pub fn config(&self) -> &VramConfig {
        &self.config
    }

    /// The VBAR page size.
    pub fn page_size(&self) -> u64 {
        self.config.page_size
    }

    /// The device's capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.lock().budget.capacity()
    }

    /// Bytes this arbiter has mapped or allocated (weights, scratch, activations as accounted).
    pub fn usage(&self) -> u64 {
        self.lock().budget.usage()
    }

    /// The simple headroom now in force.
    pub fn headroom(&self) -> u64 {
        self.lock().budget.headroom()
    }

    /// Sets the simple headroom (what ComfyUI's `--reserve-vram` sets).
    pub fn set_headroom(&self, bytes: u64) {
        self.lock().budget.set_headroom(bytes);
    }

    /// Sets the extra headroom (ComfyUI's `--vram-headroom`).
    pub fn set_extra_headroom(&self, bytes: u64) {
        self.lock().budget.set_extra_headroom(bytes);
    }

    /// Bytes to evict before `size` more fit (≤ 0: none), per §2.3.
    pub fn deficit(&self, size: u64) -> Result<i64> {
        self.lock().budget.deficit(size, self.dev.as_ref())
    }

    /// Evicts at least `bytes` (rounded up to pages) if the VBARs allow it, lowest priority first, each from
    /// the top down to its watermark limit. Returns the bytes freed.
    pub fn evict(&self, bytes: u64) -> Result<u64> {
        self.lock().evict(self.dev.as_ref(), bytes)
    }

    /// A new VBAR for a model of `size` bytes: reserves `va_factor × size` of address space, clamped to the
    /// device's capacity in whole pages (at least one page), with the watermark at the top and the VBAR at the
    /// top of the priority list.
    pub fn create_vbar(&self, size: u64) -> Result<VbarId> {
        let page = self.config.page_size;
        let mut st = self.lock();
        let wanted = size.saturating_mul(self.config.va_factor).div_ceil(page);
        let max = st.budget.capacity() / page;
        let nr_pages = wanted.min(max).max(1);
        let bytes = nr_pages * page;
        let base = self.dev.reserve(bytes)?;
        let id = VbarId::next();
        let nr_pages =
            usize::try_from(nr_pages).map_err(|_| Error::driver("vbar", "too many pages"))?;
        st.vbars.insert(id, Vbar::new(id, base, page, nr_pages));
        st.order.push(id);
        tracing::debug!(%id, size, pages = nr_pages, "vbar created");
        Ok(id)
    }

    /// Frees every page of the VBAR (pinned or not), releases its address space and forgets it.
    pub fn destroy(&self, id: VbarId) -> Result<()> {
        self.lock().destroy(self.dev.as_ref(), id)?;
        tracing::debug!(%id, "vbar destroyed");
        Ok(())
    }

    /// The VBAR's base address: a slot at byte `offset` of the model lives at `base + offset`.
    pub fn base(&self, id: VbarId) -> Result<DevPtr> {
        Ok(self.lock().vbar(id)?.base)
    }

    /// Faults `[offset, offset + size)` of the VBAR in (§2.2) and pins its pages:
    /// 1. evicts the budget's `deficit(0)` (absorbs other processes' spikes);
    /// 2. a range ending above the watermark is [`Fault::Offloaded`];
    /// 3. per page: a resident page gives its serial; at the first absent page the VBAR's absent pages up to
    ///    the range end are set against the budget (`capacity − (usage + absent·page + headroom)`) and
    ///    lower-priority pages are evicted (this VBAR's own top pages last) until they fit; if that lowered the
    ///    watermark below the range end, the fault is [`Fault::Offloaded`]. Each absent page is then mapped,
    ///    once more after evicting a page when the budget is short or the device refuses; a second refusal
    ///    makes the fault [`Fault::Offloaded`] (the range is streamed through scratch rather than the fetch
    ///    failing; pages it mapped before stay resident, unpinned, and the watermark stays where it was);
    /// 4. every page of the range gets one more pin.
    ///
    /// Errors are the device's other failures (and an unknown VBAR or a range past its end), never a full
    /// device.
    pub fn fault(&self, id: VbarId, offset: u64, size: u64) -> Result<Fault> {
        self.lock().fault(self.dev.as_ref(), id, offset, size)
    }

    /// Drops the pins a [`Fault::Resident`] fault of the same range took. Pages at or above the watermark whose
    /// last pin this was are freed now (an eviction passed them while they were pinned). Fails, changing
    /// nothing, when a page of the range holds no pin.
    pub fn unpin(&self, id: VbarId, offset: u64, size: u64) -> Result<()> {
        self.lock().unpin(self.dev.as_ref(), id, offset, size)
    }

    /// Moves the VBAR to the top of the priority list and resets its watermark to the top (every model load).
    pub fn prioritize(&self, id: VbarId) -> Result<()> {
        let mut st = self.lock();
        let v = st.vbar_mut(id)?;
        v.watermark = v.nr_pages();
        st.order.retain(|&o| o != id);
        st.order.push(id);
        Ok(())
    }

    /// Moves the VBAR to the bottom of the priority list (it is evicted first).
    pub fn deprioritize(&self, id: VbarId) -> Result<()> {
        let mut st = self.lock();
        st.vbar(id)?;
        st.order.retain(|&o| o != id);
        st.order.insert(0, id);
        Ok(())
    }

    /// Sets the watermark to `bytes` (rounded up to pages, at most the VBAR's size); lowering it frees the
    /// unpinned pages it passes now.
    pub fn set_watermark(&self, id: VbarId, bytes: u64) -> Result<()> {
        self.lock().set_watermark(self.dev.as_ref(), id, bytes)
    }

    /// Sets an eviction floor: eviction does not lower the watermark below `bytes` (rounded up to pages)
    /// until [`Arbiter::reset_limits`].
    pub fn set_watermark_limit(&self, id: VbarId, bytes: u64) -> Result<()> {
        let mut st = self.lock();
        let page = st.page_size;
        let v = st.vbar_mut(id)?;
        v.watermark_limit =
            usize::try_from(bytes.div_ceil(page)).unwrap_or(usize::MAX).min(v.nr_pages());
        Ok(())
    }

    /// Clears every VBAR's watermark limit (after every node, §4.4).
    pub fn reset_limits(&self) {
        for v in self.lock().vbars.values_mut() {
            v.watermark_limit = 0;
        }
    }

    /// Frees up to `bytes` (rounded up to pages) from the top of one VBAR, lowering its watermark down to
    /// its limit; pinned pages are passed. Returns the bytes freed (ComfyUI's `partially_unload`).
    pub fn free_memory(&self, id: VbarId, bytes: u64) -> Result<u64> {
        let mut st = self.lock();
        st.vbar(id)?;
        let page = st.page_size;
        let need = bytes.div_ceil(page);
        let freed = st.lower_watermarks(self.dev.as_ref(), &[id], |freed, _, _| freed < need)?;
        Ok(freed * page)
    }

    /// Bytes of the VBAR that are resident.
    pub fn loaded_bytes(&self, id: VbarId) -> Result<u64> {
        let st = self.lock();
        Ok(st.vbar(id)?.resident as u64 * st.page_size)
    }

    /// Residency bits of each page of the VBAR.
    pub fn residency(&self, id: VbarId) -> Result<Vec<PageState>> {
        Ok(self.lock().vbar(id)?.residency())
    }

    /// Pages the VBAR reserves.
    pub fn page_count(&self, id: VbarId) -> Result<usize> {
        Ok(self.lock().vbar(id)?.nr_pages())
    }

    /// The VBAR's watermark, in pages: pages at or above it fail to fault.
    pub fn watermark(&self, id: VbarId) -> Result<usize> {
        Ok(self.lock().vbar(id)?.watermark)
    }

    /// The VBAR's watermark limit, in pages.
    pub fn watermark_limit(&self, id: VbarId) -> Result<usize> {
        Ok(self.lock().vbar(id)?.watermark_limit)
    }

    /// The VBARs, lowest priority first.
    pub fn priority_order(&self) -> Vec<VbarId> {
        self.lock().order.clone()
    }

    /// One line describing the VBAR (numbers and a page map: `.` absent, `r` resident, `P` pinned, `|` the
    /// watermark).
    pub fn debug_line(&self, id: VbarId) -> Result<String> {
        Ok(self.lock().vbar(id)?.debug_line())
    }

    /// The whole device: usage and one line per VBAR, highest priority first (`log.memory = debug` prints it
    /// after each node).
    pub fn dump(&self) -> String {
        let st = self.lock();
        let mut out = format!(
            "vram: usage {} MiB of {} MiB, {} activation allocations",
            st.budget.usage() >> 20,
            st.budget.capacity() >> 20,
            st.allocs.len()
        );
        for id in st.order.iter().rev() {
            if let Some(v) = st.vbars.get(id) {
                out.push('\n');
                out.push_str(&v.debug_line());
            }
        }
        out
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for Arbiter {
    fn drop(&mut self) {
        let dev = self.dev.clone();
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if st.vbars.values().any(|v| v.resident > 0)
            && let Err(e) = dev.synchronize()
        {
            tracing::warn!(error = %e, "vram arbiter drop: synchronize failed");
        }
        for v in st.vbars.values_mut() {
            for p in 0..v.nr_pages() {
                if v.pages[p].mapped
                    && let Err(e) = v.unmap(p, dev.as_ref())
                {
                    tracing::warn!(error = %e, vbar = %v.id, page = p, "vram arbiter drop: unmap failed");
                }
            }
            if let Err(e) = dev.unreserve(v.base, v.reserved_bytes()) {
                tracing::warn!(error = %e, vbar = %v.id, "vram arbiter drop: unreserve failed");
            }
        }
    }
}

impl State {
    fn vbar(&self, id: VbarId) -> Result<&Vbar> {
        self.vbars.get(&id).ok_or_else(|| unknown(id))
    }

    fn vbar_mut(&mut self, id: VbarId) -> Result<&mut Vbar> {
        self.vbars.get_mut(&id).ok_or_else(|| unknown(id))
    }

    /// Evicts `bytes` rounded up to pages, walking the whole priority list.
    pub(super) fn evict(&mut self, dev: &dyn DeviceMemory, bytes: u64) -> Result<u64> {
        if bytes == 0 {
            return Ok(0);
        }
        let need = bytes.div_ceil(self.page_size);
        let ids = self.order.clone();
        let freed = self.lower_watermarks(dev, &ids, |freed, _, _| freed < need)?;
        if freed > 0 {
            tracing::debug!(bytes, freed_pages = freed, "vram evicted");
        }
        Ok(freed * self.page_size)
    }

    /// Evicts the budget's `deficit(size)` when it is positive.
    pub(super) fn evict_deficit(&mut self, dev: &dyn DeviceMemory, size: u64) -> Result<()> {
        let deficit = self.budget.deficit(size, dev)?;
        if deficit > 0 {
            self.evict(dev, deficit.unsigned_abs())?;
        }
        Ok(())
    }

    /// Walks `ids` in order (lowest priority first), lowering each watermark by one page at a time down to
    /// its limit while `more(pages freed so far, VBAR, its watermark)` holds, and frees the unpinned resident
    /// pages passed. Synchronises the device once before the first free and once after the last. Returns
    /// the pages freed.
    fn lower_watermarks(
        &mut self,
        dev: &dyn DeviceMemory,
        ids: &[VbarId],
        mut more: impl FnMut(u64, VbarId, usize) -> bool,
    ) -> Result<u64> {
        let mut freed = 0u64;
        let mut synced = false;
        for &id in ids {
            let Some(v) = self.vbars.get_mut(&id) else { continue };
            while v.watermark > v.watermark_limit && more(freed, id, v.watermark) {
                let p = v.watermark - 1;
                if v.freeable(p) {
                    if !synced {
                        dev.synchronize()?;
                        synced = true;
                    }
                    v.unmap(p, dev)?;
                    self.budget.sub(self.page_size);
                    freed += 1;
                }
                v.watermark = p;
            }
        }
        if synced {
            dev.synchronize()?;
        }
        Ok(freed)
    }

    fn fault(
        &mut self,
        dev: &dyn DeviceMemory,
        id: VbarId,
        offset: u64,
        size: u64,
    ) -> Result<Fault> {
        let page = self.page_size;
        let (first, end) = self.vbar(id)?.page_range(offset, size)?;
        if size == 0 {
            return Ok(Fault::Resident(self.vbar(id)?.signature(first, Vec::new())));
        }
        // (1) Absorb spikes of other processes seen by the last poll.
        self.evict_deficit(dev, 0)?;
        // (2) Above the watermark: stream it.
        if end > self.vbar(id)?.watermark {
            return Ok(Fault::Offloaded);
        }
        // (3) Page by page.
        let mut serials = Vec::with_capacity(end - first);
        let mut rationalised = false;
        for p in first..end {
            let v = self.vbar(id)?;
            if v.pages[p].mapped {
                serials.push(v.pages[p].serial);
                continue;
            }
            if !rationalised {
                rationalised = true;
                let absent = v.pages[..end].iter().filter(|pg| !pg.mapped).count() as u64;
                let surplus = self.budget.surplus(absent * page);
                if surplus < 0 {
                    let position = self.order.iter().position(|&o| o == id).unwrap_or(0);
                    let ids: Vec<VbarId> = self.order[..=position].to_vec();
                    let short = surplus.unsigned_abs();
                    self.lower_watermarks(dev, &ids, |freed, cur, wm| {
                        freed * page < short && !(cur == id && wm < end)
                    })?;
                }
                if end > self.vbar(id)?.watermark {
                    tracing::trace!(%id, end, "fault offloaded: own watermark lowered");
                    return Ok(Fault::Offloaded);
                }
            }
            let short = self.budget.deficit(page, dev)? > 0;
            let mapped = if short {
                false
            } else {
                match self.vbar_mut(id)?.map(p, dev) {
                    Ok(serial) => {
                        serials.push(serial);
                        true
                    }
                    Err(Error::OutOfMemory { .. }) => false,
                    Err(e) => return Err(e),
                }
            };
            if !mapped {
                self.evict(dev, page)?;
                if end > self.vbar(id)?.watermark {
                    return Ok(Fault::Offloaded);
                }
                match self.vbar_mut(id)?.map(p, dev) {
                    Ok(serial) => serials.push(serial),
                    Err(Error::OutOfMemory { requested, free }) => {
                        tracing::debug!(%id, page = p, requested, free, "fault offloaded: the device refused a page twice");
                        return Ok(Fault::Offloaded);
                    }
                    Err(e) => return Err(e),
                }
            }
            self.budget.add(page);
        }
        // (4) Pin the range.
        let v = self.vbar_mut(id)?;
        for pg in &mut v.pages[first..end] {
            pg.pin_count += 1;
        }
        Ok(Fault::Resident(v.signature(first, serials)))
    }

    fn destroy(&mut self, dev: &dyn DeviceMemory, id: VbarId) -> Result<()> {
        let v = self.vbars.get_mut(&id).ok_or_else(|| unknown(id))?;
        if v.resident > 0 {
            dev.synchronize()?;
        }
        for p in 0..v.nr_pages() {
            if v.pages[p].mapped {
                v.unmap(p, dev)?;
                self.budget.sub(self.page_size);
            }
        }
        let (base, reserved) = (v.base, v.reserved_bytes());
        self.vbars.remove(&id);
        self.order.retain(|&o| o != id);
        dev.unreserve(base, reserved)
    }

    fn unpin(&mut self, dev: &dyn DeviceMemory, id: VbarId, offset: u64, size: u64) -> Result<()> {
        if size == 0 {
            self.vbar(id)?;
            return Ok(());
        }
        let page = self.page_size;
        let v = self.vbars.get_mut(&id).ok_or_else(|| unknown(id))?;
        let (first, end) = v.page_range(offset, size)?;
        let end = end.min(v.nr_pages());
        let first = first.min(end);
        if let Some(p) = (first..end).find(|&p| v.pages[p].pin_count == 0) {
            return Err(Error::driver("vbar unpin", format!("page {p} of {id} holds no pin")));
        }
        let mut synced = false;
        for p in first..end {
            v.pages[p].pin_count -= 1;
            if p >= v.watermark && v.freeable(p) {
                if !synced {
                    dev.synchronize()?;
                    synced = true;
                }
                v.unmap(p, dev)?;
                self.budget.sub(page);
            }
        }
        if synced {
            dev.synchronize()?;
        }
        Ok(())
    }

    fn set_watermark(&mut self, dev: &dyn DeviceMemory, id: VbarId, bytes: u64) -> Result<()> {
        let page = self.page_size;
        let v = self.vbars.get_mut(&id).ok_or_else(|| unknown(id))?;
        let new = usize::try_from(bytes.div_ceil(page)).unwrap_or(usize::MAX).min(v.nr_pages());
        let mut synced = false;
        for p in new..v.watermark {
            if v.freeable(p) {
                if !synced {
                    dev.synchronize()?;
                    synced = true;
                }
                v.unmap(p, dev)?;
                self.budget.sub(page);
            }
        }
        v.watermark = new;
        if synced {
            dev.synchronize()?;
        }
        Ok(())
    }
}
