//! Unit tests of the pin rules, one rule per test, against the recording fake backing.

use super::fake::{Call, FakeBacking, GIB, MIB, check};
use super::subset::bit_reverse16;
use super::*;
use crate::memory::pressure::{GIB as PGIB, RamSnapshot};

/// The books, a fake backing, and a machine with `total_ram` bytes.
struct World {
    pins: Pins,
    fake: FakeBacking,
    total_ram: u64,
}

fn m(id: u64) -> ModelId {
    ModelId(id)
}

fn md(id: u64) -> ModuleId {
    ModuleId(id)
}

use Subset::{Patches, PatchesLoaded, Weights, WeightsLoaded};

impl World {
    fn new(cap: u64, total_ram: u64) -> World {
        World::with(PinConfig { cap, ram_cache_headroom: 0, high_ram: false }, total_ram)
    }

    fn with(config: PinConfig, total_ram: u64) -> World {
        World { pins: Pins::new(config), fake: FakeBacking::new(), total_ram }
    }

    fn pin(&mut self, model: u64, subset: Subset, module: u64, size: u64) -> PinOutcome {
        let ram = self.fake.ram(self.total_ram);
        let mut env = PinEnv { backing: &mut self.fake, ram: &ram, outputs: None };
        let out =
            self.pins.pin(&mut env, m(model), subset, md(module), size).expect("model was loaded");
        check(&self.pins, &self.fake);
        out
    }

    fn get_pin(&mut self, model: u64, subset: Subset, module: u64) -> Option<Pin> {
        let pin = self.pins.get_pin(&mut self.fake, m(model), subset, md(module));
        check(&self.pins, &self.fake);
        pin
    }

    fn free_pins(&mut self, bytes: u64, evict_active: bool, loaded: bool) -> u64 {
        let freed = self.pins.free_pins(&mut self.fake, bytes, evict_active, loaded);
        check(&self.pins, &self.fake);
        freed
    }

    fn free_registrations(&mut self, shortfall: u64, evict_active: bool) -> bool {
        let ok = self.pins.free_registrations(&mut self.fake, shortfall, evict_active);
        check(&self.pins, &self.fake);
        ok
    }

    /// Loads `model` and gives it one pin of `size` per `(subset, module)`, then sets its flags.
    fn model(
        &mut self,
        model: u64,
        pins: &[(Subset, u64)],
        size: u64,
        in_prompt: bool,
        active: bool,
    ) {
        self.pins.load_model(m(model));
        for &(subset, module) in pins {
            assert!(matches!(self.pin(model, subset, module, size), PinOutcome::Created(_)));
        }
        self.pins.set_in_prompt(m(model), in_prompt);
        self.pins.set_active(m(model), active);
    }

    fn mark(&self) -> usize {
        self.fake.calls.len()
    }

    /// The `(model, subset, offset)` of every truncate since `from`: the pins freed, in order.
    fn freed_since(&self, from: usize) -> Vec<(u64, Subset, u64)> {
        self.fake
            .calls_since(from)
            .into_iter()
            .filter_map(|c| match c {
                Call::Truncate { model, subset, offset } => Some((model.0, subset, offset)),
                _ => None,
            })
            .collect()
    }

    /// The `(model, subset, offset)` of every unregister since `from`.
    fn unregistered_since(&self, from: usize) -> Vec<(u64, Subset, u64)> {
        self.fake
            .calls_since(from)
            .into_iter()
            .filter_map(|c| match c {
                Call::Unregister { model, subset, offset } => Some((model.0, subset, offset)),
                _ => None,
            })
            .collect()
    }
}

const BIG: u64 = 1 << 50;

// ---------------------------------------------------------------------------------------------------------
// Configuration.

