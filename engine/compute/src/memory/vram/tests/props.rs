//! Property tests: random sequences of VBAR, activation and scratch operations against a small simulated
//! device, with the arbiter's invariants checked after every step.
//!
//! A model kept beside the arbiter tracks the pins each fault took and a generation per page (bumped each
//! time the page is seen going from absent to resident), so the checks do not trust the arbiter's own
//! bookkeeping.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::{MIB, PAGE};
use crate::error::Error;
use crate::memory::device::{DevPtr, DeviceMemory, StreamId};
use crate::memory::sim::SimDevice;
use crate::memory::vram::{
    Arbiter, Fault, ManualClock, PageState, Scratch, Signature, VbarId, VramConfig,
};

const CAPACITY_PAGES: u64 = 10;

#[derive(Debug, Clone)]
enum Op {
    Create { pages: u64 },
    Fault { v: usize, offset: u64, size: u64 },
    Unpin { pin: usize },
    Evict { bytes: u64 },
    Prioritize { v: usize },
    Deprioritize { v: usize },
    SetWatermark { v: usize, bytes: u64 },
    SetLimit { v: usize, bytes: u64 },
    ResetLimits,
    FreeMemory { v: usize, bytes: u64 },
    Destroy { v: usize },
    Alloc { two_mib: u64, less: u64 },
    Free { a: usize },
    External { pages: u64 },
    Tick,
    ScratchTake { bytes: u64 },
    ScratchReset,
}

fn op() -> impl Strategy<Value = Op> {
    let v = 0usize..4;
    prop_oneof![
        2 => (1u64..=8).prop_map(|pages| Op::Create { pages }),
        // Whole pages trimmed at either end by nothing, a byte or a quarter page, so ranges of the same pages
        // come back often; sometimes an empty range.
        12 => (v.clone(), 0u64..9, 0u64..=3, 0usize..3, 0usize..3).prop_map(|(v, page, pages, head, tail)| {
            let trim = [0, 1, PAGE / 4];
            let size = (pages * PAGE).saturating_sub(trim[head] + trim[tail]);
            Op::Fault { v, offset: page * PAGE + trim[head], size }
        }),
        5 => (0usize..16).prop_map(|pin| Op::Unpin { pin }),
        2 => (0..6 * PAGE).prop_map(|bytes| Op::Evict { bytes }),
        4 => v.clone().prop_map(|v| Op::Prioritize { v }),
        1 => v.clone().prop_map(|v| Op::Deprioritize { v }),
        1 => (v.clone(), 0..10 * PAGE).prop_map(|(v, bytes)| Op::SetWatermark { v, bytes }),
        1 => (v.clone(), 0..6 * PAGE).prop_map(|(v, bytes)| Op::SetLimit { v, bytes }),
        1 => Just(Op::ResetLimits),
        1 => (v.clone(), 0..4 * PAGE).prop_map(|(v, bytes)| Op::FreeMemory { v, bytes }),
        1 => v.prop_map(|v| Op::Destroy { v }),
        3 => (1u64..=24, 0u64..256).prop_map(|(two_mib, less)| Op::Alloc { two_mib, less }),
        2 => (0usize..8).prop_map(|a| Op::Free { a }),
        1 => (0u64..=4).prop_map(|pages| Op::External { pages }),
        1 => Just(Op::Tick),
        1 => (0..40 * MIB).prop_map(|bytes| Op::ScratchTake { bytes }),
        1 => Just(Op::ScratchReset),
    ]
}

/// One VBAR as seen from outside before or after an operation.
#[derive(Debug, Clone)]
struct View {
    pages: Vec<PageState>,
    watermark: usize,
}

struct Harness {
    sim: Arc<SimDevice>,
    clock: Arc<ManualClock>,
    arb: Arc<Arbiter>,
    live: Vec<VbarId>,
    /// Outstanding resident faults: (VBAR, offset, size).
    pins: Vec<(VbarId, u64, u64)>,
    /// The model's pin count per (VBAR, page).
    pin_counts: BTreeMap<(VbarId, usize), u32>,
    /// Generation per (VBAR, page): bumped whenever the page is seen becoming resident.
    gens: BTreeMap<(VbarId, usize), u64>,
    /// Last resident signature per faulted page range, with the generations of its pages then.
    sigs: BTreeMap<(VbarId, usize, usize), (Signature, Vec<u64>)>,
    allocs: Vec<DevPtr>,
    scratch: Option<Scratch>,
}

