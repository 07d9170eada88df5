//! [`LiveRanges`]: the device memory a [`super::CudaMemory`] handed out and has not taken back.
//!
//! [`crate::memory::DeviceMemory`] and [`crate::Backend::store`] are safe functions that take any [`DevPtr`], and
//! the driver would read or write whatever an address names (another allocation, or nothing: an illegal access
//! that poisons the context). So, like [`crate::memory::SimDevice`], the CUDA device refuses every address it
//! did not map or allocate: each operation at a caller's address first asks [`LiveRanges::check`], under the
//! device's state lock, and a refusal is an [`crate::Error::Driver`] the driver never sees.
//!
//! A range passes when it lies inside one plain allocation, or when mappings cover it end to end: a VBAR maps
//! its pages one by one, side by side, and a weight may straddle two of them. Two plain allocations that happen
//! to be neighbours in the pool do not add up (a copy across them is a bug in the caller).

use std::collections::BTreeMap;

use cudarc::driver::sys::CUmemGenericAllocationHandle;

use crate::error::{Error, Result};
use crate::memory::DevPtr;

/// What a live range is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A VMM mapping inside a reservation, backed by this physical allocation.
    Mapped(CUmemGenericAllocationHandle),
    /// A plain allocation from the stream-ordered pool.
    Plain,
}

#[derive(Debug, Clone, Copy)]
struct Live {
    len: u64,
    kind: Kind,
}

/// The live ranges of one device, by start address; no two overlap.
#[derive(Debug, Default)]
pub(super) struct LiveRanges {
    by_start: BTreeMap<u64, Live>,
}

impl LiveRanges {
    /// Records `[at, at + len)` (not empty, overlapping no live range: the caller checked, or the driver just
    /// handed it out) as live.
    pub(super) fn insert(&mut self, at: DevPtr, len: u64, kind: Kind) {
        debug_assert!(len > 0 && !self.overlaps(at, len), "{len} bytes at {:#x} overlap", at.0);
        self.by_start.insert(at.0, Live { len, kind });
    }

    /// Whether any live range shares a byte with `[at, at + len)`.
    pub(super) fn overlaps(&self, at: DevPtr, len: u64) -> bool {
        let end = at.0.saturating_add(len);
        let before = self.by_start.range(..=at.0).next_back();
        before.is_some_and(|(&start, r)| start + r.len > at.0)
            || self.by_start.range(at.0..end).next().is_some()
    }

    /// Checks that all of `[at, at + len)` is live memory: inside one plain allocation, or covered by mappings
    /// with no gap. An empty range touches nothing and passes. `call` names the operation in the error.
    pub(super) fn check(&self, call: &'static str, at: DevPtr, len: u64) -> Result<()> {
        if len == 0 || self.covers(at.0, len) {
            return Ok(());
        }
        Err(Error::driver(
            call,
            format!("{len} bytes at {:#x} are not memory this device mapped or allocated", at.0),
        ))
    }

    fn covers(&self, at: u64, len: u64) -> bool {
        let Some(end) = at.checked_add(len) else { return false };
        let Some((&start, first)) = self.by_start.range(..=at).next_back() else { return false };
        let mut covered = start + first.len;
        if at >= covered {
            return false;
        }
        match first.kind {
            Kind::Plain => end <= covered,
            Kind::Mapped(_) => {
                let mut next = self.by_start.range(covered..);
                while covered < end {
                    match next.next() {
                        Some((&s, &Live { len, kind: Kind::Mapped(_) })) if s == covered => {
                            covered += len;
                        }
                        Some(_) | None => return false,
                    }
                }
                true
            }
        }
    }

    /// Takes back the mapping of exactly `[at, at + len)`: the handle of its physical allocation.
    pub(super) fn remove_mapping(
        &mut self,
        at: DevPtr,
        len: u64,
    ) -> Result<CUmemGenericAllocationHandle> {
        match self.by_start.get(&at.0) {
            Some(&Live { len: l, kind: Kind::Mapped(handle) }) if l == len => {
                self.by_start.remove(&at.0);
                Ok(handle)
            }
            Some(_) | None => {
                Err(Error::driver("unmap", format!("no mapping of {len} bytes at {:#x}", at.0)))
            }
        }
    }

    /// Takes back the plain allocation that starts at `at`: its length.
    pub(super) fn remove_plain(&mut self, at: DevPtr) -> Result<u64> {
        match self.by_start.get(&at.0) {
            Some(&Live { len, kind: Kind::Plain }) => {
                self.by_start.remove(&at.0);
                Ok(len)
            }
            Some(_) | None => Err(Error::driver("free", format!("no allocation at {:#x}", at.0))),
        }
    }

