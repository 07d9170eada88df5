//! Rule-by-rule tests of the VRAM arbiter, scratch buffers and activation allocator against [`SimDevice`],
//! plus property tests (`props`) over random operation sequences.

mod props;

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::error::Error;
use crate::memory::device::{DevPtr, DeviceAllocator, DeviceMemory, StreamId};
use crate::memory::sim::SimDevice;

const MIB: u64 = 1 << 20;
const PAGE: u64 = 32 * MIB;

/// A simulated device, a hand-driven clock and an arbiter over them.
struct Rig {
    sim: Arc<SimDevice>,
    clock: Arc<ManualClock>,
    arb: Arc<Arbiter>,
}

/// A budget that is exactly the capacity: no headrooms.
fn exact() -> VramConfig {
    VramConfig { headroom: 0, driver_headroom: 0, ..VramConfig::default() }
}

fn rig_with(pages: u64, config: VramConfig) -> Rig {
    let sim = Arc::new(SimDevice::new(pages * PAGE));
    let clock = Arc::new(ManualClock::new());
    let dev: Arc<dyn DeviceMemory> = sim.clone();
    let arb = Arc::new(Arbiter::with_clock(dev, config, clock.clone()).expect("arbiter"));
    Rig { sim, clock, arb }
}

fn rig(pages: u64) -> Rig {
    rig_with(pages, exact())
}

impl Rig {
    /// A VBAR of exactly `pages` pages (its model is a tenth of that, as the VA factor is 10).
    fn vbar(&self, pages: u64) -> VbarId {
        let id = self.arb.create_vbar(pages * PAGE / 10).expect("create");
        assert_eq!(self.arb.page_count(id).expect("count"), pages as usize);
        id
    }

    /// Faults pages `first..end` and expects them resident.
    fn resident(&self, id: VbarId, first: u64, end: u64) -> Signature {
        match self.arb.fault(id, first * PAGE, (end - first) * PAGE).expect("fault") {
            Fault::Resident(sig) => sig,
            Fault::Offloaded => {
                panic!("pages {first}..{end} of {id} offloaded: {}", self.arb.dump())
            }
        }
    }

    /// Faults pages `first..end` resident and drops the pins again.
    fn load(&self, id: VbarId, first: u64, end: u64) {
        self.resident(id, first, end);
        self.arb.unpin(id, first * PAGE, (end - first) * PAGE).expect("unpin");
    }

    fn fault(&self, id: VbarId, first: u64, end: u64) -> Fault {
        self.arb.fault(id, first * PAGE, (end - first) * PAGE).expect("fault")
    }

    /// The residency map as a string: `.` absent, `r` resident, `P` pinned.
    fn map(&self, id: VbarId) -> String {
        self.arb
            .residency(id)
            .expect("residency")
            .iter()
            .map(|p| match (p.resident, p.pinned) {
                (false, _) => '.',
                (true, false) => 'r',
                (true, true) => 'P',
            })
            .collect()
    }

    /// Checks that the arbiter's count is what the device really holds.
    fn check_usage(&self) {
        assert_eq!(self.arb.usage(), self.sim.used(), "{}", self.arb.dump());
    }
}

#[test]
fn create_reserves_ten_times_the_model_clamped_to_the_device() {
    let r = rig(8);
    let a = r.arb.create_vbar(10 * MIB).expect("create");
    assert_eq!(r.arb.page_count(a).expect("count"), 4, "100 MiB of VA is 4 pages");
    assert_eq!(r.arb.watermark(a).expect("watermark"), 4);
    let b = r.arb.create_vbar(100 * MIB).expect("create");
    assert_eq!(
        r.arb.page_count(b).expect("count"),
        8,
        "1000 MiB of VA is clamped to the 8-page device"
    );
    assert_eq!(r.arb.priority_order(), vec![a, b], "new VBARs enter at the top");
    assert_eq!(r.sim.used(), 0, "nothing is mapped before a fault");
    // The base is the start of a reservation: the page addresses can be mapped.
    let base = r.arb.base(a).expect("base");
    r.resident(a, 3, 4);
    assert!(r.sim.is_mapped(base.offset(3 * PAGE), PAGE));
}

