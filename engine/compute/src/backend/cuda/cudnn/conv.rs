//! Convolutions on cuDNN, where the library is installed (PyTorch's CUDA wheels bring it; Kiln does not need it):
//! its implicit-GEMM kernels read the input where it lies, instead of gemm.rs's im2col path, which first writes
//! every output pixel's window (`C·kh·kw` values a pixel: nine times a 3×3 conv's input) into a column buffer and
//! reads it back. A VAE decoding 720p video runs hundreds of such convolutions, so there the column buffer's traffic
//! is most of the time.
//!
//! The library is loaded at the first convolution ([`Convolutions::open`]); without it (or with `KILN_CUDA_CUDNN=0`,
//! to compare the two paths), or for a problem cuDNN declines (an error from any call, asymmetric padding, tensors
//! of 2³¹ elements or more), the im2col path runs.
//! 16-bit data computes on the tensor cores with f32 accumulation (rounded once into the output, as cuBLASLt's
//! GEMMs); f32 data computes with FMA only, never TF32, as the im2col GEMM does. The algorithm (and the math type it
//! was rated with, as PyTorch applies it) is cuDNN's heuristic first choice within [`MAX_WORKSPACE`] bytes of
//! scratch, asked once per shape; a shape cuDNN fails on once runs as im2col from then on. Only cuDNN 9 is used
//! (the bindings' status codes are 9's).

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cudnn::result as dnn;
use cudarc::cudnn::sys;
use cudarc::driver::CudaStream;

use super::{Handle, failed};
use crate::backend::cuda::buf::Allocation;
use crate::dtype::DType;
use crate::error::{Error, Result};

/// The most scratch an algorithm may ask for (taken from the activations' budget at each call).
const MAX_WORKSPACE: usize = 256 << 20;

/// One convolution: NCHW input `[batch, channels, height, width]`, weight `[out_channels, channels, kh, kw]`,
/// symmetric zero padding, one stride both ways, no dilation; every tensor in `dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConvShape {
    pub(crate) dtype: DType,
    pub(crate) batch: usize,
    pub(crate) channels: usize,
    pub(crate) height: usize,
    pub(crate) width: usize,
    pub(crate) out_channels: usize,
    pub(crate) kernel: [usize; 2],
    pub(crate) pad: [usize; 2],
    pub(crate) stride: usize,
}

impl ConvShape {
    /// The output's height and width.
    pub(crate) fn out_size(&self) -> [usize; 2] {
        let out = |size: usize, k: usize, p: usize| (size + 2 * p - k) / self.stride + 1;
        [
            out(self.height, self.kernel[0], self.pad[0]),
            out(self.width, self.kernel[1], self.pad[1]),
        ]
    }

    /// The dimensions cuDNN is given (ints), or why it is not asked: a tensor of 2³¹ elements or more.
    fn dims(&self) -> Result<[[i32; 4]; 3]> {
        let [ho, wo] = self.out_size();
        let x = [self.batch, self.channels, self.height, self.width];
        let w = [self.out_channels, self.channels, self.kernel[0], self.kernel[1]];
        let y = [self.batch, self.out_channels, ho, wo];
        let int = |d: [usize; 4]| -> Result<[i32; 4]> {
            if d.iter()
                .try_fold(1usize, |n, &v| n.checked_mul(v))
                .is_none_or(|n| n > i32::MAX as usize)
            {
                return Err(Error::Unsupported(format!("a cuDNN convolution over {d:?}")));
            }
            Ok(d.map(|v| v as i32))
        };
        Ok([int(x)?, int(w)?, int(y)?])
    }
}

/// cuDNN's handle on the compute stream and the algorithm chosen for each shape (`None`: cuDNN has none that fits,
/// the im2col path runs).
pub(crate) struct Convolutions {
    handle: Mutex<Handle>,
    choices: Mutex<HashMap<ConvShape, Option<Choice>>>,
    stats: Mutex<CudnnConvStats>,
}

/// What cuDNN's convolutions have done on a device ([`crate::backend::cuda::Cuda::cudnn_conv_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CudnnConvStats {
    /// Convolutions it ran.
    pub ran: u64,
    /// Of those, the ones that added into their output (beta = 1: a causal 3-D convolution's later taps).
    pub accumulated: u64,
    /// Why it last declined one (the im2col path ran it), if it has.
    pub declined: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Choice {
    algo: sys::cudnnConvolutionFwdAlgo_t,
    math: sys::cudnnMathType_t,
    workspace: usize,
}

/// `cudnnConvolutionFwdAlgoPerf_t` with its enums as plain integers, so a value this build's bindings do not know
/// (a newer cuDNN's) is read safely and skipped.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct AlgoPerf {
    algo: i32,
    status: i32,
    time: f32,
    memory: usize,
    determinism: i32,
    math_type: i32,
    reserved: [i32; 3],
}

