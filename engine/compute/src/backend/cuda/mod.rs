//! The CUDA backend (feature `cuda`): cudarc with dynamic loading, cuBLASLt for GEMM, NVRTC kernels.
//!
//! Brief overview:
//! - [`memory`]: [`CudaMemory`], the [`DeviceMemory`] of a CUDA device (VMM reservations and mappings, the
//!   stream-ordered pool, streams, events, registered host memory).
//! - `kernels`: the CUDA C kernels (`kernels/*.cu`, one per op family), compiled by NVRTC at first use for the
//!   device's compute capability and launched on the compute stream.
//! - `gemm`: linear, matmul and conv2d on cuBLASLt.
//! - `elementwise`, `norm`, `attention`, `layout`: the other ops.
//!
//! Every op is queued on one compute stream ([`crate::memory::StreamId::COMPUTE`]); activations are plain
//! allocations, freed stream-ordered when their last tensor drops, so the CPU never waits for compute except in
//! [`Backend::synchronize`] and [`Backend::to_f32`]. They come from the device memory until the memory manager
//! hands the backend its VRAM arbiter ([`Backend::set_allocator`]), which then counts them and evicts weights
//! for them. Kernels compute in f32 and round once on store (to nearest even), matching the CPU backend's
//! semantics; weights are read exactly in their stored type (GEMMs widen to f32 where the activation type
//! cannot hold every weight value, see `gemm`).

#![allow(unsafe_code)]

mod attention;
mod buf;
mod cudnn;
mod elementwise;
mod gemm;
mod kernel_cache;
mod kernels;
mod layout;
pub mod memory;
mod norm;
pub mod profile;
mod quant;
mod ranges;

use std::sync::{Arc, RwLock};

use cudarc::driver::{CudaContext, CudaStream};

pub use buf::CudaBuf;
pub use cudnn::{CudnnAttentionStats, CudnnConvStats};
pub use kernel_cache::set_kernel_cache;
pub use kernels::{CompiledKernel, compile_all as compile_kernels};
pub use memory::CudaMemory;

use self::buf::Allocation;
use self::kernels::{Arg, Grid, KernelFile, Kernels, dtype_code};
use self::memory::drv;
use crate::backend::{
    AttentionMask, Backend, BinaryOp, Conv2dParams, ConvTerm, DeviceInfo, PadMode, RopeLayout,
    UnaryOp,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::device::DeviceAllocator;
use crate::memory::{DevPtr, DeviceMemory};
use crate::quant::Quant;
use crate::tensor::{Tensor, Weight, numel};

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

/// The CUDA backend on one device: a view of the device's shared state ([`CudaCore`]) that computes activations
/// in its own default type. [`Backend::with_compute_dtype`] makes another view of the same device.
pub struct Cuda {
    core: Arc<CudaCore>,
    dtype: DType,
    long_attention: LongAttention,
}

/// What every [`Cuda`] view of one device shares: its memory, kernels, cuBLASLt handle and allocator.
pub struct CudaCore {
    /// cuDNN for convolutions and for fused attention, each opened at its first use; `None` where the library is
    /// absent. First, so they are destroyed before the stream and context they use (fields drop in order).
    convolutions: std::sync::OnceLock<Option<cudnn::Convolutions>>,
    cudnn_attention: std::sync::OnceLock<Option<cudnn::Attention>>,
    info: DeviceInfo,
    mem: Arc<CudaMemory>,
    memory: Arc<dyn DeviceMemory>,
    /// Where activations and per-op scratch come from: `mem` until [`Backend::set_allocator`].
    allocator: RwLock<Arc<dyn DeviceAllocator>>,
    kernels: Kernels,
    gemm: gemm::Gemm,
    hadamards: quant::Hadamards,
}

impl std::ops::Deref for Cuda {
    type Target = CudaCore;

    fn deref(&self) -> &CudaCore {
        &self.core
    }
}

/// How the CUDA backend runs attention over long sequences (short ones take the flash kernel on CUDA cores
/// either way; `attention.rs` has the details).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LongAttention {
    /// Chunked cuBLASLt GEMMs around a masked row softmax.
    #[default]
    Gemm,
    /// The tensor-core flash kernel (`attention_mma.cu`) where it applies (sm_80 and later; q, k and v of one
    /// 16-bit type; heads of 64 or 128 features), the GEMMs elsewhere. Chosen with `KILN_CUDA_ATTENTION=mma`.
    Mma,
    /// The same kernel with two m-tiles a warp (128 query rows a block, FlashAttention-2's shape) where its shared
    /// memory fits the device, else as [`LongAttention::Mma`]. Chosen with `KILN_CUDA_ATTENTION=mma2`.
    Mma2,
    /// cuDNN's fused flash attention where the library (9.x) is installed and takes the problem (at least 1 024
    /// queries and keys, q, k, v of one 16-bit type, heads of at most 256 features), the GEMMs elsewhere. Chosen
    /// with `KILN_CUDA_ATTENTION=cudnn`.
    Cudnn,
}