impl Harness {
    fn new() -> Harness {
        let sim = Arc::new(SimDevice::new(CAPACITY_PAGES * PAGE));
        let clock = Arc::new(ManualClock::new());
        let config = VramConfig {
            headroom: PAGE,
            driver_headroom: PAGE,
            scratch_va: 64 * MIB,
            ..VramConfig::default()
        };
        let dev: Arc<dyn DeviceMemory> = sim.clone();
        let arb = Arc::new(Arbiter::with_clock(dev, config, clock.clone()).expect("arbiter"));
        Harness {
            sim,
            clock,
            arb,
            live: Vec::new(),
            pins: Vec::new(),
            pin_counts: BTreeMap::new(),
            gens: BTreeMap::new(),
            sigs: BTreeMap::new(),
            allocs: Vec::new(),
            scratch: None,
        }
    }

    fn views(&self) -> BTreeMap<VbarId, View> {
        self.live
            .iter()
            .map(|&id| {
                let pages = self.arb.residency(id).expect("residency");
                let watermark = self.arb.watermark(id).expect("watermark");
                (id, View { pages, watermark })
            })
            .collect()
    }

    fn pick(&self, v: usize) -> Option<VbarId> {
        (!self.live.is_empty()).then(|| self.live[v % self.live.len()])
    }

    fn page_range(offset: u64, size: u64) -> std::ops::Range<usize> {
        if size == 0 {
            return 0..0;
        }
        (offset / PAGE) as usize..(offset + size).div_ceil(PAGE) as usize
    }

    /// Applies `op`; returns whether watermarks may rise for `raised` and whether the op may evict.
    fn apply(&mut self, op: &Op) -> Step {
        let mut step = Step::default();
        match *op {
            Op::Create { pages } => {
                let id = self.arb.create_vbar(pages * PAGE / 10).expect("create");
                self.live.push(id);
            }
            Op::Fault { v, offset, size } => {
                let Some(id) = self.pick(v) else { return step };
                // Mostly inside the VBAR, sometimes past its end.
                let pages = self.arb.page_count(id).expect("count") as u64 + 1;
                let offset = (offset / PAGE) % pages * PAGE + offset % PAGE;
                step.evicts = true;
                match self.arb.fault(id, offset, size) {
                    Ok(Fault::Resident(sig)) => {
                        let end = Self::page_range(offset, size).end;
                        assert!(
                            end <= self.arb.watermark(id).expect("watermark"),
                            "resident above the watermark"
                        );
                        if size > 0 {
                            self.pins.push((id, offset, size));
                        }
                        for p in Self::page_range(offset, size) {
                            *self.pin_counts.entry((id, p)).or_default() += 1;
                        }
                        if size > 0 {
                            step.signed = Some((id, offset, size, sig));
                        }
                    }
                    Ok(Fault::Offloaded) => {
                        // Either the range reaches above the watermark, or the device refused a page twice
                        // (it has no room for one now).
                        let end = Self::page_range(offset, size).end;
                        let watermark = self.arb.watermark(id).expect("watermark");
                        let free = self.sim.mem_info().expect("mem info").free;
                        assert!(
                            end > watermark || free < PAGE,
                            "offloaded although pages ..{end} are below the watermark {watermark} and \
                             the device has {free} bytes free"
                        );
                    }
                    // A full device streams the range; it is never an error.
                    Err(e) => panic!("fault failed: {e}"),
                }
            }
            Op::Unpin { pin } => {
                if self.pins.is_empty() {
                    return step;
                }
                let (id, offset, size) = self.pins.swap_remove(pin % self.pins.len());
                self.arb.unpin(id, offset, size).expect("unpin of a held pin");
                for p in Self::page_range(offset, size) {
                    let c = self.pin_counts.get_mut(&(id, p)).expect("pinned");
                    *c -= 1;
                }
            }
            Op::Evict { bytes } => {
                step.evicts = true;
                step.freed = Some(self.arb.evict(bytes).expect("evict"));
            }
            Op::Prioritize { v } => {
                let Some(id) = self.pick(v) else { return step };
                self.arb.prioritize(id).expect("prioritize");
                step.raised = Some(id);
                step.moved = Some((id, true));
                let top = self.arb.page_count(id).expect("count");
                assert_eq!(
                    self.arb.watermark(id).expect("watermark"),
                    top,
                    "prioritising resets the watermark"
                );
            }
            Op::Deprioritize { v } => {
                let Some(id) = self.pick(v) else { return step };
                self.arb.deprioritize(id).expect("deprioritize");
                step.moved = Some((id, false));
            }
            Op::SetWatermark { v, bytes } => {
                let Some(id) = self.pick(v) else { return step };
                self.arb.set_watermark(id, bytes).expect("set watermark");
                step.raised = Some(id);
                let want =
                    (bytes.div_ceil(PAGE) as usize).min(self.arb.page_count(id).expect("count"));
                assert_eq!(self.arb.watermark(id).expect("watermark"), want);
            }
            Op::SetLimit { v, bytes } => {
                let Some(id) = self.pick(v) else { return step };
                self.arb.set_watermark_limit(id, bytes).expect("set limit");
                let want =
                    (bytes.div_ceil(PAGE) as usize).min(self.arb.page_count(id).expect("count"));
                assert_eq!(self.arb.watermark_limit(id).expect("limit"), want);
            }
            Op::ResetLimits => {
                self.arb.reset_limits();
                for &id in &self.live {
                    assert_eq!(self.arb.watermark_limit(id).expect("limit"), 0);
                }
            }
            Op::FreeMemory { v, bytes } => {
                let Some(id) = self.pick(v) else { return step };
                step.freed = Some(self.arb.free_memory(id, bytes).expect("free memory"));
            }
            Op::Destroy { v } => {
                let Some(id) = self.pick(v) else { return step };
                self.arb.destroy(id).expect("destroy");
                self.live.retain(|&l| l != id);
                self.pins.retain(|&(l, _, _)| l != id);
                self.pin_counts.retain(|&(l, _), _| l != id);
                self.gens.retain(|&(l, _), _| l != id);
                self.sigs.retain(|&(l, _, _), _| l != id);
            }
            Op::Alloc { two_mib, less } => {
                step.evicts = true;
                // Sizes whose accounting equals what the device takes, so usage can be compared exactly.
                match self.arb.alloc(two_mib * 2 * MIB - less) {
                    Ok(ptr) => self.allocs.push(ptr),
                    Err(Error::OutOfMemory { .. }) => {}
                    Err(e) => panic!("alloc failed: {e}"),
                }
            }
            Op::Free { a } => {
                if self.allocs.is_empty() {
                    return step;
                }
                let ptr = self.allocs.swap_remove(a % self.allocs.len());
                self.arb.free(ptr).expect("free");
            }
            Op::External { pages } => self.sim.set_external_usage(pages * PAGE),
            Op::Tick => self.clock.advance(Duration::from_millis(1000)),
            Op::ScratchTake { bytes } => {
                step.evicts = true;
                if self.scratch.is_none() {
                    self.scratch =
                        Some(Scratch::new(self.arb.clone(), StreamId(1)).expect("scratch"));
                }
                let s = self.scratch.as_mut().expect("made above");
                match s.take(bytes) {
                    Ok(ptr) => {
                        assert!(ptr.0 + bytes <= s.base().0 + s.mapped(), "the slice is backed");
                        assert_eq!((ptr.0 - s.base().0) % crate::memory::vram::SCRATCH_ALIGN, 0);
                    }
                    Err(Error::OutOfMemory { .. }) => {}
                    Err(e) => panic!("scratch failed: {e}"),
                }
            }
            Op::ScratchReset => {
                if let Some(s) = self.scratch.as_mut() {
                    s.reset();
                }
            }
        }
        step
    }

