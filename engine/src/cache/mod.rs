//! Output caches with upstream ComfyUI's semantics: classic, LRU(N), RAM pressure (the default) and none.
//!
//! A node's cache key covers its class, its fingerprint, its id when the class is not idempotent, and its inputs
//! with each link replaced by the linked node's key and the output slot (`keys.rs`). A fingerprint that changes
//! every time (`Fingerprint::Always`) makes the key [`CacheKey::Never`], which never hits, and so does any key
//! built on it. Keys do not depend on node ids otherwise, so renumbering a graph keeps its cache.

mod keys;
mod ram;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub use keys::{CacheKey, compute_keys};
pub use ram::{CacheThresholds, RamPressure, RamProbe, SystemRam};

use kiln_compute::memory::pressure::OutputCache;

use crate::nodes::UiOutput;
use crate::value::Value;

/// A node's stored result: per output slot, its list of values, and what it showed in the UI.
#[derive(Debug, Clone, PartialEq)]
pub struct CachedOutput {
    /// Per output slot, its values (one element unless the output is a list or the node ran over a list).
    pub outputs: Vec<Vec<Value>>,
    /// What the node showed in the UI.
    pub ui: Option<UiOutput>,
}

impl CachedOutput {
    fn byte_size(&self) -> usize {
        self.outputs.iter().flatten().map(Value::byte_size).sum()
    }
}

/// Which entries survive.
#[derive(Clone)]
pub enum CachePolicy {
    /// Only entries used by the latest prompt survive.
    Classic,
    /// Entries of the last prompts are kept while there are more than N; each prompt is a generation.
    Lru(usize),
    /// Entries are kept until available RAM falls under a threshold, then evicted by age × size.
    RamPressure(RamPressure),
    /// Nothing is cached.
    None,
}

impl std::fmt::Debug for CachePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CachePolicy::Classic => f.write_str("Classic"),
            CachePolicy::Lru(n) => write!(f, "Lru({n})"),
            CachePolicy::RamPressure(p) => write!(
                f,
                "RamPressure(active {} / inactive {} bytes)",
                p.thresholds.active, p.thresholds.inactive
            ),
            CachePolicy::None => f.write_str("None"),
        }
    }
}

/// Upstream's baseline size of an entry, so that entries without tensors still have a score.
const BASELINE_BYTES: f64 = 0.05;
/// Upstream's score multiplier per generation of age.
const AGE_MULTIPLIER: f64 = 1.3;

#[derive(Debug, Clone)]
struct Entry {
    value: Arc<CachedOutput>,
    used_generation: u64,
    touched: u64,
    bytes: usize,
}

/// A node-output cache under one policy.
#[derive(Debug)]
pub struct Cache {
    policy: CachePolicy,
    entries: HashMap<u128, Entry>,
    generation: u64,
    min_generation: u64,
    clock: u64,
}

impl Cache {
    /// An empty cache.
    pub fn new(policy: CachePolicy) -> Cache {
        Cache { policy, entries: HashMap::new(), generation: 0, min_generation: 0, clock: 0 }
    }

    /// The policy.
    pub fn policy(&self) -> &CachePolicy {
        &self.policy
    }