#[test]
fn linux_cap_follows_the_head_formula() {
    // 64 GiB, no swap: min(57.6, 60, 48) = 48 GiB, above 40 % (25.6).
    assert_eq!(linux_pin_cap(64 * GIB, 0), 48 * GIB);
    // 64 GiB + 32 GiB of disk swap: min(57.6, 60, 80) = 57.6 GiB.
    assert_eq!(linux_pin_cap(64 * GIB, 32 * GIB), 64 * GIB * 9 / 10);
    // 16 GiB + 8 GiB swap: min(14.4, 12, 8) = 8 GiB.
    assert_eq!(linux_pin_cap(16 * GIB, 8 * GIB), 8 * GIB);
    // 8 GiB, no swap: RAM − 16 GiB is negative, so 40 % wins.
    assert_eq!(linux_pin_cap(8 * GIB, 0), 8 * GIB * 4 / 10);
    assert_eq!(windows_pin_cap(10 * GIB), 4 * GIB);
}

#[test]
fn linux_config_ignores_swap_under_a_cgroup_limit() {
    let mut snap = RamSnapshot {
        total: 64 * PGIB,
        available: 60 * PGIB,
        host_total: 64 * PGIB,
        swap_total: 32 * PGIB,
        disk_swap: 32 * PGIB,
        cgroup_limit: None,
    };
    assert_eq!(PinConfig::linux(&snap, 0).cap, linux_pin_cap(64 * GIB, 32 * GIB));
    snap.cgroup_limit = Some(64 * PGIB);
    assert_eq!(PinConfig::linux(&snap, 0).cap, linux_pin_cap(64 * GIB, 0));
}

#[test]
fn ram_floor_is_half_the_cache_headroom_but_at_least_2_gib() {
    let floor =
        |headroom| PinConfig { cap: 1, ram_cache_headroom: headroom, high_ram: false }.ram_floor();
    assert_eq!(floor(10 * GIB), 5 * GIB);
    assert_eq!(floor(3 * GIB), 2 * GIB);
    assert_eq!(floor(0), 2 * GIB);
}

#[test]
fn priorities_scatter_by_bit_reversal() {
    let got: Vec<u16> = (0..8).map(bit_reverse16).collect();
    assert_eq!(got, [0, 32768, 16384, 49152, 8192, 40960, 24576, 57344]);
    assert_eq!(bit_reverse16(1 << 16), 0, "the counter wraps at 16 bits");
}

// ---------------------------------------------------------------------------------------------------------
// Creation.

#[test]
fn disabled_pins_make_nothing() {
    let mut w = World::with(PinConfig::disabled(), BIG);
    w.pins.load_model(m(1));
    assert_eq!(w.pin(1, Weights, 1, GIB), PinOutcome::NotPinned);
    assert!(w.fake.calls.is_empty());
    assert!(!w.pins.ensure_registerable(&mut w.fake, 1, true));
    assert!(!w.pins.free_registrations(&mut w.fake, 1, true));
}

#[test]
fn pin_on_an_unknown_model_is_an_error() {
    let mut w = World::new(BIG, BIG);
    let ram = w.fake.ram(BIG);
    let mut env = PinEnv { backing: &mut w.fake, ram: &ram, outputs: None };
    assert!(w.pins.pin(&mut env, m(9), Weights, md(1), GIB).is_err());
}

