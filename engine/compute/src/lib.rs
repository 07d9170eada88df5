//! Kiln's compute layer: tensors and their ops on two backends, and the memory manager that keeps weights in a
//! growable pinned host pool and streams them into a VRAM budget.
//!
//! Brief overview:
//! - [`backend`]: the [`Backend`] trait (every op a model family needs) and its implementations, `cpu` (always
//!   built) and `cuda` (feature `cuda`, cudarc with dynamic loading, NVRTC kernels, cuBLASLt).
//! - [`tensor`]: [`Tensor`] (activations, owned by a backend) and [`Weight`] (a view of weight bytes in device
//!   memory, in their stored type).
//! - [`dtype`]: element types and exact conversions (bf16, f16, fp8 e4m3fn/e5m2, int8).
//! - [`quant`]: ComfyUI's quantized weight layouts (per-tensor fp8, int8 with ConvRot, MXFP8, NVFP4) and their
//!   exact decoding.
//! - [`memory`]: the memory manager (device memory interface, simulated device, VRAM budget and VBARs, pinned
//!   host pool, safetensors loader, transfers, pins, RAM pressure, in-place LoRA, the per-layer weight API).
//! - [`select`]: picks CUDA when it is built and present, else the CPU, with one log line saying why.
//!
//! This crate sits below the workflow engine: `kiln-engine` and the model families depend on it, never the
//! reverse.

pub mod backend;
pub mod dtype;
mod error;
pub mod memory;
pub mod quant;
pub mod select;
pub mod tensor;

pub use backend::Backend;
pub use dtype::DType;
pub use error::{Error, Result};
pub use tensor::{OwnedWeight, Tensor, Weight};
