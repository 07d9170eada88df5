//! The post-node RAM arbitration of §7.6 (HEAD order), in RAM-pressure cache mode.
//!
//! What is kept longest, first: the current prompt's intermediates, the current model's pins, other models
//! of the workflow, older prompts' intermediates, old model objects (#13603). So after each node:
//! 1. evict older prompts' cached outputs until `inactive` bytes are available;
//! 2. `shortfall = active − available`; if it is positive, evict *large* current outputs (≥ 512 MiB) first;
//! 3. if a shortfall remains, free pins of inactive models for `shortfall + 512 MiB`;
//! 4. if that freed less than the shortfall, wait 50 ms when more than 64 MiB was freed (the asynchronous
//!    decommit outruns the kernel's "available" counter), then evict current-prompt outputs too.
//!
//! Upstream's Windows rule (free pins only when available < 512 MiB or swap use ≥ 5 %) is left out: Kiln runs
//! on Linux, where any shortfall frees pins.

use std::time::Duration;

use super::{CacheThresholds, OutputCache, RamProbe};

/// A current output this large is evicted before any pin (HEAD's `RAM_CACHE_LARGE_INTERMEDIATE`).
pub const LARGE_INTERMEDIATE: u64 = 512 << 20;
/// Pins are freed for the shortfall plus this much.
pub const PIN_FREE_EXTRA: u64 = 512 << 20;
/// Freeing more than this many bytes of pins earns a settle delay before RAM is read again.
pub const SETTLE_AFTER: u64 = 64 << 20;
/// How long to let the decommit thread catch up.
pub const SETTLE_DELAY: Duration = Duration::from_millis(50);

/// Frees weight pins under RAM pressure (implemented by the pin manager over its host buffers).
pub trait PinReleaser {
    /// Frees (not just unregisters) pins of *inactive* models, in the order of §7.5, until `bytes` are freed
    /// or nothing eligible is left; returns the bytes freed.
    fn free_inactive_pins(&mut self, bytes: u64) -> u64;
}

/// What one arbitration did, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Arbitration {
    /// Bytes of older prompts' outputs evicted (step 1).
    pub older_outputs_freed: u64,
    /// `active − available` after step 1, when positive.
    pub shortfall: u64,
    /// Bytes of large current outputs evicted (step 2).
    pub large_outputs_freed: u64,
    /// Bytes of pins freed (step 3).
    pub pins_freed: u64,
    /// Whether it waited for the decommit to settle (step 4).
    pub settled: bool,
    /// Bytes of current outputs evicted after pins fell short (step 4).
    pub current_outputs_freed: u64,
}

/// Runs the post-node arbitration; `sleep` is how it waits (a real sleep in production).
pub fn arbitrate_after_node(
    thresholds: &CacheThresholds,
    ram: &dyn RamProbe,
    outputs: &mut dyn OutputCache,
    pins: &mut dyn PinReleaser,
    sleep: &mut dyn FnMut(Duration),
) -> Arbitration {
    let mut report = Arbitration {
        older_outputs_freed: outputs.release(thresholds.inactive, false, 0),
        ..Arbitration::default()
    };
    let mut shortfall = thresholds.active.saturating_sub(ram.available());
    report.shortfall = shortfall;
    if shortfall > 0 {
        report.large_outputs_freed = outputs.release(thresholds.active, true, LARGE_INTERMEDIATE);
        shortfall = shortfall.saturating_sub(report.large_outputs_freed);
    }
    if shortfall == 0 {
        return report;
    }
    report.pins_freed = pins.free_inactive_pins(shortfall.saturating_add(PIN_FREE_EXTRA));
    if report.pins_freed < shortfall {
        if report.pins_freed > SETTLE_AFTER {
            sleep(SETTLE_DELAY);
            report.settled = true;
        }
        report.current_outputs_freed = outputs.release(thresholds.active, true, 0);
    }
    report
}
