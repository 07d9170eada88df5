//! Picks the backend a process computes on: CUDA when it is built in, asked for and present; otherwise the
//! CPU, with one log line saying why.
//!
//! In dynamic-loading mode cudarc *panics* when a library is missing, so the libraries' presence is checked
//! (`is_culib_present`) before the first cudarc call; from there on driver errors (no device, a driver too
//! old) are ordinary errors that also fall back.

use std::sync::Arc;

use crate::backend::cpu::Cpu;

/// What the process was asked for.
#[derive(Debug, Clone)]
pub struct Selection {
    /// Use the CPU even when CUDA is available (ComfyUI's `--cpu`).
    pub force_cpu: bool,
    /// The CUDA device to use.
    pub cuda_device: usize,
    /// Simulated device memory of the CPU backend, in bytes (weights faulted into "VRAM" count against it).
    pub cpu_memory: u64,
}

/// The backend chosen, one variant per backend.
pub enum Device {
    /// The CPU backend.
    Cpu(Arc<Cpu>),
    /// The CUDA backend.
    #[cfg(feature = "cuda")]
    Cuda(Arc<crate::backend::cuda::Cuda>),
}

impl Device {
    /// `"cpu"` or `"cuda"`.
    pub fn kind(&self) -> &'static str {
        match self {
            Device::Cpu(_) => "cpu",
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => "cuda",
        }
    }

    /// Whether models compute in 16-bit types here, as ComfyUI's `should_use_fp16` and `should_use_bf16` answer:
    /// on CUDA (sm_80 and later, the GPUs Kiln's kernels are built for), not on the CPU, which computes in f32.
    pub fn computes_in_16_bits(&self) -> bool {
        match self {
            Device::Cpu(_) => false,
            #[cfg(feature = "cuda")]
            Device::Cuda(_) => true,
        }
    }
}

/// Why the CPU was chosen, or `None` when CUDA was.
pub fn select(selection: &Selection) -> (Device, Option<String>) {
    let cpu = |reason: String| {
        tracing::info!("computing on the CPU: {reason}");
        (Device::Cpu(Arc::new(Cpu::new(selection.cpu_memory))), Some(reason))
    };
    if selection.force_cpu {
        return cpu("--cpu was given".to_owned());
    }
    #[cfg(feature = "cuda")]
    {
        if let Some(missing) = crate::backend::cuda::missing_library() {
            return cpu(format!("the CUDA library {missing} was not found"));
        }
        match crate::backend::cuda::Cuda::new(selection.cuda_device) {
            Ok(cuda) => {
                tracing::info!(device = %cuda.info().name, "computing on CUDA device {}", selection.cuda_device);
                (Device::Cuda(Arc::new(cuda)), None)
            }
            Err(e) => cpu(format!("CUDA device {} is not usable: {e}", selection.cuda_device)),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        cpu("this build has no CUDA support (feature `cuda`)".to_owned())
    }
}