    /// Every live mapping: start, length, handle.
    pub(super) fn mappings(
        &self,
    ) -> impl Iterator<Item = (u64, u64, CUmemGenericAllocationHandle)> + '_ {
        self.by_start.iter().filter_map(|(&at, r)| match r.kind {
            Kind::Mapped(handle) => Some((at, r.len, handle)),
            Kind::Plain => None,
        })
    }

    /// Every live plain allocation's start.
    pub(super) fn plains(&self) -> impl Iterator<Item = u64> + '_ {
        self.by_start.iter().filter_map(|(&at, r)| match r.kind {
            Kind::Plain => Some(at),
            Kind::Mapped(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: u64 = 2 << 20;

    /// Two mappings side by side at 1 GiB, a third after a one-page gap, and a 4 KiB plain allocation right
    /// after it, followed by a second plain allocation.
    fn ranges() -> LiveRanges {
        let mut r = LiveRanges::default();
        r.insert(DevPtr(1 << 30), PAGE, Kind::Mapped(1));
        r.insert(DevPtr((1 << 30) + PAGE), PAGE, Kind::Mapped(2));
        r.insert(DevPtr((1 << 30) + 3 * PAGE), PAGE, Kind::Mapped(3));
        r.insert(DevPtr((1 << 30) + 4 * PAGE), 4096, Kind::Plain);
        r.insert(DevPtr((1 << 30) + 4 * PAGE + 4096), 4096, Kind::Plain);
        r
    }

    fn ok(r: &LiveRanges, at: u64, len: u64) -> bool {
        r.check("test", DevPtr(at), len).is_ok()
    }

    #[test]
    fn ranges_inside_live_memory_pass() {
        let r = ranges();
        let base = 1 << 30;
        assert!(ok(&r, base, PAGE), "one whole mapping");
        assert!(ok(&r, base + 10, 100), "inside a mapping");
        assert!(ok(&r, base + PAGE - 1000, 4096), "across two adjacent mappings");
        assert!(ok(&r, base, 2 * PAGE), "both adjacent mappings whole");
        assert!(ok(&r, base + 4 * PAGE, 4096), "a whole plain allocation");
        assert!(ok(&r, base + 4 * PAGE + 4000, 96), "the end of a plain allocation");
        assert!(ok(&r, 0, 0), "an empty range touches nothing");
    }

    #[test]
    fn ranges_outside_live_memory_are_refused() {
        let r = ranges();
        let base = 1 << 30;
        assert!(!ok(&r, 0x1000, 4), "below every range");
        assert!(!ok(&r, base - 1, 2), "starts before the first mapping");
        assert!(!ok(&r, base + 2 * PAGE, 1), "in the gap");
        assert!(!ok(&r, base + PAGE, 2 * PAGE), "runs into the gap");
        assert!(!ok(&r, base, 3 * PAGE + 1), "spans the gap");
        assert!(!ok(&r, base + 4 * PAGE - 16, 32), "from a mapping into a plain allocation");
        assert!(!ok(&r, base + 4 * PAGE + 4000, 200), "across two neighbouring plain allocations");
        assert!(!ok(&r, base + 4 * PAGE + 8192, 1), "past the last allocation");
        assert!(!ok(&r, u64::MAX - 10, 20), "wraps around the address space");
        let err = r.check("copy_d2h", DevPtr(0x1000), 64).expect_err("refused");
        assert!(
            matches!(&err, Error::Driver { call: "copy_d2h", msg } if msg.contains("64 bytes at 0x1000")),
            "{err}"
        );
    }

    #[test]
    fn overlaps_sees_any_shared_byte() {
        let r = ranges();
        let base = 1 << 30;
        assert!(r.overlaps(DevPtr(base + 2 * PAGE), PAGE + 1), "reaches into the third mapping");
        assert!(r.overlaps(DevPtr(base + 2 * PAGE - 1), 1), "the last byte of the second mapping");
        assert!(!r.overlaps(DevPtr(base + 2 * PAGE), PAGE), "exactly the gap");
        assert!(!r.overlaps(DevPtr(base - PAGE), PAGE), "just below");
    }

    #[test]
    fn taking_ranges_back_needs_the_exact_range_and_kind() {
        let mut r = ranges();
        let base = 1 << 30;
        assert!(r.remove_mapping(DevPtr(base), PAGE / 2).is_err(), "part of a mapping");
        assert!(r.remove_mapping(DevPtr(base + 4 * PAGE), 4096).is_err(), "a plain allocation");
        assert!(r.remove_plain(DevPtr(base)).is_err(), "a mapping");
        assert!(r.remove_plain(DevPtr(base + 4 * PAGE + 1)).is_err(), "inside an allocation");
        assert_eq!(r.remove_mapping(DevPtr(base + PAGE), PAGE).expect("mapping"), 2);
        assert!(r.remove_mapping(DevPtr(base + PAGE), PAGE).is_err(), "already taken back");
        assert!(!ok(&r, base + PAGE - 1000, 4096), "the two mappings are no longer adjacent");
        assert_eq!(r.remove_plain(DevPtr(base + 4 * PAGE)).expect("allocation"), 4096);
        assert!(!ok(&r, base + 4 * PAGE, 1), "freed memory is refused");
        assert!(r.remove_plain(DevPtr(base + 4 * PAGE)).is_err(), "double free");
        let maps: Vec<_> = r.mappings().collect();
        assert_eq!(maps, [(base, PAGE, 1), (base + 3 * PAGE, PAGE, 3)]);
        assert_eq!(r.plains().collect::<Vec<_>>(), [base + 4 * PAGE + 4096]);
    }
}
