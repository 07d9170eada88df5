//! How far pinning may go: the registration cap (§7.4), the RAM floor and the hysteresis amounts (§7.3).

use crate::memory::pressure::{GIB, RamSnapshot};

/// Extra bytes of pins freed when a new pin lacks RAM, so the next pins do not each pay for a free
/// (`PIN_PRESSURE_HYSTERESIS`).
pub const PIN_PRESSURE_HYSTERESIS: u64 = 256 << 20;
/// Extra bytes unregistered when a registration would pass the cap: each unregistration implies a device
/// sync, so each one should buy a good amount of room (`REGISTERABLE_PIN_HYSTERESIS`).
pub const REGISTERABLE_PIN_HYSTERESIS: u64 = 2 * GIB;
/// Pins never take available RAM below this, whatever the cache threshold (HEAD, #14116).
pub const MIN_PIN_RAM_FLOOR: u64 = 2 * GIB;

/// The pin manager's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinConfig {
    /// Most bytes registered (page-locked) at once (`MAX_PINNED_MEMORY`); 0 disables pinning
    /// (`--disable-pinned-memory`, or a platform without registration).
    pub cap: u64,
    /// The RAM-pressure cache's active threshold (`RAM_CACHE_HEADROOM`, 0 in the other cache modes): pins
    /// keep half of it available, and at least [`MIN_PIN_RAM_FLOOR`].
    pub ram_cache_headroom: u64,
    /// `--high-ram`: pins never wait for RAM (the RAM budget always passes; the cap still holds).
    pub high_ram: bool,
}

impl PinConfig {
    /// Pinning off (`--disable-pinned-memory`).
    pub fn disabled() -> PinConfig {
        PinConfig { cap: 0, ram_cache_headroom: 0, high_ram: false }
    }

    /// Linux defaults for this machine: the cap of [`linux_pin_cap`] over the (cgroup-clamped) RAM, with disk
    /// swap counted only outside a cgroup limit (a cgroup may allow swap the host has run out of).
    pub fn linux(ram: &RamSnapshot, ram_cache_headroom: u64) -> PinConfig {
        let swap = if ram.cgroup_limit.is_some() { 0 } else { ram.disk_swap };
        PinConfig { cap: linux_pin_cap(ram.total, swap), ram_cache_headroom, high_ram: false }
    }

    /// Whether pins may be made at all.
    pub fn enabled(&self) -> bool {
        self.cap > 0
    }

    /// Available RAM that pin creation leaves alone: `max(headroom / 2, 2 GiB)`.
    pub fn ram_floor(&self) -> u64 {
        (self.ram_cache_headroom / 2).max(MIN_PIN_RAM_FLOOR)
    }
}

/// HEAD's Linux registration cap (#15266): `max(0.4·RAM, min(0.9·RAM, RAM − 4 GiB, RAM + swap − 16 GiB))`,
/// with `disk_swap` the disk-backed swap (zram is not swap: it lives in RAM).
pub fn linux_pin_cap(ram: u64, disk_swap: u64) -> u64 {
    let tenths = |n: u64| (u128::from(ram) * u128::from(n) / 10) as u64;
    let with_swap = ram.saturating_add(disk_swap).saturating_sub(16 * GIB);
    tenths(4).max(tenths(9).min(ram.saturating_sub(4 * GIB)).min(with_swap))
}

/// The Windows registration cap: 40 % of RAM ("the Windows limit is apparently 50 %").
pub fn windows_pin_cap(ram: u64) -> u64 {
    (u128::from(ram) * 4 / 10) as u64
}
