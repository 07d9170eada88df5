use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Cache, CacheKey, CachePolicy, CachedOutput, RamPressure, RamProbe};
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

/// Reports low RAM for the first `low_reads` reads, then plenty.
struct Simulated {
    reads: AtomicUsize,
    low_reads: usize,
}

impl RamProbe for Simulated {
    fn available_bytes(&self) -> u64 {
        if self.reads.fetch_add(1, Ordering::SeqCst) < self.low_reads { 0 } else { u64::MAX }
    }
}

fn ram_cache(low_reads: usize) -> (Cache, Arc<Simulated>) {
    let probe = Arc::new(Simulated { reads: AtomicUsize::new(usize::MAX / 2), low_reads });
    let pressure = RamPressure { active_bytes: 1, inactive_bytes: 1, probe: probe.clone() };
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
