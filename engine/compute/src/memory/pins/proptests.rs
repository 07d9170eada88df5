//! Property tests of the pin books: the invariants under any sequence of calls (the registered bytes never
//! pass the cap), the free order (tiers, then oldest model, then subset, then LIFO), the hysteresis amounts
//! of both budgets, stealing only from strictly lower priorities of identical size, and the node reset.

use proptest::prelude::*;

use super::fake::{Call, FakeBacking, GIB, MIB, check};
use super::tiers::{free_tiers, registration_tiers};
use super::*;

const SIZES: [u64; 4] = [64 * MIB, 256 * MIB, GIB, 3 * GIB / 2];
const MODELS: u8 = 3;

fn subset_of(i: u8) -> Subset {
    Subset::ALL[usize::from(i) % 4]
}

#[derive(Debug, Clone)]
enum Op {
    Load(u8),
    Active(u8, bool),
    InPrompt(u8, bool),
    Pin { model: u8, subset: u8, module: u8, size: u8 },
    GetPin { model: u8, subset: u8, module: u8 },
    Free { gib_eighths: u8, evict_active: bool, loaded: bool },
    FreeRegistrations { gib_eighths: u8, evict_active: bool },
    Reset,
    Remove(u8),
    RefuseRegister(u8),
    SetRam(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0..MODELS).prop_map(Op::Load),
        1 => (0..MODELS, any::<bool>()).prop_map(|(m, b)| Op::Active(m, b)),
        1 => (0..MODELS, any::<bool>()).prop_map(|(m, b)| Op::InPrompt(m, b)),
        8 => (0..MODELS, 0..4u8, 0..6u8, 0..3u8)
            .prop_map(|(model, subset, module, size)| Op::Pin { model, subset, module, size }),
        3 => (0..MODELS, 0..4u8, 0..6u8).prop_map(|(model, subset, module)| Op::GetPin { model, subset, module }),
        1 => (0..64u8, any::<bool>(), any::<bool>())
            .prop_map(|(gib_eighths, evict_active, loaded)| Op::Free { gib_eighths, evict_active, loaded }),
        1 => (0..64u8, any::<bool>())
            .prop_map(|(gib_eighths, evict_active)| Op::FreeRegistrations { gib_eighths, evict_active }),
        1 => Just(Op::Reset),
        1 => (0..MODELS).prop_map(Op::Remove),
        1 => (1..3u8).prop_map(Op::RefuseRegister),
        1 => (2..24u8).prop_map(Op::SetRam),
    ]
}