    fn check(
        &mut self,
        op: &Op,
        order_before: &[VbarId],
        before: &BTreeMap<VbarId, View>,
        step: Step,
    ) {
        let after = self.views();
        let dump = self.arb.dump();

        // The priority list changes only by creating, destroying, prioritising and deprioritising.
        let mut expected: Vec<VbarId> =
            order_before.iter().copied().filter(|id| self.live.contains(id)).collect();
        if let Some(&new) = self.live.iter().find(|id| !order_before.contains(id)) {
            expected.push(new);
        }
        if let Some((id, top)) = step.moved {
            expected.retain(|&o| o != id);
            if top {
                expected.push(id);
            } else {
                expected.insert(0, id);
            }
        }
        assert_eq!(self.arb.priority_order(), expected, "{op:?}: priority list");

        // Usage is exactly what the device holds for us, and within its capacity.
        assert_eq!(self.arb.usage(), self.sim.used(), "{op:?}\n{dump}");
        assert!(self.arb.usage() <= CAPACITY_PAGES * PAGE, "{op:?}\n{dump}");

        let mut lost_pages = 0u64;
        for (&id, view) in &after {
            let base = self.arb.base(id).expect("base");
            let resident = view.pages.iter().filter(|p| p.resident).count() as u64;
            assert_eq!(self.arb.loaded_bytes(id).expect("loaded"), resident * PAGE);
            for (p, state) in view.pages.iter().enumerate() {
                let pins = self.pin_counts.get(&(id, p)).copied().unwrap_or(0);
                assert_eq!(state.pinned, pins > 0, "{op:?}: pin bit of {id} page {p}\n{dump}");
                assert!(
                    !state.pinned || state.resident,
                    "{op:?}: pinned page {p} of {id} unmapped\n{dump}"
                );
                assert_eq!(
                    state.resident,
                    self.sim.is_mapped(base.offset(p as u64 * PAGE), PAGE),
                    "{op:?}: residency of {id} page {p} disagrees with the device"
                );
                assert!(
                    !state.resident || p < view.watermark || state.pinned,
                    "{op:?}: unpinned resident page {p} of {id} above the watermark\n{dump}"
                );
            }
            let Some(old) = before.get(&id) else { continue };
            // Watermarks only go down, except by prioritising or setting them.
            if step.raised != Some(id) {
                assert!(view.watermark <= old.watermark, "{op:?}: watermark of {id} rose\n{dump}");
                // Eviction stops at the limit.
                let limit = self.arb.watermark_limit(id).expect("limit");
                assert!(
                    view.watermark == old.watermark || view.watermark >= limit,
                    "{op:?}: watermark of {id} lowered below its limit {limit}\n{dump}"
                );
            }
            // Within a VBAR pages are lost from the top: all of them at or above the new watermark.
            for (p, (was, is)) in old.pages.iter().zip(&view.pages).enumerate() {
                if was.resident && !is.resident {
                    lost_pages += 1;
                    assert!(
                        p >= view.watermark,
                        "{op:?}: {id} lost page {p} below its watermark\n{dump}"
                    );
                    assert!(
                        step.evicts
                            || step.freed.is_some()
                            || step.raised == Some(id)
                            || matches!(op, Op::Unpin { .. }),
                        "{op:?} freed a page\n{dump}"
                    );
                }
                if !was.resident && is.resident {
                    *self.gens.entry((id, p)).or_default() += 1;
                }
            }
        }
        if let Some(freed) = step.freed {
            assert_eq!(freed, lost_pages * PAGE, "{op:?}: bytes freed");
        }

        // Across VBARs, a VBAR loses pages only once every lower one is down to its limit.
        if step.evicts {
            for (rank, id) in order_before.iter().enumerate() {
                let (Some(old), Some(new)) = (before.get(id), after.get(id)) else { continue };
                let lost = old.pages.iter().zip(&new.pages).any(|(w, i)| w.resident && !i.resident);
                if !lost {
                    continue;
                }
                for lower in &order_before[..rank] {
                    let Some(low) = after.get(lower) else { continue };
                    let limit = self.arb.watermark_limit(*lower).expect("limit");
                    assert!(
                        low.watermark <= limit,
                        "{op:?}: {id} lost pages while the lower {lower} still had some above its limit\n{dump}"
                    );
                }
            }
        }

        // A resident signature equals the last one for the range exactly when no page was re-mapped since.
        if let Some((id, offset, size, sig)) = step.signed {
            let pages = Self::page_range(offset, size);
            let gens: Vec<u64> =
                pages.clone().map(|p| self.gens.get(&(id, p)).copied().unwrap_or(0)).collect();
            let key = (id, pages.start, pages.end);
            if let Some((old_sig, old_gens)) = self.sigs.get(&key) {
                assert_eq!(
                    sig.matches(Some(old_sig)),
                    &gens == old_gens,
                    "{op:?}: signature {sig:?} vs {old_sig:?}, generations {gens:?} vs {old_gens:?}"
                );
            }
            self.sigs.insert(key, (sig, gens));
        }
    }
}

