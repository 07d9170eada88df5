//! Attention and RoPE on CUDA: attention by GEMMs on tensor cores or by the flash kernel (`attention.cu`), and
//! the rotary embedding (`rope.cu`).
//!
//! **Two paths.** A problem with at least [`GEMM_MIN_TOKENS`] queries and keys, or a head wider than the flash
//! kernel holds (a VAE's single head of 384 to 1024 features), runs as cuBLASLt GEMMs over chunks of query rows:
//! the scores `q·kᵀ` in f32 (16-bit q and k on the tensor cores with the f32 accumulation written out: exact
//! products summed in f32, the flash kernel's arithmetic), a row softmax of `scores·scale`
//! with the mask into probabilities of the compute type (`attention_softmax`), and `p·v` in the compute type with
//! f32 accumulation (probabilities rounded to bf16 before the second product, as FlashAttention and PyTorch's SDPA,
//! which ComfyUI runs on a GPU, do). The score chunk is at most [`SCORE_CHUNK_BYTES`] and [`MAX_CHUNK_ROWS`]
//! rows. The flash kernel (f32 on CUDA cores, O(N) memory) runs the small problems, where a GEMM's launch
//! would not pay (text encoders' short prompts, tiny test models), and those whose q, k and v differ in type
//! (it reads each exactly); wide heads of mixed types run the GEMMs in f32.
//!
//! With [`LongAttention::Cudnn`] the long problems cuDNN takes (at least 1 024 queries and keys, q, k and v of one
//! 16-bit type, heads of at most 256 features, a multiple of 8; causal only with as many queries as keys) run on
//! cuDNN's fused flash attention (`cudnn/attention.rs`), the others as GEMMs.
//!
//! With [`LongAttention::Mma`] the long problems it fits (sm_80 and later, q, k and v of one 16-bit type,
//! 16-byte aligned, heads of 64 or 128) run on the tensor-core flash kernel (`attention_mma.cu`) instead: the scores
//! stay in registers, and the key and value tiles are copied with `cp.async` one tile ahead of their use. With
//! [`LongAttention::Mma2`] its two-m-tile form runs them (128 query rows a block), where the device's shared
//! memory holds its block.

use super::gemm::GemmArgs;
use super::kernels::{Arg, Grid, KernelFile, dtype_code};
use super::{Cuda, LongAttention};
use crate::backend::{AttentionMask, RopeLayout};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Query rows per warp and keys per tile (`ATT_R`, `ATT_BK` in `attention.cu`).
const ROWS_PER_WARP: usize = 4;
const KEYS_PER_TILE: usize = 32;
/// The largest head dimension the kernel's registers hold (`ATT_DV_CHUNKS` × 32).
const MAX_HEAD_DIM: usize = 256;
/// Queries and keys from which attention runs as GEMMs (each at least this many).
const GEMM_MIN_TOKENS: usize = 64;
/// Device bytes of one chunk's scores (f32) and probabilities (compute type).
const SCORE_CHUNK_BYTES: usize = 256 << 20;
/// Query rows of one chunk at most (a GEMM of this many rows per head already fills the GPU).
const MAX_CHUNK_ROWS: usize = 4096;

/// Whether attention of these sizes runs as GEMMs (see the module docs).
fn by_gemm(nq: usize, nk: usize, d: usize, dv: usize) -> bool {
    d > MAX_HEAD_DIM || dv > MAX_HEAD_DIM || (nq >= GEMM_MIN_TOKENS && nk >= GEMM_MIN_TOKENS)
}

/// The row stride of the GEMM path's scores and probabilities: `nk` rounded up to 8 elements, so every row
/// starts 16-byte aligned (what cuBLASLt's tensor-core algorithms want of a leading dimension).
fn score_stride(nk: usize) -> usize {
    nk.next_multiple_of(8)
}

/// Query rows of one m-tile a warp of the tensor-core kernel (`MMA_ROWS`: 4 warps of 16).
const MMA_ROWS: usize = 64;
/// Keys per tile of the tensor-core kernel (`MMA_KEYS`; `MMA2_KEYS_128` for two m-tiles of 128 features) and the
/// padding of its shared-memory rows (`MMA_PAD`).
const MMA_KEYS: usize = 64;
const MMA2_KEYS_128: usize = 32;
const MMA_PAD: usize = 8;

