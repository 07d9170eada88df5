//! The CPU backend: f32 compute, linears on AVX-512 or AVX2 micro-kernels where the CPU has them (bf16 × bf16
//! with AVX512-BF16), convolutions on AVX-512's or AVX2's strided products, attention and matmul on AVX-512's or
//! else the `gemm` crate's, rayon for the rest; device memory simulated by [`SimDevice`].
//!
//! Tensors are [`CpuBuf`]s holding f32, f16 or bf16 elements; every op widens its inputs to f32, computes in
//! f32 and rounds its result to the output dtype. Weights stay in the simulated device in their stored dtype
//! and are widened each time an op reads them. Ops run synchronously on the calling thread and the rayon pool.
//!
//! One module per op family: `storage` (buffers and dtype conversion), `weights` (reading weights), `gemm`
//! (the checked GEMM front), `packed_gemm` (packed products with AVX-512 micro-kernels), `avx2` (their AVX2
//! forms) and `avx2_product` (the strided product blocked for AVX2 CPUs), `skinny` (products of few rows without packing), `linear`, `attention`, `norm`,
//! `elementwise`, `quant` (the row and block formats of quantized weights), `rope`, `conv`, `image`, `layout` and `store`; `simd` holds the vectorised inner loops.

mod attention;
mod avx2;
mod avx2_product;
mod conv;
mod elementwise;
mod gemm;
mod image;
mod int8_dots;
mod layout;
mod linear;
mod norm;
mod packed_gemm;
mod quant;
mod rope;
mod simd;
mod skinny;
mod storage;
pub(crate) mod store;
mod weights;
pub mod work;

use std::sync::{Arc, RwLock};

pub use self::storage::CpuBuf;
use self::storage::{compute_dtype, read_f32, tensor_from_f32};
use crate::backend::{
    AttentionMask, Backend, BinaryOp, Conv2dParams, ConvTerm, DeviceInfo, PadMode, RopeLayout,
    UnaryOp,
};
use crate::dtype::DType;
use crate::error::Result;
use crate::memory::device::DeviceAllocator;
use crate::memory::{DevPtr, DeviceMemory, SimDevice};
use crate::quant::Quant;
use crate::tensor::{OwnedWeight, Tensor, Weight, numel};

/// The CPU backend. It computes every op in f32 with the weights' exact values; activations are stored in its
/// compute type (f32 unless made by [`Backend::with_compute_dtype`], whose views round each op's output to f16
/// or bf16 as a GPU's would be; unlike CUDA's GEMMs, they do not round a weight of another type to it first).
pub struct Cpu {
    sim: Arc<SimDevice>,
    memory: Arc<dyn DeviceMemory>,
    /// The memory manager's arbiter once [`Backend::set_allocator`] gives it (activations stay in host RAM; the
    /// device memory models derive goes through it), shared by every view of the device.
    allocator: Arc<RwLock<Option<Arc<dyn DeviceAllocator>>>>,
    dtype: DType,
}

impl Cpu {
    /// A CPU backend whose simulated device memory holds `capacity` bytes; weight files are read where they
    /// lie ([`SimDevice::reading_files_in_place`]).
    pub fn new(capacity: u64) -> Cpu {
        let sim = Arc::new(SimDevice::reading_files_in_place(capacity));
        let memory: Arc<dyn DeviceMemory> = sim.clone();
        Cpu { sim, memory, allocator: Arc::default(), dtype: DType::F32 }
    }

    /// A CPU backend whose simulated device behaves as a GPU's: weights are copied into it (resident, pinned
    /// or streamed) rather than read where they lie in their files. The memory manager's tests run its GPU
    /// policies on it.
    pub fn simulating_gpu(capacity: u64) -> Cpu {
        let sim = Arc::new(SimDevice::new(capacity));
        let memory: Arc<dyn DeviceMemory> = sim.clone();
        Cpu { sim, memory, allocator: Arc::default(), dtype: DType::F32 }
    }

    /// The simulated device memory (for tests that inspect it).
    pub fn sim(&self) -> &Arc<SimDevice> {
        &self.sim
    }
}

impl Backend for Cpu {
    type Buf = CpuBuf;

