//! Tests of RAM reading (on samples of the kernel's files), the `--cache-ram` thresholds and the order of the
//! post-node arbitration (with a recording fake cache and fake pins).

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

use super::*;

const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------------------------
// Parsing.

const MEMINFO: &str = "MemTotal:       24684084 kB
MemFree:         9825536 kB
MemAvailable:   23702320 kB
Buffers:          389576 kB
SwapCached:            0 kB
SwapTotal:       8388604 kB
SwapFree:        8388604 kB
";

#[test]
fn meminfo_fields_are_bytes() {
    let info = parse_meminfo(MEMINFO).expect("sample parses");
    assert_eq!(info.total, 24_684_084 * 1024);
    assert_eq!(info.available, 23_702_320 * 1024);
    assert_eq!(info.swap_total, 8_388_604 * 1024);
}

#[test]
fn meminfo_without_available_is_rejected_and_without_swap_reads_zero() {
    assert_eq!(parse_meminfo("MemTotal: 100 kB\nMemFree: 50 kB\n"), None);
    assert_eq!(parse_meminfo("MemTotal: 100 kB\nMemAvailable: x kB\n"), None);
    let info = parse_meminfo("MemTotal: 100 kB\nMemAvailable: 60 kB\n").expect("parses");
    assert_eq!((info.total, info.available, info.swap_total), (102_400, 61_440, 0));
    // A field whose name merely starts like another is not mistaken for it.
    assert_eq!(
        parse_meminfo("MemTotalX: 1 kB\nMemTotal: 2 kB\nMemAvailable: 1 kB\n").map(|m| m.total),
        Some(2048)
    );
}

const SWAPS: &str = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority
/dev/zram0                              partition\t8388604\t\t1024\t\t100
/dev/nvme0n1p3                          partition\t16777212\t0\t\t-2
/swap file with spaces                  file\t\t2097148\t\t0\t\t-3
garbage line
";

#[test]
fn swaps_are_split_from_the_right_and_zram_is_not_disk() {
    let areas = parse_swaps(SWAPS);
    assert_eq!(areas.len(), 3, "{areas:?}");
    assert_eq!(areas[0].path, "/dev/zram0");
    assert_eq!(areas[0].kind, SwapKind::Zram);
    assert_eq!((areas[0].size, areas[0].used), (8_388_604 * 1024, 1024 * 1024));
    assert_eq!(areas[1].kind, SwapKind::Disk);
    assert_eq!(areas[2].path, "/swap file with spaces");
    assert_eq!(areas[2].kind, SwapKind::Disk);
    assert_eq!(disk_swap_bytes(&areas), (16_777_212 + 2_097_148) * 1024);
}

#[test]
fn no_swap_is_zero() {
    let areas = parse_swaps("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n");
    assert!(areas.is_empty());
    assert_eq!(disk_swap_bytes(&areas), 0);
}

#[test]
fn proc_cgroup_finds_unified_and_v1_memory_paths() {
    let v2 = parse_proc_cgroup("0::/user.slice/user-1000.slice/session-2.scope\n");
    assert_eq!(v2.unified.as_deref(), Some("/user.slice/user-1000.slice/session-2.scope"));
    assert_eq!(v2.memory_v1, None);
    // A hybrid host (v1 controllers plus an empty unified hierarchy), as on this build machine.
    let hybrid =
        parse_proc_cgroup("9:name=systemd:/\n4:memory:/process_api/ec83\n3:cpuset:/\n0::/\n");
    assert_eq!(hybrid.unified.as_deref(), Some("/"));
    assert_eq!(hybrid.memory_v1.as_deref(), Some("/process_api/ec83"));
    let joined = parse_proc_cgroup("5:cpu,memory:/docker/abc\n");
    assert_eq!(joined.memory_v1.as_deref(), Some("/docker/abc"));
    assert_eq!(parse_proc_cgroup("nonsense\n"), CgroupMembership::default());
}

#[test]
fn cgroup_limits_and_stats() {
    assert_eq!(parse_cgroup_limit("max\n"), None);
    assert_eq!(parse_cgroup_limit("4294967296\n"), Some(4 << 30));
    assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None, "v1's unlimited");
    assert_eq!(parse_cgroup_limit("-1\n"), None);
    let stat = "anon 100\nfile 5000\ninactive_file 3000\ntotal_inactive_file 7000\n";
    assert_eq!(parse_memory_stat(stat, "inactive_file"), Some(3000));
    assert_eq!(parse_memory_stat(stat, "total_inactive_file"), Some(7000));
    assert_eq!(parse_memory_stat(stat, "active_file"), None);
}

// ---------------------------------------------------------------------------------------------------------
// SystemRam over a sample tree.

/// A directory of sample files, removed when dropped.
struct SampleTree(PathBuf);

