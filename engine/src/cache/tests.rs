use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Cache, CacheKey, CachePolicy, CacheThresholds, CachedOutput, RamPressure, RamProbe};
use crate::tensor::Tensor;
use crate::value::Value;

fn entry(bytes: usize) -> Arc<CachedOutput> {
    let floats = bytes / 4;
    Arc::new(CachedOutput {
        outputs: vec![vec![Value::Image(Tensor::full(vec![floats], 0.0))]],
        ui: None,
    })
}

fn key(n: u128) -> CacheKey {
    CacheKey::Key(n)
}

#[test]
fn classic_keeps_only_the_latest_prompts_keys() {
    let mut cache = Cache::new(CachePolicy::Classic);
    cache.begin_prompt(&[key(1), key(2)]);
    cache.set(&key(1), entry(4));
    cache.set(&key(2), entry(4));
    cache.begin_prompt(&[key(2), key(3)]);
    assert!(cache.get(&key(1)).is_none(), "key 1 is not in the new prompt");
    assert!(cache.get(&key(2)).is_some());
}

#[test]
fn lru_keeps_the_last_generations_while_over_n() {
    let mut cache = Cache::new(CachePolicy::Lru(2));
    for n in 1..=4u128 {
        cache.begin_prompt(&[key(n)]);
        cache.set(&key(n), entry(4));
    }
    assert!(cache.len() <= 2, "at most N entries once older generations can go: {}", cache.len());
    assert!(cache.get(&key(4)).is_some() && cache.get(&key(3)).is_some());
    assert!(cache.get(&key(1)).is_none());
    // Using an old entry again keeps it alive.
    cache.begin_prompt(&[key(3)]);
    cache.set(&key(5), entry(4));
    assert!(cache.get(&key(3)).is_some());
}

#[test]
fn none_caches_nothing() {
    let mut cache = Cache::new(CachePolicy::None);
    cache.begin_prompt(&[key(1)]);
    cache.set(&key(1), entry(4));
    assert!(cache.get(&key(1)).is_none());
}

#[test]
fn never_keys_never_hit() {
    let mut cache = Cache::new(CachePolicy::Classic);
    cache.begin_prompt(&[CacheKey::Never]);
    cache.set(&CacheKey::Never, entry(4));
    assert!(cache.get(&CacheKey::Never).is_none());
    assert!(cache.is_empty());
}

/// Reports no RAM available for the first `low` reads, then plenty.
struct Simulated {
    reads: AtomicUsize,
    low: AtomicUsize,
}

impl RamProbe for Simulated {
    fn available(&self) -> u64 {
        let low = self.low.load(Ordering::SeqCst);
        if self.reads.fetch_add(1, Ordering::SeqCst) < low { 0 } else { u64::MAX }
    }
}

fn ram_cache(low_reads: usize) -> (Cache, Arc<Simulated>) {
    let probe = Arc::new(Simulated {
        reads: AtomicUsize::new(usize::MAX / 2),
        low: AtomicUsize::new(low_reads),
    });
    let thresholds = CacheThresholds { active: 1, inactive: 1 };
    let pressure = RamPressure { thresholds, probe: probe.clone() };
    (Cache::new(CachePolicy::RamPressure(pressure)), probe)
}

#[test]
fn ram_pressure_keeps_everything_while_ram_is_plentiful() {
    let (mut cache, _) = ram_cache(0);
    for n in 1..=50u128 {
        cache.begin_prompt(&[key(n)]);
        cache.set(&key(n), entry(1 << 20));
        cache.after_node();
    }
    assert_eq!(cache.len(), 50, "never evicted by count");
}

#[test]
fn ram_pressure_evicts_old_large_entries_first_and_spares_the_current_prompt() {
    // One low reading: exactly one eviction, then RAM is back.
    let (mut cache, probe) = ram_cache(1);
    cache.begin_prompt(&[key(1), key(2)]);
    cache.set(&key(1), entry(4)); // old and small
    cache.set(&key(2), entry(4 << 20)); // old and large
    cache.begin_prompt(&[key(3)]);
    cache.set(&key(3), entry(1 << 20)); // newer
    cache.begin_prompt(&[key(4)]);
    cache.set(&key(4), entry(64 << 20)); // current prompt: never evicted for pressure
    probe.reads.store(0, Ordering::SeqCst);
    cache.after_node();
    assert!(cache.get(&key(4)).is_some(), "the current prompt's entry stays");
    assert!(cache.get(&key(2)).is_none(), "the oldest large entry goes first (age × size)");
    assert!(cache.get(&key(1)).is_some() && cache.get(&key(3)).is_some());
}

#[test]
fn ram_pressure_with_a_persistently_low_reading_evicts_every_older_entry() {
    let (mut cache, probe) = ram_cache(usize::MAX);
    cache.begin_prompt(&[key(1)]);
    cache.set(&key(1), entry(4));
    cache.begin_prompt(&[key(2)]);
    cache.set(&key(2), entry(4));
    probe.reads.store(0, Ordering::SeqCst);
    cache.after_node();
    assert!(cache.get(&key(1)).is_none());
    assert!(cache.get(&key(2)).is_some(), "the running prompt's own outputs are not evicted");
}

