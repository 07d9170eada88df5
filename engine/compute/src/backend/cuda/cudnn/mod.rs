//! cuDNN, where the library is installed (PyTorch's CUDA wheels bring it; Kiln does not need it): convolutions
//! ([`conv`]) and fused attention ([`attention`]) on its kernels. Each opens its own handle on the compute stream
//! at its first use; without the library, or where cuDNN declines a problem, the backend's own path runs. Only
//! cuDNN 9 is used (the bindings' status codes and attribute numbers are 9's).

#![allow(unsafe_code)]

pub(crate) mod attention;
pub(crate) mod conv;
mod graph;

pub use attention::CudnnAttentionStats;
pub(crate) use attention::{Attention, AttentionShape};
pub use conv::CudnnConvStats;
pub(crate) use conv::{ConvShape, Convolutions};

use cudarc::cudnn::result as dnn;
use cudarc::cudnn::sys;
use cudarc::driver::CudaStream;

use crate::error::Error;

/// A cuDNN handle bound to the compute stream.
pub(crate) struct Handle(pub(super) sys::cudnnHandle_t);

// SAFETY: a cuDNN handle is not tied to the thread that created it; every use goes through a mutex, so it is
// never used from two threads at once.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreate`, destroyed once, here.
        let _ = unsafe { dnn::destroy_handle(self.0) };
    }
}

impl Handle {
    /// A handle on `stream`, or `None` (logged, with `otherwise`: what runs instead) when the library is not
    /// installed, is not version 9 or does not start.
    pub(super) fn open(stream: &CudaStream, otherwise: &str) -> Option<Handle> {
        // SAFETY: this only tries to dlopen the library and reports whether it loaded.
        if !unsafe { sys::is_culib_present() } {
            tracing::debug!("libcudnn not found: {otherwise}");
            return None;
        }
        let version = dnn::get_version();
        if !(90_000..100_000).contains(&version) {
            tracing::info!(version, "cuDNN is not version 9: {otherwise}");
            return None;
        }
        let open = || -> crate::error::Result<Handle> {
            stream
                .context()
                .bind_to_thread()
                .map_err(|e| super::memory::drv("cuCtxSetCurrent", e))?;
            let handle = Handle(dnn::create_handle().map_err(|e| failed("cudnnCreate", e))?);
            // SAFETY: the handle is alive and the stream belongs to the context bound to this thread.
            unsafe { dnn::set_stream(handle.0, stream.cu_stream() as sys::cudaStream_t) }
                .map_err(|e| failed("cudnnSetStream", e))?;
            Ok(handle)
        };
        match open() {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %e, "cuDNN did not start: {otherwise}");
                None
            }
        }
    }
}

/// A cuDNN call's error, naming the call.
pub(super) fn failed(call: &'static str, e: dnn::CudnnError) -> Error {
    Error::driver(call, format!("{e:?}"))
}
