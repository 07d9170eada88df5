//! Reading available RAM, for the RAM-pressure cache.

/// Reports how much RAM is available.
pub trait RamProbe: Send + Sync {
    /// Available bytes now.
    fn available_bytes(&self) -> u64;
}

/// Reads `MemAvailable` from `/proc/meminfo`; where that cannot be read, reports unlimited RAM (so nothing is
/// evicted for pressure).
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcMeminfo;

impl ProcMeminfo {
    /// Total RAM in bytes (`MemTotal`), or `None` where it cannot be read.
    pub fn total_bytes() -> Option<u64> {
        read_field("MemTotal")
    }
}

impl RamProbe for ProcMeminfo {
    fn available_bytes(&self) -> u64 {
        read_field("MemAvailable").unwrap_or(u64::MAX)
    }
}

fn read_field(name: &str) -> Option<u64> {
    meminfo_bytes(&std::fs::read_to_string("/proc/meminfo").ok()?, name)
}

/// The `name` field (`MemTotal`, `MemAvailable`, ...) of `/proc/meminfo` text, converted from KiB to bytes;
/// `None` when the field is missing or not a number.
pub fn meminfo_bytes(meminfo: &str, name: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kib| kib.saturating_mul(1024))
}