/// One form of the tensor-core kernel (`attention_mma.cu`): its entry point and block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MmaKernel {
    name: &'static str,
    /// Query rows of a block.
    rows: usize,
    /// Dynamic shared memory of a block: two stages of a key and a value tile, and with two m-tiles the block's q.
    shared: usize,
}

/// The tensor-core kernel for heads of `d` features with `m_tiles` (1 or 2) m-tiles a warp, if there is one.
fn mma_kernel(d: usize, m_tiles: usize) -> Option<MmaKernel> {
    let name = match (d, m_tiles) {
        (64, 1) => "attention_mma_64",
        (128, 1) => "attention_mma_128",
        (64, 2) => "attention_mma2_64",
        (128, 2) => "attention_mma2_128",
        _ => return None,
    };
    let keys = if (d, m_tiles) == (128, 2) { MMA2_KEYS_128 } else { MMA_KEYS };
    let rows = MMA_ROWS * m_tiles;
    let q = if m_tiles > 1 { rows } else { 0 };
    Some(MmaKernel { name, rows, shared: (4 * keys + q) * (d + MMA_PAD) * 2 })
}

/// Query rows per chunk of the GEMM path: `batch` heads of `nk` keys, probabilities of `esize` bytes.
fn chunk_rows(batch: usize, nk: usize, esize: usize, nq: usize) -> usize {
    let per_row = batch * score_stride(nk) * (4 + esize);
    (SCORE_CHUNK_BYTES / per_row.max(1)).clamp(1, MAX_CHUNK_ROWS).min(nq.max(1))
}

/// Dynamic shared memory of one attention block, in bytes.
fn shared_bytes(warps: usize, d: usize, dv: usize) -> usize {
    let qb = warps * ROWS_PER_WARP;
    (qb * d + KEYS_PER_TILE * (d | 1) + KEYS_PER_TILE * dv) * 4
}