#[test]
fn fault_maps_pins_and_signs_the_range() {
    let r = rig(8);
    let a = r.vbar(4);
    let Fault::Resident(sig) = r.arb.fault(a, 0, PAGE + 1).expect("fault") else {
        panic!("offloaded")
    };
    assert_eq!(sig.serials(), &[1, 1]);
    assert_eq!(sig.first_page(), 0);
    assert_eq!(sig.vbar(), a);
    assert_eq!(r.map(a), "PP..");
    assert_eq!(r.arb.loaded_bytes(a).expect("loaded"), 2 * PAGE);
    assert!(r.sim.is_mapped(r.arb.base(a).expect("base"), 2 * PAGE));
    r.check_usage();

    // A second fault finds the pages resident: same signature, second pin.
    let again = r.resident(a, 0, 2);
    assert!(again.matches(Some(&sig)));
    r.arb.unpin(a, 0, 2 * PAGE).expect("unpin");
    assert_eq!(r.map(a), "PP..", "one pin left");
    r.arb.unpin(a, 0, PAGE + 1).expect("unpin");
    assert_eq!(r.map(a), "rr..", "unpinned pages below the watermark stay resident");
    let err = r.arb.unpin(a, 0, PAGE).expect_err("no pin left");
    assert!(err.to_string().contains("holds no pin"), "{err}");
}

#[test]
fn a_zero_byte_fault_touches_nothing() {
    let r = rig(8);
    let a = r.vbar(4);
    let Fault::Resident(sig) = r.arb.fault(a, PAGE, 0).expect("fault") else { panic!("offloaded") };
    assert!(sig.serials().is_empty());
    assert_eq!(r.map(a), "....");
    r.arb.unpin(a, PAGE, 0).expect("nothing to unpin");
}

#[test]
fn signature_changes_only_when_a_page_is_mapped_again() {
    let r = rig(8);
    let a = r.vbar(4);
    let first = r.resident(a, 1, 3);
    r.arb.unpin(a, PAGE, 2 * PAGE).expect("unpin");
    assert!(r.resident(a, 1, 3).matches(Some(&first)), "nothing was re-mapped");
    r.arb.unpin(a, PAGE, 2 * PAGE).expect("unpin");
    // Evict page 2 only, then prioritise so it can be faulted again.
    r.arb.set_watermark(a, 2 * PAGE).expect("lower");
    assert_eq!(r.map(a), ".r..");
    r.arb.prioritize(a).expect("prioritize");
    let after = r.resident(a, 1, 3);
    assert_eq!(after.serials(), &[1, 2]);
    assert!(!after.matches(Some(&first)), "page 2 was re-allocated");
    assert!(!after.matches(None));
}

#[test]
fn ranges_above_the_watermark_or_the_clamp_are_offloaded() {
    let r = rig(8);
    let a = r.vbar(4);
    r.arb.set_watermark(a, PAGE + 1).expect("set");
    assert_eq!(r.arb.watermark(a).expect("watermark"), 2);
    assert_eq!(r.fault(a, 1, 3), Fault::Offloaded);
    assert_eq!(r.map(a), "....", "an offloaded fault maps and pins nothing");
    r.resident(a, 0, 2);
    // Past the reservation (the clamp) always offloads, even with the watermark at the top.
    r.arb.prioritize(a).expect("prioritize");
    assert_eq!(r.fault(a, 3, 5), Fault::Offloaded);
}