/// Runs `ops` on fresh books, checking the invariants after every step.
fn run(config: PinConfig, total_gib: u8, ops: &[Op]) {
    let mut pins = Pins::new(config);
    let mut fake = FakeBacking::new();
    let mut total = u64::from(total_gib) * GIB;
    for op in ops {
        match *op {
            Op::Load(model) => pins.load_model(ModelId(model.into())),
            Op::Active(model, b) => pins.set_active(ModelId(model.into()), b),
            Op::InPrompt(model, b) => pins.set_in_prompt(ModelId(model.into()), b),
            Op::Pin { model, subset, module, size } => {
                let known = pins.models.contains_key(&ModelId(model.into()));
                let ram = fake.ram(total);
                let mut env = PinEnv { backing: &mut fake, ram: &ram, outputs: None };
                let size = SIZES[usize::from(size)];
                let out = pins.pin(
                    &mut env,
                    ModelId(model.into()),
                    subset_of(subset),
                    ModuleId(module.into()),
                    size,
                );
                assert_eq!(out.is_ok(), known, "only unknown models are errors");
                if let Ok(out) = out {
                    assert_eq!(out.pin().is_some(), !matches!(out, PinOutcome::NotPinned));
                    if !config.enabled() {
                        assert_eq!(out, PinOutcome::NotPinned);
                    }
                }
            }
            Op::GetPin { model, subset, module } => {
                let before =
                    pins.pin_of(ModelId(model.into()), subset_of(subset), ModuleId(module.into()));
                let got = pins.get_pin(
                    &mut fake,
                    ModelId(model.into()),
                    subset_of(subset),
                    ModuleId(module.into()),
                );
                assert_eq!(got.map(|p| (p.offset, p.size)), before.map(|p| (p.offset, p.size)));
            }
            Op::Free { gib_eighths, evict_active, loaded } => {
                pins.free_pins(&mut fake, u64::from(gib_eighths) * GIB / 8, evict_active, loaded);
            }
            Op::FreeRegistrations { gib_eighths, evict_active } => {
                pins.free_registrations(&mut fake, u64::from(gib_eighths) * GIB / 8, evict_active);
            }
            Op::Reset => {
                pins.reset_node(&mut fake);
                for m in pins.models.values() {
                    assert!(!m.active, "every model inactive after a node");
                    for subset in [Subset::Patches, Subset::PatchesLoaded] {
                        assert!(
                            m.subsets[subset.index()].stack.is_empty(),
                            "patch pins outlived the node"
                        );
                    }
                }
            }
            Op::Remove(model) => {
                pins.remove_model(&mut fake, ModelId(model.into()));
                assert!(!pins.models.contains_key(&ModelId(model.into())));
            }
            Op::RefuseRegister(n) => fake.register_failures = n.into(),
            Op::SetRam(gib) => total = u64::from(gib) * GIB,
        }
        check(&pins, &fake);
    }
}

/// A population: for each `(model, subset, size)` a pin (models loaded in order of first appearance, all
/// active while pinning), with plenty of RAM and no cap pressure.
fn populate(config: PinConfig, spec: &[(u8, u8, u8)]) -> (Pins, FakeBacking) {
    let mut pins = Pins::new(config);
    let mut fake = FakeBacking::new();
    let ram = fake.ram(u64::MAX);
    for (n, &(model, subset, size)) in spec.iter().enumerate() {
        let id = ModelId(model.into());
        if !pins.models.contains_key(&id) {
            pins.load_model(id);
        }
        let mut env = PinEnv { backing: &mut fake, ram: &ram, outputs: None };
        pins.pin(&mut env, id, subset_of(subset), ModuleId(n as u64), SIZES[usize::from(size)])
            .expect("loaded");
    }
    check(&pins, &fake);
    (pins, fake)
}

fn set_flags(pins: &mut Pins, flags: &[(bool, bool)]) {
    for (i, &(in_prompt, active)) in flags.iter().enumerate() {
        pins.set_in_prompt(ModelId(i as u64), in_prompt);
        pins.set_active(ModelId(i as u64), active);
    }
}

/// A place in the free order: (tier, model age, subset position within the tier).
type FreeKey = (usize, usize, usize);

/// Where `(model, subset)` stands in the free order, if a free with these flags may take its pins.
fn free_key(
    pins: &Pins,
    model: ModelId,
    subset: Subset,
    loaded: bool,
    evict_active: bool,
) -> Option<FreeKey> {
    let m = &pins.models[&model];
    let (tier, t) = free_tiers(loaded, evict_active)
        .into_iter()
        .enumerate()
        .find(|(_, t)| t.covers(m.in_prompt, m.active) && t.subsets.contains(&subset))?;
    let age = pins.models.values().filter(|o| o.loaded_seq < m.loaded_seq).count();
    let pos = t.subsets.iter().position(|&s| s == subset)?;
    Some((tier, age, pos))
}

/// Bytes of pins a free with these flags may take.
fn eligible_free_bytes(pins: &Pins, loaded: bool, evict_active: bool) -> u64 {
    let mut total = 0;
    for (&id, m) in &pins.models {
        for s in Subset::ALL {
            if free_key(pins, id, s, loaded, evict_active).is_some() {
                total += m.subsets[s.index()].stack.iter().map(|slot| slot.size).sum::<u64>();
            }
        }
    }
    total
}

