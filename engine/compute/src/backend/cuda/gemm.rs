//! GEMM on cuBLASLt (bf16/f16 inputs with f32 accumulation, f32 as plain f32), and the ops built on it: linear,
//! batched matmul and conv2d (im2col into scratch, then a GEMM per sample and chunk of output pixels).
//!
//! A weight stored in another type than the activations is cast to the activations' type first and the GEMM runs
//! in that type, as ComfyUI's `cast_bias_weight` does (`weight.to(input.dtype)`; a weight it converted at load
//! went to that type too): fp8 exactly, an f16 weight under bf16 activations (or the reverse) and an f32 weight
//! under 16-bit ones rounded to nearest even. A scaled or block-quantized weight is dequantized into that type.
//!
//! Problems are stated row-major, as the tensors are: `c[b] (M×N, row stride ldc) = a[b] (M×K) · op(b[b])`, with
//! `b` stored `[K, N]` or, transposed, `[N, K]`. cuBLASLt is column-major, so the call computes `cᵀ = op(b)ᵀ · aᵀ`:
//! its A operand is our `b`, its B operand our `a`, and m, n = N, M. Pointer alignments are passed to the algorithm
//! heuristic, so weights at any offset work. When cuBLASLt has no algorithm for a shape, a plain tiled kernel
//! (`gemm.cu`) computes it.

#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys as ltsys;

use super::Cuda;
use super::buf::Allocation;
use super::kernels::{Arg, Grid, KernelFile, dtype_code};
use crate::backend::{Conv2dParams, ConvGeometry, ConvTerm};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, Weight, numel};

/// cuBLASLt's workspace.
pub(crate) const WORKSPACE: u64 = 32 << 20;

/// Largest im2col scratch per chunk, in elements.
const IM2COL_CHUNK: usize = 64 << 20;

/// One GEMM, row-major (see the module docs). Leading dimensions and strides are in elements.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GemmArgs {
    /// What the product is for (`linear`, `conv2d`, …): its name in the [`super::profile`].
    pub(crate) op: &'static str,
    /// The type of `a` and `b`.
    pub(crate) dtype: DType,
    /// The type of `c`: `dtype`, or f32 for 16-bit operands whose f32 accumulation is kept (attention's scores).
    pub(crate) out: DType,
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) a: u64,
    pub(crate) lda: usize,
    pub(crate) b: u64,
    pub(crate) ldb: usize,
    pub(crate) b_transposed: bool,
    pub(crate) c: u64,
    pub(crate) ldc: usize,
    pub(crate) batch: usize,
    pub(crate) stride_a: usize,
    pub(crate) stride_b: usize,
    pub(crate) stride_c: usize,
    /// A vector of `n` values of `out`'s type to add to every row of `c` (16-byte aligned): by cuBLASLt's bias
    /// epilogue, to the f32 accumulation before its one rounding, as PyTorch's `addmm` does for a linear layer.
    /// [`Cuda::gemm`] says whether it was added (the fallback kernel leaves it to the caller).
    pub(crate) bias: Option<u64>,
    /// Whether the product is added to what `c` holds (in f32, rounded once into `c`) instead of replacing it.
    pub(crate) accumulate: bool,
}

/// A cuBLASLt handle, its workspace, and the algorithm its heuristic chose for each kind of problem.
pub(crate) struct Gemm {
    handle: Mutex<Handle>,
    workspace: Allocation,
    /// The heuristic's choice per [`AlgoKey`], or why it had none: asked once per kind of problem instead of at
    /// every call (tens of microseconds of host time each, thousands of GEMMs a step).
    algos: Mutex<HashMap<AlgoKey, std::result::Result<ltsys::cublasLtMatmulAlgo_t, String>>>,
}

/// Everything cuBLASLt's heuristic is told about a problem: its types, sizes, layouts and operand alignments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct AlgoKey {
    dtype: DType,
    out: DType,
    sizes: [usize; 4],
    leading: [usize; 3],
    strides: [usize; 3],
    b_transposed: bool,
    alignments: [u32; 4],
    bias: bool,
}