#[test]
fn a_fault_evicts_lower_priority_vbars_first_from_their_top() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(4);
    r.load(a, 0, 4);
    r.load(b, 0, 4);
    let c = r.vbar(8);
    r.resident(c, 0, 2);
    assert_eq!(r.map(a), "rr..", "the lowest VBAR loses its top two pages");
    assert_eq!(r.arb.watermark(a).expect("watermark"), 2);
    assert_eq!(r.map(b), "rrrr");
    assert_eq!(r.map(c), "PP......");
    r.check_usage();

    // With a floor on the lowest VBAR, the next one up pays.
    r.arb.set_watermark_limit(a, 2 * PAGE).expect("limit");
    r.resident(c, 2, 3);
    assert_eq!(r.map(a), "rr..");
    assert_eq!(r.map(b), "rrr.");
}

#[test]
fn a_lower_vbar_never_evicts_a_higher_one_to_fault() {
    let r = rig(8);
    let low = r.vbar(4);
    let high = r.vbar(8);
    r.load(high, 0, 8);
    assert_eq!(r.fault(low, 0, 1), Fault::Offloaded);
    assert_eq!(r.map(high), "rrrrrrrr");
    assert_eq!(r.arb.watermark(low).expect("watermark"), 0, "its own watermark went down instead");
    // It stays offloaded (no thrash) until it is prioritised.
    assert_eq!(r.fault(low, 0, 1), Fault::Offloaded);
    r.arb.prioritize(low).expect("prioritize");
    r.resident(low, 0, 1);
    assert_eq!(r.map(high), "rrrrrrr.", "now the other VBAR is below it");
}

#[test]
fn a_model_bigger_than_the_budget_trims_its_own_top() {
    // Budget of 6 pages: 8 pages of capacity, 2 of headroom.
    let r = rig_with(8, VramConfig { headroom: 2 * PAGE, ..exact() });
    let x = r.vbar(8);
    for p in 0..6 {
        r.load(x, p, p + 1);
    }
    let evictions_before = r.sim.counters().unmaps;
    assert_eq!(r.fault(x, 7, 8), Fault::Offloaded);
    assert_eq!(r.arb.watermark(x).expect("watermark"), 7);
    assert_eq!(r.fault(x, 6, 7), Fault::Offloaded);
    assert_eq!(r.arb.watermark(x).expect("watermark"), 6);
    assert_eq!(r.map(x), "rrrrrr..");
    assert_eq!(r.sim.counters().unmaps, evictions_before, "nothing resident had to go");
    // Later faults above the watermark fail fast; below it they hit.
    assert_eq!(r.fault(x, 7, 8), Fault::Offloaded);
    r.resident(x, 2, 4);
}

#[test]
fn lower_addresses_of_a_vbar_keep_room_for_themselves() {
    // Budget of 6 pages. Faulting page 5 first is fine (pages 0..6 fit), but page 7 would leave no room for
    // the six absent pages below it, which rank higher: it is offloaded and the watermark drops.
    let r = rig_with(8, VramConfig { headroom: 2 * PAGE, ..exact() });
    let x = r.vbar(8);
    r.load(x, 5, 6);
    assert_eq!(r.fault(x, 7, 8), Fault::Offloaded);
    assert_eq!(r.arb.watermark(x).expect("watermark"), 7);
    for p in 0..5 {
        r.load(x, p, p + 1);
    }
    assert_eq!(r.map(x), "rrrrrr..");
}

#[test]
fn a_refused_page_is_retried_once_after_evicting_a_page() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(8);
    r.load(a, 0, 4);
    // Another process takes 3 pages; the budget has not polled since, so it still sees room.
    r.sim.set_external_usage(3 * PAGE);
    r.resident(b, 0, 2);
    assert_eq!(r.map(a), "rrr.", "exactly one page of the lowest VBAR made room for the retry");
    assert_eq!(r.map(b), "PP......");
    r.check_usage();
}

#[test]
fn a_second_refusal_streams_the_range_instead_of_failing() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(8);
    r.load(a, 0, 1);
    r.sim.set_external_usage(8 * PAGE);
    assert_eq!(r.fault(b, 0, 1), Fault::Offloaded, "no room even after eviction: streamed");
    assert_eq!(r.map(a), "....", "the retry evicted a page first");
    assert_eq!(r.map(b), "........", "nothing was pinned");
    assert_eq!(r.arb.watermark(b).expect("watermark"), 8, "a refusal does not lower the watermark");
    r.check_usage();
}