impl LongAttention {
    /// The choice `KILN_CUDA_ATTENTION` names (`gemm`, `mma`, `mma2` or `cudnn`), the default when it is unset;
    /// another value is an error naming it.
    pub fn from_env() -> Result<LongAttention> {
        match std::env::var("KILN_CUDA_ATTENTION").as_deref() {
            Err(_) | Ok("") | Ok("gemm") => Ok(LongAttention::Gemm),
            Ok("mma") => Ok(LongAttention::Mma),
            Ok("mma2") => Ok(LongAttention::Mma2),
            Ok("cudnn") => Ok(LongAttention::Cudnn),
            Ok(other) => Err(Error::Unsupported(format!(
                "KILN_CUDA_ATTENTION={other} (expected gemm, mma, mma2 or cudnn)"
            ))),
        }
    }
}

impl Cuda {
    /// Opens CUDA device `ordinal`, computing in bf16.
    pub fn new(ordinal: usize) -> Result<Cuda> {
        Cuda::with_dtype(ordinal, DType::BF16)
    }

    /// Opens CUDA device `ordinal`, computing activations in `dtype` (f32, f16 or bf16), with long attention
    /// as `KILN_CUDA_ATTENTION` says ([`LongAttention::from_env`]).
    pub fn with_dtype(ordinal: usize, dtype: DType) -> Result<Cuda> {
        let long_attention = LongAttention::from_env()?;
        if !dtype.is_compute() {
            return Err(Error::Unsupported(format!("computing in {dtype}")));
        }
        if let Some(lib) = missing_library() {
            return Err(Error::Unsupported(format!("the CUDA library {lib} was not found")));
        }
        let ctx: Arc<CudaContext> =
            CudaContext::new(ordinal).map_err(|e| drv("cuInit/cuDevicePrimaryCtxRetain", e))?;
        let compute: Arc<CudaStream> = ctx.new_stream().map_err(|e| drv("cuStreamCreate", e))?;
        let name = ctx.name().map_err(|e| drv("cuDeviceGetName", e))?;
        let total = ctx.total_mem().map_err(|e| drv("cuDeviceTotalMem", e))? as u64;
        let mem = Arc::new(CudaMemory::new(ctx.clone(), compute)?);
        let memory: Arc<dyn DeviceMemory> = mem.clone();
        let plain: Arc<dyn DeviceAllocator> = mem.clone();
        let kernels = Kernels::new(ctx)?;
        // The cuBLASLt workspace lives as long as the backend, so it stays a plain allocation.
        let gemm = gemm::Gemm::new(Allocation::new(&plain, gemm::WORKSPACE)?)?;
        let info = DeviceInfo { kind: "cuda", index: ordinal, name, total_memory: total };
        let hadamards = quant::Hadamards::default();
        let core = CudaCore {
            convolutions: std::sync::OnceLock::new(),
            cudnn_attention: std::sync::OnceLock::new(),
            info,
            mem,
            memory,
            allocator: RwLock::new(plain),
            kernels,
            gemm,
            hadamards,
        };
        Ok(Cuda { core: Arc::new(core), dtype, long_attention })
    }