impl SampleTree {
    fn new(name: &str) -> SampleTree {
        let dir = std::env::temp_dir().join(format!("kiln-pressure-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        SampleTree(dir)
    }

    fn write(&self, path: &str, text: &str) -> &SampleTree {
        let path = self.0.join(path);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("dirs");
        std::fs::write(path, text).expect("write sample");
        self
    }

    fn ram(&self) -> SystemRam {
        SystemRam::with_roots(self.0.join("proc"), self.0.join("cgroup"))
    }
}

impl Drop for SampleTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// 32 GiB of RAM, 20 GiB available, `swap` KiB of disk swap plus 4 GiB of zram.
fn host(tree: &SampleTree, swap_kib: u64) {
    tree.write(
        "proc/meminfo",
        "MemTotal: 33554432 kB\nMemAvailable: 20971520 kB\nSwapTotal: 4194304 kB\n",
    );
    let mut swaps =
        String::from("Filename\tType\tSize\tUsed\tPriority\n/dev/zram0 partition 4194304 0 100\n");
    if swap_kib > 0 {
        swaps += &format!("/swapfile file {swap_kib} 0 -2\n");
    }
    tree.write("proc/swaps", &swaps);
}

#[test]
fn bare_host_has_no_cgroup_limit() {
    let tree = SampleTree::new("bare");
    host(&tree, 8 << 20);
    tree.write("proc/self/cgroup", "0::/\n");
    let snap = tree.ram().snapshot().expect("readable");
    assert_eq!(snap.total, 32 << 30);
    assert_eq!(snap.available, 20 << 30);
    assert_eq!(snap.disk_swap, 8 << 30, "zram is not counted");
    assert_eq!(snap.swap_total, 4 << 30);
    assert_eq!(snap.cgroup_limit, None);
    assert_eq!(tree.ram().available(), 20 << 30);
}

#[test]
fn v2_limit_clamps_total_and_available_to_limit_minus_working_set() {
    let tree = SampleTree::new("v2");
    host(&tree, 0);
    tree.write("proc/self/cgroup", "0::/kiln.slice/job\n")
        .write("cgroup/kiln.slice/job/memory.max", "max\n")
        .write("cgroup/kiln.slice/memory.max", "8589934592\n")
        .write("cgroup/kiln.slice/memory.current", "6442450944\n")
        .write("cgroup/kiln.slice/memory.stat", "anon 1\ninactive_file 1073741824\n")
        // The job's own usage is not the limiting cgroup's and must not be used.
        .write("cgroup/kiln.slice/job/memory.current", "1\n");
    let snap = tree.ram().snapshot().expect("readable");
    assert_eq!(snap.cgroup_limit, Some(8 << 30));
    assert_eq!(snap.total, 8 << 30);
    // limit 8 − (usage 6 − inactive page cache 1) = 3 GiB, below the host's 20.
    assert_eq!(snap.available, 3 << 30);
    assert_eq!(snap.host_total, 32 << 30);
}

#[test]
fn tightest_limit_on_the_path_wins_and_limits_above_ram_are_ignored() {
    let tree = SampleTree::new("nested");
    host(&tree, 0);
    tree.write("proc/self/cgroup", "0::/a/b\n")
        .write("cgroup/a/b/memory.max", "68719476736\n") // 64 GiB: above the host's RAM, no limit
        .write("cgroup/a/memory.max", "17179869184\n") // 16 GiB
        .write("cgroup/a/memory.current", "4294967296\n")
        .write("cgroup/memory.max", "25769803776\n"); // 24 GiB at the root
    let snap = tree.ram().snapshot().expect("readable");
    assert_eq!(snap.cgroup_limit, Some(16 << 30));
    assert_eq!(snap.total, 16 << 30);
    assert_eq!(snap.available, 12 << 30, "16 − 4, no memory.stat");
}

#[test]
fn host_available_wins_when_it_is_lower() {
    let tree = SampleTree::new("lowhost");
    host(&tree, 0);
    tree.write("proc/self/cgroup", "0::/\n")
        .write("cgroup/memory.max", "30064771072\n") // 28 GiB
        .write("cgroup/memory.current", "1073741824\n");
    let snap = tree.ram().snapshot().expect("readable");
    assert_eq!(snap.available, 20 << 30, "min(host 20, 28 − 1)");
    assert_eq!(snap.total, 28 << 30);
}

#[test]
fn v1_memory_controller_is_read_on_a_hybrid_host() {
    let tree = SampleTree::new("v1");
    host(&tree, 0);
    tree.write("proc/self/cgroup", "4:memory:/process_api/x\n0::/\n")
        .write("cgroup/memory/process_api/x/memory.limit_in_bytes", "4294967296\n")
        .write("cgroup/memory/process_api/x/memory.usage_in_bytes", "3221225472\n")
        .write(
            "cgroup/memory/process_api/x/memory.stat",
            "cache 5\ntotal_inactive_file 1073741824\n",
        )
        .write("cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
    let snap = tree.ram().snapshot().expect("readable");
    assert_eq!(snap.cgroup_limit, Some(4 << 30));
    assert_eq!(snap.available, 2 << 30, "4 − (3 − 1)");
}

#[test]
fn unreadable_meminfo_reports_unlimited_ram() {
    let tree = SampleTree::new("none");
    assert_eq!(tree.ram().snapshot(), None);
    assert_eq!(tree.ram().available(), u64::MAX);
}

// ---------------------------------------------------------------------------------------------------------
// Thresholds.

#[test]
fn default_thresholds_follow_upstream() {
    let small = CacheThresholds::defaults(8 * GIB);
    assert_eq!(small, CacheThresholds { active: 2 * GIB, inactive: 8 * GIB });
    let mid = CacheThresholds::defaults(64 * GIB);
    assert_eq!(mid, CacheThresholds { active: 64 * GIB / 10, inactive: 64 * GIB });
    let big = CacheThresholds::defaults(256 * GIB);
    assert_eq!(big, CacheThresholds { active: 10 * GIB, inactive: 128 * GIB });
}

#[test]
fn cache_ram_flag_values_replace_defaults_in_order() {
    let total = 64 * GIB;
    let none: [&str; 0] = [];
    assert_eq!(CacheThresholds::from_cache_ram(&none, total), Ok(CacheThresholds::defaults(total)));
    assert_eq!(
        CacheThresholds::from_cache_ram(&["4"], total),
        Ok(CacheThresholds { active: 4 * GIB, inactive: 64 * GIB })
    );
    assert_eq!(
        CacheThresholds::from_cache_ram(&["1.5", "16"], total),
        Ok(CacheThresholds { active: 3 * GIB / 2, inactive: 16 * GIB })
    );
    assert_eq!(
        CacheThresholds::from_cache_ram(&["0", "0"], total),
        Ok(CacheThresholds { active: 0, inactive: 0 })
    );
}

#[test]
fn bad_cache_ram_values_are_errors() {
    let total = 64 * GIB;
    assert_eq!(
        CacheThresholds::from_cache_ram(&["four"], total),
        Err(CacheRamError::NotANumber("four".into()))
    );
    assert_eq!(
        CacheThresholds::from_cache_ram(&["-1"], total),
        Err(CacheRamError::OutOfRange(-1.0))
    );
    assert!(matches!(
        CacheThresholds::from_cache_ram(&["nan"], total),
        Err(CacheRamError::OutOfRange(_))
    ));
    assert!(matches!(
        CacheThresholds::from_cache_ram(&["inf"], total),
        Err(CacheRamError::OutOfRange(_))
    ));
    assert_eq!(
        CacheThresholds::from_cache_ram(&["1", "2", "3"], total),
        Err(CacheRamError::TooMany(3))
    );
}

// ---------------------------------------------------------------------------------------------------------
// Arbitration.

#[derive(Debug, Clone, PartialEq)]
enum Event {
    Release { target: u64, free_active: bool, min_entry: u64, freed: u64 },
    FreePins { asked: u64, freed: u64 },
    Sleep(Duration),
}

/// A cache of entries `(bytes, current prompt)`; evicting one makes its bytes available.
struct FakeCache {
    entries: Vec<(u64, bool)>,
    available: Rc<Cell<u64>>,
    log: Rc<RefCell<Vec<Event>>>,
}

impl OutputCache for FakeCache {
    fn release(&mut self, target: u64, free_active: bool, min_entry: u64) -> u64 {
        let mut freed = 0;
        if self.available.get() < target {
            // Biggest first (every entry has the same age here).
            self.entries.sort_by_key(|e| std::cmp::Reverse(e.0));
            let mut kept = Vec::new();
            for (bytes, current) in std::mem::take(&mut self.entries) {
                let eligible = (free_active || !current) && bytes >= min_entry;
                if eligible && self.available.get() < target {
                    self.available.set(self.available.get() + bytes);
                    freed += bytes;
                } else {
                    kept.push((bytes, current));
                }
            }
            self.entries = kept;
        }
        self.log.borrow_mut().push(Event::Release { target, free_active, min_entry, freed });
        freed
    }
}

/// Pins worth `freeable` bytes; freeing does not show in `available` at once (the decommit lags).
struct FakePins {
    freeable: u64,
    log: Rc<RefCell<Vec<Event>>>,
}

impl PinReleaser for FakePins {
    fn free_inactive_pins(&mut self, bytes: u64) -> u64 {
        let freed = bytes.min(self.freeable);
        self.freeable -= freed;
        self.log.borrow_mut().push(Event::FreePins { asked: bytes, freed });
        freed
    }
}

const TH: CacheThresholds = CacheThresholds { active: 4 * GIB, inactive: 16 * GIB };

/// Runs one arbitration with `available` bytes, cache `entries` and `pins` bytes of freeable pins.
fn arbitrate(available: u64, entries: &[(u64, bool)], pins: u64) -> (Arbitration, Vec<Event>) {
    let log = Rc::new(RefCell::new(Vec::new()));
    let avail = Rc::new(Cell::new(available));
    let mut cache =
        FakeCache { entries: entries.to_vec(), available: avail.clone(), log: log.clone() };
    let mut fake_pins = FakePins { freeable: pins, log: log.clone() };
    let probe = {
        let avail = avail.clone();
        move || avail.get()
    };
    let sleep_log = log.clone();
    let mut sleep = move |d: Duration| sleep_log.borrow_mut().push(Event::Sleep(d));
    let report = arbitrate_after_node(&TH, &probe, &mut cache, &mut fake_pins, &mut sleep);
    let events = log.borrow().clone();
    (report, events)
}

fn release(target: u64, free_active: bool, min_entry: u64, freed: u64) -> Event {
    Event::Release { target, free_active, min_entry, freed }
}

#[test]
fn enough_ram_only_trims_older_outputs() {
    let (report, events) = arbitrate(10 * GIB, &[(3 * GIB, false), (GIB, true)], 8 * GIB);
    // Older outputs go until 16 GiB are available (13 GiB after the 3 GiB entry, still short, nothing left).
    assert_eq!(events, vec![release(16 * GIB, false, 0, 3 * GIB)]);
    assert_eq!(report.shortfall, 0);
    assert_eq!(report.pins_freed, 0);
}

#[test]
fn large_current_outputs_go_before_pins() {
    // 1 GiB available: shortfall 3 GiB; a 4 GiB current output covers it, the 100 MiB one stays.
    let (report, events) = arbitrate(GIB, &[(4 * GIB, true), (100 * MIB, true)], 8 * GIB);
    assert_eq!(
        events,
        vec![release(16 * GIB, false, 0, 0), release(4 * GIB, true, LARGE_INTERMEDIATE, 4 * GIB)]
    );
    assert_eq!(report.shortfall, 3 * GIB);
    assert_eq!(report.large_outputs_freed, 4 * GIB);
    assert_eq!(report.pins_freed, 0);
}

#[test]
fn pins_are_freed_for_the_remaining_shortfall_plus_512_mib() {
    // Shortfall 3 GiB, large outputs give 1 GiB, pins are asked for 2 GiB + 512 MiB and cover it.
    let (report, events) = arbitrate(GIB, &[(GIB, true), (100 * MIB, true)], 8 * GIB);
    assert_eq!(
        events,
        vec![
            release(16 * GIB, false, 0, 0),
            release(4 * GIB, true, LARGE_INTERMEDIATE, GIB),
            Event::FreePins { asked: 2 * GIB + 512 * MIB, freed: 2 * GIB + 512 * MIB },
        ]
    );
    assert_eq!(report.current_outputs_freed, 0);
    assert!(!report.settled);
}

#[test]
fn pins_falling_short_settle_then_evict_current_outputs() {
    // Shortfall 3 GiB, no large outputs, only 1 GiB of pins: settle (freed > 64 MiB), then current outputs.
    let (report, events) = arbitrate(GIB, &[(100 * MIB, true), (200 * MIB, true)], GIB);
    assert_eq!(
        events,
        vec![
            release(16 * GIB, false, 0, 0),
            release(4 * GIB, true, LARGE_INTERMEDIATE, 0),
            Event::FreePins { asked: 3 * GIB + 512 * MIB, freed: GIB },
            Event::Sleep(Duration::from_millis(50)),
            release(4 * GIB, true, 0, 300 * MIB),
        ]
    );
    assert!(report.settled);
    assert_eq!(report.current_outputs_freed, 300 * MIB);
}

#[test]
fn no_settle_when_pins_freed_64_mib_or_less() {
    let (report, events) = arbitrate(GIB, &[(100 * MIB, true)], 64 * MIB);
    assert!(!report.settled);
    assert!(!events.iter().any(|e| matches!(e, Event::Sleep(_))), "{events:?}");
    assert_eq!(events.last(), Some(&release(4 * GIB, true, 0, 100 * MIB)));
}

#[test]
fn older_outputs_are_evicted_before_ram_is_read() {
    // 3.5 GiB available; evicting the old 1 GiB entry ends the shortfall, so nothing else happens.
    let (report, events) = arbitrate(7 * GIB / 2, &[(GIB, false), (8 * GIB, true)], 8 * GIB);
    assert_eq!(events, vec![release(16 * GIB, false, 0, GIB)]);
    assert_eq!(report.shortfall, 0);
}
