//! The VRAM side of the memory manager (memory-manager.md §2): a budget without estimates, VBARs whose
//! pages are faulted in just in time, per-stream scratch buffers, and the activation allocator's front door,
//! all arbitrated per device by one [`Arbiter`].
//!
//! Modules:
//! - `config`: [`VramConfig`], the §10 knobs with ComfyUI's defaults.
//! - `budget`: the deficit formula of §2.3, the driver poll and its [`Clock`], activation accounting.
//! - `vbar`: a VBAR's page table and the types callers see ([`VbarId`], [`Fault`], [`Signature`]).
//! - `arbiter`: [`Arbiter`], owner of the priority list and every VBAR: fault, unpin, evict, watermarks.
//! - `alloc`: [`Arbiter::alloc`] / [`Arbiter::free`] for activations, and scratch growth.
//! - `scratch`: [`Scratch`], one offload stream's growable scratch buffer.

mod alloc;
mod arbiter;
mod budget;
mod config;
mod scratch;
mod vbar;

#[cfg(test)]
mod tests;

pub use arbiter::Arbiter;
pub use budget::{Clock, ManualClock, SystemClock, accounted_activation_bytes};
pub use config::VramConfig;
pub use scratch::{SCRATCH_ALIGN, Scratch};
pub use vbar::{Fault, PageState, Signature, VbarId};