    /// What cuDNN's convolutions have done on this device: the calls it ran (and of those, the accumulating ones)
    /// and why it last declined one; `declined` says so where cuDNN never opened.
    pub fn cudnn_conv_stats(&self) -> CudnnConvStats {
        match self.convolutions.get() {
            Some(Some(convolutions)) => convolutions.stats(),
            Some(None) => CudnnConvStats {
                declined: Some("cuDNN 9 did not open on this device (or KILN_CUDA_CUDNN=0)".into()),
                ..CudnnConvStats::default()
            },
            None => CudnnConvStats {
                declined: Some("no convolution has asked for cuDNN yet".into()),
                ..CudnnConvStats::default()
            },
        }
    }

    /// What cuDNN's fused attention ([`LongAttention::Cudnn`]) has done on this device: the calls it ran and why it
    /// last declined one; `declined` says so where cuDNN never opened (no library, or no call asked for it yet).
    pub fn cudnn_attention_stats(&self) -> CudnnAttentionStats {
        match self.cudnn_attention.get() {
            Some(Some(attention)) => attention.stats(),
            Some(None) => CudnnAttentionStats {
                ran: 0,
                declined: Some("cuDNN 9 did not open on this device".into()),
            },
            None => CudnnAttentionStats {
                ran: 0,
                declined: Some("no attention has asked for cuDNN yet".into()),
            },
        }
    }

    /// This backend with long attention run as `path` says.
    pub fn with_long_attention(mut self, path: LongAttention) -> Cuda {
        self.long_attention = path;
        self
    }

    /// What the device is.
    pub fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    /// The device memory as its concrete type (pool trimming).
    pub fn cuda_memory(&self) -> &Arc<CudaMemory> {
        &self.mem
    }

    fn stream(&self) -> &CudaStream {
        self.mem.compute_stream()
    }

    fn launch(&self, file: KernelFile, name: &'static str, grid: Grid, args: &[Arg]) -> Result<()> {
        self.launch_counted(file, name, grid, args, 0.0)
    }

    /// [`Cuda::launch`] of a kernel that does `flops` operations (for the [`profile`]).
    fn launch_counted(
        &self,
        file: KernelFile,
        name: &'static str,
        grid: Grid,
        args: &[Arg],
        flops: f64,
    ) -> Result<()> {
        profile::timed(
            self.stream(),
            || name.to_owned(),
            flops,
            || self.kernels.launch(self.stream(), file, name, grid, args),
        )
    }

    /// `bytes` of device memory for activations or per-op scratch, from the allocator now in force.
    pub(crate) fn alloc(&self, bytes: u64) -> Result<Allocation> {
        let allocator = self.allocator.read().unwrap_or_else(|p| p.into_inner()).clone();
        Allocation::new(&allocator, bytes)
    }

    /// A new tensor whose elements the caller's kernels write.
    fn empty(&self, shape: Vec<usize>, dtype: DType) -> Result<Tensor<Cuda>> {
        let bytes = (numel(&shape) * dtype.size()) as u64;
        let alloc = self.alloc(bytes)?;
        Ok(Tensor::from_parts(CudaBuf::new(alloc), shape, dtype))
    }

    /// An activation dtype check: ops take f32, f16 and bf16 tensors.
    fn compute_type(op: &'static str, dtype: DType) -> Result<DType> {
        if dtype.is_compute() {
            Ok(dtype)
        } else {
            Err(Error::shape(op, format!("{dtype} is not a compute type")))
        }
    }

    fn fill_ptr(&self, ptr: u64, dtype: DType, n: usize, value: f32) -> Result<()> {
        self.launch(
            KernelFile::Cast,
            "fill",
            Grid::linear(n),
            &[Arg::Ptr(ptr), Arg::I32(dtype_code(dtype)), Arg::n(n), Arg::F32(value)],
        )
    }

