//! The RAM-pressure cache thresholds and ComfyUI's `--cache-ram [ACTIVE [INACTIVE]]` flag (§9.4).
//!
//! Both thresholds are amounts of *available* RAM to restore, not amounts of cache: after each node the
//! caches and pins are trimmed until `active` bytes are available; outputs of older prompts are trimmed until
//! `inactive` bytes are. ComfyUI's "GB" are GiB (its `main.py` divides MiB by 1024, `execution.py` multiplies
//! by `1024 ** 3`), so these are too.

/// 2³⁰ bytes, the unit of `--cache-ram`.
pub const GIB: u64 = 1 << 30;

/// How much available RAM the RAM-pressure cache restores, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheThresholds {
    /// Trim to this after each node (upstream's `RAM_CACHE_HEADROOM`; pins keep RAM down to half of it).
    pub active: u64,
    /// Trim older prompts' outputs to this.
    pub inactive: u64,
}

/// A `--cache-ram` value that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CacheRamError {
    /// A value that is not a number.
    #[error("--cache-ram: {0:?} is not a number of GB")]
    NotANumber(String),
    /// A negative, infinite or NaN value.
    #[error("--cache-ram: {0} is not a size (it must be a finite number of GB, 0 or more)")]
    OutOfRange(f64),
    /// More than the two values the flag takes.
    #[error("--cache-ram takes at most two values (ACTIVE INACTIVE), got {0}")]
    TooMany(usize),
}

impl CacheThresholds {
    /// Upstream's defaults (#14089, #15068) for a machine whose RAM is `total` bytes (cgroup-clamped):
    /// active = clamp(10 % of RAM, 2 GiB, 10 GiB), inactive = min(RAM, 128 GiB).
    pub fn defaults(total: u64) -> CacheThresholds {
        CacheThresholds {
            active: (total / 10).clamp(2 * GIB, 10 * GIB),
            inactive: total.min(128 * GIB),
        }
    }

    /// The thresholds for `--cache-ram` followed by `values` (zero, one or two numbers of GiB, as typed): the
    /// first replaces the active default, the second the inactive one.
    pub fn from_cache_ram<S: AsRef<str>>(
        values: &[S],
        total: u64,
    ) -> Result<CacheThresholds, CacheRamError> {
        if values.len() > 2 {
            return Err(CacheRamError::TooMany(values.len()));
        }
        let mut parsed = values.iter().map(|v| parse_gib(v.as_ref()));
        let active = parsed.next().transpose()?;
        let inactive = parsed.next().transpose()?;
        Ok(CacheThresholds::defaults(total).with_cache_ram(active, inactive))
    }

    /// These thresholds with the ones `--cache-ram` gives, in GiB, in their place: `active` replaces the active
    /// threshold, `inactive` the inactive one (bytes truncated, as upstream's `int()`).
    pub fn with_cache_ram(mut self, active: Option<f64>, inactive: Option<f64>) -> CacheThresholds {
        // `as` saturates, so a huge value becomes u64::MAX bytes rather than wrapping.
        let bytes = |gib: f64| (gib * GIB as f64) as u64;
        if let Some(gib) = active {
            self.active = bytes(gib);
        }
        if let Some(gib) = inactive {
            self.inactive = bytes(gib);
        }
        self
    }
}

/// A number of GiB as typed on the command line: finite and not negative.
fn parse_gib(text: &str) -> Result<f64, CacheRamError> {
    let gib: f64 = text.trim().parse().map_err(|_| CacheRamError::NotANumber(text.to_string()))?;
    if !gib.is_finite() || gib < 0.0 {
        return Err(CacheRamError::OutOfRange(gib));
    }
    Ok(gib)
}
