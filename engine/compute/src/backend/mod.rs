//! The [`Backend`] trait: every op a model family needs, on two implementations.
//!
//! - [`cpu::Cpu`], always built: f32 compute (weights of any stored type are widened per layer), GEMM with the
//!   `gemm` crate, rayon for the rest. Its device memory is [`crate::memory::SimDevice`], a simulation with the
//!   page and budget semantics of a GPU, so the memory manager's policies run in CI.
//! - `cuda::Cuda` (feature `cuda`): cudarc with dynamic loading; cuBLASLt for GEMM, every other op a CUDA C
//!   kernel compiled at run time by NVRTC.
//!
//! Conventions shared by every op:
//! - Tensors are dense and row-major. Activations are in a compute type (f32, f16, bf16); an op's output has the
//!   dtype of its first tensor input unless stated. Backends compute internally in f32 (accumulators, norms,
//!   softmax) whatever the storage type.
//! - Weights ([`Weight`]) are in their stored type (any [`DType`], fp8 included) and use torch's layouts: a
//!   linear weight is `[out, in]`, a conv weight `[out, in, kh, kw]`.
//! - Shape errors are [`crate::Error::Shape`] naming the op; nothing panics on a bad shape.
//!
//! Model code is generic over `B: Backend`; [`crate::select`] picks the backend at run time.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use std::sync::Arc;

use crate::dtype::DType;
use crate::error::Result;
use crate::memory::DeviceMemory;
use crate::tensor::{Tensor, Weight};

/// Elementwise functions of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// x·sigmoid(x).
    Silu,
    /// GELU with erf (torch's default `approximate="none"`).
    Gelu,
    /// GELU with the tanh approximation (`approximate="tanh"`).
    GeluTanh,
    /// tanh(x).
    Tanh,
    /// sigmoid(x).
    Sigmoid,
    /// exp(x).
    Exp,
    /// -x.
    Neg,
    /// max(x, 0).
    Relu,
    /// x with NaN as 0 and ±∞ as ± the largest finite value of x's dtype (torch's `nan_to_num` defaults; what
    /// ComfyUI's FLUX blocks apply to f16 activations, with ±65504).
    NanToNum,
}

/// Elementwise functions of two tensors, with numpy broadcasting (shapes aligned from the right; a dimension
/// of 1, or a missing one, repeats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b.
    Add,
    /// a − b.
    Sub,
    /// a · b.
    Mul,
    /// a / b.
    Div,
}

/// Which keys a query may attend to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionMask {
    /// Every query attends to every key (a DiT's joint sequence, a VAE's mid-block).
    None,
    /// Query i attends to keys 0..=i + (Nk − Nq) (a decoder; with Nq = Nk the usual lower triangle).
    Causal,
}

/// How RoPE pairs the features of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs (2m, 2m+1), rotated by angle m (NextDiT, Flux).
    Interleaved,
    /// Pairs (m, m + D/2), "rotate_half" (Llama, Qwen3).
    Half,
}

/// Padding at the edges of a dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PadMode {
    /// Fill with a constant.
    Constant(f32),
    /// Wrap around (torch `mode="circular"`).
    Circular,
    /// Repeat the edge value (torch `mode="replicate"`).
    Replicate,
}

/// Geometry of a 2-D convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Stride (same in both directions).
    pub stride: usize,
    /// Zero padding: top, bottom, left, right (a VAE encoder's downsample pads only bottom and right).
    pub padding: [usize; 4],
}

impl Conv2dParams {
    /// Stride 1 and `p` zeros on every side (a 3×3 "same" conv has `p = 1`).
    pub fn same(p: usize) -> Conv2dParams {
        Conv2dParams { stride: 1, padding: [p; 4] }
    }
}

/// One term of [`Backend::conv2d_sum`]: the 2-D convolution of `n` samples of `x` `[N, C, H, W]` from sample
/// `from` (no copy of them) with `w` `[O, C, kh, kw]`, added to output samples `at..at + n`.
#[derive(Clone, Copy)]
pub struct ConvTerm<'a, B: Backend> {
    /// The input.
    pub x: &'a Tensor<B>,
    /// The first sample of `x` read.
    pub from: usize,
    /// How many samples are read (and written).
    pub n: usize,
    /// The kernel.
    pub w: &'a Weight<'a>,
    /// The first output sample this term adds to.
    pub at: usize,
}