struct Handle(ltsys::cublasLtHandle_t);

// SAFETY: a cuBLASLt handle is not tied to the thread that created it; every use goes through the mutex, so it is
// never used from two threads at once.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `cublasLtCreate` and is destroyed once, here.
        let _ = unsafe { lt::destroy_handle(self.0) };
    }
}

/// RAII guards for cuBLASLt descriptors.
struct Layout(ltsys::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatrixLayoutCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matrix_layout(self.0) };
    }
}
struct Desc(ltsys::cublasLtMatmulDesc_t);
impl Desc {
    /// Sets `attr` to `value`: `T` must be the type cuBLASLt documents for the attribute (int32 for an operation,
    /// uint32 for an epilogue, a 64-bit device address for a pointer).
    fn set<T: Copy>(&self, attr: ltsys::cublasLtMatmulDescAttributes_t, value: &T) -> Result<()> {
        // SAFETY: the descriptor is alive and `value` points to size_of::<T>() readable bytes; cuBLASLt reads no
        // more than that and refuses a size that is not its attribute's.
        unsafe {
            lt::set_matmul_desc_attribute(self.0, attr, (value as *const T).cast(), size_of::<T>())
        }
        .map_err(|e| blas("cublasLtMatmulDescSetAttribute", e))
    }
}
impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulDescCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_desc(self.0) };
    }
}
struct Pref(ltsys::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by `cublasLtMatmulPreferenceCreate`, destroyed once.
        let _ = unsafe { lt::destroy_matmul_pref(self.0) };
    }
}

fn blas(call: &'static str, e: lt::CublasError) -> Error {
    Error::driver(call, format!("{e:?}"))
}

/// The largest power of two (at most 256) dividing every address a batched operand starts at.
fn alignment(ptr: u64, stride_bytes: u64, batch: usize) -> u32 {
    let bits = if batch > 1 { ptr | stride_bytes } else { ptr };
    if bits == 0 { 256 } else { (1u64 << bits.trailing_zeros().min(8)) as u32 }
}

impl Gemm {
    pub(crate) fn new(workspace: Allocation) -> Result<Gemm> {
        let handle = lt::create_handle().map_err(|e| blas("cublasLtCreate", e))?;
        Ok(Gemm { handle: Mutex::new(Handle(handle)), workspace, algos: Mutex::default() })
    }

    /// Queues the GEMM on cuBLASLt; an error means it queued nothing.
    fn cublaslt(&self, stream: &cudarc::driver::CudaStream, g: &GemmArgs) -> Result<()> {
        let data_type = |dtype: DType| match dtype {
            DType::F32 => Ok(ltsys::cudaDataType_t::CUDA_R_32F),
            DType::F16 => Ok(ltsys::cudaDataType_t::CUDA_R_16F),
            DType::BF16 => Ok(ltsys::cudaDataType_t::CUDA_R_16BF),
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 => {
                Err(Error::Unsupported(format!("a GEMM on {dtype} operands")))
            }
        };
        if g.out != g.dtype && g.out != DType::F32 {
            return Err(Error::Unsupported(format!(
                "a GEMM of {} operands into {}",
                g.dtype, g.out
            )));
        }
        let (ty, out_ty) = (data_type(g.dtype)?, data_type(g.out)?);
        let (esize, out_size) = (g.dtype.size() as u64, g.out.size() as u64);
        let layout = |ty, rows: usize, cols: usize, ld: usize, stride: usize| -> Result<Layout> {
            let l = Layout(
                lt::create_matrix_layout(ty, rows as u64, cols as u64, ld as i64)
                    .map_err(|e| blas("cublasLtMatrixLayoutCreate", e))?,
            );
            if g.batch > 1 {
                let count = g.batch as i32;
                let stride = stride as i64;
                // SAFETY: BATCH_COUNT takes an int32 and STRIDED_BATCH_OFFSET an int64, the types passed; the
                // layout is alive.
                unsafe {
                    lt::set_matrix_layout_attribute(
                        l.0,
                        ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                        (&count as *const i32).cast(),
                        size_of::<i32>(),
                    )
                    .map_err(|e| blas("cublasLtMatrixLayoutSetAttribute", e))?;
                    lt::set_matrix_layout_attribute(
                        l.0,
                        ltsys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&stride as *const i64).cast(),
                        size_of::<i64>(),
                    )
                    .map_err(|e| blas("cublasLtMatrixLayoutSetAttribute", e))?;
                }
            }
            Ok(l)
        };
        // cuBLASLt's A is our b: stored N×K column-major (our [K, N] row-major), or K×N when transposed.
        let (a_rows, a_cols) = if g.b_transposed { (g.k, g.n) } else { (g.n, g.k) };
        let a_layout = layout(ty, a_rows, a_cols, g.ldb, g.stride_b)?;
        let b_layout = layout(ty, g.k, g.m, g.lda, g.stride_a)?;
        let c_layout = layout(out_ty, g.n, g.m, g.ldc, g.stride_c)?;