    fn info(&self) -> DeviceInfo {
        let total_memory = self.memory.mem_info().map(|m| m.total).unwrap_or(0);
        DeviceInfo { kind: "cpu", index: 0, name: "cpu".to_owned(), total_memory }
    }

    fn memory(&self) -> &Arc<dyn DeviceMemory> {
        &self.memory
    }

    fn compute_dtype(&self) -> DType {
        self.dtype
    }

    fn set_allocator(&self, allocator: Arc<dyn DeviceAllocator>) {
        *self.allocator.write().unwrap_or_else(|p| p.into_inner()) = Some(allocator);
    }

    fn device_allocator(&self) -> Option<Arc<dyn DeviceAllocator>> {
        self.allocator.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn with_compute_dtype(&self, dtype: DType) -> Result<Cpu> {
        compute_dtype("with_compute_dtype", dtype)?;
        Ok(Cpu {
            sim: self.sim.clone(),
            memory: self.memory.clone(),
            allocator: self.allocator.clone(),
            dtype,
        })
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn from_f32(&self, shape: &[usize], values: &[f32], dtype: DType) -> Result<Tensor<Self>> {
        tensor_from_f32(shape.to_vec(), values.to_vec(), dtype, "from_f32")
    }

    fn to_f32(&self, x: &Tensor<Self>) -> Result<Vec<f32>> {
        Ok(read_f32(x, "to_f32")?.into_owned())
    }

    fn full(&self, shape: &[usize], value: f32, dtype: DType) -> Result<Tensor<Self>> {
        compute_dtype("full", dtype)?;
        tensor_from_f32(shape.to_vec(), vec![value; numel(shape)], dtype, "full")
    }

    fn weight_to_tensor(&self, w: &Weight<'_>, dtype: DType) -> Result<Tensor<Self>> {
        compute_dtype("weight_to_tensor", dtype)?;
        // NVFP4 packs two values a byte: the values' shape is the matrix, not the stored bytes'.
        let shape = match w.quant() {
            Quant::Nvfp4 { .. } => {
                let (rows, cols) = w.matrix("weight_to_tensor")?;
                vec![rows, cols]
            }
            _ => w.shape().to_vec(),
        };
        tensor_from_f32(shape, weights::widen(&self.sim, w)?, dtype, "weight_to_tensor")
    }

    fn causal_taps(&self, w: &Weight<'_>, first: usize, dtype: DType) -> Result<OwnedWeight> {
        weights::causal_taps(self, w, first, dtype)
    }

    fn cast(&self, x: &Tensor<Self>, dtype: DType) -> Result<Tensor<Self>> {
        storage::cast(x, dtype)
    }

    fn store(&self, x: &Tensor<Self>, dst: DevPtr, dtype: DType, seed: Option<u64>) -> Result<()> {
        store::store(self, x, dst, dtype, seed)
    }

    fn linear(
        &self,
        x: &Tensor<Self>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
    ) -> Result<Tensor<Self>> {
        let out = linear::linear(self, x, w, bias)?;
        let k = x.shape().last().copied().unwrap_or(0);
        work::count(2 * numel(out.shape()) * k, w.bytes());
        Ok(out)
    }

    fn matmul(
        &self,
        a: &Tensor<Self>,
        b: &Tensor<Self>,
        transpose_b: bool,
    ) -> Result<Tensor<Self>> {
        let out = linear::matmul(a, b, transpose_b)?;
        let k = a.shape().last().copied().unwrap_or(0);
        work::count(2 * numel(out.shape()) * k, 0);
        Ok(out)
    }

    fn embedding(&self, ids: &[u32], table: &Weight<'_>) -> Result<Tensor<Self>> {
        linear::embedding(self, ids, table)
    }

    fn rms_norm(&self, x: &Tensor<Self>, w: Option<&Weight<'_>>, eps: f32) -> Result<Tensor<Self>> {
        norm::rms_norm(self, x, w, eps)
    }

    fn channel_rms_norm(
        &self,
        x: &Tensor<Self>,
        w: Option<&Weight<'_>>,
        eps: f32,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<Self>> {
        norm::channel_rms_norm(self, x, w, eps, act)
    }

    fn layer_norm(
        &self,
        x: &Tensor<Self>,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Self>> {
        norm::layer_norm(self, x, w, b, eps)
    }

    fn group_norm(
        &self,
        x: &Tensor<Self>,
        groups: usize,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Self>> {
        norm::group_norm(self, x, groups, w, b, eps)
    }

    fn softmax(&self, x: &Tensor<Self>) -> Result<Tensor<Self>> {
        norm::softmax(x)
    }

    fn attention(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<Tensor<Self>> {
        let out = attention::attention(q, k, v, mask, scale)?;
        // Scores q·kᵀ and their product with v, over every (query, key) pair.
        let nk = k.shape()[2];
        work::count(2 * (numel(q.shape()) + numel(out.shape())) * nk, 0);
        Ok(out)
    }

    fn rope(
        &self,
        x: &Tensor<Self>,
        cos: &Tensor<Self>,
        sin: &Tensor<Self>,
        layout: RopeLayout,
    ) -> Result<Tensor<Self>> {
        rope::rope(x, cos, sin, layout)
    }

    fn unary(&self, x: &Tensor<Self>, op: UnaryOp) -> Result<Tensor<Self>> {
        elementwise::unary(x, op)
    }

    fn binary(&self, a: &Tensor<Self>, b: &Tensor<Self>, op: BinaryOp) -> Result<Tensor<Self>> {
        elementwise::binary(a, b, op)
    }

    fn affine(&self, x: &Tensor<Self>, mul: f32, add: f32) -> Result<Tensor<Self>> {
        elementwise::affine(x, mul, add)
    }

    fn gated(&self, gate: &Tensor<Self>, up: &Tensor<Self>, act: UnaryOp) -> Result<Tensor<Self>> {
        elementwise::gated(gate, up, act)
    }

    fn modulate(
        &self,
        x: &Tensor<Self>,
        scale: &Tensor<Self>,
        shift: Option<&Tensor<Self>>,
    ) -> Result<Tensor<Self>> {
        elementwise::modulate(x, scale, shift)
    }

    fn conv2d(
        &self,
        x: &Tensor<Self>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
    ) -> Result<Tensor<Self>> {
        let out = conv::conv2d(self, x, w, bias, params)?;
        // Each output element sums C_in × kh × kw products: the weight's elements per output channel.
        let per_output = w.shape().get(1..).map(numel).unwrap_or(0);
        work::count(2 * numel(out.shape()) * per_output, w.bytes());
        Ok(out)
    }

    fn conv2d_sum(
        &self,
        terms: &[ConvTerm<'_, Self>],
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
        batch: usize,
    ) -> Result<Tensor<Self>> {
        let out = conv::conv2d_sum(self, terms, bias, params, batch)?;
        let [_, _, oh, ow] = *out.shape() else { return Ok(out) };
        for t in terms {
            // A term's outputs: its samples' planes, each summing C_in × kh × kw products.
            let outputs = t.n * t.w.shape()[0] * oh * ow;
            work::count(2 * outputs * numel(&t.w.shape()[1..]), t.w.bytes());
        }
        Ok(out)
    }

    fn upsample_nearest2x(&self, x: &Tensor<Self>) -> Result<Tensor<Self>> {
        image::upsample_nearest2x(x)
    }

    fn patchify(&self, x: &Tensor<Self>, p: usize) -> Result<Tensor<Self>> {
        image::patchify(x, p)
    }

    fn unpatchify(
        &self,
        x: &Tensor<Self>,
        p: usize,
        channels: usize,
        h: usize,
        w: usize,
    ) -> Result<Tensor<Self>> {
        image::unpatchify(x, p, channels, h, w)
    }

    fn concat(&self, xs: &[&Tensor<Self>], dim: isize) -> Result<Tensor<Self>> {
        layout::concat(xs, dim)
    }

    fn slice(
        &self,
        x: &Tensor<Self>,
        dim: isize,
        start: usize,
        len: usize,
    ) -> Result<Tensor<Self>> {
        layout::slice(x, dim, start, len)
    }

    fn pad(
        &self,
        x: &Tensor<Self>,
        dim: isize,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Result<Tensor<Self>> {
        layout::pad(x, dim, before, after, mode)
    }

    fn permute(&self, x: &Tensor<Self>, perm: &[usize]) -> Result<Tensor<Self>> {
        layout::permute(x, perm)
    }
}
