//! The RAM-pressure cache's settings: its thresholds and how it reads RAM.
//!
//! Both come from the compute layer's [`kiln_compute::memory::pressure`], so the output cache and the memory
//! manager's pins answer to one RAM policy: the same reading of available RAM (`/proc/meminfo`, clamped to the
//! process's cgroup limit) and the same `--cache-ram` thresholds, in GiB as upstream.

use std::sync::Arc;

pub use kiln_compute::memory::pressure::{CacheThresholds, RamProbe, SystemRam};

/// RAM assumed where the machine's RAM cannot be read (not Linux), for the default thresholds.
const UNKNOWN_TOTAL: u64 = 16 << 30;

/// The RAM-pressure thresholds and how RAM is read.
#[derive(Clone)]
pub struct RamPressure {
    /// Available RAM to restore: `inactive` by evicting older prompts' entries (when a prompt starts and
    /// after each node), `active` after each node.
    pub thresholds: CacheThresholds,
    /// Reads available RAM (fresh on every call: evictions change it).
    pub probe: Arc<dyn RamProbe + Send + Sync>,
}

impl RamPressure {
    /// Upstream's defaults ([`CacheThresholds::defaults`]) for a machine with `total` bytes of RAM:
    /// active = clamp(10 %, 2 GiB, 10 GiB), inactive = min(total, 128 GiB).
    pub fn defaults(total: u64, probe: Arc<dyn RamProbe + Send + Sync>) -> RamPressure {
        RamPressure { thresholds: CacheThresholds::defaults(total), probe }
    }

    /// Upstream's defaults for this machine, read with [`SystemRam`] (total RAM clamped to the cgroup limit;
    /// 16 GiB assumed where RAM cannot be read, and then nothing is evicted for pressure).
    pub fn system() -> RamPressure {
        let ram = SystemRam::new();
        let total = ram.snapshot().map_or(UNKNOWN_TOTAL, |snapshot| snapshot.total);
        RamPressure::defaults(total, Arc::new(ram))
    }
}