    /// Number of stored entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Starts a prompt whose nodes have `keys`: a new generation; entries the prompt uses are stamped with it,
    /// then the policy trims.
    pub fn begin_prompt<'a>(&mut self, keys: impl IntoIterator<Item = &'a CacheKey>) {
        self.generation += 1;
        let used: HashSet<u128> = keys.into_iter().filter_map(|k| k.id()).collect();
        for key in &used {
            if let Some(entry) = self.entries.get_mut(key) {
                entry.used_generation = self.generation;
            }
        }
        match &self.policy {
            CachePolicy::Classic => self.entries.retain(|key, _| used.contains(key)),
            CachePolicy::Lru(_) => self.trim_lru(),
            CachePolicy::RamPressure(pressure) => {
                let target = pressure.thresholds.inactive;
                self.evict_for_ram(target, false, 0);
            }
            CachePolicy::None => self.entries.clear(),
        }
    }

    /// The stored result for a key.
    pub fn get(&mut self, key: &CacheKey) -> Option<Arc<CachedOutput>> {
        let id = key.id()?;
        self.clock += 1;
        let entry = self.entries.get_mut(&id)?;
        entry.used_generation = self.generation;
        entry.touched = self.clock;
        Some(entry.value.clone())
    }

    /// Stores a result.
    pub fn set(&mut self, key: &CacheKey, value: Arc<CachedOutput>) {
        let Some(id) = key.id() else { return };
        if matches!(self.policy, CachePolicy::None) {
            return;
        }
        self.clock += 1;
        let bytes = value.byte_size();
        self.entries.insert(
            id,
            Entry { value, used_generation: self.generation, touched: self.clock, bytes },
        );
        if matches!(self.policy, CachePolicy::Lru(_)) {
            self.trim_lru();
        }
    }

    /// The cache's own trim after each node, for an executor without a memory manager: under RAM pressure,
    /// evict older prompts' entries until the active threshold is available. With a memory manager, its
    /// arbitration (which reaches the cache through [`OutputCache`]) runs instead.
    pub fn after_node(&mut self) {
        if let CachePolicy::RamPressure(pressure) = &self.policy {
            let target = pressure.thresholds.active;
            self.evict_for_ram(target, false, 0);
        }
    }

    /// Drops every entry.
    pub fn clear(&mut self) {
        self.entries.clear();
    }

    fn trim_lru(&mut self) {
        let CachePolicy::Lru(max) = self.policy else { return };
        while self.entries.len() > max && self.min_generation < self.generation {
            self.min_generation += 1;
            let min = self.min_generation;
            self.entries.retain(|_, e| e.used_generation >= min);
        }
    }

    /// Evicts entries, highest `1.3^age × (0.05 + bytes)` first (ties: least recently touched first), until
    /// the probe reports `target` bytes available (memory-manager.md §9.3). Entries of the current prompt are
    /// kept unless `free_active`, and entries under `min_entry_size` bytes are kept. Returns the bytes of the
    /// entries evicted; 0 outside RAM-pressure mode, which has no probe.
    fn evict_for_ram(&mut self, target: u64, free_active: bool, min_entry_size: u64) -> u64 {
        let CachePolicy::RamPressure(pressure) = &self.policy else { return 0 };
        let probe = pressure.probe.clone();
        if probe.available() >= target {
            return 0;
        }
        let generation = self.generation;
        let mut candidates: Vec<(u128, f64, u64)> = self
            .entries
            .iter()
            .filter(|(_, e)| free_active || e.used_generation < generation)
            .filter(|(_, e)| e.bytes as u64 >= min_entry_size)
            .map(|(k, e)| {
                let age = (generation - e.used_generation) as f64;
                (*k, AGE_MULTIPLIER.powf(age) * (e.bytes as f64 + BASELINE_BYTES), e.touched)
            })
            .collect();
        candidates.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.2.cmp(&b.2)));
        let mut freed = 0;
        for (key, _, _) in candidates {
            if let Some(entry) = self.entries.remove(&key) {
                freed += entry.bytes as u64;
            }
            if probe.available() >= target {
                break;
            }
        }
        freed
    }
}

/// The cache as the memory manager's post-node RAM arbitration sees it (§7.6, §9.3): [`OutputCache::release`]
/// evicts by score until RAM is available. Only a RAM-pressure cache releases anything; the other policies
/// have no RAM reading and evict by their own rules.
impl OutputCache for Cache {
    fn release(&mut self, target_available: u64, free_active: bool, min_entry_size: u64) -> u64 {
        self.evict_for_ram(target_available, free_active, min_entry_size)
    }
}

#[cfg(test)]
mod tests;
