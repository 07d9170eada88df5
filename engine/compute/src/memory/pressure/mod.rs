//! RAM pressure: how much RAM this process may still use, the `--cache-ram` thresholds, and the arbitration
//! after every node between cached node outputs and weight pins (memory-manager.md §7.6, §9.3–§9.4).
//!
//! Host RAM is shared by three users that never ask before growing: cached node outputs (owned by the
//! workflow engine), pinned RAM copies of weights (owned by [`super::pins`]) and everything else. Nobody
//! estimates; instead the RAM is read ([`RamProbe`]) and, when it runs short, the least valuable holdings are
//! given back in a fixed order. The cache is reached through [`OutputCache`] and the pins through
//! [`PinReleaser`], so this module decides the order and tests drive it with recording fakes.
//!
//! - `system`: reading `/proc/meminfo`, `/proc/swaps` and cgroup limits ([`SystemRam`]);
//! - `thresholds`: [`CacheThresholds`], the `--cache-ram` defaults and flag;
//! - `arbitrate`: [`arbitrate_after_node`].

mod arbitrate;
mod system;
mod thresholds;

pub use arbitrate::{
    Arbitration, LARGE_INTERMEDIATE, PIN_FREE_EXTRA, PinReleaser, SETTLE_AFTER, SETTLE_DELAY,
    arbitrate_after_node,
};
pub use system::{
    CgroupMembership, Meminfo, RamSnapshot, SwapArea, SwapKind, SystemRam, disk_swap_bytes,
    parse_cgroup_limit, parse_meminfo, parse_memory_stat, parse_proc_cgroup, parse_swaps,
};
pub use thresholds::{CacheRamError, CacheThresholds, GIB};

/// Reports how much RAM this process can still use.
pub trait RamProbe {
    /// Available bytes now (a fresh reading every call: eviction changes it).
    fn available(&self) -> u64;
}

impl<F: Fn() -> u64> RamProbe for F {
    fn available(&self) -> u64 {
        self()
    }
}

/// The workflow engine's node-output cache, as RAM pressure sees it (its RAM-pressure mode, §9.3).
pub trait OutputCache {
    /// Evicts entries until `target_available` bytes of RAM are available (returning at once when they
    /// already are), highest `1.3^age × bytes` score first. Entries of the current prompt are kept unless
    /// `free_active`; entries smaller than `min_entry_size` bytes are kept. Returns the bytes of the entries
    /// evicted, by the cache's own accounting.
    fn release(&mut self, target_available: u64, free_active: bool, min_entry_size: u64) -> u64;
}

#[cfg(test)]
mod tests;
