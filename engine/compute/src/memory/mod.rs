//! The memory manager: weights in a growable pinned host pool, faulted into a VRAM budget page by page, or
//! streamed through scratch when they do not fit — with no memory estimates (ComfyUI's dynamic VRAM with
//! comfy-aimdo; the design brief is `memory-manager.md`, whose section numbers the docs below cite).
//!
//! Modules, bottom up:
//! - [`device`]: the [`DeviceMemory`] interface every policy talks to; [`sim`]: its simulation in host RAM.
//! - [`host`]: [`HostBuffer`], the growable, prefaulted, registrable host buffer pins live in (§3).
//! - [`loader`]: safetensors headers and the threaded reader that fills host buffers from disk (§4.1).
//! - [`ring`]: the per-device staging ring and the windowed pin-on-the-way path, disk to device (§4.2, §4.3).

pub mod device;
pub mod host;
pub mod loader;
pub mod pins;
pub mod pressure;
pub mod ring;
pub mod sim;
pub mod vram;

pub use device::{DevPtr, DeviceEvent, DeviceMemory, HostMemory, HostSlice, MemInfo, StreamId};
pub use host::{HostBuffer, HostBufferConfig, WriteRange};
pub use loader::{
    FileSource, LoadOptions, LoadStats, SafetensorsFile, TensorInfo, drop_page_cache,
};
pub use ring::{PinRange, RingConfig, StagingRing, read_through_pin};
pub use sim::{SimCounters, SimDevice};