#[test]
fn a_refusal_in_the_middle_of_a_range_keeps_the_pages_mapped_before_it() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(8);
    // The budget polls an empty device here and does not poll again (the clock stands still).
    r.load(a, 0, 1);
    r.arb.set_watermark_limit(b, 8 * PAGE).expect("limit");
    // Another process leaves room for one page besides a's; the budget still sees the whole device.
    r.sim.set_external_usage(6 * PAGE);
    // Page 0 maps, page 1 maps after evicting a's page, page 2 is refused twice: the range is streamed.
    assert_eq!(r.fault(b, 0, 4), Fault::Offloaded);
    assert_eq!(r.map(a), "....");
    assert_eq!(r.map(b), "rr......", "the pages mapped before stay resident, unpinned");
    assert_eq!(r.arb.watermark(b).expect("watermark"), 8);
    r.check_usage();
    // Once the device has room again the same range faults in, reusing the two pages.
    r.sim.set_external_usage(0);
    r.resident(b, 0, 4);
    assert_eq!(r.map(b), "PPPP....");
    r.check_usage();
}

#[test]
fn every_fault_first_absorbs_a_spike_the_driver_reports() {
    let r = rig_with(8, VramConfig { driver_headroom: PAGE, ..exact() });
    let a = r.vbar(4);
    r.load(a, 0, 4);
    // Another process takes the rest of the device; the next poll sees no free memory, a page short of the
    // driver headroom.
    r.sim.set_external_usage(4 * PAGE);
    r.clock.advance(Duration::from_millis(2000));
    r.resident(a, 0, 1);
    assert_eq!(r.map(a), "Prr.", "even a fault that hits evicts the deficit");
    assert_eq!(r.arb.watermark(a).expect("watermark"), 3);
}

#[test]
fn eviction_walks_up_from_the_lowest_vbar_and_passes_pinned_pages() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(4);
    r.load(a, 0, 4);
    r.load(b, 0, 4);
    r.resident(a, 3, 4);
    let syncs = r.sim.counters().syncs;
    assert_eq!(r.arb.evict(PAGE + 1).expect("evict"), 2 * PAGE, "rounded up to two pages");
    assert_eq!(
        r.sim.counters().syncs,
        syncs + 2,
        "one sync before the first free and one after the last"
    );
    assert_eq!(r.map(a), "r..P", "the pinned top page was passed, not freed");
    assert_eq!(r.arb.watermark(a).expect("watermark"), 1);
    assert_eq!(r.map(b), "rrrr");
    r.check_usage();

    // The passed page is freed at its last unpin, being above the watermark.
    r.arb.unpin(a, 3 * PAGE, PAGE).expect("unpin");
    assert_eq!(r.map(a), "r...");
    r.check_usage();

    // Limits are floors; clearing them lets eviction go further.
    r.arb.set_watermark_limit(b, 3 * PAGE).expect("limit");
    assert_eq!(r.arb.evict(4 * PAGE).expect("evict"), 2 * PAGE);
    assert_eq!(r.map(a), "....");
    assert_eq!(r.map(b), "rrr.");
    assert_eq!(r.arb.watermark_limit(b).expect("limit"), 3);
    r.arb.reset_limits();
    assert_eq!(r.arb.watermark_limit(b).expect("limit"), 0);
    assert_eq!(r.arb.evict(PAGE).expect("evict"), PAGE);
    assert_eq!(r.map(b), "rr..");

    let syncs = r.sim.counters().syncs;
    assert_eq!(r.arb.evict(0).expect("evict"), 0);
    assert_eq!(r.sim.counters().syncs, syncs, "nothing freed, no sync");
}

