//! The host side of the memory manager: [`HostBuffer`], the growable buffer that weight pins and the staging
//! ring live in (memory-manager.md §3).
//!
//! - `vm`: reserve, commit, decommit and prefault address space (the only raw memory calls).
//! - `prefault`: the six-thread pool that faults pages in ahead of use, one job at a time.
//! - `decommit`: the thread that gives memory back, with a 384 MiB bound on what is queued.
//! - `buffer`: [`HostBuffer`] itself, its registrations and the [`WriteRange`] claims loaders write through.
//!
//! The point of all of it: never allocate fresh pinned memory on the hot path. Pages are faulted in the
//! background and registered (page-locked) in place, which is an order of magnitude faster than a pinned
//! allocation (performance-anchors.md §1.1, target T7).

mod buffer;
mod decommit;
mod prefault;
mod vm;

pub use buffer::{COMMIT_GRANULE, HostBuffer, HostBufferConfig, WriteRange};
