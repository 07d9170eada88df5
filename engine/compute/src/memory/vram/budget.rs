//! The VRAM budget (§2.3): how many bytes must be evicted before `size` more fit, from the bytes the manager
//! tracks and a driver poll made at most every [`super::VramConfig::budget_poll`].
//!
//! ```text
//! deficit_simple = usage + size + headroom − capacity
//! deficit_delta  = deficit_sync + (usage − usage_at_last_poll) + size
//! deficit        = max(deficit_simple, deficit_delta) + extra_headroom
//! deficit_sync   = driver_headroom − free_reported_by_driver          (at the last poll)
//! ```
//!
//! Invariant: `usage` changes only through [`Budget::add`] and [`Budget::sub`], called by the arbiter exactly
//! when it maps, allocates, unmaps or frees device memory, so it is the manager's whole footprint. The poll's
//! clock is injected ([`Clock`]) so tests move time by hand instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::config::VramConfig;
use crate::error::Result;
use crate::memory::device::DeviceMemory;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// A monotonic clock for the budget's driver poll.
pub trait Clock: Send + Sync {
    /// Time elapsed since an arbitrary fixed start; never decreases.
    fn now(&self) -> Duration;
}

/// The real clock ([`Instant`]).
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl SystemClock {
    /// A clock starting now.
    pub fn new() -> SystemClock {
        SystemClock { start: Instant::now() }
    }
}