#[test]
fn prioritize_and_deprioritize_move_vbars_in_the_list() {
    let r = rig(8);
    let a = r.vbar(2);
    let b = r.vbar(2);
    let c = r.vbar(2);
    assert_eq!(r.arb.priority_order(), vec![a, b, c]);
    r.arb.set_watermark(a, 0).expect("set");
    r.arb.prioritize(a).expect("prioritize");
    assert_eq!(r.arb.priority_order(), vec![b, c, a]);
    assert_eq!(r.arb.watermark(a).expect("watermark"), 2, "prioritising resets the watermark");
    r.arb.deprioritize(c).expect("deprioritize");
    assert_eq!(r.arb.priority_order(), vec![c, b, a]);
    r.load(a, 0, 2);
    r.load(b, 0, 2);
    r.load(c, 0, 2);
    r.arb.evict(PAGE).expect("evict");
    assert_eq!(r.map(c), "r.", "the deprioritised VBAR goes first");
}

#[test]
fn set_watermark_frees_unpinned_pages_now_and_may_raise_it() {
    let r = rig(8);
    let a = r.vbar(4);
    r.load(a, 0, 4);
    r.resident(a, 2, 3);
    r.arb.set_watermark(a, PAGE).expect("set");
    assert_eq!(r.map(a), "r.P.", "the pinned page stays until its unpin");
    r.check_usage();
    r.arb.set_watermark(a, 100 * PAGE).expect("raise");
    assert_eq!(r.arb.watermark(a).expect("watermark"), 4, "clamped to the VBAR");
    r.arb.unpin(a, 2 * PAGE, PAGE).expect("unpin");
    assert_eq!(r.map(a), "r.r.", "below the raised watermark again, so it stays");
}

#[test]
fn free_memory_takes_from_the_top_of_one_vbar() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(4);
    r.load(a, 0, 4);
    r.load(b, 0, 4);
    assert_eq!(r.arb.free_memory(b, PAGE + 1).expect("free"), 2 * PAGE);
    assert_eq!(r.map(b), "rr..");
    assert_eq!(r.map(a), "rrrr");
    r.arb.set_watermark_limit(b, PAGE).expect("limit");
    assert_eq!(r.arb.free_memory(b, 10 * PAGE).expect("free"), PAGE, "stops at the limit");
    assert_eq!(r.map(b), "r...");
    r.check_usage();
}

#[test]
fn destroy_frees_everything_and_forgets_the_vbar() {
    let r = rig(8);
    let a = r.vbar(4);
    r.load(a, 0, 2);
    r.resident(a, 3, 4);
    let base = r.arb.base(a).expect("base");
    r.arb.destroy(a).expect("destroy");
    assert_eq!(r.sim.used(), 0);
    assert_eq!(r.arb.usage(), 0);
    assert!(!r.sim.is_mapped(base, PAGE));
    assert!(r.arb.priority_order().is_empty());
    assert!(r.arb.fault(a, 0, PAGE).is_err(), "a stale id is an error");
    assert!(r.arb.destroy(a).is_err());
    // The address space went back: the device refuses a map there.
    assert!(r.sim.map(base, PAGE).is_err());
}

#[test]
fn introspection_describes_the_vbars() {
    let r = rig(8);
    let a = r.vbar(4);
    let b = r.vbar(2);
    r.load(a, 0, 2);
    r.resident(b, 0, 1);
    r.arb.set_watermark(a, 3 * PAGE).expect("set");
    assert_eq!(r.arb.loaded_bytes(a).expect("loaded"), 2 * PAGE);
    assert_eq!(
        r.arb.residency(b).expect("residency"),
        vec![PageState { resident: true, pinned: true }, PageState::default()]
    );
    let line = r.arb.debug_line(a).expect("line");
    assert!(
        line.contains("pages=4 watermark=3 limit=0 resident=2 (64 MiB) pinned=0 [rr.|.]"),
        "{line}"
    );
    let dump = r.arb.dump();
    let lines: Vec<&str> = dump.lines().collect();
    assert_eq!(lines.len(), 3, "{dump}");
    assert!(lines[0].starts_with("vram: usage 96 MiB of 256 MiB"), "{dump}");
    assert!(lines[1].starts_with(&b.to_string()), "highest priority first: {dump}");
    assert!(lines[2].starts_with(&a.to_string()), "{dump}");
}