impl AlgoPerf {
    /// The algorithm and math type this entry rates, if it succeeded within `max_workspace` in a math type allowed
    /// for the data (FMA only for f32: never TF32).
    fn choice(&self, max_workspace: usize, f32_data: bool) -> Option<Choice> {
        use sys::cudnnConvolutionFwdAlgo_t as A;
        use sys::cudnnMathType_t as M;
        if self.status != 0 || self.memory > max_workspace {
            return None;
        }
        let algo = match self.algo {
            0 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
            1 => A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM,
            2 => A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM,
            3 => A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT,
            4 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT,
            5 => A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING,
            6 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD,
            7 => A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED,
            _ => return None,
        };
        let math = match (self.math_type, f32_data) {
            (3, _) => M::CUDNN_FMA_MATH,
            (0, false) => M::CUDNN_DEFAULT_MATH,
            (1, false) => M::CUDNN_TENSOR_OP_MATH,
            _ => return None,
        };
        Some(Choice { algo, math, workspace: self.memory })
    }
}

/// RAII guards for cuDNN descriptors.
struct TensorDesc(sys::cudnnTensorDescriptor_t);
impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateTensorDescriptor`, destroyed once.
        let _ = unsafe { dnn::destroy_tensor_descriptor(self.0) };
    }
}
struct FilterDesc(sys::cudnnFilterDescriptor_t);
impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateFilterDescriptor`, destroyed once.
        let _ = unsafe { dnn::destroy_filter_descriptor(self.0) };
    }
}
struct ConvDesc(sys::cudnnConvolutionDescriptor_t);
impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: created by `cudnnCreateConvolutionDescriptor`, destroyed once.
        let _ = unsafe { dnn::destroy_convolution_descriptor(self.0) };
    }
}

/// The descriptors of one convolution.
struct Descriptors {
    x: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    y: TensorDesc,
}

impl Descriptors {
    fn new(s: &ConvShape) -> Result<Descriptors> {
        let (data, math) = match s.dtype {
            DType::F32 => {
                (sys::cudnnDataType_t::CUDNN_DATA_FLOAT, sys::cudnnMathType_t::CUDNN_FMA_MATH)
            }
            DType::F16 => {
                (sys::cudnnDataType_t::CUDNN_DATA_HALF, sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH)
            }
            DType::BF16 => (
                sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
                sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
            ),
            other => return Err(Error::Unsupported(format!("a cuDNN convolution in {other}"))),
        };
        let [xd, wd, yd] = s.dims()?;
        let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let tensor = |dims: [i32; 4]| -> Result<TensorDesc> {
            let t = TensorDesc(
                dnn::create_tensor_descriptor()
                    .map_err(|e| failed("cudnnCreateTensorDescriptor", e))?,
            );
            // SAFETY: the descriptor was just created and is alive.
            unsafe { dnn::set_tensor4d_descriptor(t.0, nchw, data, dims) }
                .map_err(|e| failed("cudnnSetTensor4dDescriptor", e))?;
            Ok(t)
        };
        let x = tensor(xd)?;
        let y = tensor(yd)?;
        let w = FilterDesc(
            dnn::create_filter_descriptor()
                .map_err(|e| failed("cudnnCreateFilterDescriptor", e))?,
        );
        // SAFETY: the descriptor was just created and is alive.
        unsafe { dnn::set_filter4d_descriptor(w.0, data, nchw, wd) }
            .map_err(|e| failed("cudnnSetFilter4dDescriptor", e))?;
        let conv = ConvDesc(
            dnn::create_convolution_descriptor()
                .map_err(|e| failed("cudnnCreateConvolutionDescriptor", e))?,
        );
        let int = |v: usize| v as i32; // pads and strides are at most a side of a tensor under 2³¹ elements
        // SAFETY: the descriptor was just created and is alive.
        unsafe {
            dnn::set_convolution2d_descriptor(
                conv.0,
                int(s.pad[0]),
                int(s.pad[1]),
                int(s.stride),
                int(s.stride),
                1,
                1,
                sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
            .map_err(|e| failed("cudnnSetConvolution2dDescriptor", e))?;
            dnn::set_convolution_math_type(conv.0, math)
                .map_err(|e| failed("cudnnSetConvolutionMathType", e))?;
        }
        Ok(Descriptors { x, w, conv, y })
    }
}

impl Convolutions {
    /// cuDNN on `stream`, or `None` when the library is not installed, does not start (the reason is logged) or
    /// `KILN_CUDA_CUDNN=0` turns it off.
    pub(crate) fn open(stream: &CudaStream) -> Option<Convolutions> {
        if std::env::var("KILN_CUDA_CUDNN").is_ok_and(|v| v == "0") {
            return None;
        }
        let handle = Handle::open(stream, "convolutions run as im2col and GEMM")?;
        Some(Convolutions {
            handle: Mutex::new(handle),
            choices: Mutex::default(),
            stats: Mutex::default(),
        })
    }