    fn cast_ptr(&self, src: u64, sdt: DType, dst: u64, ddt: DType, n: usize) -> Result<()> {
        if self.cast_f8x4(src, sdt, dst, ddt, n, 1.0)? {
            return Ok(());
        }
        self.launch(
            KernelFile::Cast,
            "cast",
            Grid::linear(n),
            &[
                Arg::Ptr(src),
                Arg::I32(dtype_code(sdt)),
                Arg::Ptr(dst),
                Arg::I32(dtype_code(ddt)),
                Arg::n(n),
            ],
        )
    }

    /// `dst = src · scale` four values a thread (`cast_f8x4`) for an fp8 source and a 16-bit destination, aligned and
    /// a multiple of four long: whether it ran (`false`: nothing queued, the caller casts one value a thread).
    fn cast_f8x4(
        &self,
        src: u64,
        sdt: DType,
        dst: u64,
        ddt: DType,
        n: usize,
        scale: f32,
    ) -> Result<bool> {
        let fits = matches!(sdt, DType::F8E4M3 | DType::F8E5M2)
            && matches!(ddt, DType::F16 | DType::BF16)
            && n.is_multiple_of(4)
            && src.is_multiple_of(4)
            && dst.is_multiple_of(8);
        if !fits {
            return Ok(false);
        }
        self.launch(
            KernelFile::Cast,
            "cast_f8x4",
            Grid::linear(n / 4),
            &[
                Arg::Ptr(src),
                Arg::I32(dtype_code(sdt)),
                Arg::Ptr(dst),
                Arg::I32(dtype_code(ddt)),
                Arg::n(n / 4),
                Arg::F32(scale),
            ],
        )?;
        Ok(true)
    }

    /// The weight's elements as `dtype`: its own bytes when it is stored so, else a cast into scratch (returned
    /// so the caller keeps it until its kernels are queued; the free is stream-ordered after them).
    ///
    /// A scaled weight is dequantized as ComfyUI does on a GPU: `dtype(q) · dtype(scale)`, rounded to `dtype`.
    fn weight_as(&self, w: &Weight<'_>, dtype: DType) -> Result<(u64, Option<Allocation>)> {
        if w.dtype() == dtype && w.quant() == Quant::None {
            return Ok((w.ptr().0, None));
        }
        let scratch = self.alloc((w.values() * dtype.size()) as u64)?;
        self.cast_weight_ptr(w, scratch.ptr().0, dtype)?;
        Ok((scratch.ptr().0, Some(scratch)))
    }

    /// Writes `w`'s values as `dtype` at `dst`: a cast, or the dequantization of a quantized weight.
    fn cast_weight_ptr(&self, w: &Weight<'_>, dst: u64, dtype: DType) -> Result<()> {
        if w.quant().has_table() {
            return self.dequantize_ptr(w, dst, dtype);
        }
        let Some(scale) = w.scale() else {
            return self.cast_ptr(w.ptr().0, w.dtype(), dst, dtype, w.numel());
        };
        let scale = crate::dtype::round_to(dtype, scale);
        if self.cast_f8x4(w.ptr().0, w.dtype(), dst, dtype, w.numel(), scale)? {
            return Ok(());
        }
        self.launch(
            KernelFile::Cast,
            "cast_scaled",
            Grid::linear(w.numel()),
            &[
                Arg::Ptr(w.ptr().0),
                Arg::I32(dtype_code(w.dtype())),
                Arg::Ptr(dst),
                Arg::I32(dtype_code(dtype)),
                Arg::n(w.numel()),
                Arg::F32(scale),
            ],
        )
    }

    fn op_cast(&self, x: &Tensor<Cuda>, dtype: DType) -> Result<Tensor<Cuda>> {
        Self::compute_type("cast", dtype)?;
        if x.dtype() == dtype {
            return Ok(x.clone());
        }
        let out = self.empty(x.shape().to_vec(), dtype)?;
        self.cast_ptr(x.buf().ptr().0, x.dtype(), out.buf().ptr().0, dtype, x.numel())?;
        Ok(out)
    }
}

impl Backend for Cuda {
    type Buf = CudaBuf;

    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn memory(&self) -> &Arc<dyn DeviceMemory> {
        &self.memory
    }

    fn compute_dtype(&self) -> DType {
        self.dtype
    }