        let desc = Desc(
            lt::create_matmul_desc(
                ltsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                ltsys::cudaDataType_t::CUDA_R_32F,
            )
            .map_err(|e| blas("cublasLtMatmulDescCreate", e))?,
        );
        use ltsys::cublasLtMatmulDescAttributes_t as Attr;
        // TRANSA and TRANSB take a cublasOperation_t (int32: 0 = N, 1 = T).
        desc.set(Attr::CUBLASLT_MATMUL_DESC_TRANSA, &i32::from(g.b_transposed))?;
        desc.set(Attr::CUBLASLT_MATMUL_DESC_TRANSB, &0i32)?;
        if let Some(bias) = g.bias {
            // EPILOGUE takes a uint32 (cublasLtEpilogue_t), BIAS_POINTER a device pointer (the caller keeps the
            // bias alive until the stream has run the GEMM).
            desc.set(
                Attr::CUBLASLT_MATMUL_DESC_EPILOGUE,
                &(ltsys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS as u32),
            )?;
            desc.set(Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias)?;
        }

        let alignments = [
            alignment(g.b, g.stride_b as u64 * esize, g.batch),
            alignment(g.a, g.stride_a as u64 * esize, g.batch),
            alignment(g.c, g.stride_c as u64 * out_size, g.batch),
            alignment(g.c, g.stride_c as u64 * out_size, g.batch),
        ];
        let key = AlgoKey {
            dtype: g.dtype,
            out: g.out,
            sizes: [g.m, g.n, g.k, g.batch],
            leading: [g.lda, g.ldb, g.ldc],
            strides: [g.stride_a, g.stride_b, g.stride_c],
            b_transposed: g.b_transposed,
            alignments,
            bias: g.bias.is_some(),
        };
        let handle = self.handle.lock().unwrap_or_else(|p| p.into_inner());
        let cached = self.algos.lock().unwrap_or_else(|p| p.into_inner()).get(&key).cloned();
        let algo = match cached {
            Some(choice) => choice,
            None => {
                // A decline is remembered too: the fallback runs that kind of GEMM without asking again.
                let choice = self
                    .heuristic(&handle, &desc, [&a_layout, &b_layout, &c_layout], alignments)
                    .map_err(|e| e.to_string());
                self.algos.lock().unwrap_or_else(|p| p.into_inner()).insert(key, choice.clone());
                choice
            }
        }
        .map_err(|why| Error::Unsupported(format!("cuBLASLt has no algorithm: {why}")))?;
        let alpha = 1.0f32;
        let beta = if g.accumulate { 1.0f32 } else { 0.0f32 };
        // SAFETY: the operand addresses hold the matrices the layouts describe (the caller checked the shapes and
        // keeps the buffers alive until the stream has run the GEMM; they are freed stream-ordered); alpha and
        // beta are f32 as the scale type says; the workspace is WORKSPACE bytes of device memory owned by `self`
        // and only used on this stream; C and D are the same matrix (read first where beta = 1).
        unsafe {
            lt::matmul(
                handle.0,
                desc.0,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                g.b as *const c_void,
                a_layout.0,
                g.a as *const c_void,
                b_layout.0,
                g.c as *const c_void,
                c_layout.0,
                g.c as *mut c_void,
                c_layout.0,
                &algo,
                self.workspace.ptr().0 as *mut c_void,
                WORKSPACE as usize,
                stream.cu_stream() as ltsys::cudaStream_t,
            )
        }
        .map_err(|e| blas("cublasLtMatmul", e))
    }

    /// The algorithm cuBLASLt's heuristic picks first for a GEMM of these descriptors (layouts A, B and C = D)
    /// within [`WORKSPACE`] bytes, at operand alignments A, B, C, D.
    fn heuristic(
        &self,
        handle: &Handle,
        desc: &Desc,
        [a, b, c]: [&Layout; 3],
        alignments: [u32; 4],
    ) -> Result<ltsys::cublasLtMatmulAlgo_t> {
        let pref =
            Pref(lt::create_matmul_pref().map_err(|e| blas("cublasLtMatmulPreferenceCreate", e))?);
        let workspace = WORKSPACE;
        let aligns = [
            ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
            ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
            ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
        ]
        .into_iter()
        .zip(alignments);
        // SAFETY: MAX_WORKSPACE_BYTES takes a uint64 and the MIN_ALIGNMENT attributes a uint32, the types passed;
        // the preference is alive.
        unsafe {
            lt::set_matmul_pref_attribute(
                pref.0,
                ltsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace as *const u64).cast(),
                size_of::<u64>(),
            )
            .map_err(|e| blas("cublasLtMatmulPreferenceSetAttribute", e))?;
            for (attr, value) in aligns {
                lt::set_matmul_pref_attribute(
                    pref.0,
                    attr,
                    (&value as *const u32).cast(),
                    size_of::<u32>(),
                )
                .map_err(|e| blas("cublasLtMatmulPreferenceSetAttribute", e))?;
            }
        }

        // SAFETY: every descriptor is alive and describes the operands of the GEMM it is asked for.
        let heuristic =
            unsafe { lt::get_matmul_algo_heuristic(handle.0, desc.0, a.0, b.0, c.0, c.0, pref.0) }
                .map_err(|e| blas("cublasLtMatmulAlgoGetHeuristic", e))?;
        Ok(heuristic.algo)
    }
}