impl Cuda {
    pub(crate) fn op_attention(
        &self,
        q: &Tensor<Cuda>,
        k: &Tensor<Cuda>,
        v: &Tensor<Cuda>,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("attention", q.dtype())?;
        Self::compute_type("attention", k.dtype())?;
        Self::compute_type("attention", v.dtype())?;
        let bad = || {
            Error::shape(
                "attention",
                format!("q {:?}, k {:?}, v {:?}", q.shape(), k.shape(), v.shape()),
            )
        };
        let ([b, hq, nq, d], [kb, hkv, nk, kd], [vb, vh, vn, dv]) = (
            <[usize; 4]>::try_from(q.shape()).map_err(|_| bad())?,
            <[usize; 4]>::try_from(k.shape()).map_err(|_| bad())?,
            <[usize; 4]>::try_from(v.shape()).map_err(|_| bad())?,
        );
        if kb != b
            || vb != b
            || vh != hkv
            || vn != nk
            || kd != d
            || d == 0
            || hkv == 0
            || hq % hkv != 0
        {
            return Err(bad());
        }
        let shape = vec![b, hq, nq, dv];
        let sizes = Sizes { b, hq, hkv, nq, nk, d, dv };
        let mixed = k.dtype() != dt || v.dtype() != dt;
        let wide = d > MAX_HEAD_DIM || dv > MAX_HEAD_DIM;
        if b * hq * nq * dv > 0 && by_gemm(nq, nk, d, dv) && (wide || !mixed) {
            if mixed {
                // Wide heads of mixed types: every operand in f32, so each is read exactly.
                let f32s = |t: &Tensor<Cuda>| self.op_cast(t, DType::F32);
                let out32 = self.empty(shape, DType::F32)?;
                self.attention_by_gemm(
                    &f32s(q)?,
                    &f32s(k)?,
                    &f32s(v)?,
                    &out32,
                    sizes,
                    mask,
                    scale,
                )?;
                return self.op_cast(&out32, dt);
            }
            let out = self.empty(shape, dt)?;
            if self.long_attention == LongAttention::Cudnn
                && self.attention_on_cudnn(q, k, v, &out, sizes, mask, scale)?
            {
                return Ok(out);
            }
            let sm80 = self.kernels.arch() >= (8, 0);
            // The kernel copies rows of keys and values 16 bytes at a time.
            let aligned = [q, k, v].iter().all(|t| t.buf().ptr().0 % 16 == 0);
            let max_shared = self.kernels.max_shared() as usize;
            let mma = match self.long_attention {
                LongAttention::Gemm | LongAttention::Cudnn => None,
                LongAttention::Mma => mma_kernel(d, 1),
                LongAttention::Mma2 => {
                    mma_kernel(d, 2).filter(|k| k.shared <= max_shared).or(mma_kernel(d, 1))
                }
            }
            // The kernel counts a tile's visible keys in 32 bits.
            .filter(|_| sm80 && dt != DType::F32 && d == dv && aligned && nq.max(nk) < 1 << 30);
            match mma {
                Some(kernel) => self.attention_mma(kernel, q, k, v, &out, sizes, mask, scale)?,
                None => self.attention_by_gemm(q, k, v, &out, sizes, mask, scale)?,
            }
            return Ok(out);
        }
        let out = self.empty(shape, dt)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let mut warps = 8;
        while warps > 1 && shared_bytes(warps, d, dv) > self.kernels.max_shared() as usize {
            warps /= 2;
        }
        let qb = warps * ROWS_PER_WARP;
        let grid = Grid {
            grid: (nq.div_ceil(qb) as u32, hq as u32, b as u32),
            block: ((warps * 32) as u32, 1, 1),
            shared: shared_bytes(warps, d, dv) as u32,
        };
        self.launch(
            KernelFile::Attention,
            "attention",
            grid,
            &[
                Arg::Ptr(q.buf().ptr().0),
                Arg::Ptr(k.buf().ptr().0),
                Arg::Ptr(v.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::I32(dtype_code(k.dtype())),
                Arg::I32(dtype_code(v.dtype())),
                Arg::I32(hq as i32),
                Arg::I32(hkv as i32),
                Arg::n(nq),
                Arg::n(nk),
                Arg::I32(d as i32),
                Arg::I32(dv as i32),
                Arg::F32(scale),
                Arg::I32(i32::from(mask == AttentionMask::Causal)),
            ],
        )?;
        Ok(out)
    }

    /// The tensor-core flash kernel `kernel` (see the module docs) into `out` `[B, Hq, Nq, D]`: q, k, v and out
    /// of one 16-bit type.
    #[allow(clippy::too_many_arguments)]
    fn attention_mma(
        &self,
        kernel: MmaKernel,
        q: &Tensor<Cuda>,
        k: &Tensor<Cuda>,
        v: &Tensor<Cuda>,
        out: &Tensor<Cuda>,
        Sizes { b, hq, hkv, nq, nk, d, .. }: Sizes,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<()> {
        let grid = Grid {
            grid: (nq.div_ceil(kernel.rows) as u32, hq as u32, b as u32),
            block: (128, 1, 1),
            shared: kernel.shared as u32,
        };
        let flops = 4.0 * (b * hq * d) as f64 * visible_pairs(nq, nk, mask);
        self.launch_counted(
            KernelFile::AttentionMma,
            kernel.name,
            grid,
            &[
                Arg::Ptr(q.buf().ptr().0),
                Arg::Ptr(k.buf().ptr().0),
                Arg::Ptr(v.buf().ptr().0),
                Arg::Ptr(out.buf().ptr().0),
                Arg::I32(dtype_code(out.dtype())),
                Arg::I32(hq as i32),
                Arg::I32(hkv as i32),
                Arg::n(nq),
                Arg::n(nk),
                Arg::F32(scale),
                Arg::I32(i32::from(mask == AttentionMask::Causal)),
            ],
            flops,
        )
    }

    /// `out = attention(q, k, v)` on cuDNN's fused flash attention (`cudnn/attention.rs`): whether it ran; `false`
    /// (nothing queued) where cuDNN is absent or declines the problem (q, k and v of `out`'s 16-bit type).
    #[allow(clippy::too_many_arguments)]
    fn attention_on_cudnn(
        &self,
        q: &Tensor<Cuda>,
        k: &Tensor<Cuda>,
        v: &Tensor<Cuda>,
        out: &Tensor<Cuda>,
        Sizes { b, hq, hkv, nq, nk, d, dv }: Sizes,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<bool> {
        let causal = mask == AttentionMask::Causal;
        // cuDNN's causal mask is aligned top left: the same as Kiln's only for as many keys as queries.
        if d != dv || (causal && nq != nk) {
            return Ok(false);
        }
        let Some(attention) =
            self.cudnn_attention.get_or_init(|| super::cudnn::Attention::open(self.stream()))
        else {
            return Ok(false);
        };
        let shape = super::cudnn::AttentionShape {
            dtype: out.dtype(),
            batch: b,
            heads: hq,
            kv_heads: hkv,
            q_tokens: nq,
            kv_tokens: nk,
            head_dim: d,
            causal,
        };
        // cuDNN runs on the CUDA runtime, which uses the context current on this thread.
        self.stream()
            .context()
            .bind_to_thread()
            .map_err(|e| super::memory::drv("cuCtxSetCurrent", e))?;
        let flops = 4.0 * (b * hq * d) as f64 * visible_pairs(nq, nk, mask);
        let name = || format!("cudnn attention {}", out.dtype());
        let ran = super::profile::timed(self.stream(), name, flops, || {
            attention.forward(
                &shape,
                [q.buf().ptr().0, k.buf().ptr().0, v.buf().ptr().0, out.buf().ptr().0],
                scale,
                |bytes| self.alloc(bytes),
            )
        });
        match ran {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::debug!(error = %e, ?shape, "cuDNN declined; attention by GEMMs");
                Ok(false)
            }
        }
    }

    /// The GEMM path (see the module docs) into `out` `[B, Hq, Nq, Dv]`: q, k and v of `out`'s type. Query head
    /// `h` of batch `b` reads kv head `h / g` (g = Hq / Hkv): for each `j < g` one strided batch over the B·Hkv
    /// kv heads covers query heads `i·g + j` (i the kv head's index over the batch), so the scores of a chunk are
    /// `[B·Hkv, rows, Nk]` (rows [`score_stride`] apart).
    #[allow(clippy::too_many_arguments)]
    fn attention_by_gemm(
        &self,
        q: &Tensor<Cuda>,
        k: &Tensor<Cuda>,
        v: &Tensor<Cuda>,
        out: &Tensor<Cuda>,
        sizes: Sizes,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<()> {
        let dt = out.dtype();
        let (chunk, ld) = (
            chunk_rows(sizes.b * sizes.hkv, sizes.nk, dt.size(), sizes.nq),
            score_stride(sizes.nk),
        );
        let scratch = sizes.b * sizes.hkv * chunk * ld;
        let scores = self.alloc((scratch * 4) as u64)?;
        let probs = self.alloc((scratch * dt.size()) as u64)?;
        let at = GemmAddresses {
            q: q.buf().ptr().0,
            k: k.buf().ptr().0,
            v: v.buf().ptr().0,
            out: out.buf().ptr().0,
            scores: scores.ptr().0,
            probs: probs.ptr().0,
        };
        for step in gemm_plan(sizes, dt, chunk, at) {
            match step {
                GemmStep::Product(g) => {
                    self.gemm(&g)?;
                }
                GemmStep::Softmax { rows, per_head, q0 } => self.launch(
                    KernelFile::Attention,
                    "attention_softmax",
                    Grid::rows(rows, 256),
                    &[
                        Arg::Ptr(at.scores),
                        Arg::Ptr(at.probs),
                        Arg::I32(dtype_code(dt)),
                        Arg::n(rows),
                        Arg::n(per_head),
                        Arg::n(sizes.nk),
                        Arg::n(ld),
                        Arg::n(sizes.nq),
                        Arg::n(q0),
                        Arg::F32(scale),
                        Arg::I32(i32::from(mask == AttentionMask::Causal)),
                    ],
                )?,
            }
        }
        Ok(())
    }

    pub(crate) fn op_rope(
        &self,
        x: &Tensor<Cuda>,
        cos: &Tensor<Cuda>,
        sin: &Tensor<Cuda>,
        layout: RopeLayout,
    ) -> Result<Tensor<Cuda>> {
        let dt = Self::compute_type("rope", x.dtype())?;
        let [b, n, h, d] = *x.shape() else {
            return Err(Error::shape("rope", format!("x {:?} is not [B, N, H, D]", x.shape())));
        };
        let want = [n, d / 2];
        if d % 2 != 0 || cos.shape() != want || sin.shape() != want || cos.dtype() != sin.dtype() {
            return Err(Error::shape(
                "rope",
                format!(
                    "x {:?}, cos {:?} {}, sin {:?} {}",
                    x.shape(),
                    cos.shape(),
                    cos.dtype(),
                    sin.shape(),
                    sin.dtype()
                ),
            ));
        }
        Self::compute_type("rope", cos.dtype())?;
        let out = self.empty(x.shape().to_vec(), dt)?;
        self.launch(
            KernelFile::Rope,
            "rope",
            Grid::linear(x.numel() / 2),
            &[
                Arg::Ptr(x.buf().ptr().0),
                Arg::I32(dtype_code(dt)),
                Arg::Ptr(cos.buf().ptr().0),
                Arg::Ptr(sin.buf().ptr().0),
                Arg::I32(dtype_code(cos.dtype())),
                Arg::Ptr(out.buf().ptr().0),
                Arg::n(b),
                Arg::n(n),
                Arg::n(h),
                Arg::n(d),
                Arg::I32(i32::from(layout == RopeLayout::Interleaved)),
            ],
        )?;
        Ok(out)
    }
}

/// The device addresses the GEMM path works on: q, k, v and the output in the compute type, a chunk's f32 scores
/// and its probabilities in the compute type.
#[derive(Debug, Clone, Copy)]
struct GemmAddresses {
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    scores: u64,
    probs: u64,
}

/// One launch of the GEMM path.
#[derive(Debug, Clone, Copy)]
enum GemmStep {
    /// A chunk's scores `q·kᵀ` (f32) or its output `p·v` (the compute type).
    Product(GemmArgs),
    /// `attention_softmax` over a chunk's `rows` score rows, `per_head` of each head, from query `q0`.
    Softmax { rows: usize, per_head: usize, q0: usize },
}

/// The launches of the GEMM path for `sizes` in the compute type `dt`, chunks of `chunk` query rows (see
/// [`Cuda::attention_by_gemm`]): for each query head `j` of a kv group and each chunk, the scores, the
/// softmax and the output.
fn gemm_plan(sizes: Sizes, dt: DType, chunk: usize, at: GemmAddresses) -> Vec<GemmStep> {
    let Sizes { b, hq, hkv, nq, nk, d, dv } = sizes;
    let (g, batch, esize, ld) = (hq / hkv, b * hkv, dt.size(), score_stride(nk));
    let mut steps = Vec::new();
    for j in 0..g {
        for q0 in (0..nq).step_by(chunk.max(1)) {
            let rows = chunk.min(nq - q0);
            steps.push(GemmStep::Product(GemmArgs {
                op: "attention q·k",
                dtype: dt,
                out: DType::F32,
                m: rows,
                n: nk,
                k: d,
                a: at.q + ((j * nq + q0) * d * esize) as u64,
                lda: d,
                b: at.k,
                ldb: d,
                b_transposed: true,
                c: at.scores,
                ldc: ld,
                batch,
                stride_a: g * nq * d,
                stride_b: nk * d,
                stride_c: rows * ld,
                bias: None,
                accumulate: false,
            }));
            steps.push(GemmStep::Softmax { rows: batch * rows, per_head: rows, q0 });
            steps.push(GemmStep::Product(GemmArgs {
                op: "attention p·v",
                dtype: dt,
                out: dt,
                m: rows,
                n: dv,
                k: nk,
                a: at.probs,
                lda: ld,
                b: at.v,
                ldb: dv,
                b_transposed: false,
                c: at.out + ((j * nq + q0) * dv * esize) as u64,
                ldc: dv,
                batch,
                stride_a: rows * ld,
                stride_b: nk * dv,
                stride_c: g * nq * dv,
                bias: None,
                accumulate: false,
            }));
        }
    }
    steps
}

/// How many (query, key) pairs attention of `nq` queries over `nk` keys computes: all of them, or under a causal
/// mask those with key `j <= i + (nk − nq)` (the kernels skip the rest), for the profile's operation count.
fn visible_pairs(nq: usize, nk: usize, mask: AttentionMask) -> f64 {
    if mask != AttentionMask::Causal {
        return nq as f64 * nk as f64;
    }
    // Row i sees clamp(i + nk − nq + 1, 0, nk) keys: the sum over x = i + nk − nq + 1 of the clamp.
    let (nk, lo, hi) = (nk as i128, nk as i128 - nq as i128 + 1, nk as i128);
    let sum = |a: i128, b: i128| if a > b { 0 } else { (a + b) * (b - a + 1) / 2 };
    (sum(lo.max(1), hi.min(nk)) + nk * (hi - lo.max(nk + 1) + 1).max(0)) as f64
}

/// The sizes of one attention call.
#[derive(Debug, Clone, Copy)]
struct Sizes {
    b: usize,
    hq: usize,
    hkv: usize,
    nq: usize,
    nk: usize,
    d: usize,
    dv: usize,
}

#[cfg(test)]
mod tests {
    use super::{
        GemmAddresses, GemmStep, Sizes, by_gemm, chunk_rows, gemm_plan, score_stride, shared_bytes,
    };
    use crate::dtype::DType;

    /// Host memory for running a GEMM plan: buffers at distinct base addresses, each holding f32 values but
    /// addressed with the element size the device buffer would have. Every access is bounds-checked.
    struct Host {
        /// (base address, element size, values)
        bufs: Vec<(u64, usize, Vec<f64>)>,
    }

    impl Host {
        fn add(&mut self, esize: usize, values: Vec<f64>) -> u64 {
            let base = (self.bufs.len() as u64 + 1) << 40;
            self.bufs.push((base, esize, values));
            base
        }

        /// The buffer and element an address `addr` plus `i` elements of `esize` bytes falls on.
        fn slot(&self, addr: u64, esize: usize, i: usize) -> (usize, usize) {
            let (n, &(base, size, ref v)) = self
                .bufs
                .iter()
                .enumerate()
                .find(|(_, (base, _, _))| addr >= *base && addr < base + (1 << 40))
                .expect("an address inside a buffer");
            assert_eq!(size, esize, "a buffer of {size}-byte elements read as {esize}-byte ones");
            let off = (addr - base) as usize;
            assert_eq!(off % esize, 0, "a misaligned address");
            let e = off / esize + i;
            assert!(e < v.len(), "element {e} past the end of a buffer of {}", v.len());
            (n, e)
        }

        fn get(&self, addr: u64, esize: usize, i: usize) -> f64 {
            let (n, e) = self.slot(addr, esize, i);
            self.bufs[n].2[e]
        }

        fn set(&mut self, addr: u64, esize: usize, i: usize, v: f64) {
            let (n, e) = self.slot(addr, esize, i);
            self.bufs[n].2[e] = v;
        }
    }

    /// `GemmArgs`' row-major contract (gemm.rs): c[b] = a[b] · op(b[b]).
    fn product(host: &mut Host, g: &super::GemmArgs) {
        let es = g.dtype.size();
        for bi in 0..g.batch {
            for r in 0..g.m {
                for c in 0..g.n {
                    let mut acc = 0.0;
                    for k in 0..g.k {
                        let a = host.get(g.a, es, bi * g.stride_a + r * g.lda + k);
                        let b = if g.b_transposed {
                            host.get(g.b, es, bi * g.stride_b + c * g.ldb + k)
                        } else {
                            host.get(g.b, es, bi * g.stride_b + k * g.ldb + c)
                        };
                        acc += a * b;
                    }
                    host.set(g.c, g.out.size(), bi * g.stride_c + r * g.ldc + c, acc);
                }
            }
        }
    }

    /// `attention_softmax` (attention.cu) on the host.
    #[allow(clippy::too_many_arguments)]
    fn softmax(
        host: &mut Host,
        at: &GemmAddresses,
        esize: usize,
        (rows, per_head, q0): (usize, usize, usize),
        (nq, nk, ld): (usize, usize, usize),
        scale: f64,
        causal: bool,
    ) {
        for r in 0..rows {
            let e = q0 as i64 + (r % per_head) as i64 + nk as i64 - nq as i64 + 1;
            let seen = if causal { e.clamp(0, nk as i64) as usize } else { nk };
            let s: Vec<f64> = (0..nk).map(|c| host.get(at.scores, 4, r * ld + c) * scale).collect();
            let m = s[..seen].iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s[..seen].iter().map(|x| (x - m).exp()).sum();
            for (c, x) in s.iter().enumerate() {
                let p = if c < seen { (x - m).exp() / sum } else { 0.0 };
                host.set(at.probs, esize, r * ld + c, p);
            }
        }
    }

    #[test]
    fn the_gemm_plan_computes_attention_for_every_head_chunk_and_mask() {
        // (dtype, b, hq, hkv, nq, nk, d, dv, causal, chunk): GQA at batch 2, chunks that do not divide the
        // queries, unpadded and padded score rows, causal with Nq < Nk and Nq > Nk (rows that see no key).
        let cases = [
            (DType::BF16, 2, 6, 3, 37, 29, 8, 12, true, 5),
            (DType::F32, 1, 4, 1, 20, 33, 16, 16, false, 7),
            (DType::F16, 1, 2, 2, 50, 30, 8, 8, true, 16),
            (DType::BF16, 3, 2, 1, 9, 64, 4, 6, false, 9),
        ];
        for (dt, b, hq, hkv, nq, nk, d, dv, causal, chunk) in cases {
            let what = format!(
                "{dt} b {b} heads {hq}/{hkv} n {nq}/{nk} d {d}/{dv} causal {causal} chunk {chunk}"
            );
            let val = |n: usize, seed: usize| -> Vec<f64> {
                (0..n)
                    .map(|i| (((i * 7919 + seed * 104_729) % 1000) as f64 / 500.0) - 1.0)
                    .collect()
            };
            let (q, k, v) =
                (val(b * hq * nq * d, 1), val(b * hkv * nk * d, 2), val(b * hkv * nk * dv, 3));
            let es = dt.size();
            let ld = score_stride(nk);
            let mut host = Host { bufs: Vec::new() };
            let at = GemmAddresses {
                q: host.add(es, q.clone()),
                k: host.add(es, k.clone()),
                v: host.add(es, v.clone()),
                out: host.add(es, vec![f64::NAN; b * hq * nq * dv]),
                scores: host.add(4, vec![f64::NAN; b * hkv * chunk * ld]),
                probs: host.add(es, vec![f64::NAN; b * hkv * chunk * ld]),
            };
            let scale = 1.0 / (d as f64).sqrt();
            for step in gemm_plan(Sizes { b, hq, hkv, nq, nk, d, dv }, dt, chunk, at) {
                match step {
                    GemmStep::Product(g) => product(&mut host, &g),
                    GemmStep::Softmax { rows, per_head, q0 } => softmax(
                        &mut host,
                        &at,
                        es,
                        (rows, per_head, q0),
                        (nq, nk, ld),
                        scale,
                        causal,
                    ),
                }
            }
            let got = host.bufs[3].2.clone();
            for bi in 0..b {
                for h in 0..hq {
                    let kh = bi * hkv + h / (hq / hkv);
                    for i in 0..nq {
                        let qi = &q[((bi * hq + h) * nq + i) * d..][..d];
                        let last =
                            if causal { i as i64 + nk as i64 - nq as i64 } else { nk as i64 - 1 };
                        let keys: Vec<usize> = (0..nk).filter(|&j| j as i64 <= last).collect();
                        let s: Vec<f64> = keys
                            .iter()
                            .map(|&j| {
                                let kj = &k[(kh * nk + j) * d..][..d];
                                qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>() * scale
                            })
                            .collect();
                        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                        let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
                        for c in 0..dv {
                            let want: f64 = keys
                                .iter()
                                .zip(&s)
                                .map(|(&j, x)| (x - m).exp() / sum * v[(kh * nk + j) * dv + c])
                                .sum();
                            let o = got[((bi * hq + h) * nq + i) * dv + c];
                            assert!(
                                (o - want).abs() < 1e-9,
                                "{what}: out[{bi},{h},{i},{c}] {o} want {want}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn long_sequences_and_wide_heads_run_as_gemms_in_bounded_chunks() {
        assert!(by_gemm(4096, 4096, 128, 128), "a DiT's joint sequence");
        assert!(by_gemm(1, 1, 384, 384), "a VAE's single head of 384 features");
        assert!(!by_gemm(20, 512, 64, 64), "a short prompt");
        // Qwen-Image at 1328²: 24 heads of 6 909 keys (rows of 6 912), bf16 probabilities: 269 rows a chunk.
        assert_eq!(score_stride(6909), 6912);
        assert_eq!(score_stride(64), 64);
        assert_eq!(chunk_rows(24, 6909, 2, 6909), 269);
        assert_eq!(chunk_rows(1, 100, 2, 10_000), 4096, "at most MAX_CHUNK_ROWS");
        assert_eq!(chunk_rows(1, 100, 2, 70), 70, "never more than the queries");
        assert_eq!(chunk_rows(100_000, 100_000, 4, 10), 1, "at least one row");
    }

    #[test]
    fn causal_attention_counts_only_the_pairs_it_computes() {
        use crate::backend::AttentionMask;
        for nq in 0..40 {
            for nk in 0..40 {
                let seen: usize = (0..nq)
                    .map(|i| (i as i64 + nk as i64 - nq as i64 + 1).clamp(0, nk as i64) as usize)
                    .sum();
                assert_eq!(
                    super::visible_pairs(nq, nk, AttentionMask::Causal),
                    seen as f64,
                    "{nq} {nk}"
                );
                assert_eq!(super::visible_pairs(nq, nk, AttentionMask::None), (nq * nk) as f64);
            }
        }
    }

    #[test]
    fn the_tensor_core_kernels_fit_the_shared_memory_they_are_sized_for() {
        let k = |d, m| super::mma_kernel(d, m).expect("a kernel");
        // One m-tile: two stages of 64 keys and values, 68 KB at 128 features (three blocks an SM on sm_90).
        assert_eq!(k(128, 1).shared, 4 * 64 * 136 * 2);
        assert_eq!((k(64, 1).rows, k(128, 2).rows), (64, 128));
        // Two m-tiles at 128 features: 32-key tiles and the block's 128 q rows, 68 KB; at 64, 64-key tiles, 55 KB.
        assert_eq!(k(128, 2).shared, (4 * 32 + 128) * 136 * 2);
        assert_eq!(k(64, 2).shared, (4 * 64 + 128) * 72 * 2);
        // Every form fits sm_86/89's 99 KB a block, two blocks of each Hopper's 227 KB.
        for (d, m) in [(64, 1), (128, 1), (64, 2), (128, 2)] {
            assert!(k(d, m).shared <= 99 * 1024 && 2 * k(d, m).shared <= 227 * 1024, "{d} {m}");
        }
        assert_eq!(super::mma_kernel(96, 1), None);
    }

    #[test]
    fn the_largest_head_fits_an_h200_block() {
        // 227 KiB of opt-in shared memory per block on sm_90.
        assert!(shared_bytes(8, 256, 256) <= 227 * 1024);
        assert_eq!(shared_bytes(1, 64, 64), (4 * 64 + 32 * 65 + 32 * 64) * 4);
    }
}
