//! [`VramConfig`]: the VRAM knobs of memory-manager.md §10, with ComfyUI's defaults.
//!
//! Invariant: sizes are bytes; the page and the scratch chunk are multiples of the device granularity
//! ([`VramConfig::validate`] checks it when an [`super::Arbiter`] is made).

use std::time::Duration;

use crate::error::{Error, Result};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The VRAM side's settings for one device (§10), all in bytes unless named otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VramConfig {
    /// Memory the budget keeps free (`simple_headroom`, `vram.headroom_mib`; ComfyUI's `--reserve-vram GB`
    /// sets it to `GB × 2^30`). Default 256 MiB.
    pub headroom: u64,
    /// Added to every deficit (`extra_headroom`, `vram.extra_headroom_mib`; ComfyUI's `--vram-headroom`).
    /// Default 0.
    pub extra_headroom: u64,
    /// Free memory the driver poll wants to see (`deficit_sync = driver_headroom − driver free`; aimdo's
    /// constant `VRAM_HEADROOM`). Default 256 MiB.
    pub driver_headroom: u64,
    /// How often, at most, the driver is asked for free memory (`vram.budget_poll_ms`). Default 2000 ms.
    pub budget_poll: Duration,
    /// The VBAR page (`VBAR_PAGE_SIZE`). Default 32 MiB.
    pub page_size: u64,
    /// A VBAR reserves this many times the model's size of address space (`vbar.va_factor`; room for casts
    /// up to FP32 of FP4 weights), clamped to the device's capacity. Default 10.
    pub va_factor: u64,
    /// Address space each offload stream's scratch buffer reserves (`scratch.va_gib`). Default 16 GiB.
    pub scratch_va: u64,
    /// The scratch buffer grows by this much physical memory at a time (`scratch.chunk_mib`). Default 16 MiB.
    pub scratch_chunk: u64,
    /// Extra room an activation allocation evicts for before it allocates (`deficit(size + alloc_headroom)`).
    /// Default 0, as upstream's stream-ordered allocation path; upstream's synchronous `cudaMalloc` path uses
    /// 128 MiB.
    pub alloc_headroom: u64,
}

impl Default for VramConfig {
    fn default() -> VramConfig {
        VramConfig {
            headroom: 256 * MIB,
            extra_headroom: 0,
            driver_headroom: 256 * MIB,
            budget_poll: Duration::from_millis(2000),
            page_size: 32 * MIB,
            va_factor: 10,
            scratch_va: 16 * GIB,
            scratch_chunk: 16 * MIB,
            alloc_headroom: 0,
        }
    }
}

impl VramConfig {
    /// Checks the settings against a device's mapping granularity.
    pub fn validate(&self, granularity: u64) -> Result<()> {
        let aligned = |what: &str, v: u64| {
            if v == 0 || !v.is_multiple_of(granularity) {
                Err(Error::Unsupported(format!(
                    "a {what} of {v} bytes is not a positive multiple of the device granularity ({granularity} bytes)"
                )))
            } else {
                Ok(())
            }
        };
        aligned("VBAR page", self.page_size)?;
        aligned("scratch chunk", self.scratch_chunk)?;
        if self.scratch_va == 0 {
            return Err(Error::Unsupported("a scratch buffer needs some address space".into()));
        }
        if self.va_factor == 0 {
            return Err(Error::Unsupported("a VBAR needs a VA factor of at least 1".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_comfyuis() {
        let c = VramConfig::default();
        assert_eq!(c.headroom, 256 * MIB);
        assert_eq!(c.extra_headroom, 0);
        assert_eq!(c.budget_poll, Duration::from_millis(2000));
        assert_eq!(c.page_size, 32 * MIB);
        assert_eq!(c.va_factor, 10);
        assert_eq!(c.scratch_va, 16 * GIB);
        assert_eq!(c.scratch_chunk, 16 * MIB);
        c.validate(2 * MIB).expect("defaults fit a 2 MiB granularity");
    }

    #[test]
    fn unaligned_sizes_are_refused() {
        let c = VramConfig { page_size: 3 * MIB, ..VramConfig::default() };
        assert!(matches!(c.validate(2 * MIB), Err(Error::Unsupported(_))));
        let c = VramConfig { scratch_chunk: 0, ..VramConfig::default() };
        assert!(c.validate(2 * MIB).is_err());
        let c = VramConfig { va_factor: 0, ..VramConfig::default() };
        assert!(c.validate(2 * MIB).is_err());
    }
}
