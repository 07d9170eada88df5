//! The memory manager: weights in a growable pinned host pool, faulted into a VRAM budget page by page, or
//! streamed through scratch when they do not fit — with no memory estimates (ComfyUI's dynamic VRAM with
//! comfy-aimdo; the design brief is `memory-manager.md`, whose section numbers the docs below cite).
//!
//! Modules, bottom up:
//! - [`device`]: the [`DeviceMemory`] interface every policy talks to; [`sim`]: its simulation in host RAM.
//! - [`host`]: [`HostBuffer`], the growable, prefaulted, registrable host buffer pins live in (§3).
//! - [`loader`]: safetensors headers and the threaded reader that fills host buffers from disk (§4.1).
//! - [`ring`]: the per-device staging ring and the windowed pin-on-the-way path, disk to device (§4.2, §4.3).
//! - [`vram`]: the VRAM budget, VBARs (pages faulted in just in time, watermarks, signatures), scratch
//!   buffers and the activation allocator, arbitrated per device (§2).
//! - [`pins`]: which weights' host memory is pinned and registered, under RAM and registration budgets (§7).
//! - [`pressure`]: reading RAM (cgroups included), the `--cache-ram` thresholds and the post-node RAM
//!   arbitration between cached node outputs and pins (§7.6, §9.4).
//! - [`lora`]: in-place LoRA and the other weight adapters: packed patch images and the patch maths (§6).
//! - [`manager`] and [`model`]: the [`MemoryManager`] of a device and the models it loads; [`Model::fetch`] is
//!   the one way a forward pass gets a layer's weights, resident, streamed or patched (§5).

pub mod device;
pub mod host;
pub mod loader;
pub mod lora;
pub mod manager;
pub mod model;
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
pub use manager::{ManagerConfig, ManagerStats, MemoryManager};
pub use model::{Layer, LoadPlan, Model, SlotPlan};
pub use ring::{PinRange, RingConfig, StagingRing, read_through_pin};
pub use sim::{SimCounters, SimDevice};
