//! A VBAR's page table (§2.1) and the types its callers see: [`VbarId`], [`Fault`], [`Signature`],
//! [`PageState`].
//!
//! A VBAR is a reserved virtual address range of `nr_pages` pages whose physical memory is mapped page by
//! page. Invariants the arbiter keeps (and the property tests check): a page with pins is never unmapped;
//! every mapped page at or above the watermark is pinned (it was passed by an eviction and is freed at its
//! last unpin); each mapping of a page bumps its serial, so a [`Signature`] taken earlier compares equal only
//! while none of its pages was re-mapped.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::memory::device::{DevPtr, DeviceMemory};

/// Names one VBAR; unique in the process (never reused, so a stale id cannot reach a newer VBAR).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VbarId(u64);

impl VbarId {
    /// A fresh id.
    pub(super) fn next() -> VbarId {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        VbarId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Display for VbarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "vbar#{}", self.0)
    }
}

/// What a fault of a byte range of a VBAR found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a resident fault holds pins until the range is unpinned"]
pub enum Fault {
    /// Every page of the range is mapped and now pinned (one pin each; [`super::Arbiter::unpin`] drops it).
    /// The signature says whether bytes copied there before are still there.
    Resident(Signature),
    /// The range is (at least partly) above the VBAR's watermark, or the budget could not make room without
    /// lowering it there: stream the bytes through scratch instead. Nothing was pinned.
    Offloaded,
}

/// The serial of each page a resident range touches, at the time of the fault.
///
/// Equal signatures (same VBAR, same pages, same serials) mean no page of the range was re-mapped in
/// between, so bytes written there are still valid. A caller that has no stored signature must copy.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Signature {
    vbar: VbarId,
    first_page: u64,
    serials: Vec<u32>,
}

impl Signature {
    /// The VBAR faulted.
    pub fn vbar(&self) -> VbarId {
        self.vbar
    }

    /// The first page of the range.
    pub fn first_page(&self) -> u64 {
        self.first_page
    }

    /// One serial per page of the range.
    pub fn serials(&self) -> &[u32] {
        &self.serials
    }

    /// Whether bytes copied when `stored` was taken are still valid now (absent ⇒ not valid).
    pub fn matches(&self, stored: Option<&Signature>) -> bool {
        stored.is_some_and(|s| s == self)
    }
}

/// What one page of a VBAR holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PageState {
    /// Physical memory is mapped.
    pub resident: bool,
    /// At least one fault holds it.
    pub pinned: bool,
}

/// One page entry.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Page {
    pub(super) mapped: bool,
    pub(super) pin_count: u32,
    pub(super) serial: u32,
}

/// One VBAR: its reservation and page table. Only the arbiter touches it.
#[derive(Debug)]
pub(super) struct Vbar {
    pub(super) id: VbarId,
    pub(super) base: DevPtr,
    pub(super) page_size: u64,
    pub(super) watermark: usize,
    pub(super) watermark_limit: usize,
    pub(super) resident: usize,
    pub(super) pages: Vec<Page>,
}

impl Vbar {
    /// A VBAR over a reservation of `nr_pages` pages at `base`, watermark at the top.
    pub(super) fn new(id: VbarId, base: DevPtr, page_size: u64, nr_pages: usize) -> Vbar {
        Vbar {
            id,
            base,
            page_size,
            watermark: nr_pages,
            watermark_limit: 0,
            resident: 0,
            pages: vec![Page::default(); nr_pages],
        }
    }

    /// Pages reserved.
    pub(super) fn nr_pages(&self) -> usize {
        self.pages.len()
    }

    /// Bytes of address space reserved.
    pub(super) fn reserved_bytes(&self) -> u64 {
        self.pages.len() as u64 * self.page_size
    }

    /// Address of page `p`.
    pub(super) fn page_ptr(&self, p: usize) -> DevPtr {
        self.base.offset(p as u64 * self.page_size)
    }

    /// Maps page `p` (absent) and bumps its serial.
    pub(super) fn map(&mut self, p: usize, dev: &dyn DeviceMemory) -> Result<u32> {
        debug_assert!(!self.pages[p].mapped, "mapping a mapped page");
        dev.map(self.page_ptr(p), self.page_size)?;
        let page = &mut self.pages[p];
        page.mapped = true;
        page.serial = page.serial.wrapping_add(1);
        self.resident += 1;
        Ok(page.serial)
    }