    /// What it has run and declined so far.
    pub(crate) fn stats(&self) -> CudnnConvStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Queues the convolution as [`Convolutions::run_or_decline`] does, and counts what happened.
    pub(crate) fn forward(
        &self,
        s: &ConvShape,
        ptrs: [u64; 3],
        accumulate: bool,
        scratch: impl FnOnce(u64) -> Result<Allocation>,
    ) -> Result<()> {
        let result = self.run_or_decline(s, ptrs, accumulate, scratch);
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(()) => {
                stats.ran += 1;
                stats.accumulated += u64::from(accumulate);
            }
            Err(e) => stats.declined = Some(e.to_string()),
        }
        result
    }

    /// Queues `y = conv(x, w)` (no bias; with `accumulate`, `y += conv(x, w)`, cuDNN's beta = 1: the f32
    /// products added to y's values, rounded once) on the stream the handle was opened on; `scratch` allocates
    /// the algorithm's workspace. An error means nothing was queued (the caller runs the im2col path).
    fn run_or_decline(
        &self,
        s: &ConvShape,
        [x, w, y]: [u64; 3],
        accumulate: bool,
        scratch: impl FnOnce(u64) -> Result<Allocation>,
    ) -> Result<()> {
        if [x, w, y].iter().any(|p| p % 16 != 0) {
            // cuDNN 9 refuses misaligned tensors; a weight at an odd offset of its file runs as im2col.
            return Err(Error::Unsupported(
                "a cuDNN convolution of tensors not 16-byte aligned".into(),
            ));
        }
        let cached = self.choices.lock().unwrap_or_else(|p| p.into_inner()).get(s).copied();
        if let Some(None) = cached {
            return Err(Error::Unsupported(format!("cuDNN has no algorithm for {s:?}")));
        }
        let d = Descriptors::new(s)?;
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        let choice = match cached {
            Some(c) => c,
            None => {
                let c = self.heuristic(&handle, &d, s.dtype == DType::F32).unwrap_or_else(|e| {
                    tracing::debug!(error = %e, "cuDNN's heuristic failed");
                    None
                });
                self.choices.lock().unwrap_or_else(|p| p.into_inner()).insert(*s, c);
                c
            }
        };
        let Some(choice) = choice else {
            return Err(Error::Unsupported(format!("cuDNN has no algorithm for {s:?}")));
        };
        // A workspace that cannot be had now (memory taken for a moment) leaves the shape to cuDNN next time.
        let workspace =
            if choice.workspace > 0 { Some(scratch(choice.workspace as u64)?) } else { None };
        let ran = Self::run(&handle, &d, choice, [x, w, y], accumulate, workspace.as_ref());
        if ran.is_err() {
            // Not again for this shape: each try would build the descriptors and take the workspace anew.
            self.choices.lock().unwrap_or_else(|p| p.into_inner()).insert(*s, None);
        }
        ran
    }

    /// Queues the convolution `d` of the tensors at `[x, w, y]` with `choice` and its workspace.
    fn run(
        handle: &Handle,
        d: &Descriptors,
        choice: Choice,
        [x, w, y]: [u64; 3],
        accumulate: bool,
        workspace: Option<&Allocation>,
    ) -> Result<()> {
        // SAFETY: the descriptor is alive.
        unsafe { dnn::set_convolution_math_type(d.conv.0, choice.math) }
            .map_err(|e| failed("cudnnSetConvolutionMathType", e))?;
        let (ws_ptr, ws_len) = workspace
            .map_or((std::ptr::null_mut(), 0), |a| (a.ptr().0 as *mut c_void, choice.workspace));
        let (alpha, beta) = (1.0f32, if accumulate { 1.0f32 } else { 0.0f32 });
        // SAFETY: the descriptors describe the tensors at x, w and y (the caller checked the shapes and keeps the
        // buffers alive until the stream has run the convolution; they and the workspace are freed stream-ordered);
        // alpha and beta are floats, as cuDNN takes them for half, bfloat16 and float data (y is read first where
        // beta = 1: it holds the values to add to); the workspace holds
        // `ws_len` bytes.
        unsafe {
            dnn::convolution_forward(
                handle.0,
                (&alpha as *const f32).cast(),
                d.x.0,
                x as *const c_void,
                d.w.0,
                w as *const c_void,
                d.conv.0,
                choice.algo,
                ws_ptr,
                ws_len,
                (&beta as *const f32).cast(),
                d.y.0,
                y as *mut c_void,
            )
        }
        .map_err(|e| failed("cudnnConvolutionForward", e))
    }