/// The sizes of `x · Wᵀ`: m rows of k inputs, n outputs, and the output's shape.
pub(crate) struct LinearShape {
    pub(crate) m: usize,
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) out: Vec<usize>,
}

/// Checks `x`, `w` and `bias` of a linear layer against each other.
pub(crate) fn linear_shape(
    x: &Tensor<Cuda>,
    w: &Weight<'_>,
    bias: Option<&Weight<'_>>,
) -> Result<LinearShape> {
    let (n, k) = w.matrix("linear")?;
    let xk = *x.shape().last().ok_or_else(|| Error::shape("linear", "x has rank 0"))?;
    if xk != k {
        return Err(Error::shape(
            "linear",
            format!("x {:?} against weight {:?}", x.shape(), w.shape()),
        ));
    }
    if let Some(b) = bias
        && b.numel() != n
    {
        return Err(Error::shape("linear", format!("bias {:?} for {n} outputs", b.shape())));
    }
    let mut out = x.shape().to_vec();
    *out.last_mut().unwrap_or(&mut 0) = n;
    Ok(LinearShape { m: x.numel() / k.max(1), n, k, out })
}

impl Cuda {
    /// Queues one GEMM: cuBLASLt, or the fallback kernel where cuBLASLt has no algorithm. Whether `g.bias` was
    /// added (only by cuBLASLt's epilogue).
    pub(crate) fn gemm(&self, g: &GemmArgs) -> Result<bool> {
        if g.m == 0 || g.n == 0 || g.batch == 0 {
            return Ok(false);
        }
        let flops = 2.0 * (g.m * g.n * g.k * g.batch) as f64;
        let name = || {
            let out = if g.out == g.dtype { String::new() } else { format!(" → {}", g.out) };
            format!("gemm {} {}{out}", g.op, g.dtype)
        };
        super::profile::timed(self.stream(), name, flops, || self.gemm_now(g))
    }