#[test]
fn activations_evict_the_deficit_first_and_are_accounted() {
    let r = rig(8);
    let a = r.vbar(8);
    r.load(a, 0, 8);
    let ptr = r.arb.alloc(40 * MIB).expect("alloc");
    assert_eq!(r.map(a), "rrrrrr..", "40 MiB short: two pages evicted");
    assert_eq!(r.arb.usage(), 6 * PAGE + 40 * MIB);
    assert_eq!(r.arb.allocation_count(), 1);
    r.check_usage();
    r.arb.free(ptr).expect("free");
    assert_eq!(r.arb.usage(), 6 * PAGE);
    assert!(r.arb.free(ptr).is_err(), "freed twice");
    // Small allocations count for at least 1 KiB, big ones in 2 MiB pages.
    let small = r.arb.alloc(10).expect("alloc");
    assert_eq!(r.arb.usage(), 6 * PAGE + 1024);
    let big = r.arb.alloc(3 * MIB).expect("alloc");
    assert_eq!(r.arb.usage(), 6 * PAGE + 1024 + 4 * MIB);
    r.arb.free(small).expect("free");
    r.arb.free(big).expect("free");
    assert_eq!(r.arb.usage(), 6 * PAGE);
}

#[test]
fn the_arbiter_as_a_backends_allocator_accounts_activations_and_evicts_for_them() {
    let r = rig(8);
    let a = r.vbar(8);
    r.load(a, 0, 8);
    // What a backend holds after `Backend::set_allocator(arbiter)`.
    let allocator: Arc<dyn DeviceAllocator> = r.arb.clone();
    let ptr = allocator.alloc(PAGE).expect("alloc through the trait");
    assert_eq!(r.map(a), "rrrrrrr.", "the device was full: a page of weights made room");
    assert_eq!(r.arb.usage(), 8 * PAGE);
    assert_eq!(r.arb.allocation_count(), 1);
    r.check_usage();
    allocator.free(ptr).expect("free");
    assert_eq!(r.arb.allocation_count(), 0);
    r.check_usage();
    assert!(allocator.free(ptr).is_err(), "freed twice");
    assert!(allocator.free(DevPtr(0x1234)).is_err(), "not allocated here");
}

#[test]
fn a_refused_activation_evicts_its_size_and_retries_once() {
    let r = rig(8);
    let a = r.vbar(4);
    r.load(a, 0, 4);
    r.sim.set_external_usage(4 * PAGE);
    let ptr = r.arb.alloc(PAGE).expect("retried after evicting a page");
    assert_eq!(r.map(a), "rrr.");
    r.check_usage();
    r.sim.set_external_usage(8 * PAGE);
    let err = r.arb.alloc(PAGE).expect_err("no room even after eviction");
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert_eq!(r.map(a), "rr..", "it evicted once more before giving up");
    r.arb.free(ptr).expect("free");
    r.check_usage();
}

#[test]
fn scratch_hands_out_aligned_slices_and_grows_in_chunks() {
    let r = rig_with(8, VramConfig { scratch_va: 64 * MIB, ..exact() });
    let mut s = Scratch::new(r.arb.clone(), StreamId(1)).expect("scratch");
    assert_eq!(s.stream(), StreamId(1));
    assert_eq!(s.reserved(), 64 * MIB);
    assert_eq!(s.mapped(), 0);
    let first = s.take(100).expect("take");
    assert_eq!(first, s.base());
    assert_eq!(s.mapped(), 16 * MIB, "one chunk");
    let second = s.take(20 * MIB).expect("take");
    assert_eq!(second, s.base().offset(SCRATCH_ALIGN), "aligned after the first slice");
    assert_eq!(s.mapped(), 32 * MIB);
    assert_eq!(r.sim.counters().maps, 2, "chunk by chunk");
    assert!(r.sim.is_mapped(s.base(), 32 * MIB));
    r.sim.write(second.offset(20 * MIB - 4), &[1, 2, 3, 4]).expect("the whole slice is backed");
    r.check_usage();

    // A reset reuses the memory without mapping more.
    s.reset();
    assert_eq!(s.used(), 0);
    assert_eq!(s.take(30 * MIB).expect("take"), s.base());
    assert_eq!(r.sim.counters().maps, 2);

    // Beyond the reservation.
    let err = s.take(40 * MIB).expect_err("past the reservation");
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");

    drop(s);
    assert_eq!(r.sim.used(), 0);
    assert_eq!(r.arb.usage(), 0);
}