#[test]
fn new_pins_are_cut_from_the_buffer_end_and_registered() {
    let mut w = World::new(BIG, BIG);
    w.pins.load_model(m(1));
    let a = w.pin(1, Weights, 10, 3 * MIB);
    let b = w.pin(1, Weights, 11, 5 * MIB);
    assert_eq!(a, PinOutcome::Created(Pin { offset: 0, size: 3 * MIB, registered: true }));
    assert_eq!(b, PinOutcome::Created(Pin { offset: 3 * MIB, size: 5 * MIB, registered: true }));
    assert_eq!(
        w.fake.calls,
        vec![
            Call::Extend { model: m(1), subset: Weights, size: 3 * MIB, offset: 0 },
            Call::Register { model: m(1), subset: Weights, offset: 0, size: 3 * MIB },
            Call::Extend { model: m(1), subset: Weights, size: 5 * MIB, offset: 3 * MIB },
            Call::Register { model: m(1), subset: Weights, offset: 3 * MIB, size: 5 * MIB },
        ]
    );
    let stats = w.pins.stats(m(1), Weights).expect("known model");
    assert_eq!(
        stats,
        SubsetStats { pins: 2, bytes: 8 * MIB, registered_bytes: 8 * MIB, split: Some(1) }
    );
    assert_eq!(w.pins.registered_bytes(), 8 * MIB);
    assert_eq!(w.pins.pinned_bytes(m(1)), 8 * MIB);
    // Subsets have their own buffers.
    assert_eq!(w.pin(1, WeightsLoaded, 10, MIB).pin().map(|p| p.offset), Some(0));
    assert_eq!(w.pin(1, Weights, 12, 0), PinOutcome::NotPinned, "nothing to pin");
}

#[test]
fn an_existing_pin_is_returned_without_work() {
    struct Recording(Vec<(u64, bool, u64)>);
    impl OutputCache for Recording {
        fn release(&mut self, target: u64, free_active: bool, min_entry: u64) -> u64 {
            self.0.push((target, free_active, min_entry));
            0
        }
    }
    let mut w =
        World::with(PinConfig { cap: BIG, ram_cache_headroom: 6 * GIB, high_ram: false }, BIG);
    w.pins.load_model(m(1));
    let mut cache = Recording(Vec::new());
    let ram = w.fake.ram(BIG);
    let mut env = PinEnv { backing: &mut w.fake, ram: &ram, outputs: Some(&mut cache) };
    let first = w.pins.pin(&mut env, m(1), Weights, md(1), GIB).expect("loaded");
    let again = w.pins.pin(&mut env, m(1), Weights, md(1), GIB).expect("loaded");
    assert_eq!(again, PinOutcome::Existing(first.pin().expect("created")));
    // Inactive outputs gave way to the active threshold once, for the new pin only.
    assert_eq!(cache.0, vec![(6 * GIB, false, 0)]);
    assert_eq!(w.fake.calls.len(), 2, "extend and register, once");
}

// ---------------------------------------------------------------------------------------------------------
// The RAM budget.

#[test]
fn budget_keeps_the_floor_free() {
    for (headroom, available, fits) in [
        (6 * GIB, 4 * GIB, GIB), // floor 3 GiB
        (0, 3 * GIB, GIB),       // floor 2 GiB
    ] {
        let mut w =
            World::with(PinConfig { cap: BIG, ram_cache_headroom: headroom, high_ram: false }, BIG);
        let ram = move || available;
        assert!(w.pins.ensure_pin_budget(&mut w.fake, &ram, fits, false, false));
        assert!(!w.pins.ensure_pin_budget(&mut w.fake, &ram, fits + 1, false, false));
    }
    let mut w = World::with(PinConfig { cap: BIG, ram_cache_headroom: 0, high_ram: true }, BIG);
    assert!(w.pins.ensure_pin_budget(&mut w.fake, &|| 0u64, 100 * GIB, false, false), "--high-ram");
}

#[test]
fn budget_frees_older_inactive_pins_with_256_mib_hysteresis() {
    let mut w = World::new(BIG, 16 * GIB);
    w.model(1, &[(Weights, 1), (Weights, 2), (Weights, 3), (Weights, 4)], GIB, false, false);
    w.pins.load_model(m(2));
    // 4 GiB committed, 12 available; 11.5 GiB + the 2 GiB floor is 1.5 GiB short: free 1.75 GiB → two pins.
    let from = w.mark();
    let out = w.pin(2, Weights, 1, 11 * GIB + GIB / 2);
    assert!(matches!(out, PinOutcome::Created(_)), "{out:?}");
    assert_eq!(w.freed_since(from), vec![(1, Weights, 3 * GIB), (1, Weights, 2 * GIB)], "LIFO");
    assert_eq!(w.pins.stats(m(1), Weights).map(|s| s.pins), Some(2));
}