    /// Whether page `p` may be freed now: mapped and holding no pin.
    pub(super) fn freeable(&self, p: usize) -> bool {
        let page = &self.pages[p];
        page.mapped && page.pin_count == 0
    }

    /// Unmaps page `p` (mapped). The caller checked its pins and synchronised the device.
    pub(super) fn unmap(&mut self, p: usize, dev: &dyn DeviceMemory) -> Result<()> {
        debug_assert!(self.pages[p].mapped, "unmapping an absent page");
        dev.unmap(self.page_ptr(p), self.page_size)?;
        self.pages[p].mapped = false;
        self.resident -= 1;
        Ok(())
    }

    /// The signature of a resident range starting at page `first`.
    pub(super) fn signature(&self, first: usize, serials: Vec<u32>) -> Signature {
        Signature { vbar: self.id, first_page: first as u64, serials }
    }

    /// Pages `first..end` rounded out from a byte range; an error when the range overflows.
    pub(super) fn page_range(&self, offset: u64, size: u64) -> Result<(usize, usize)> {
        let end = offset.checked_add(size).ok_or_else(|| {
            Error::driver("vbar", format!("range {offset}+{size} overflows the address space"))
        })?;
        let first = offset / self.page_size;
        let last = end.div_ceil(self.page_size);
        let clamp = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Ok((clamp(first), clamp(last)))
    }

    /// Residency bits of every page.
    pub(super) fn residency(&self) -> Vec<PageState> {
        self.pages
            .iter()
            .map(|p| PageState { resident: p.mapped, pinned: p.pin_count > 0 })
            .collect()
    }

    /// One line for the debug dump: numbers, then a map with `.` absent, `r` resident, `P` pinned and `|`
    /// at the watermark.
    pub(super) fn debug_line(&self) -> String {
        let pinned = self.pages.iter().filter(|p| p.pin_count > 0).count();
        let mut map = String::with_capacity(self.pages.len() + 1);
        for (i, p) in self.pages.iter().enumerate() {
            if i == self.watermark {
                map.push('|');
            }
            map.push(match (p.mapped, p.pin_count > 0) {
                (false, _) => '.',
                (true, false) => 'r',
                (true, true) => 'P',
            });
        }
        if self.watermark == self.pages.len() {
            map.push('|');
        }
        format!(
            "{} base={:#x} pages={} watermark={} limit={} resident={} ({} MiB) pinned={} [{}]",
            self.id,
            self.base.0,
            self.pages.len(),
            self.watermark,
            self.watermark_limit,
            self.resident,
            (self.resident as u64 * self.page_size) >> 20,
            pinned,
            map
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_compare_vbar_pages_and_serials() {
        let a = VbarId::next();
        let b = VbarId::next();
        assert_ne!(a, b, "ids are never reused");
        let sig = |vbar, first, serials: &[u32]| Signature {
            vbar,
            first_page: first,
            serials: serials.to_vec(),
        };
        let s = sig(a, 0, &[1, 1]);
        assert!(s.matches(Some(&sig(a, 0, &[1, 1]))));
        assert!(!s.matches(None), "absent means not valid");
        assert!(!s.matches(Some(&sig(a, 0, &[1, 2]))), "a re-mapped page");
        assert!(!s.matches(Some(&sig(b, 0, &[1, 1]))), "another VBAR");
        assert!(!s.matches(Some(&sig(a, 1, &[1, 1]))), "other pages");
    }

    #[test]
    fn page_ranges_round_out_to_pages() {
        let v = Vbar::new(VbarId::next(), DevPtr(1 << 32), 32 << 20, 4);
        assert_eq!(v.page_range(0, 1).expect("range"), (0, 1));
        assert_eq!(v.page_range((32 << 20) - 1, 2).expect("range"), (0, 2));
        assert_eq!(v.page_range(32 << 20, 32 << 20).expect("range"), (1, 2));
        assert!(v.page_range(u64::MAX, 2).is_err());
    }

    #[test]
    fn debug_line_shows_the_watermark() {
        let mut v = Vbar::new(VbarId::next(), DevPtr(1 << 32), 32 << 20, 4);
        v.pages[0].mapped = true;
        v.pages[0].pin_count = 1;
        v.pages[1].mapped = true;
        v.resident = 2;
        v.watermark = 3;
        let line = v.debug_line();
        assert!(line.ends_with("[Pr.|.]"), "{line}");
        assert!(line.contains("resident=2 (64 MiB) pinned=1"), "{line}");
    }
}