fn unlimited() -> PinConfig {
    PinConfig { cap: u64::MAX, ram_cache_headroom: 0, high_ram: false }
}

fn spec() -> impl Strategy<Value = Vec<(u8, u8, u8)>> {
    prop::collection::vec((0..MODELS, 0..4u8, 0..4u8), 0..40)
}

fn flags() -> impl Strategy<Value = Vec<(bool, bool)>> {
    prop::collection::vec((any::<bool>(), any::<bool>()), usize::from(MODELS))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_under_any_sequence(
        cap_gib in prop_oneof![1 => Just(0u8), 9 => 1..8u8],
        headroom_gib in 0..8u8,
        high_ram in any::<bool>(),
        total_gib in 2..24u8,
        ops in prop::collection::vec(op(), 0..80),
    ) {
        let config = PinConfig {
            cap: u64::from(cap_gib) * GIB,
            ram_cache_headroom: u64::from(headroom_gib) * GIB,
            high_ram,
        };
        run(config, total_gib, &ops);
    }

    #[test]
    fn free_order_follows_tiers_then_age_then_subset_then_lifo(
        spec in spec(),
        flags in flags(),
        bytes_eighths in 0..200u64,
        evict_active in any::<bool>(),
        loaded in any::<bool>(),
    ) {
        let (mut pins, mut fake) = populate(unlimited(), &spec);
        set_flags(&mut pins, &flags);
        let bytes = bytes_eighths * GIB / 8;
        let eligible = eligible_free_bytes(&pins, loaded, evict_active);
        let sizes: std::collections::BTreeMap<(ModelId, Subset, u64), u64> = pins.models.iter()
            .flat_map(|(&id, m)| Subset::ALL.into_iter().flat_map(move |s| {
                m.subsets[s.index()].stack.iter().map(move |slot| ((id, s, slot.offset), slot.size))
            }))
            .collect();

        let freed = pins.free_pins(&mut fake, bytes, evict_active, loaded);
        check(&pins, &fake);

        let order: Vec<(ModelId, Subset, u64)> = fake.calls.iter().filter_map(|c| match *c {
            Call::Truncate { model, subset, offset } => Some((model, subset, offset)),
            _ => None,
        }).collect();
        let mut last: Option<(FreeKey, ModelId, Subset, u64)> = None;
        for &(model, subset, offset) in &order {
            let key = free_key(&pins, model, subset, loaded, evict_active);
            prop_assert!(key.is_some(), "freed an ineligible pin {model:?} {subset:?}");
            let key = key.unwrap_or_default();
            if let Some((k, lm, ls, lo)) = last {
                prop_assert!(k <= key, "tier order broken: {k:?} then {key:?}");
                if (lm, ls) == (model, subset) {
                    prop_assert!(offset < lo, "not LIFO within {model:?} {subset:?}");
                }
            }
            last = Some((key, model, subset, offset));
        }
        let freed_sum: u64 = order.iter().map(|k| sizes[k]).sum();
        prop_assert_eq!(freed, freed_sum);
        prop_assert!(freed >= bytes.min(eligible), "stopped early: {} of {}", freed, bytes);
        if let (Some((key, ..)), Some(&k)) = (last, order.last()) {
            prop_assert!(freed - sizes[&k] < bytes, "freed past the request by more than the last pin");
            // Nothing eligible and earlier in the order was left behind.
            for (&id, m) in &pins.models {
                for s in Subset::ALL {
                    if let Some(other) = free_key(&pins, id, s, loaded, evict_active) {
                        prop_assert!(
                            m.subsets[s.index()].stack.is_empty() || other >= key,
                            "{id:?} {s:?} skipped though it comes before {key:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn pin_budget_frees_the_shortfall_plus_256_mib(
        spec in spec(),
        flags in flags(),
        total_gib in 1..60u64,
        size in 0..4usize,
    ) {
        let (mut pins, mut fake) = populate(unlimited(), &spec);
        set_flags(&mut pins, &flags);
        let total = total_gib * GIB;
        let size = SIZES[size];
        let available = total.saturating_sub(fake.committed());
        let eligible = eligible_free_bytes(&pins, false, false);
        let before = fake.committed();
        let ram = fake.ram(total);
        let ok = pins.ensure_pin_budget(&mut fake, &ram, size, false, false);
        check(&pins, &fake);
        let freed = before - fake.committed();
        let need = size + MIN_PIN_RAM_FLOOR;
        if need <= available {
            prop_assert!(ok);
            prop_assert_eq!(freed, 0);
        } else {
            let shortfall = need - available;
            let target = shortfall + PIN_PRESSURE_HYSTERESIS;
            prop_assert!(freed >= target.min(eligible), "freed {} of target {}", freed, target);
            prop_assert!(freed < target + SIZES[3], "freed {} past target {}", freed, target);
            prop_assert_eq!(ok, freed >= shortfall);
        }
    }

    #[test]
    fn registration_budget_unregisters_the_excess_plus_2_gib(
        spec in spec(),
        flags in flags(),
        cap_gib in 1..40u64,
        size in 0..4usize,
        evict_active in any::<bool>(),
    ) {
        let cap = cap_gib * GIB;
        let (mut pins, mut fake) = populate(PinConfig { cap, ram_cache_headroom: 0, high_ram: false }, &spec);
        set_flags(&mut pins, &flags);
        let size = SIZES[size];
        let tiers = registration_tiers(evict_active);
        let eligible: u64 = pins.models.values()
            .filter(|m| tiers.iter().any(|t| t.covers(m.in_prompt, m.active)))
            .map(|m| m.subsets.iter().map(|s| s.registered_bytes).sum::<u64>())
            .sum();
        let before = pins.registered_bytes();
        let committed = fake.committed();
        let ok = pins.ensure_registerable(&mut fake, size, evict_active);
        check(&pins, &fake);
        prop_assert_eq!(fake.committed(), committed, "unregistering frees no RAM");
        let unregistered = before - pins.registered_bytes();
        if before + size <= cap {
            prop_assert!(ok);
            prop_assert_eq!(unregistered, 0);
        } else {
            let shortfall = before + size - cap;
            let target = shortfall + REGISTERABLE_PIN_HYSTERESIS;
            prop_assert!(unregistered >= target.min(eligible));
            prop_assert!(unregistered < target + SIZES[3]);
            prop_assert_eq!(ok, unregistered >= shortfall);
        }
        if ok {
            prop_assert!(pins.registered_bytes() + size <= cap, "the new registration would pass the cap");
        }
    }

    #[test]
    fn stealing_only_takes_strictly_lower_priorities_of_identical_size(
        sizes in prop::collection::vec(0..3usize, 1..30),
        thieves in prop::collection::vec((0..40u64, 0..3usize), 1..30),
    ) {
        let mut pins = Pins::new(unlimited());
        let mut fake = FakeBacking::new();
        let model = ModelId(0);
        pins.load_model(model);
        let roomy = fake.ram(u64::MAX);
        for (i, &s) in sizes.iter().enumerate() {
            let mut env = PinEnv { backing: &mut fake, ram: &roomy, outputs: None };
            pins.pin(&mut env, model, Subset::Weights, ModuleId(i as u64), SIZES[s]).expect("loaded");
        }
        // From here every budget fails (no RAM, the only model active), so pins can only be stolen.
        let starved = fake.ram(0);
        for &(module, s) in &thieves {
            let module = ModuleId(module);
            let size = SIZES[s];
            let set = &pins.models[&model].subsets[Subset::Weights.index()];
            let had = set.index_of(module).is_some();
            let rivals: Vec<(u16, ModuleId, u64)> = set.stack.iter().filter(|slot| slot.size == size)
                .map(|slot| (set.known_priority(slot.module).unwrap_or_default(), slot.module, slot.offset))
                .collect();
            let mut env = PinEnv { backing: &mut fake, ram: &starved, outputs: None };
            let out = pins.pin(&mut env, model, Subset::Weights, module, size).expect("loaded");
            check(&pins, &fake);
            let set = &pins.models[&model].subsets[Subset::Weights.index()];
            let own = set.known_priority(module).unwrap_or_default();
            let lowest = rivals.iter().min().copied();
            match out {
                PinOutcome::Existing(_) => prop_assert!(had),
                PinOutcome::Created(_) => prop_assert!(false, "a budget passed with no RAM"),
                PinOutcome::Stolen { pin, victim } => {
                    prop_assert!(!had);
                    prop_assert!(lowest.is_some(), "stole with no pin of that size");
                    if let Some((p, m, offset)) = lowest {
                        prop_assert_eq!(victim, m, "not the lowest priority of that size");
                        prop_assert!(p < own, "stole from priority {} with {}", p, own);
                        prop_assert_eq!(pin.offset, offset);
                    }
                    prop_assert_eq!(pin.size, size);
                    prop_assert!(set.index_of(victim).is_none());
                }
                PinOutcome::NotPinned => {
                    prop_assert!(!had);
                    prop_assert!(lowest.is_none_or(|(p, ..)| p >= own), "could have stolen from {:?}", lowest);
                }
            }
        }
    }

    #[test]
    fn registration_swaps_keep_the_cap_and_always_fit_a_pin_under_it(
        cap_mib in 1536..6144u64,
        sizes in prop::collection::vec(0..4usize, 1..24),
        uses in prop::collection::vec(0..24u64, 1..60),
    ) {
        let cap = cap_mib * MIB;
        let mut pins = Pins::new(PinConfig { cap, ram_cache_headroom: 0, high_ram: false });
        let mut fake = FakeBacking::new();
        let model = ModelId(0);
        pins.load_model(model);
        pins.set_in_prompt(model, true);
        let ram = fake.ram(u64::MAX);
        for (i, &s) in sizes.iter().enumerate() {
            let mut env = PinEnv { backing: &mut fake, ram: &ram, outputs: None };
            let out = pins.pin(&mut env, model, Subset::Weights, ModuleId(i as u64), SIZES[s]).expect("loaded");
            prop_assert!(matches!(out, PinOutcome::Created(_)), "every pin fits under the cap alone: {:?}", out);
        }
        for &module in &uses {
            let got = pins.get_pin(&mut fake, model, Subset::Weights, ModuleId(module));
            check(&pins, &fake);
            prop_assert_eq!(got.is_some(), (module as usize) < sizes.len());
            if let Some(pin) = got {
                prop_assert!(pin.registered, "the active model makes room within itself");
            }
        }
    }

    #[test]
    fn node_reset_leaves_no_patch_pins_and_keeps_weights(spec in spec(), flags in flags()) {
        let (mut pins, mut fake) = populate(unlimited(), &spec);
        set_flags(&mut pins, &flags);
        let weights: Vec<u64> = (0..MODELS).map(|m| {
            [Subset::Weights, Subset::WeightsLoaded].iter()
                .filter_map(|&s| pins.stats(ModelId(m.into()), s)).map(|s| s.bytes).sum()
        }).collect();
        pins.reset_node(&mut fake);
        check(&pins, &fake);
        for m in 0..MODELS {
            let id = ModelId(m.into());
            for s in [Subset::Patches, Subset::PatchesLoaded] {
                prop_assert!(pins.stats(id, s).is_none_or(|st| st.pins == 0 && st.registered_bytes == 0));
                prop_assert!(fake.bufs.get(&(id, s)).is_none_or(|b| b.end == 0 && b.registered.is_empty()));
            }
            let kept: u64 = [Subset::Weights, Subset::WeightsLoaded].iter()
                .filter_map(|&s| pins.stats(id, s)).map(|s| s.bytes).sum();
            prop_assert_eq!(kept, weights[usize::from(m)]);
        }
    }
}