impl<'a, B: Backend> ConvTerm<'a, B> {
    /// Every sample of `x`, added from output sample `at`.
    pub fn whole(x: &'a Tensor<B>, w: &'a Weight<'a>, at: usize) -> ConvTerm<'a, B> {
        ConvTerm { x, from: 0, n: x.shape().first().copied().unwrap_or(0), w, at }
    }

    /// Checks that `terms` can sum into one output of `batch` samples: at least one, every input `[N, C, H, W]`
    /// with the first's C, H and W, every kernel the first's shape, each term's samples inside its input and
    /// inside the batch.
    pub(crate) fn check_sum(
        op: &'static str,
        terms: &[ConvTerm<'_, B>],
        batch: usize,
    ) -> Result<()> {
        let Some(first) = terms.first() else {
            return Err(crate::Error::shape(op, "no convolution to sum"));
        };
        let (x0, w0) = (first.x.shape(), first.w.shape());
        for t in terms {
            let x = t.x.shape();
            let fits = x.len() == 4
                && x0.len() == 4
                && x[1..] == x0[1..]
                && t.from + t.n <= x[0]
                && t.at + t.n <= batch;
            if !fits || t.w.shape() != w0 {
                return Err(crate::Error::shape(
                    op,
                    format!(
                        "a term of samples {}..{} of x {x:?} with kernel {:?} into samples from {}, beside x \
                         {x0:?} and kernel {w0:?}, in a batch of {batch}",
                        t.from,
                        t.from + t.n,
                        t.w.shape(),
                        t.at
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The geometry of one 2-D convolution of each sample: input `[c, h, w]`, kernel `[o, c, kh, kw]`, zero padding
/// (top, bottom, left, right), stride, and the output's sides `oh`, `ow`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConvGeometry {
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) o: usize,
    pub(crate) kh: usize,
    pub(crate) kw: usize,
    pub(crate) pad: [usize; 4],
    pub(crate) stride: usize,
    pub(crate) oh: usize,
    pub(crate) ow: usize,
}

impl ConvGeometry {
    /// The geometry of an input of shape `x` convolved with a kernel of shape `w`, or a shape error naming `op`.
    pub(crate) fn of(
        op: &'static str,
        x: &[usize],
        w: &[usize],
        params: Conv2dParams,
    ) -> Result<ConvGeometry> {
        let &[_, c, h, wd] = x else {
            return Err(crate::Error::shape(op, format!("x must be [B, C, H, W], got {x:?}")));
        };
        let &[o, wc, kh, kw] = w else {
            return Err(crate::Error::shape(
                op,
                format!("weight must be [O, C, kh, kw], got {w:?}"),
            ));
        };
        if wc != c {
            return Err(crate::Error::shape(
                op,
                format!("x {x:?} has {c} channels, weight {w:?} takes {wc}"),
            ));
        }
        let [top, bottom, left, right] = params.padding;
        let (hp, wp) = (h + top + bottom, wd + left + right);
        let stride = params.stride;
        if stride == 0 || kh == 0 || kw == 0 || hp < kh || wp < kw {
            return Err(crate::Error::shape(
                op,
                format!("kernel {kh}×{kw}, stride {stride} on a padded {hp}×{wp} input"),
            ));
        }
        let (oh, ow) = ((hp - kh) / stride + 1, (wp - kw) / stride + 1);
        Ok(ConvGeometry { c, h, w: wd, o, kh, kw, pad: params.padding, stride, oh, ow })
    }
}

/// What a device is, for logs and `/system_stats`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `"cpu"` or `"cuda"`.
    pub kind: &'static str,
    /// Ordinal (0 for the CPU).
    pub index: usize,
    /// Human-readable name (`"NVIDIA H200"`, `"cpu"`).
    pub name: String,
    /// Device memory in bytes (for the CPU, the simulated capacity).
    pub total_memory: u64,
}

/// A compute backend: its memory and every op.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A tensor's storage (cheap to clone; shared).
    type Buf: Clone + Send + Sync + 'static;

    /// What the device is.
    fn info(&self) -> DeviceInfo;

    /// The device memory weights live in (shared with the memory manager).
    fn memory(&self) -> &Arc<dyn DeviceMemory>;

    /// The type activations are computed in by default (f32 on the CPU, bf16 on CUDA, unless this backend was
    /// made by [`Backend::with_compute_dtype`]).
    fn compute_dtype(&self) -> DType;

    /// This backend with `dtype` as its [`Backend::compute_dtype`], sharing the device, its memory and its
    /// allocator with `self`: how a model runs in the type its family computes in on this device. An error for a
    /// storage-only type.
    fn with_compute_dtype(&self, dtype: DType) -> Result<Self>;

    /// Waits until every op queued so far has finished (a no-op where ops are synchronous).
    fn synchronize(&self) -> Result<()>;

    /// Makes the backend take its device allocations (activations, per-op scratch) from `allocator` from
    /// now on; allocations made before keep freeing where they came from. The memory manager passes its
    /// VRAM arbiter, so activations count against the budget and evict weights when the device is full.
    /// `allocator` must allocate from this backend's [`Backend::memory`]. The default ignores it: the CPU
    /// backend keeps activations in host RAM, outside the simulated device.
    fn set_allocator(&self, allocator: Arc<dyn crate::memory::device::DeviceAllocator>) {
        let _ = allocator;
    }

    /// The allocator [`Backend::set_allocator`] set, if this backend keeps one: device memory a model derives at
    /// run time ([`crate::OwnedWeight::from_tensor`], a VAE's reordered kernels) is taken through it, so the
    /// budget sees it as it sees activations. `None` (the default): such memory comes from
    /// [`Backend::memory`] directly.
    fn device_allocator(&self) -> Option<Arc<dyn crate::memory::device::DeviceAllocator>> {
        None
    }

    // --- Data movement -------------------------------------------------------------------------------------

    /// A tensor of `dtype` holding `values` (rounded to `dtype`).
    #[allow(
        clippy::wrong_self_convention,
        reason = "a constructor on the backend that owns the tensor"
    )]
    fn from_f32(&self, shape: &[usize], values: &[f32], dtype: DType) -> Result<Tensor<Self>>;

    /// The values as f32, row-major (waits for the tensor's producers).
    fn to_f32(&self, x: &Tensor<Self>) -> Result<Vec<f32>>;

    /// A tensor of `dtype` filled with `value`.
    fn full(&self, shape: &[usize], value: f32, dtype: DType) -> Result<Tensor<Self>>;

    /// A weight as an activation tensor of `dtype` (pad tokens, embeddings used as values, LoRA factors).
    fn weight_to_tensor(&self, w: &Weight<'_>, dtype: DType) -> Result<Tensor<Self>>;

    /// `x` converted to `dtype` (round to nearest even when narrowing).
    fn cast(&self, x: &Tensor<Self>, dtype: DType) -> Result<Tensor<Self>>;

    /// Writes `x` into device memory at `dst` as `numel` elements of `dtype`, fp8 included (the in-place
    /// LoRA write-back into a weight's VBAR bytes). With `seed`, rounding is stochastic (a deterministic
    /// function of the seed and the element index, so a patched weight is reproducible); without, to nearest
    /// even. The caller owns `dst` for the duration (a faulted, pinned VBAR range).
    fn store(
        &self,
        x: &Tensor<Self>,
        dst: crate::memory::DevPtr,
        dtype: DType,
        seed: Option<u64>,
    ) -> Result<()>;

    /// The temporal taps of a causal 3-D convolution weight `w` `[O, I, kt, kh, kw]` from tap `first` on, as a
    /// new weight of `dtype` reordered to `[kt − first, O, I, kh, kw]`, so that each tap is a 2-D kernel
    /// `[O, I, kh, kw]` lying in one block (a video VAE's convolutions run as sums of 2-D ones). Taken through
    /// [`Backend::device_allocator`] where there is one. The default reorders on the device: the weight as a
    /// tensor, permuted, stored.
    fn causal_taps(
        &self,
        w: &Weight<'_>,
        first: usize,
        dtype: DType,
    ) -> Result<crate::OwnedWeight> {
        generic_causal_taps(self, w, first, dtype)
    }

    // --- Linear algebra ------------------------------------------------------------------------------------

    /// `x · wᵀ (+ bias)`: x `[.., K]`, w `[N, K]`, bias `[N]` → `[.., N]`. Accumulates in f32.
    fn linear(
        &self,
        x: &Tensor<Self>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
    ) -> Result<Tensor<Self>>;

    /// Batched `a · b` (or `a · bᵀ` with `transpose_b`): a `[batch.., M, K]`, b `[batch.., K, N]` (or
    /// `[batch.., N, K]`) with equal batch dims → `[batch.., M, N]`. Accumulates in f32.
    fn matmul(&self, a: &Tensor<Self>, b: &Tensor<Self>, transpose_b: bool)
    -> Result<Tensor<Self>>;

    /// Rows of `table` `[V, D]` at `ids` → `[ids.len(), D]` in the compute type. An id ≥ V is an error.
    fn embedding(&self, ids: &[u32], table: &Weight<'_>) -> Result<Tensor<Self>>;

    // --- Normalisation -------------------------------------------------------------------------------------

    /// RMSNorm over the last dimension: `x / sqrt(mean(x²) + eps) · w` (`w` used as is, not `1 + w`). For a
    /// per-head norm, pass x as `[.., heads, head_dim]` and a `[head_dim]` weight.
    fn rms_norm(&self, x: &Tensor<Self>, w: Option<&Weight<'_>>, eps: f32) -> Result<Tensor<Self>>;

    /// RMSNorm over the channels (dimension 1) of `x` `[B, C, spatial..]`: each position's C values
    /// `x / sqrt(mean(x²) + eps) · w[c]`, then `act` if given. The values are those of [`Backend::rms_norm`]
    /// on the channels-last transpose (then [`Backend::unary`]), rounded as those ops round, without the two
    /// transposes (the Wan VAEs' norm).
    fn channel_rms_norm(
        &self,
        x: &Tensor<Self>,
        w: Option<&Weight<'_>>,
        eps: f32,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<Self>>;

    /// LayerNorm over the last dimension, with optional affine weight and bias.
    fn layer_norm(
        &self,
        x: &Tensor<Self>,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Self>>;

    /// GroupNorm of `x` `[B, C, spatial..]` over `groups` channel groups, with optional per-channel affine.
    fn group_norm(
        &self,
        x: &Tensor<Self>,
        groups: usize,
        w: Option<&Weight<'_>>,
        b: Option<&Weight<'_>>,
        eps: f32,
    ) -> Result<Tensor<Self>>;

    /// Softmax over the last dimension.
    fn softmax(&self, x: &Tensor<Self>) -> Result<Tensor<Self>>;

    // --- Attention and position ----------------------------------------------------------------------------

    /// `softmax(q·kᵀ·scale + mask)·v` for q `[B, Hq, Nq, D]`, k `[B, Hkv, Nk, D]`, v `[B, Hkv, Nk, Dv]` →
    /// `[B, Hq, Nq, Dv]`. Hq must be a multiple of Hkv (grouped-query: query head h reads kv head
    /// h / (Hq/Hkv)). Memory is O(N) (flash-style, no Nq×Nk score matrix), so a VAE's 16k-token mid-block
    /// runs.
    fn attention(
        &self,
        q: &Tensor<Self>,
        k: &Tensor<Self>,
        v: &Tensor<Self>,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<Tensor<Self>>;

    /// Rotates x `[B, N, H, D]` by angles whose cosines and sines are `cos`, `sin` `[N, D/2]` (f32): pair m
    /// is rotated by angle m, pairs laid out as `layout` says.
    fn rope(
        &self,
        x: &Tensor<Self>,
        cos: &Tensor<Self>,
        sin: &Tensor<Self>,
        layout: RopeLayout,
    ) -> Result<Tensor<Self>>;

    // --- Elementwise ---------------------------------------------------------------------------------------

    /// `op(x)` elementwise.
    fn unary(&self, x: &Tensor<Self>, op: UnaryOp) -> Result<Tensor<Self>>;

    /// `op(a, b)` elementwise with broadcasting; the output has the broadcast shape and `a`'s dtype.
    fn binary(&self, a: &Tensor<Self>, b: &Tensor<Self>, op: BinaryOp) -> Result<Tensor<Self>>;

    /// `x · mul + add` elementwise with scalars.
    fn affine(&self, x: &Tensor<Self>, mul: f32, add: f32) -> Result<Tensor<Self>>;

    /// The gated MLP activation `act(gate) · up` (SwiGLU with `Silu`, GeGLU with `Gelu`/`GeluTanh`).
    fn gated(&self, gate: &Tensor<Self>, up: &Tensor<Self>, act: UnaryOp) -> Result<Tensor<Self>>;

    /// Scale/shift modulation `x · (1 + scale) + shift` for x `[B, N, D]` and per-sample scale and shift
    /// `[B, D]` broadcast over the tokens.
    fn modulate(
        &self,
        x: &Tensor<Self>,
        scale: &Tensor<Self>,
        shift: Option<&Tensor<Self>>,
    ) -> Result<Tensor<Self>>;

    // --- Images --------------------------------------------------------------------------------------------

    /// 2-D convolution of x `[B, C, H, W]` with w `[O, C, kh, kw]` and optional bias `[O]` → `[B, O, H', W']`.
    fn conv2d(
        &self,
        x: &Tensor<Self>,
        w: &Weight<'_>,
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
    ) -> Result<Tensor<Self>>;

    /// `[batch, O, H', W']`: the sum of the `terms`' 2-D convolutions (every kernel the same shape, `params`
    /// for each), each added to the output samples it names, plus `bias` `[O]`; a sample no term reaches is the
    /// bias alone (zero without one). A causal 3-D convolution's temporal taps, each over the frames it reads
    /// where they lie, summed into one output: no copy of the frames, no output per tap, no padding of them and
    /// no sums. Each term's products accumulate in f32; the output is rounded to the compute type at most once
    /// per term and once for the bias (one term of every sample of its input into every output sample: exactly
    /// [`Backend::conv2d`]).
    fn conv2d_sum(
        &self,
        terms: &[ConvTerm<'_, Self>],
        bias: Option<&Weight<'_>>,
        params: Conv2dParams,
        batch: usize,
    ) -> Result<Tensor<Self>>;

    /// Nearest-neighbour 2× upsampling of x `[B, C, H, W]` → `[B, C, 2H, 2W]`.
    fn upsample_nearest2x(&self, x: &Tensor<Self>) -> Result<Tensor<Self>>;

    /// x `[B, C, H, W]` (H, W multiples of `p`) → tokens `[B, (H/p)·(W/p), p·p·C]`, token (r, s) row-major,
    /// feature `(py·p + px)·C + c` = x[c, p·r + py, p·s + px] (NextDiT's order).
    fn patchify(&self, x: &Tensor<Self>, p: usize) -> Result<Tensor<Self>>;

    /// The inverse of [`Backend::patchify`]: tokens `[B, (H/p)·(W/p), p·p·C]` → `[B, C, H, W]`.
    fn unpatchify(
        &self,
        x: &Tensor<Self>,
        p: usize,
        channels: usize,
        h: usize,
        w: usize,
    ) -> Result<Tensor<Self>>;

    // --- Layout --------------------------------------------------------------------------------------------

    /// Joins tensors along `dim` (other dimensions equal).
    fn concat(&self, xs: &[&Tensor<Self>], dim: isize) -> Result<Tensor<Self>>;

    /// `len` entries of `dim` starting at `start`.
    fn slice(&self, x: &Tensor<Self>, dim: isize, start: usize, len: usize)
    -> Result<Tensor<Self>>;

    /// Pads `dim` with `before` and `after` entries.
    fn pad(
        &self,
        x: &Tensor<Self>,
        dim: isize,
        before: usize,
        after: usize,
        mode: PadMode,
    ) -> Result<Tensor<Self>>;

    /// Reorders dimensions: output dimension i is input dimension `perm[i]` (a copy, as torch's
    /// `.permute(..).contiguous()`).
    fn permute(&self, x: &Tensor<Self>, perm: &[usize]) -> Result<Tensor<Self>>;
}

/// [`Backend::causal_taps`] through the backend's own ops: the weight as an f32 tensor, permuted, stored.
pub(crate) fn generic_causal_taps<B: Backend>(
    b: &B,
    w: &Weight<'_>,
    first: usize,
    dtype: DType,
) -> Result<crate::OwnedWeight> {
    let [o, i, kt, kh, kw] = causal_geometry(w, first)?;
    let full = b.weight_to_tensor(w, DType::F32)?.reshape(&[o * i, kt, kh * kw])?;
    // Every tap: the whole weight, no copy to slice.
    let kept = if first == 0 { full } else { b.slice(&full, 1, first, kt - first)? };
    let reordered = b.permute(&kept, &[1, 0, 2])?.reshape(&[kt - first, o, i, kh, kw])?;
    crate::OwnedWeight::from_tensor(b, &reordered, dtype)
}

/// The dims `[O, I, kt, kh, kw]` of a causal 3-D convolution weight whose taps from `first` on are asked for
/// ([`Backend::causal_taps`]), or the error naming what is wrong.
pub(crate) fn causal_geometry(w: &Weight<'_>, first: usize) -> Result<[usize; 5]> {
    let &[o, i, kt, kh, kw] = w.shape() else {
        return Err(crate::Error::shape(
            "causal_taps",
            format!("a causal convolution weight is 5-D, not {:?}", w.shape()),
        ));
    };
    if first >= kt {
        return Err(crate::Error::shape(
            "causal_taps",
            format!("tap {first} of a causal convolution of {kt} taps"),
        ));
    }
    Ok([o, i, kt, kh, kw])
}
