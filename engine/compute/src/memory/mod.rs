//! The memory manager: weights in a growable pinned host pool, faulted into a VRAM budget page by page, or
//! streamed through scratch when they do not fit — with no memory estimates (ComfyUI's dynamic VRAM with
//! comfy-aimdo; the design brief is `memory-manager.md`, whose section numbers the docs below cite).
//!
//! Modules, bottom up:
//! - [`device`]: the [`DeviceMemory`] interface every policy talks to; [`sim`]: its simulation in host RAM.

pub mod device;
pub mod sim;
pub mod vram;

pub use device::{DevPtr, DeviceEvent, DeviceMemory, HostMemory, HostSlice, MemInfo, StreamId};
pub use sim::{SimCounters, SimDevice};