// ---------------------------------------------------------------------------------------------------------
// `OutputCache::release`, as the memory manager's post-node arbitration calls it (memory-manager.md §9.3).

use kiln_compute::memory::pressure::OutputCache;

const MIB: usize = 1 << 20;

/// Three generations: prompt 1 stored A (4 MiB) and B (1 MiB), prompt 2 stored C then D (5 MiB each), and
/// the running prompt 3 stored E (64 MiB).
fn three_generations(low_reads: usize) -> (Cache, Arc<Simulated>) {
    let (mut cache, probe) = ram_cache(low_reads);
    cache.begin_prompt(&[key(1), key(2)]);
    cache.set(&key(1), entry(4 * MIB));
    cache.set(&key(2), entry(MIB));
    cache.begin_prompt(&[key(3), key(4)]);
    cache.set(&key(3), entry(5 * MIB));
    cache.set(&key(4), entry(5 * MIB));
    cache.begin_prompt(&[key(5)]);
    cache.set(&key(5), entry(64 * MIB));
    (cache, probe)
}

fn present(cache: &mut Cache) -> Vec<u128> {
    (1..=5u128).filter(|n| cache.get(&key(*n)).is_some()).collect()
}

#[test]
fn release_evicts_by_age_weighted_size_oldest_first_on_ties() {
    let (mut cache, probe) = three_generations(0);
    // Scores in generation 3: A 1.3² × 4 MiB ≈ 6.76 MiB, C = D = 1.3 × 5 MiB = 6.5 MiB, B 1.3² × 1 MiB.
    // So the older, smaller A goes before C; C and D tie and C, touched first, goes first; E is current.
    let mut order = Vec::new();
    for _ in 0..4 {
        // One low reading: one eviction per call, then RAM is back.
        probe_low(&probe, 1);
        let before: Vec<u128> = (1..=5u128).filter(|n| cache.entries.contains_key(n)).collect();
        let freed = cache.release(u64::MAX - 1, false, 0);
        let after: Vec<u128> = (1..=5u128).filter(|n| cache.entries.contains_key(n)).collect();
        let gone: Vec<u128> = before.into_iter().filter(|n| !after.contains(n)).collect();
        assert_eq!(gone.len(), 1, "exactly one eviction per low reading: {gone:?}");
        let bytes = [4 * MIB, MIB, 5 * MIB, 5 * MIB][gone[0] as usize - 1] as u64;
        assert_eq!(freed, bytes, "release returns the evicted entry's bytes");
        order.push(gone[0]);
    }
    assert_eq!(order, vec![1, 3, 4, 2]);
    // Only the current prompt's entry is left, and it is kept without `free_active` however low RAM is.
    probe_low(&probe, usize::MAX);
    assert_eq!(cache.release(u64::MAX - 1, false, 0), 0);
    assert_eq!(present(&mut cache), vec![5]);
}

#[test]
fn release_with_free_active_takes_current_entries_and_skips_small_ones() {
    let (mut cache, probe) = three_generations(0);
    probe_low(&probe, usize::MAX);
    // Persistently low RAM: everything at or above 5 MiB goes, the current 64 MiB entry included.
    let freed = cache.release(u64::MAX - 1, true, 5 * MIB as u64);
    assert_eq!(freed, (64 + 5 + 5) * MIB as u64);
    assert_eq!(present(&mut cache), vec![1, 2], "entries under min_entry_size stay");
}

#[test]
fn release_does_nothing_while_the_target_is_available() {
    let (mut cache, probe) = three_generations(0);
    probe_low(&probe, 0);
    assert_eq!(cache.release(u64::MAX - 1, true, 0), 0);
    assert_eq!(present(&mut cache), vec![1, 2, 3, 4, 5]);
    // The target is compared with what the probe reads: a target above it evicts.
    let (mut cache, probe) = three_generations(0);
    probe_low(&probe, usize::MAX);
    assert_eq!(cache.release(1, false, 0), (4 + 1 + 5 + 5) * MIB as u64);
    assert_eq!(cache.release(0, true, 0), 0, "0 bytes are always available");
    assert_eq!(present(&mut cache), vec![5]);
}

#[test]
fn release_outside_ram_pressure_mode_evicts_nothing() {
    for policy in [CachePolicy::Classic, CachePolicy::Lru(10)] {
        let mut cache = Cache::new(policy);
        cache.begin_prompt(&[key(1)]);
        cache.set(&key(1), entry(4 * MIB));
        // A RAM-pressure cache would evict it (`free_active`, and `u64::MAX` bytes are never available).
        assert_eq!(cache.release(u64::MAX, true, 0), 0);
        assert_eq!(cache.len(), 1);
    }
}

/// Makes the next `low_reads` readings report no RAM available, and the ones after plenty.
fn probe_low(probe: &Simulated, low_reads: usize) {
    probe.reads.store(0, Ordering::SeqCst);
    probe.low.store(low_reads, Ordering::SeqCst);
}