/// What an applied operation allows the checks to see.
#[derive(Default)]
struct Step {
    /// This VBAR's watermark may have risen.
    raised: Option<VbarId>,
    /// The operation may evict across VBARs (lowest priority first).
    evicts: bool,
    /// Bytes the operation reported freeing.
    freed: Option<u64>,
    /// A resident fault's range and signature.
    signed: Option<(VbarId, u64, u64, Signature)>,
    /// A VBAR moved to the top (`true`) or the bottom of the priority list.
    moved: Option<(VbarId, bool)>,
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn the_arbiter_keeps_its_invariants(ops in prop::collection::vec(op(), 1..96)) {
        let mut h = Harness::new();
        for op in &ops {
            let order = h.arb.priority_order();
            let before = h.views();
            let step = h.apply(op);
            h.check(op, &order, &before, step);
        }
        // Everything given back leaves nothing behind.
        for (id, offset, size) in std::mem::take(&mut h.pins) {
            h.arb.unpin(id, offset, size).expect("unpin");
        }
        for ptr in std::mem::take(&mut h.allocs) {
            h.arb.free(ptr).expect("free");
        }
        h.scratch = None;
        for id in std::mem::take(&mut h.live) {
            h.arb.destroy(id).expect("destroy");
        }
        prop_assert_eq!(h.arb.usage(), 0);
        prop_assert_eq!(h.sim.used(), 0);
    }
}