    fn with_compute_dtype(&self, dtype: DType) -> Result<Cuda> {
        Self::compute_type("with_compute_dtype", dtype)?;
        Ok(Cuda { core: self.core.clone(), dtype, long_attention: self.long_attention })
    }

    fn synchronize(&self) -> Result<()> {
        self.stream().synchronize().map_err(|e| drv("cuStreamSynchronize", e))
    }

    fn set_allocator(&self, allocator: Arc<dyn DeviceAllocator>) {
        *self.allocator.write().unwrap_or_else(|p| p.into_inner()) = allocator;
    }

    fn device_allocator(&self) -> Option<Arc<dyn DeviceAllocator>> {
        Some(self.allocator.read().unwrap_or_else(|p| p.into_inner()).clone())
    }

    fn from_f32(&self, shape: &[usize], values: &[f32], dtype: DType) -> Result<Tensor<Self>> {
        Self::compute_type("from_f32", dtype)?;
        if numel(shape) != values.len() {
            return Err(Error::shape(
                "from_f32",
                format!("{} values for shape {shape:?}", values.len()),
            ));
        }
        let out = self.empty(shape.to_vec(), dtype)?;
        self.mem.upload(out.buf().ptr(), crate::dtype::narrow(dtype, values))?;
        Ok(out)
    }

    fn to_f32(&self, x: &Tensor<Self>) -> Result<Vec<f32>> {
        let mut bytes = vec![0u8; x.numel() * x.dtype().size()];
        self.mem.copy_d2h(&mut bytes, x.buf().ptr())?;
        Ok(crate::dtype::widen(x.dtype(), &bytes))
    }

    fn full(&self, shape: &[usize], value: f32, dtype: DType) -> Result<Tensor<Self>> {
        Self::compute_type("full", dtype)?;
        let out = self.empty(shape.to_vec(), dtype)?;
        self.fill_ptr(out.buf().ptr().0, dtype, out.numel(), value)?;
        Ok(out)
    }

    fn weight_to_tensor(&self, w: &Weight<'_>, dtype: DType) -> Result<Tensor<Self>> {
        Self::compute_type("weight_to_tensor", dtype)?;
        let shape = match w.quant() {
            Quant::Nvfp4 { .. } => {
                let (rows, cols) = w.matrix("weight_to_tensor")?;
                vec![rows, cols]
            }
            _ => w.shape().to_vec(),
        };
        let out = self.empty(shape, dtype)?;
        self.cast_weight_ptr(w, out.buf().ptr().0, dtype)?;
        Ok(out)
    }

    fn cast(&self, x: &Tensor<Self>, dtype: DType) -> Result<Tensor<Self>> {
        self.op_cast(x, dtype)
    }