#[test]
fn budget_failure_falls_back_to_stealing() {
    let mut w = World::new(BIG, 16 * GIB);
    w.model(1, &[(Weights, 1)], GIB, false, false);
    w.pins.load_model(m(2));
    // 1.5 GiB short, only 1 GiB freeable: the budget fails after freeing it, and nothing can be stolen.
    let from = w.mark();
    assert_eq!(w.pin(2, Weights, 1, 14 * GIB + GIB / 2), PinOutcome::NotPinned);
    assert_eq!(w.freed_since(from), vec![(1, Weights, 0)]);
    assert!(!w.fake.calls_since(from).iter().any(|c| matches!(c, Call::Extend { .. })));
}

// ---------------------------------------------------------------------------------------------------------
// Registration.

#[test]
fn registration_cap_unregisters_with_2_gib_hysteresis_and_keeps_ram() {
    let mut w = World::new(4 * GIB, BIG);
    w.model(1, &[(Weights, 1), (Weights, 2), (Weights, 3)], GIB, false, false);
    w.pins.load_model(m(2));
    let from = w.mark();
    let committed = w.fake.committed();
    // 3 + 2 GiB is 1 GiB over the cap: unregister 1 + 2 GiB, walking down from the split.
    assert!(matches!(w.pin(2, Weights, 1, 2 * GIB), PinOutcome::Created(_)));
    assert_eq!(
        w.unregistered_since(from),
        vec![(1, Weights, 2 * GIB), (1, Weights, GIB), (1, Weights, 0)]
    );
    assert!(w.freed_since(from).is_empty(), "unregistering frees no RAM");
    assert_eq!(w.fake.committed(), committed + 2 * GIB);
    assert_eq!(
        w.pins.stats(m(1), Weights),
        Some(SubsetStats { pins: 3, bytes: 3 * GIB, registered_bytes: 0, split: None })
    );
    assert_eq!(w.pins.registered_bytes(), 2 * GIB);
}

#[test]
fn get_pin_re_registers_after_making_room() {
    let mut w = World::new(4 * GIB, BIG);
    w.model(1, &[(Weights, 1), (Weights, 2), (Weights, 3)], GIB, false, false);
    w.model(2, &[(Weights, 1)], 2 * GIB, false, true); // unregisters all of model 1
    assert_eq!(w.get_pin(1, Weights, 3).map(|p| p.registered), Some(true));
    assert_eq!(w.pins.stats(m(1), Weights).and_then(|s| s.split), Some(2));
    assert_eq!(
        w.get_pin(1, Weights, 1).map(|p| p.registered),
        Some(true),
        "3 + 1 GiB fits the cap"
    );
    assert_eq!(w.pins.stats(m(1), Weights).and_then(|s| s.split), Some(2));
    // 4 + 1 GiB: 1 GiB short; model 1 (inactive) goes first from its split down, then the active model 2.
    let from = w.mark();
    let pin = w.get_pin(1, Weights, 2).expect("has a pin");
    assert!(pin.registered);
    assert_eq!(
        w.unregistered_since(from),
        vec![(1, Weights, 2 * GIB), (1, Weights, 0), (2, Weights, 0)]
    );
    assert_eq!(w.pins.registered_bytes(), GIB);
    assert_eq!(w.get_pin(1, Weights, 9), None, "no pin, nothing to return");
}

#[test]
fn one_active_model_swaps_registrations_within_itself() {
    let mut w = World::new(2 * GIB, BIG);
    w.model(1, &[(Weights, 1), (Weights, 2)], GIB, true, true);
    let third = w.pin(1, Weights, 3, GIB);
    assert_eq!(third, PinOutcome::Created(Pin { offset: 2 * GIB, size: GIB, registered: true }));
    assert_eq!(w.pins.registered_bytes(), GIB);
    assert_eq!(w.get_pin(1, Weights, 1).map(|p| p.registered), Some(true));
    assert_eq!(w.pins.registered_bytes(), 2 * GIB);
}

