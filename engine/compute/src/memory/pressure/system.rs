//! Reading this machine's RAM: `/proc/meminfo`, `/proc/swaps` and the cgroup memory limit the process runs
//! under (v2 `memory.max`/`memory.current`, v1 `memory.limit_in_bytes`/`memory.usage_in_bytes`).
//!
//! `/proc/meminfo` is not namespaced, so inside a container with a memory limit it reports the host's RAM,
//! not the limit the kernel kills the process at. As upstream ComfyUI does (`comfy/system_memory.py`), the
//! snapshot clamps total RAM to the tightest cgroup limit found from the process's own cgroup up to the mount
//! root, and available RAM to `limit − usage` of that same cgroup, where usage leaves out the reclaimable
//! inactive page cache. A limit at or above the host's RAM is no limit. Nothing is cached: an orchestrator may
//! resize the cgroup while the process runs.
//!
//! The parsers are pure functions over file text so tests feed them samples; [`SystemRam`] reads the files
//! under two roots (`/proc` and `/sys/fs/cgroup` in production, a directory of samples in tests).

use std::path::{Path, PathBuf};

use super::RamProbe;

/// cgroup v1 spells "no limit" as a number near 2⁶³ rather than a word.
const CGROUP_V1_UNLIMITED: u64 = 1 << 62;

/// The `/proc/meminfo` fields the memory manager uses, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meminfo {
    /// `MemTotal`.
    pub total: u64,
    /// `MemAvailable`: what can be allocated without swapping, counting reclaimable caches.
    pub available: u64,
    /// `SwapTotal` (every kind of swap, zram included).
    pub swap_total: u64,
}

/// Parses `/proc/meminfo` text (values in KiB); `None` when `MemTotal` or `MemAvailable` is missing or not a
/// number. A missing `SwapTotal` reads as 0.
pub fn parse_meminfo(text: &str) -> Option<Meminfo> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
            .map(|kib| kib.saturating_mul(1024))
    };
    Some(Meminfo {
        total: field("MemTotal")?,
        available: field("MemAvailable")?,
        swap_total: field("SwapTotal").unwrap_or(0),
    })
}

/// What backs a swap area.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwapKind {
    /// A partition or file on a disk: memory pushed there really leaves RAM.
    Disk,
    /// A compressed RAM device (`/dev/zramN`): swapping to it still uses RAM, so it does not count as swap.
    Zram,
}

/// One line of `/proc/swaps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwapArea {
    /// The device or file.
    pub path: String,
    /// What backs it.
    pub kind: SwapKind,
    /// Size in bytes.
    pub size: u64,
    /// Bytes in use.
    pub used: u64,
}

/// Parses `/proc/swaps` text (header, then `Filename Type Size Used Priority` with sizes in KiB). A file name
/// may hold spaces, so each line is split from the right. Lines that do not parse are skipped.
pub fn parse_swaps(text: &str) -> Vec<SwapArea> {
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let (path, [_priority, used, size, _kind]) = split_from_right(line)?;
            let name = path.rsplit('/').next().unwrap_or(path);
            let kind = if name.starts_with("zram") { SwapKind::Zram } else { SwapKind::Disk };
            Some(SwapArea {
                path: path.to_string(),
                kind,
                size: size.parse::<u64>().ok()?.saturating_mul(1024),
                used: used.parse::<u64>().ok()?.saturating_mul(1024),
            })
        })
        .collect()
}

/// Splits the last `N` blank-separated fields off `line` (last field first); the rest is the remainder,
/// which may hold blanks itself.
fn split_from_right<const N: usize>(line: &str) -> Option<(&str, [&str; N])> {
    let is_blank = |c: char| c == ' ' || c == '\t';
    let mut rest = line.trim_end_matches(is_blank);
    let mut fields = [""; N];
    for field in &mut fields {
        let at = rest.rfind(is_blank)?;
        *field = &rest[at + 1..];
        rest = rest[..at].trim_end_matches(is_blank);
    }
    (!rest.is_empty()).then_some((rest, fields))
}

/// Total bytes of disk-backed swap (zram left out).
pub fn disk_swap_bytes(areas: &[SwapArea]) -> u64 {
    areas.iter().filter(|a| a.kind == SwapKind::Disk).map(|a| a.size).sum()
}

/// Where `/proc/self/cgroup` puts this process.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupMembership {
    /// Path in the unified (v2) hierarchy, from the `0::PATH` line.
    pub unified: Option<String>,
    /// Path in the v1 hierarchy that holds the `memory` controller.
    pub memory_v1: Option<String>,
}

/// Parses `/proc/self/cgroup` text (`ID:CONTROLLERS:PATH` per line).
pub fn parse_proc_cgroup(text: &str) -> CgroupMembership {
    let mut out = CgroupMembership::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.unified = Some(path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            out.memory_v1 = Some(path.to_string());
        }
    }
    out
}

/// Parses a cgroup limit file (`memory.max`, `memory.limit_in_bytes`): `None` for `max`, v1's near-2⁶³
/// "unlimited", or anything that is not a number.
pub fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let value: u64 = text.trim().parse().ok()?;
    (value < CGROUP_V1_UNLIMITED).then_some(value)
}

