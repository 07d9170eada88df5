//! Raw virtual memory: reserve address space, commit and decommit ranges of it, prefault pages, release it.
//!
//! Every function here works on a range of a reservation that [`reserve`] returned and that its owner (a
//! [`super::HostBuffer`]) has not released; that ownership is the promise every `unsafe` block below relies on.
//! Addresses are plain `usize` so the types holding them stay `Send + Sync` without `unsafe impl`.

#![allow(unsafe_code)]

use std::ffi::c_void;
use std::io;

use rustix::mm::{MapFlags, ProtFlags};

/// Step of the prefault fallback (one write per page; a smaller step than the real page only touches more).
const TOUCH_STEP: usize = 4096;

/// Reserves `len` bytes of address space with no access and no backing (`PROT_NONE`, `MAP_NORESERVE`).
pub(super) fn reserve(len: usize) -> io::Result<usize> {
    // SAFETY: a new anonymous mapping at an address the kernel picks (no MAP_FIXED) cannot alias any memory
    // Rust already refers to.
    let ptr = unsafe {
        rustix::mm::mmap_anonymous(
            std::ptr::null_mut(),
            len,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::NORESERVE,
        )
    }?;
    Ok(ptr as usize)
}

/// Commits `[addr, addr + len)` of a reservation: replaces it with zeroed, readable and writable memory that
/// counts against the system's commit limit.
pub(super) fn commit(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the range lies inside a reservation its caller owns and is not committed, so no Rust reference
    // points into it; MAP_FIXED replaces only our own PROT_NONE pages.
    unsafe {
        rustix::mm::mmap_anonymous(
            addr as *mut c_void,
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::PRIVATE | MapFlags::FIXED,
        )
    }?;
    Ok(())
}

/// Decommits `[addr, addr + len)`: the pages are freed and the range goes back to reserved, no-access.
pub(super) fn decommit(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: the range lies inside a reservation its caller owns; the caller has taken the range out of use
    // (no claims, no registrations, no prefault job, length already lowered), so nothing reads or writes it.
    unsafe {
        rustix::mm::mmap_anonymous(
            addr as *mut c_void,
            len,
            ProtFlags::empty(),
            MapFlags::PRIVATE | MapFlags::FIXED | MapFlags::NORESERVE,
        )
    }?;
    Ok(())
}

/// Releases a whole reservation.
pub(super) fn release(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: `addr`/`len` are exactly a reservation from `reserve`, which its owner has stopped using (every
    // committed range was decommitted first and the owner forgot the address).
    unsafe { rustix::mm::munmap(addr as *mut c_void, len) }?;
    Ok(())
}

/// Faults in every page of the committed range `[addr, addr + len)` for writing, without changing its bytes.
///
/// Uses `madvise(MADV_POPULATE_WRITE)` (Linux ≥ 5.14) and falls back to touching one byte per page when the
/// kernel does not know the advice.
pub(super) fn prefault(addr: usize, len: usize) -> io::Result<()> {
    if len == 0 {
        return Ok(());
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        // MADV_POPULATE_WRITE wants page-aligned ranges; callers pass ranges of 2 MiB-aligned commits.
        // SAFETY: the range is committed memory of a reservation its caller owns; populating changes no byte.
        let populated = unsafe {
            rustix::mm::madvise(addr as *mut c_void, len, rustix::mm::Advice::LinuxPopulateWrite)
        };
        match populated {
            Ok(()) => return Ok(()),
            Err(rustix::io::Errno::INVAL) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let mut at = addr;
    while at < addr + len {
        let p = at as *mut u8;
        // SAFETY: `p` lies in committed, writable memory its caller owns and hands to no one else while the
        // prefault runs; writing back the byte just read leaves the contents unchanged.
        unsafe { p.write_volatile(p.read_volatile()) };
        at += TOUCH_STEP;
    }
    Ok(())
}

/// Copies `out.len()` bytes from `addr` into `out`.
///
/// # Safety
/// `[addr, addr + out.len())` must be committed memory that no one writes while the copy runs.
pub(super) unsafe fn copy_out(addr: usize, out: &mut [u8]) {
    // SAFETY: the caller promises the source is readable and not written; `out` is a distinct Rust buffer.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
}

/// A mutable slice over `[addr, addr + len)`.
///
/// # Safety
/// The range must be committed memory that nothing else reads or writes for `'a`.
pub(super) unsafe fn slice_mut<'a>(addr: usize, len: usize) -> &'a mut [u8] {
    // SAFETY: the caller promises the range is committed and exclusively ours for 'a.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len) }
}

/// How many of the 4 KiB pages of `[addr, addr + len)` are resident, from `/proc/self/pagemap` (bit 63 of
/// each page's entry); for tests that check prefaulting and decommitting.
#[cfg(all(test, target_os = "linux", target_arch = "x86_64"))]
pub(super) fn resident_pages(addr: usize, len: usize) -> usize {
    use std::os::unix::fs::FileExt;
    let pagemap = std::fs::File::open("/proc/self/pagemap").expect("open pagemap");
    let pages = len.div_ceil(TOUCH_STEP);
    let mut entries = vec![0u8; pages * 8];
    pagemap.read_exact_at(&mut entries, (addr / TOUCH_STEP * 8) as u64).expect("read pagemap");
    entries
        .chunks_exact(8)
        .filter(|e| u64::from_le_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]) >> 63 == 1)
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn commit_prefault_decommit_and_release_round_trip() {
        let base = reserve(8 * MIB).expect("reserve");
        commit(base, 4 * MIB).expect("commit");
        // SAFETY: the first 4 MiB were just committed and nothing else knows of them.
        let s = unsafe { slice_mut(base, 4 * MIB) };
        s[0] = 7;
        s[4 * MIB - 1] = 9;
        prefault(base, 4 * MIB).expect("prefault");
        assert_eq!((s[0], s[4 * MIB - 1]), (7, 9), "prefaulting keeps the bytes");
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        assert_eq!(resident_pages(base, 4 * MIB), 4 * MIB / TOUCH_STEP, "every page faulted in");
        decommit(base, 4 * MIB).expect("decommit");
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        assert_eq!(resident_pages(base, 4 * MIB), 0, "decommitted pages are gone");
        commit(base, 2 * MIB).expect("recommit");
        let mut back = [1u8; 1];
        // SAFETY: the first 2 MiB are committed again and only read here.
        unsafe { copy_out(base, &mut back) };
        assert_eq!(back, [0], "a recommitted page is fresh");
        release(base, 8 * MIB).expect("release");
    }
}