    fn gemm_now(&self, g: &GemmArgs) -> Result<bool> {
        if g.k > 0 {
            match self.gemm.cublaslt(self.stream(), g) {
                Ok(()) => return Ok(g.bias.is_some()),
                Err(e) => {
                    tracing::debug!(error = %e, m = g.m, n = g.n, k = g.k, "cuBLASLt declined; fallback GEMM")
                }
            }
        }
        let dt = dtype_code(g.dtype);
        let (sb_r, sb_c) = if g.b_transposed { (1, g.ldb) } else { (g.ldb, 1) };
        let grid = Grid {
            grid: (g.n.div_ceil(16) as u32, g.m.div_ceil(16) as u32, g.batch as u32),
            block: (16, 16, 1),
            shared: 0,
        };
        // Not `self.launch`: the profile times the fallback as this GEMM.
        self.kernels.launch(
            self.stream(),
            KernelFile::Gemm,
            "gemm_fallback",
            grid,
            &[
                Arg::Ptr(g.a),
                Arg::I32(dt),
                Arg::Ptr(g.b),
                Arg::I32(dt),
                Arg::Ptr(g.c),
                Arg::I32(dtype_code(g.out)),
                Arg::n(g.m),
                Arg::n(g.n),
                Arg::n(g.k),
                Arg::n(g.stride_a),
                Arg::n(g.lda),
                Arg::I64(1),
                Arg::n(g.stride_b),
                Arg::n(sb_r),
                Arg::n(sb_c),
                Arg::n(g.stride_c),
                Arg::n(g.ldc),
                Arg::I32(i32::from(g.accumulate)),
            ],
        )?;
        Ok(false)
    }

    pub(crate) fn op_linear(
        &self,
        x: &Tensor<Cuda>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
    ) -> Result<Tensor<Cuda>> {
        if matches!(w.quant(), crate::quant::Quant::Int8 { activations: true, .. }) {
            // ComfyUI runs int8 weights with int8 activations on every device.
            return self.op_linear_int8(x, w, bias);
        }
        let dtype = Self::compute_type("linear", x.dtype())?;
        let LinearShape { m, n, k, out: shape } = linear_shape(x, w, bias)?;
        let out = self.empty(shape, dtype)?;
        let (wptr, _scratch) = self.weight_as(w, dtype)?;
        // The bias in the compute type (as ComfyUI casts it) goes into the GEMM's epilogue where it is aligned.
        let fused = match bias {
            Some(b) if k > 0 => {
                b.require_unscaled("linear")?;
                let (ptr, scratch) = self.weight_as(b, dtype)?;
                (ptr % 16 == 0).then_some((ptr, scratch))
            }
            _ => None,
        };
        let added = if k == 0 {
            self.fill_ptr(out.buf().ptr().0, dtype, out.numel(), 0.0)?;
            false
        } else {
            self.gemm(&GemmArgs {
                op: "linear",
                dtype,
                out: dtype,
                m,
                n,
                k,
                a: x.buf().ptr().0,
                lda: k,
                b: wptr,
                ldb: k,
                b_transposed: true,
                c: out.buf().ptr().0,
                ldc: n,
                batch: 1,
                stride_a: 0,
                stride_b: 0,
                stride_c: 0,
                bias: fused.as_ref().map(|(ptr, _)| *ptr),
                accumulate: false,
            })?
        };
        if let Some(b) = bias
            && !added
        {
            self.bias_add(&out, b, n, 1)?;
        }
        Ok(out)
    }