#[test]
fn registration_tiers_go_inactive_first_oldest_loaded_first() {
    let mut w = World::new(4 * GIB, BIG);
    w.model(9, &[(Weights, 1)], GIB, false, false); // loaded first
    w.model(2, &[(Weights, 1)], GIB, false, false);
    w.model(5, &[(WeightsLoaded, 1)], GIB, true, false); // in the prompt
    w.model(7, &[(Weights, 1)], GIB, true, true); // active
    let from = w.mark();
    // 1 GiB short + 2 GiB hysteresis: 9, 2, then the in-prompt 5; never the active 7.
    assert!(w.free_registrations(GIB, false));
    assert_eq!(
        w.unregistered_since(from),
        vec![(9, Weights, 0), (2, Weights, 0), (5, WeightsLoaded, 0)]
    );
    // Only the active model holds registrations now: without evict_active nothing can be given up.
    assert!(!w.free_registrations(GIB, false));
    assert!(w.free_registrations(GIB, true));
    assert_eq!(w.pins.registered_bytes(), 0);
}

#[test]
fn reloading_a_model_makes_it_the_youngest() {
    let mut w = World::new(BIG, BIG);
    w.model(9, &[(Weights, 1)], GIB, false, false);
    w.model(2, &[(Weights, 1)], GIB, false, false);
    w.pins.load_model(m(9));
    w.pins.set_active(m(9), false);
    let from = w.mark();
    w.free_pins(BIG, false, false);
    assert_eq!(w.freed_since(from), vec![(2, Weights, 0), (9, Weights, 0)]);
}

#[test]
fn a_registration_larger_than_the_cap_never_fits() {
    let mut w = World::new(GIB, BIG);
    assert!(!w.pins.ensure_registerable(&mut w.fake, GIB + 1, true));
    assert!(w.pins.ensure_registerable(&mut w.fake, GIB, true));
}

// ---------------------------------------------------------------------------------------------------------
// Freeing.

/// Model 1 (oldest): in the prompt, inactive; model 2: not in the prompt; model 3: active, in the prompt.
fn tiered() -> World {
    let mut w = World::new(BIG, BIG);
    w.model(1, &[(Weights, 1), (Weights, 2), (WeightsLoaded, 3)], GIB, true, false);
    w.model(
        2,
        &[(Weights, 1), (Patches, 2), (WeightsLoaded, 3), (PatchesLoaded, 4)],
        GIB,
        false,
        false,
    );
    w.model(3, &[(Weights, 1), (WeightsLoaded, 2)], GIB, true, true);
    w
}

#[test]
fn free_pins_follows_the_head_tiers() {
    let mut w = tiered();
    let from = w.mark();
    assert_eq!(w.free_pins(BIG, false, false), 7 * GIB);
    assert_eq!(
        w.freed_since(from),
        vec![
            (2, Weights, 0),       // 1: not in the prompt
            (2, Patches, 0),       //
            (2, WeightsLoaded, 0), // 2: -loaded, not in the prompt
            (2, PatchesLoaded, 0), //
            (1, WeightsLoaded, 0), // 3: -loaded, in the prompt
            (1, Weights, GIB),     // 4: in the prompt, inactive, LIFO
            (1, Weights, 0),
        ]
    );
    assert_eq!(w.pins.pinned_bytes(m(3)), 2 * GIB, "the active model keeps its pins");
    let from = w.mark();
    assert_eq!(w.free_pins(BIG, true, false), 2 * GIB);
    assert_eq!(
        w.freed_since(from),
        vec![(3, WeightsLoaded, 0), (3, Weights, 0)],
        "5: active, -loaded first"
    );
}

