//! The CUDA backend (feature `cuda`): cudarc with dynamic loading, cuBLASLt for GEMM, NVRTC kernels.

#![allow(unsafe_code)]

use crate::backend::{Backend, DeviceInfo};

/// The first CUDA library that cannot be loaded (`libcuda`, `libcublasLt`, `libnvrtc`), or `None` when all
/// are present. Call before any other cudarc function: a missing library makes cudarc panic.
pub fn missing_library() -> Option<&'static str> {
    // SAFETY: these only try to dlopen the library and report whether it loaded.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Some("libcuda");
    }
    // SAFETY: as above.
    if !unsafe { cudarc::cublaslt::sys::is_culib_present() } {
        return Some("libcublasLt");
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Some("libnvrtc");
    }
    None
}

/// The CUDA backend on one device.
pub struct Cuda {
    info: DeviceInfo,
}

impl Cuda {
    /// Opens CUDA device `ordinal`.
    pub fn new(ordinal: usize) -> crate::Result<Cuda> {
        Err(crate::Error::Unsupported(format!(
            "CUDA device {ordinal}: the backend is not built yet"
        )))
    }

    /// What the device is.
    pub fn info(&self) -> DeviceInfo {
        self.info.clone()
    }
}

#[allow(dead_code)]
fn _assert_backend<B: Backend>() {}