    pub(crate) fn op_matmul(
        &self,
        a: &Tensor<Cuda>,
        b: &Tensor<Cuda>,
        transpose_b: bool,
    ) -> Result<Tensor<Cuda>> {
        let dtype = Self::compute_type("matmul", a.dtype())?;
        let (ra, rb) = (a.shape().len(), b.shape().len());
        if ra < 2 || ra != rb || a.shape()[..ra - 2] != b.shape()[..rb - 2] {
            return Err(Error::shape("matmul", format!("{:?} · {:?}", a.shape(), b.shape())));
        }
        let (m, k) = (a.shape()[ra - 2], a.shape()[ra - 1]);
        let (bk, n) = if transpose_b {
            (b.shape()[rb - 1], b.shape()[rb - 2])
        } else {
            (b.shape()[rb - 2], b.shape()[rb - 1])
        };
        if bk != k {
            return Err(Error::shape(
                "matmul",
                format!("{:?} · {:?} (transpose_b {transpose_b})", a.shape(), b.shape()),
            ));
        }
        let batch = numel(&a.shape()[..ra - 2]);
        let b = self.op_cast(b, dtype)?;
        let mut shape = a.shape()[..ra - 2].to_vec();
        shape.extend([m, n]);
        let out = self.empty(shape, dtype)?;
        if k == 0 {
            self.fill_ptr(out.buf().ptr().0, dtype, out.numel(), 0.0)?;
            return Ok(out);
        }
        self.gemm(&GemmArgs {
            op: "matmul",
            dtype,
            out: dtype,
            m,
            n,
            k,
            a: a.buf().ptr().0,
            lda: k,
            b: b.buf().ptr().0,
            ldb: if transpose_b { k } else { n },
            b_transposed: transpose_b,
            c: out.buf().ptr().0,
            ldc: n,
            batch,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
            bias: None,
            accumulate: false,
        })?;
        Ok(out)
    }

    pub(crate) fn op_conv2d(
        &self,
        x: &Tensor<Cuda>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
    ) -> Result<Tensor<Cuda>> {
        let batch = x.shape().first().copied().unwrap_or(0);
        self.conv2d_terms("conv2d", &[ConvTerm::whole(x, w, 0)], bias, params, batch)
    }