    fn store(&self, x: &Tensor<Self>, dst: DevPtr, dtype: DType, seed: Option<u64>) -> Result<()> {
        if matches!(dtype, DType::I8 | DType::U8) && seed.is_some() {
            // As the CPU backend: integer bytes are rounded by their caller.
            return Err(Error::Unsupported(format!(
                "storing into {dtype} weight bytes stochastically"
            )));
        }
        let n = x.numel();
        // `dst` comes from the caller: refuse memory this device did not map or allocate before a kernel writes
        // it. The caller owns the range until the kernel has run (the trait's contract), so nothing can take it
        // back between this check and the launch.
        self.mem.check_live("store", dst, (n * dtype.size()) as u64)?;
        self.launch(
            KernelFile::Cast,
            "store",
            Grid::linear(n),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(x.dtype())),
                Arg::Ptr(dst.0),
                Arg::I32(dtype_code(dtype)),
                Arg::n(n),
                Arg::I32(i32::from(seed.is_some())),
                Arg::U64(seed.unwrap_or(0)),
            ],
        )
    }

    fn linear(
        &self,
        x: &Tensor<Self>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
    ) -> Result<Tensor<Self>> {
        self.op_linear(x, w, bias)
    }

    fn matmul(
        &self,
        a: &Tensor<Self>,
        b: &Tensor<Self>,
        transpose_b: bool,
    ) -> Result<Tensor<Self>> {
        self.op_matmul(a, b, transpose_b)
    }

    fn embedding(&self, ids: &[u32], table: &Weight<'_>) -> Result<Tensor<Self>> {
        self.op_embedding(ids, table)
    }

    fn rms_norm(&self, x: &Tensor<Self>, w: Option<&Weight<'_>>, eps: f32) -> Result<Tensor<Self>> {
        self.op_rms_norm(x, w, eps)
    }

    fn channel_rms_norm(
        &self,
        x: &Tensor<Self>,
        w: Option<&Weight<'_>>,
        eps: f32,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<Self>> {
        self.op_channel_rms_norm(x, w, eps, act)
    }

    fn layer_norm(
        &self,
        x: &Tensor<Self>,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Self>> {
        self.op_layer_norm(x, w, b, eps)
    }

    fn group_norm(
        &self,
        x: &Tensor<Self>,
        groups: usize,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Self>> {
        self.op_group_norm(x, groups, w, b, eps)
    }

    fn softmax(&self, x: &Tensor<Self>) -> Result<Tensor<Self>> {
        self.op_softmax(x)
    }

    fn attention(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<Tensor<Self>> {
        self.op_attention(q, k, v, mask, scale)
    }

    fn rope(
        &self,
        x: &Tensor<Self>,
        cos: &Tensor<Self>,
        sin: &Tensor<Self>,
        layout: RopeLayout,
    ) -> Result<Tensor<Self>> {
        self.op_rope(x, cos, sin, layout)
    }

    fn unary(&self, x: &Tensor<Self>, op: UnaryOp) -> Result<Tensor<Self>> {
        self.op_unary(x, op)
    }

    fn binary(&self, a: &Tensor<Self>, b: &Tensor<Self>, op: BinaryOp) -> Result<Tensor<Self>> {
        self.op_binary(a, b, op)
    }

    fn affine(&self, x: &Tensor<Self>, mul: f32, add: f32) -> Result<Tensor<Self>> {
        self.op_affine(x, mul, add)
    }

    fn gated(&self, gate: &Tensor<Self>, up: &Tensor<Self>, act: UnaryOp) -> Result<Tensor<Self>> {
        self.op_gated(gate, up, act)
    }

    fn modulate(
        &self,
        x: &Tensor<Self>,
        scale: &Tensor<Self>,
        shift: Option<&Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        self.op_modulate(x, scale, shift)
    }

    fn conv2d(
        &self,
        x: &Tensor<Self>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
    ) -> Result<Tensor<Self>> {
        self.op_conv2d(x, w, bias, params)
    }

    fn conv2d_sum(
        &self,
        terms: &[ConvTerm<'_, Self>],
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
        batch: usize,
    ) -> Result<Tensor<Self>> {
        self.op_conv2d_sum(terms, bias, params, batch)
    }

    fn upsample_nearest2x(&self, x: &Tensor<Self>) -> Result<Tensor<Self>> {
        self.op_upsample_nearest2x(x)
    }

    fn patchify(&self, x: &Tensor<Self>, p: usize) -> Result<Tensor<Self>> {
        self.op_patchify(x, p)
    }

    fn unpatchify(
        &self,
        x: &Tensor<Self>,
        p: usize,
        channels: usize,
        h: usize,
        w: usize,
    ) -> Result<Tensor<Self>> {
        self.op_unpatchify(x, p, channels, h, w)
    }

    fn concat(&self, xs: &[&Tensor<Self>], dim: isize) -> Result<Tensor<Self>> {
        self.op_concat(xs, dim)
    }

    fn slice(
        &self,
        x: &Tensor<Self>,
        dim: isize,
        start: usize,
        len: usize,
    ) -> Result<Tensor<Self>> {
        self.op_slice(x, dim, start, len)
    }

    fn pad(
        &self,
        x: &Tensor<Self>,
        dim: isize,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Result<Tensor<Self>> {
        self.op_pad(x, dim, before, after, mode)
    }

    fn permute(&self, x: &Tensor<Self>, perm: &[usize]) -> Result<Tensor<Self>> {
        self.op_permute(x, perm)
    }
}