#[test]
fn scratch_growth_evicts_weights_first() {
    let r = rig_with(8, VramConfig { scratch_va: 64 * MIB, ..exact() });
    let a = r.vbar(8);
    r.load(a, 0, 8);
    let mut s = Scratch::new(r.arb.clone(), StreamId(2)).expect("scratch");
    s.take(MIB).expect("take");
    assert_eq!(r.map(a), "rrrrrrr.", "a 16 MiB chunk cost one page");
    s.take(20 * MIB).expect("take");
    assert_eq!(r.map(a), "rrrrrrr.", "the freed page had room for the second chunk");
    r.check_usage();
}

#[test]
fn a_refused_scratch_chunk_evicts_a_chunk_and_retries_once() {
    let r = rig_with(8, VramConfig { scratch_va: 64 * MIB, ..exact() });
    let a = r.vbar(4);
    r.load(a, 0, 4);
    // Another process fills the device after the last poll: the budget sees room, the device refuses.
    r.sim.set_external_usage(4 * PAGE);
    let mut s = Scratch::new(r.arb.clone(), StreamId(3)).expect("scratch");
    s.take(MIB).expect("retried after evicting");
    assert_eq!(r.map(a), "rrr.");
    r.check_usage();
    r.sim.set_external_usage(8 * PAGE);
    assert!(matches!(s.take(32 * MIB), Err(Error::OutOfMemory { .. })));
    assert_eq!(s.mapped(), 16 * MIB, "nothing half-grown is lost track of");
    r.check_usage();
}

#[test]
fn the_arbiter_can_be_shared_between_threads() {
    let r = rig_with(8, VramConfig { headroom: PAGE, ..exact() });
    let ids: Vec<VbarId> = (0..4).map(|_| r.vbar(4)).collect();
    std::thread::scope(|scope| {
        for (t, &id) in ids.iter().enumerate() {
            let arb = &r.arb;
            scope.spawn(move || {
                for i in 0..50u64 {
                    let page = (i * 7 + t as u64) % 4;
                    match arb.fault(id, page * PAGE, PAGE).expect("fault") {
                        Fault::Resident(_) => arb.unpin(id, page * PAGE, PAGE).expect("unpin"),
                        Fault::Offloaded => arb.prioritize(id).expect("prioritize"),
                    }
                    let ptr = arb.alloc(MIB).expect("alloc");
                    arb.free(ptr).expect("free");
                }
            });
        }
    });
    r.check_usage();
    assert!(r.arb.usage() <= 7 * PAGE, "within the budget: {}", r.arb.dump());
    for id in ids {
        assert!(!r.map(id).contains('P'), "no pin left");
    }
}

#[test]
fn arbiters_and_scratch_buffers_cross_threads() {
    fn shared<T: Send + Sync>() {}
    fn sent<T: Send>() {}
    shared::<Arbiter>();
    sent::<Scratch>();
}

#[test]
fn dropping_the_arbiter_releases_every_vbar() {
    let r = rig(8);
    let a = r.vbar(4);
    r.load(a, 0, 3);
    let base = r.arb.base(a).expect("base");
    let Rig { sim, arb, .. } = r;
    drop(arb);
    assert_eq!(sim.used(), 0);
    assert!(sim.map(base, PAGE).is_err(), "the reservation is gone");
}