    pub(crate) fn op_conv2d_sum(
        &self,
        terms: &[ConvTerm<'_, Cuda>],
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
        batch: usize,
    ) -> Result<Tensor<Cuda>> {
        ConvTerm::check_sum("conv2d_sum", terms, batch)?;
        self.conv2d_terms("conv2d_sum", terms, bias, params, batch)
    }

    /// `[batch, O, H', W']`: each term's convolution added into its samples (the first written where it covers
    /// the batch, the output zeroed first where it does not), then the bias. The terms are one `whole` term or
    /// passed [`ConvTerm::check_sum`].
    fn conv2d_terms(
        &self,
        op: &'static str,
        terms: &[ConvTerm<'_, Cuda>],
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
        batch: usize,
    ) -> Result<Tensor<Cuda>> {
        let [first, ..] = terms else {
            return Err(Error::shape(op, "no convolution to sum"));
        };
        let dtype = Self::compute_type(op, first.x.dtype())?;
        let g0 = ConvGeometry::of(op, first.x.shape(), first.w.shape(), params)?;
        if let Some(b) = bias
            && b.numel() != g0.o
        {
            return Err(Error::shape(op, format!("bias {:?} for {} channels", b.shape(), g0.o)));
        }
        let out = self.empty(vec![batch, g0.o, g0.oh, g0.ow], dtype)?;
        let sample = (g0.o * g0.oh * g0.ow * dtype.size()) as u64;
        let covers = first.at == 0 && first.n == batch;
        if !covers {
            self.fill_ptr(out.buf().ptr().0, dtype, out.numel(), 0.0)?;
        }
        for (i, t) in terms.iter().enumerate() {
            if t.x.dtype() != dtype {
                return Err(Error::shape(
                    op,
                    format!("a {} term beside {dtype} ones", t.x.dtype()),
                ));
            }
            // Samples `from..from + n` of x (inside it: `check_sum`, or a `whole` term): a view at their offset.
            // Every term has the first's channels, sides and kernel shape, so its geometry is the first's.
            let x = t.x.buf().ptr().0 + (t.from * g0.c * g0.h * g0.w * dtype.size()) as u64;
            let (wptr, _scratch) = self.weight_as(t.w, dtype)?;
            let y = out.buf().ptr().0 + t.at as u64 * sample;
            self.conv2d_into(&g0, t.n, dtype, [x, wptr, y], !covers || i > 0)?;
        }
        if let Some(bw) = bias {
            self.bias_add(&out, bw, g0.o, g0.oh * g0.ow)?;
        }
        Ok(out)
    }

    /// Queues `y = conv(x, w)` (with `accumulate`, `y += conv(x, w)`: the f32 products added to y's values,
    /// rounded once) for the `[x, w, y]` addresses of `n` samples of a problem `g` in `dtype`.
    fn conv2d_into(
        &self,
        g: &ConvGeometry,
        n: usize,
        dtype: DType,
        [x, w, y]: [u64; 3],
        accumulate: bool,
    ) -> Result<()> {
        let (pixels, ckk, esize) = (g.oh * g.ow, g.c * g.kh * g.kw, dtype.size());
        let [pt, pb, pl, pr] = g.pad;
        let sample = |at: usize, size: usize| (at * size * esize) as u64;
        if g.kh == 1 && g.kw == 1 && g.stride == 1 && g.pad == [0; 4] {
            // A 1×1 convolution reads x [C, H·W] as it is: one GEMM per sample, no column buffer.
            for b in 0..n {
                self.gemm(&GemmArgs {
                    op: "conv2d 1x1",
                    dtype,
                    out: dtype,
                    m: g.o,
                    n: pixels,
                    k: g.c,
                    a: w,
                    lda: g.c,
                    b: x + sample(b, g.c * pixels),
                    ldb: pixels,
                    b_transposed: false,
                    c: y + sample(b, g.o * pixels),
                    ldc: pixels,
                    batch: 1,
                    stride_a: 0,
                    stride_b: 0,
                    stride_c: 0,
                    bias: None,
                    accumulate,
                })?;
            }
            return Ok(());
        }
        if pt == pb && pl == pr && self.conv_on_cudnn(g, n, dtype, [x, w, y], accumulate)? {
            return Ok(());
        }
        // im2col and a GEMM, chunk by chunk of output pixels (cuDNN absent or declining).
        // A multiple of 8 pixels, so every full chunk's column rows and every chunk's output columns start
        // 16-byte aligned for cuBLASLt's vectorised kernels (a last, partial chunk's rows may not).
        let chunk = ((IM2COL_CHUNK / ckk.max(1)) / 8 * 8).max(8).min(pixels.max(1));
        let col = self.alloc((ckk * chunk * esize) as u64)?;
        for b in 0..n {
            let xb = x + sample(b, g.c * g.h * g.w);
            let ob = y + sample(b, g.o * pixels);
            let mut p0 = 0;
            while p0 < pixels {
                let np = chunk.min(pixels - p0);
                self.launch(
                    KernelFile::Conv,
                    "im2col",
                    Grid {
                        grid: (np.div_ceil(256).min(65_535) as u32, ckk.min(65_535) as u32, 1),
                        block: (256, 1, 1),
                        shared: 0,
                    },
                    &[
                        Arg::Ptr(xb),
                        Arg::Ptr(col.ptr().0),
                        Arg::n(g.c),
                        Arg::n(g.h),
                        Arg::n(g.w),
                        Arg::n(g.kh),
                        Arg::n(g.kw),
                        Arg::n(g.stride),
                        Arg::n(pt),
                        Arg::n(pl),
                        Arg::n(g.ow),
                        Arg::n(p0),
                        Arg::n(np),
                        Arg::I32(esize as i32),
                    ],
                )?;
                // out_b[:, p0 .. p0 + np] (row stride H'·W') = w [O, C·kh·kw] · col [C·kh·kw, np].
                self.gemm(&GemmArgs {
                    op: "conv2d",
                    dtype,
                    out: dtype,
                    m: g.o,
                    n: np,
                    k: ckk,
                    a: w,
                    lda: ckk,
                    b: col.ptr().0,
                    ldb: np,
                    b_transposed: false,
                    c: ob + (p0 * esize) as u64,
                    ldc: pixels,
                    batch: 1,
                    stride_a: 0,
                    stride_b: 0,
                    stride_c: 0,
                    bias: None,
                    accumulate,
                })?;
                p0 += np;
            }
        }
        Ok(())
    }

    /// `y (+)= conv(x, w)` on cuDNN (see cudnn/conv.rs), the padding symmetric: whether it ran; `false` (nothing
    /// queued) where cuDNN is absent or declines the problem.
    fn conv_on_cudnn(
        &self,
        g: &ConvGeometry,
        n: usize,
        dtype: DType,
        [x, w, y]: [u64; 3],
        accumulate: bool,
    ) -> Result<bool> {
        let Some(convolutions) =
            self.convolutions.get_or_init(|| super::cudnn::Convolutions::open(self.stream()))
        else {
            return Ok(false);
        };
        let shape = super::cudnn::ConvShape {
            dtype,
            batch: n,
            channels: g.c,
            height: g.h,
            width: g.w,
            out_channels: g.o,
            kernel: [g.kh, g.kw],
            pad: [g.pad[0], g.pad[2]],
            stride: g.stride,
        };
        // cuDNN runs on the CUDA runtime, which uses the context current on this thread.
        self.stream()
            .context()
            .bind_to_thread()
            .map_err(|e| super::memory::drv("cuCtxSetCurrent", e))?;
        let flops = 2.0 * (n * g.o * g.oh * g.ow * g.c * g.kh * g.kw) as f64;
        let name = || format!("cudnn conv2d {dtype}");
        let ran = super::profile::timed(self.stream(), name, flops, || {
            convolutions.forward(&shape, [x, w, y], accumulate, |bytes| self.alloc(bytes))
        });
        match ran {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::debug!(error = %e, ?shape, "cuDNN declined; im2col and GEMM");
                Ok(false)
            }
        }
    }

    /// In place: `out[i] += bias[(i / inner) % channels]`.
    pub(crate) fn bias_add(
        &self,
        out: &Tensor<Cuda>,
        bias: &Weight<'_>,
        channels: usize,
        inner: usize,
    ) -> Result<()> {
        bias.require_unscaled("bias_add")?;
        self.launch(
            KernelFile::Elementwise,
            "bias_add",
            Grid::linear(out.numel()),
            &[
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(out.dtype())),
                Arg::Ptr(bias.ptr().0),
                Arg::I32(dtype_code(bias.dtype())),
                Arg::n(out.numel()),
                Arg::n(channels),
                Arg::n(inner.max(1)),
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::alignment;

    #[test]
    fn alignment_is_the_largest_power_of_two_up_to_256() {
        assert_eq!(alignment(0x1000, 0, 1), 256);
        assert_eq!(alignment(0x1002, 0, 1), 2);
        assert_eq!(alignment(0x1010, 0, 1), 16);
        assert_eq!(alignment(0x1000, 6, 2), 2, "batch strides count");
        assert_eq!(alignment(0x1000, 6, 1), 256, "a single matrix ignores the stride");
    }
}