#[test]
fn a_loaded_request_spares_pins_the_prompt_streams_from() {
    let mut w = tiered();
    let from = w.mark();
    assert_eq!(w.free_pins(BIG, true, true), 6 * GIB);
    let freed = w.freed_since(from);
    assert!(!freed.contains(&(1, Weights, 0)) && !freed.contains(&(3, Weights, 0)), "{freed:?}");
    assert_eq!(freed.last(), Some(&(3, WeightsLoaded, 0)));
    assert_eq!(w.pins.pinned_bytes(m(1)), 2 * GIB);
}

#[test]
fn free_pins_stops_once_enough_is_freed() {
    let mut w = tiered();
    let from = w.mark();
    assert_eq!(w.free_pins(GIB + GIB / 2, false, false), 2 * GIB);
    assert_eq!(w.freed_since(from), vec![(2, Weights, 0), (2, Patches, 0)]);
    assert_eq!(w.free_pins(0, false, false), 0);
}

#[test]
fn freeing_a_registered_pin_unregisters_then_truncates() {
    let mut w = World::new(BIG, BIG);
    w.model(1, &[(Weights, 1)], GIB, false, false);
    let from = w.mark();
    w.free_pins(1, false, false);
    assert_eq!(
        w.fake.calls_since(from),
        vec![
            Call::Unregister { model: m(1), subset: Weights, offset: 0 },
            Call::Truncate { model: m(1), subset: Weights, offset: 0 },
        ]
    );
    assert_eq!(w.pins.registered_bytes(), 0);
}

#[test]
fn the_releaser_frees_only_inactive_models() {
    let mut w = World::new(BIG, BIG);
    w.model(1, &[(Weights, 1)], GIB, true, true);
    w.model(2, &[(Weights, 1)], GIB, true, false);
    let freed = w.pins.releaser(&mut w.fake).free_inactive_pins(BIG);
    check(&w.pins, &w.fake);
    assert_eq!(freed, GIB);
    assert_eq!((w.pins.pinned_bytes(m(1)), w.pins.pinned_bytes(m(2))), (GIB, 0));
}

// ---------------------------------------------------------------------------------------------------------
// Stealing.

#[test]
fn stealing_takes_the_lowest_strictly_lower_priority_of_identical_size() {
    let mut w = World::new(BIG, BIG);
    // Priorities by first attempt: a 0, b 32768, c 16384 (2 GiB), d 49152, e 8192, f 40960, g 24576.
    w.model(1, &[(Weights, 1), (Weights, 2)], GIB, true, true);
    assert!(matches!(w.pin(1, Weights, 3, 2 * GIB), PinOutcome::Created(_)));
    w.total_ram = w.fake.committed() + GIB; // every budget fails from here on
    let a_pin = w.pins.pin_of(m(1), Weights, md(1)).expect("a is pinned");
    assert_eq!(w.pin(1, Weights, 4, GIB), PinOutcome::Stolen { pin: a_pin, victim: md(1) });
    assert_eq!(w.pins.pin_of(m(1), Weights, md(1)), None, "a lost its pin");
    assert_eq!(
        w.pin(1, Weights, 5, GIB),
        PinOutcome::NotPinned,
        "8192 is below b's 32768 and d's 49152"
    );
    assert_eq!(w.pin(1, Weights, 6, 3 * GIB), PinOutcome::NotPinned, "no pin of that size");
    assert_eq!(
        w.pin(1, Weights, 1, GIB),
        PinOutcome::NotPinned,
        "a keeps priority 0 and beats no one"
    );
    let c_pin = w.pins.pin_of(m(1), Weights, md(3)).expect("c is pinned");
    assert_eq!(w.pin(1, Weights, 7, 2 * GIB), PinOutcome::Stolen { pin: c_pin, victim: md(3) });
}