/// The `field` line of a cgroup `memory.stat` file, in bytes.
pub fn parse_memory_stat(text: &str, field: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut parts = line.split_whitespace();
        (parts.next()? == field).then(|| parts.next()?.parse().ok())?
    })
}

/// What the machine's RAM looks like to this process, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RamSnapshot {
    /// RAM this process may use: the host's `MemTotal`, clamped to the cgroup limit.
    pub total: u64,
    /// RAM available now: the host's `MemAvailable`, clamped to `limit − usage` of the limiting cgroup.
    pub available: u64,
    /// The host's `MemTotal`.
    pub host_total: u64,
    /// The host's `SwapTotal` (all kinds).
    pub swap_total: u64,
    /// Disk-backed swap from `/proc/swaps` (zram left out).
    pub disk_swap: u64,
    /// The binding cgroup limit, if any is below the host's RAM.
    pub cgroup_limit: Option<u64>,
}

/// Reads RAM from the files of the running system (or of a sample tree in tests).
#[derive(Debug, Clone)]
pub struct SystemRam {
    proc_root: PathBuf,
    cgroup_root: PathBuf,
}

impl Default for SystemRam {
    fn default() -> Self {
        SystemRam::new()
    }
}

/// The cgroup hierarchy a directory belongs to (the files have different names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CgroupVersion {
    V1,
    V2,
}

impl SystemRam {
    /// Reads `/proc` and `/sys/fs/cgroup`.
    pub fn new() -> SystemRam {
        SystemRam::with_roots("/proc", "/sys/fs/cgroup")
    }

    /// Reads `PROC/meminfo`, `PROC/swaps`, `PROC/self/cgroup` and the cgroup files under `cgroup_root`.
    pub fn with_roots(proc_root: impl Into<PathBuf>, cgroup_root: impl Into<PathBuf>) -> SystemRam {
        SystemRam { proc_root: proc_root.into(), cgroup_root: cgroup_root.into() }
    }

    /// A fresh reading; `None` where `meminfo` cannot be read (not Linux).
    pub fn snapshot(&self) -> Option<RamSnapshot> {
        let meminfo = parse_meminfo(&read(&self.proc_root.join("meminfo"))?)?;
        let disk_swap = read(&self.proc_root.join("swaps"))
            .map(|t| disk_swap_bytes(&parse_swaps(&t)))
            .unwrap_or(0);
        let mut snapshot = RamSnapshot {
            total: meminfo.total,
            available: meminfo.available,
            host_total: meminfo.total,
            swap_total: meminfo.swap_total,
            disk_swap,
            cgroup_limit: None,
        };
        if let Some((limit, dir, version)) = self.cgroup_scope(meminfo.total) {
            snapshot.cgroup_limit = Some(limit);
            snapshot.total = meminfo.total.min(limit);
            snapshot.available = match cgroup_usage(&dir, version) {
                Some(usage) => meminfo.available.min(limit.saturating_sub(usage)),
                None => meminfo.available.min(limit),
            };
        }
        Some(snapshot)
    }

    /// The tightest cgroup limit below `host_total`, with the directory it was found in.
    fn cgroup_scope(&self, host_total: u64) -> Option<(u64, PathBuf, CgroupVersion)> {
        let membership = read(&self.proc_root.join("self/cgroup")).map(|t| parse_proc_cgroup(&t));
        let membership = membership.unwrap_or_default();
        let mut dirs = Vec::new();
        let v1_root = self.cgroup_root.join("memory");
        for (root, path, version) in [
            (&self.cgroup_root, membership.unified, CgroupVersion::V2),
            (&v1_root, membership.memory_v1, CgroupVersion::V1),
        ] {
            let Some(path) = path else { continue };
            let mut dir = root.join(path.trim_start_matches('/'));
            loop {
                dirs.push((dir.clone(), version));
                if dir == *root || !dir.starts_with(root) || !dir.pop() {
                    break;
                }
            }
        }
        dirs.into_iter()
            .filter_map(|(dir, version)| {
                let file = match version {
                    CgroupVersion::V2 => "memory.max",
                    CgroupVersion::V1 => "memory.limit_in_bytes",
                };
                let limit = parse_cgroup_limit(&read(&dir.join(file))?)?;
                Some((limit, dir, version))
            })
            .filter(|(limit, _, _)| *limit < host_total)
            .min_by_key(|(limit, _, _)| *limit)
    }
}

impl RamProbe for SystemRam {
    /// Available bytes; where RAM cannot be read, reports unlimited RAM so nothing is evicted for pressure.
    fn available(&self) -> u64 {
        self.snapshot().map_or(u64::MAX, |s| s.available)
    }
}

/// Non-reclaimable usage of a cgroup: its usage minus the inactive page cache, which the kernel drops before
/// it kills anything (what the kubelet calls the working set).
fn cgroup_usage(dir: &Path, version: CgroupVersion) -> Option<u64> {
    let (usage_file, inactive_field) = match version {
        CgroupVersion::V2 => ("memory.current", "inactive_file"),
        CgroupVersion::V1 => ("memory.usage_in_bytes", "total_inactive_file"),
    };
    let usage: u64 = read(&dir.join(usage_file))?.trim().parse().ok()?;
    let inactive = read(&dir.join("memory.stat"))
        .and_then(|t| parse_memory_stat(&t, inactive_field))
        .unwrap_or(0);
    Some(usage.saturating_sub(inactive))
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}