impl Default for SystemClock {
    fn default() -> SystemClock {
        SystemClock::new()
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    /// A clock at zero.
    pub fn new() -> ManualClock {
        ManualClock::default()
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// The bytes an activation allocation of `bytes` counts for (upstream's guess at the stream-ordered
/// allocator): at least 1 KiB; above 1 MiB, rounded up to whole 2 MiB pages; in between, as asked.
pub fn accounted_activation_bytes(bytes: u64) -> u64 {
    if bytes <= KIB {
        KIB
    } else if bytes > MIB {
        bytes.div_ceil(2 * MIB) * (2 * MIB)
    } else {
        bytes
    }
}

/// The budget of one device: tracked usage, headrooms and the last driver poll.
pub(crate) struct Budget {
    capacity: u64,
    headroom: u64,
    extra_headroom: u64,
    driver_headroom: u64,
    poll_every: Duration,
    usage: u64,
    usage_at_poll: u64,
    deficit_sync: i128,
    last_poll: Option<Duration>,
    clock: Arc<dyn Clock>,
}

impl Budget {
    /// A budget for a device of `capacity` bytes with nothing in use.
    pub(crate) fn new(capacity: u64, config: &VramConfig, clock: Arc<dyn Clock>) -> Budget {
        Budget {
            capacity,
            headroom: config.headroom,
            extra_headroom: config.extra_headroom,
            driver_headroom: config.driver_headroom,
            poll_every: config.budget_poll,
            usage: 0,
            usage_at_poll: 0,
            deficit_sync: 0,
            last_poll: None,
            clock,
        }
    }

    /// Bytes to evict before `size` more bytes fit (≤ 0: none). Polls the driver first when the last poll is
    /// at least the poll interval old.
    pub(crate) fn deficit(&mut self, size: u64, dev: &dyn DeviceMemory) -> Result<i64> {
        self.poll(dev)?;
        let usage = i128::from(self.usage);
        let size = i128::from(size);
        let simple = usage + size + i128::from(self.headroom) - i128::from(self.capacity);
        let delta = self.deficit_sync + (usage - i128::from(self.usage_at_poll)) + size;
        let deficit = simple.max(delta) + i128::from(self.extra_headroom);
        Ok(clamp_i64(deficit))
    }

    /// `capacity − (usage + need + headroom)`: what is left once `need` more bytes are in use (the fault's
    /// rationalisation, §2.2).
    pub(crate) fn surplus(&self, need: u64) -> i64 {
        clamp_i64(
            i128::from(self.capacity)
                - (i128::from(self.usage) + i128::from(need) + i128::from(self.headroom)),
        )
    }

    fn poll(&mut self, dev: &dyn DeviceMemory) -> Result<()> {
        let now = self.clock.now();
        if let Some(last) = self.last_poll
            && now.saturating_sub(last) < self.poll_every
        {
            return Ok(());
        }
        let info = dev.mem_info()?;
        self.last_poll = Some(now);
        self.usage_at_poll = self.usage;
        self.deficit_sync = i128::from(self.driver_headroom) - i128::from(info.free);
        tracing::trace!(free = info.free, deficit_sync = %self.deficit_sync, "vram budget poll");
        Ok(())
    }

    /// Counts `bytes` more in use.
    pub(crate) fn add(&mut self, bytes: u64) {
        self.usage += bytes;
    }

    /// Counts `bytes` fewer in use.
    pub(crate) fn sub(&mut self, bytes: u64) {
        debug_assert!(bytes <= self.usage, "usage would go below zero");
        self.usage = self.usage.saturating_sub(bytes);
    }

    /// Bytes in use as tracked by the manager.
    pub(crate) fn usage(&self) -> u64 {
        self.usage
    }

    /// The device's capacity.
    pub(crate) fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Sets the simple headroom (ComfyUI's `--reserve-vram`).
    pub(crate) fn set_headroom(&mut self, bytes: u64) {
        self.headroom = bytes;
    }

    /// The simple headroom.
    pub(crate) fn headroom(&self) -> u64 {
        self.headroom
    }

    /// Sets the extra headroom (ComfyUI's `--vram-headroom`).
    pub(crate) fn set_extra_headroom(&mut self, bytes: u64) {
        self.extra_headroom = bytes;
    }
}

fn clamp_i64(v: i128) -> i64 {
    i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::sim::SimDevice;

    fn setup(capacity: u64, config: VramConfig) -> (SimDevice, Arc<ManualClock>, Budget) {
        let clock = Arc::new(ManualClock::new());
        let budget = Budget::new(capacity, &config, clock.clone());
        (SimDevice::new(capacity), clock, budget)
    }

    fn small_config() -> VramConfig {
        VramConfig { headroom: 64 * MIB, driver_headroom: 32 * MIB, ..VramConfig::default() }
    }

    #[test]
    fn simple_deficit_counts_usage_size_and_headroom() {
        let (dev, _clock, mut b) = setup(1024 * MIB, small_config());
        // Empty device: deficit_sync = 32 − 1024 MiB, so the simple formula wins.
        assert_eq!(b.deficit(0, &dev).expect("deficit"), -960 * MIB as i64);
        b.add(900 * MIB);
        assert_eq!(b.deficit(100 * MIB, &dev).expect("deficit"), 40 * MIB as i64);
        b.sub(900 * MIB);
        assert_eq!(b.usage(), 0);
    }

    #[test]
    fn extra_headroom_is_added_and_headroom_is_settable() {
        let (dev, _clock, mut b) = setup(1024 * MIB, small_config());
        b.set_extra_headroom(10 * MIB);
        assert_eq!(b.deficit(0, &dev).expect("deficit"), -950 * MIB as i64);
        b.set_headroom(1024 * MIB);
        assert_eq!(b.headroom(), 1024 * MIB);
        assert_eq!(b.deficit(0, &dev).expect("deficit"), 10 * MIB as i64);
    }

    #[test]
    fn driver_poll_sees_other_processes_at_most_every_interval() {
        let (dev, clock, mut b) = setup(1024 * MIB, small_config());
        assert!(b.deficit(0, &dev).expect("first call polls") < 0);
        dev.set_external_usage(1000 * MIB);
        // Within the interval the stale poll is used: no deficit yet.
        clock.advance(Duration::from_millis(1999));
        assert!(b.deficit(0, &dev).expect("deficit") < 0);
        clock.advance(Duration::from_millis(1));
        // Free is 24 MiB, the driver headroom 32 MiB: 8 MiB short, plus the size asked for.
        assert_eq!(b.deficit(0, &dev).expect("deficit"), 8 * MIB as i64);
        assert_eq!(b.deficit(MIB, &dev).expect("deficit"), 9 * MIB as i64);
    }

    #[test]
    fn usage_since_the_last_poll_counts_in_the_delta() {
        let (dev, clock, mut b) = setup(1024 * MIB, small_config());
        dev.set_external_usage(1000 * MIB);
        assert_eq!(b.deficit(0, &dev).expect("poll"), 8 * MIB as i64);
        // Our own usage grows without a new poll: the delta grows with it, even though the simple formula
        // (which does not know about the other process) sees plenty of room.
        b.add(4 * MIB);
        assert_eq!(b.deficit(0, &dev).expect("deficit"), 12 * MIB as i64);
        // The next poll starts the delta from the usage at that time.
        clock.advance(Duration::from_secs(2));
        assert_eq!(b.deficit(0, &dev).expect("deficit"), 8 * MIB as i64);
    }

    #[test]
    fn surplus_is_what_is_left_after_a_need() {
        let (_dev, _clock, mut b) = setup(1024 * MIB, small_config());
        b.add(100 * MIB);
        assert_eq!(b.surplus(64 * MIB), (1024 - 100 - 64 - 64) * MIB as i64);
        assert_eq!(b.surplus(2048 * MIB), (1024 - 100 - 2048 - 64) * MIB as i64);
    }

    #[test]
    fn activation_accounting_rounds_as_upstream() {
        assert_eq!(accounted_activation_bytes(0), KIB);
        assert_eq!(accounted_activation_bytes(1), KIB);
        assert_eq!(accounted_activation_bytes(KIB), KIB);
        assert_eq!(accounted_activation_bytes(KIB + 1), KIB + 1);
        assert_eq!(accounted_activation_bytes(MIB), MIB);
        assert_eq!(accounted_activation_bytes(MIB + 1), 2 * MIB);
        assert_eq!(accounted_activation_bytes(3 * MIB), 4 * MIB);
        assert_eq!(accounted_activation_bytes(4 * MIB), 4 * MIB);
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        assert_eq!(clock.now(), Duration::ZERO);
        clock.advance(Duration::from_millis(5));
        assert_eq!(clock.now(), Duration::from_millis(5));
        let real = SystemClock::new();
        let a = real.now();
        assert!(real.now() >= a);
    }
}