    /// The heuristic's first algorithm that succeeds within [`MAX_WORKSPACE`] (for f32 data, with FMA math), with
    /// the math type it was rated with and the scratch it needs.
    fn heuristic(
        &self,
        handle: &Handle,
        d: &Descriptors,
        f32_data: bool,
    ) -> Result<Option<Choice>> {
        let mut count = 0;
        // SAFETY: the handle is alive and `count` is written.
        unsafe { sys::cudnnGetConvolutionForwardAlgorithmMaxCount(handle.0, &mut count) }
            .result()
            .map_err(|e| failed("cudnnGetConvolutionForwardAlgorithmMaxCount", e))?;
        let mut perf = vec![AlgoPerf::default(); count.clamp(1, 64) as usize];
        let mut returned = 0;
        // SAFETY: the handle and descriptors are alive; `perf` holds `perf.len()` entries laid out as
        // cudnnConvolutionFwdAlgoPerf_t (the same C layout, its enums as the ints they are); `returned` is written.
        unsafe {
            dnn::get_convolution_forward_algorithm(
                handle.0,
                d.x.0,
                d.w.0,
                d.conv.0,
                d.y.0,
                perf.len() as i32,
                &mut returned,
                perf.as_mut_ptr().cast(),
            )
        }
        .map_err(|e| failed("cudnnGetConvolutionForwardAlgorithm_v7", e))?;
        let returned = (returned.max(0) as usize).min(perf.len());
        Ok(perf[..returned].iter().find_map(|p| p.choice(MAX_WORKSPACE, f32_data)))
    }
}

#[cfg(test)]
mod tests {
    use super::ConvShape;
    use crate::dtype::DType;

    fn shape(batch: usize, c: usize, hw: usize, k: usize, pad: usize, stride: usize) -> ConvShape {
        ConvShape {
            dtype: DType::BF16,
            batch,
            channels: c,
            height: hw,
            width: hw + 1,
            out_channels: 7,
            kernel: [k, k],
            pad: [pad, pad],
            stride,
        }
    }

    #[test]
    fn the_output_size_is_the_padded_windows_at_the_stride() {
        assert_eq!(shape(1, 3, 10, 3, 1, 1).out_size(), [10, 11]);
        assert_eq!(shape(1, 3, 10, 3, 0, 2).out_size(), [4, 5]);
        assert_eq!(shape(1, 3, 9, 4, 2, 2).out_size(), [5, 6]);
    }

    #[test]
    fn an_algorithm_is_taken_only_when_it_succeeded_within_the_workspace_in_an_allowed_math_type() {
        use super::AlgoPerf;
        let perf = |algo, status, memory, math_type| AlgoPerf {
            algo,
            status,
            memory,
            math_type,
            ..AlgoPerf::default()
        };
        let max = 1 << 30;
        let c = perf(1, 0, 1000, 1).choice(max, false).expect("tensor ops for bf16");
        assert_eq!((c.algo as i32, c.math as i32, c.workspace), (1, 1, 1000));
        assert!(
            perf(1, 0, 1000, 1).choice(max, true).is_none(),
            "tensor ops (TF32) refused for f32"
        );
        assert!(
            perf(1, 0, 1000, 0).choice(max, true).is_none(),
            "default math may be TF32 for f32"
        );
        assert_eq!(
            perf(0, 0, 0, 3).choice(max, true).map(|c| c.math as i32),
            Some(3),
            "FMA for f32"
        );
        assert!(perf(1, 9, 0, 1).choice(max, false).is_none(), "a failed status");
        assert!(perf(1, 0, max + 1, 1).choice(max, false).is_none(), "over the workspace");
        assert!(
            perf(8, 0, 0, 1).choice(max, false).is_none(),
            "an algorithm this build does not know"
        );
        assert!(
            perf(1, 0, 0, 7).choice(max, false).is_none(),
            "a math type this build does not know"
        );
    }

    #[test]
    fn tensors_of_two_to_the_31_elements_are_not_given_to_cudnn() {
        assert!(shape(4, 128, 1000, 3, 1, 1).dims().is_ok());
        let dims = shape(2, 3, 10, 3, 1, 1).dims().expect("small");
        assert_eq!(dims, [[2, 3, 10, 11], [7, 3, 3, 3], [2, 7, 10, 11]]);
        // 2 × 1024 × 1024 × 1025 elements of input.
        assert!(shape(2, 1024, 1024, 3, 1, 1).dims().is_err());
    }
}