#[test]
fn a_stolen_unregistered_pin_is_registered_when_room_allows() {
    let mut w = World::new(2 * GIB, BIG);
    w.model(1, &[(Weights, 1), (Weights, 2)], GIB, true, true);
    assert!(w.free_registrations(2 * GIB, true));
    w.total_ram = w.fake.committed() + GIB;
    match w.pin(1, Weights, 3, GIB) {
        PinOutcome::Stolen { pin, victim } => {
            assert_eq!(victim, md(1));
            assert_eq!(pin, Pin { offset: 0, size: GIB, registered: true });
        }
        other => panic!("expected a steal, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------------------
// Backing failures.

#[test]
fn a_buffer_that_cannot_grow_makes_no_pin() {
    let mut w = World::new(BIG, BIG);
    w.fake.max_buffer = GIB;
    w.pins.load_model(m(1));
    assert_eq!(w.pin(1, Weights, 1, 2 * GIB), PinOutcome::NotPinned);
    assert!(!w.fake.calls.iter().any(|c| matches!(c, Call::Register { .. })));
}

#[test]
fn a_refused_registration_frees_registrations_and_retries_once() {
    let mut w = World::new(BIG, BIG);
    w.model(1, &[(Weights, 1)], GIB, false, false);
    w.pins.load_model(m(2));
    w.fake.register_failures = 1;
    let from = w.mark();
    assert!(matches!(w.pin(2, Weights, 1, GIB), PinOutcome::Created(_)));
    assert_eq!(
        w.fake.calls_since(from),
        vec![
            Call::Extend { model: m(2), subset: Weights, size: GIB, offset: 0 },
            Call::Register { model: m(2), subset: Weights, offset: 0, size: GIB },
            Call::Unregister { model: m(1), subset: Weights, offset: 0 },
            Call::Register { model: m(2), subset: Weights, offset: 0, size: GIB },
        ]
    );
}

#[test]
fn a_registration_refused_twice_gives_the_range_back() {
    let mut w = World::new(BIG, BIG);
    w.pins.load_model(m(1));
    w.fake.register_failures = 2;
    assert_eq!(w.pin(1, Weights, 1, GIB), PinOutcome::NotPinned);
    assert_eq!(
        w.fake.calls.last(),
        Some(&Call::Truncate { model: m(1), subset: Weights, offset: 0 })
    );
    assert_eq!(w.fake.committed(), 0);
}

// ---------------------------------------------------------------------------------------------------------
// Per-node reset and model removal.

#[test]
fn node_reset_drops_patch_pins_and_marks_models_inactive() {
    let mut w = World::new(BIG, BIG);
    w.model(1, &[(Weights, 1), (Patches, 2), (Patches, 3), (PatchesLoaded, 4)], GIB, false, true);
    let from = w.mark();
    w.pins.reset_node(&mut w.fake);
    check(&w.pins, &w.fake);
    assert_eq!(
        w.freed_since(from),
        vec![(1, PatchesLoaded, 0), (1, Patches, GIB), (1, Patches, 0)]
    );
    for subset in [Patches, PatchesLoaded] {
        assert_eq!(w.pins.stats(m(1), subset).map(|s| (s.pins, s.registered_bytes)), Some((0, 0)));
    }
    assert_eq!(w.pins.pinned_bytes(m(1)), GIB, "weight pins persist");
    let set = &w.pins.models[&m(1)].subsets[Patches.index()];
    assert_eq!(set.known_priority(md(2)), None, "patch priorities start over");
    // Inactive now: an ordinary free reaches the weights.
    assert_eq!(w.free_pins(BIG, false, false), GIB);
}

#[test]
fn removing_a_model_frees_everything_and_forgets_it() {
    let mut w = World::new(BIG, BIG);
    w.model(1, &[(Weights, 1), (WeightsLoaded, 2), (Patches, 3)], GIB, true, true);
    assert_eq!(w.pins.remove_model(&mut w.fake, m(1)), 3 * GIB);
    check(&w.pins, &w.fake);
    assert_eq!(w.pins.stats(m(1), Weights), None);
    assert_eq!((w.pins.registered_bytes(), w.fake.committed()), (0, 0));
}
