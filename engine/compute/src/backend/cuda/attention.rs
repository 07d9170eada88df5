//! Attention and RoPE on CUDA: attention by GEMMs on tensor cores or by the flash kernel (`attention.cu`), and
//! the rotary embedding (`rope.cu`).
//!
//! **Two paths.** A problem with at least [`GEMM_MIN_TOKENS`] queries and keys, or a head wider than the flash
//! kernel holds (a VAE's single head of 384 to 1024 features), runs as cuBLASLt GEMMs over chunks of query rows:
//! the scores `q·kᵀ` in f32 (from f32 copies of q and k on TF32 tensor cores when they are 16-bit, which TF32
//! holds exactly: exact products summed in f32, the flash kernel's arithmetic), a row softmax of `scores·scale`
//! with the mask into probabilities of the compute type (`attention_softmax`), and `p·v` in the compute type with
//! f32 accumulation (probabilities rounded to bf16 before the second product, as FlashAttention and PyTorch's SDPA,
//! which ComfyUI runs on a GPU, do). The score chunk is at most [`SCORE_CHUNK_BYTES`] and [`MAX_CHUNK_ROWS`]
//! rows. The flash kernel (f32 on CUDA cores, O(N) memory) runs the small problems, where a GEMM's launch
//! would not pay (text encoders' short prompts, tiny test models), and those whose q, k and v differ in type
//! (it reads each exactly); wide heads of mixed types run the GEMMs in f32.
//!
//! With [`LongAttention::Mma`] the long problems it fits (sm_80 and later, q, k and v of one 16-bit type, heads
//! of 64 or 128) run on the tensor-core flash kernel (`attention_mma.cu`) instead: the scores stay in registers.

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

/// Query rows of one block of the tensor-core kernel (`MMA_ROWS`: 4 warps of 16).
const MMA_ROWS: usize = 64;
/// Keys per tile of the tensor-core kernel (`MMA_KEYS`) and the padding of its shared-memory rows (`MMA_PAD`).
const MMA_KEYS: usize = 64;
const MMA_PAD: usize = 8;

/// The tensor-core kernel for heads of `d` features, if there is one.
fn mma_kernel(d: usize) -> Option<&'static str> {
    match d {
        64 => Some("attention_mma_64"),
        128 => Some("attention_mma_128"),
        _ => None,
    }
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
        if kb != b || vb != b || vh != hkv || vn != nk || kd != d || hkv == 0 || hq % hkv != 0 {
            return Err(bad());
        }
        if d == 0 {
            return Err(bad());
        }
        let out = self.empty(vec![b, hq, nq, dv], dt)?;
        if out.numel() == 0 {
            return Ok(out);
        }
        let sizes = Sizes { b, hq, hkv, nq, nk, d, dv };
        let mixed = k.dtype() != dt || v.dtype() != dt;
        let wide = d > MAX_HEAD_DIM || dv > MAX_HEAD_DIM;
        if by_gemm(nq, nk, d, dv) && (wide || !mixed) {
            if mixed {
                // Wide heads of mixed types: every operand in f32, so each is read exactly.
                let f32s = |t: &Tensor<Cuda>| self.op_cast(t, DType::F32);
                let out32 = self.empty(vec![b, hq, nq, dv], DType::F32)?;
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
            let sm80 = self.kernels.arch() >= (8, 0);
            let mma = mma_kernel(d).filter(|_| {
                self.long_attention == LongAttention::Mma && sm80 && dt != DType::F32 && d == dv
            });
            match mma {
                Some(kernel) => self.attention_mma(kernel, q, k, v, &out, sizes, mask, scale)?,
                None => self.attention_by_gemm(q, k, v, &out, sizes, mask, scale)?,
            }
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
        kernel: &'static str,
        q: &Tensor<Cuda>,
        k: &Tensor<Cuda>,
        v: &Tensor<Cuda>,
        out: &Tensor<Cuda>,
        Sizes { b, hq, hkv, nq, nk, d, .. }: Sizes,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<()> {
        let grid = Grid {
            grid: (nq.div_ceil(MMA_ROWS) as u32, hq as u32, b as u32),
            block: (128, 1, 1),
            shared: (2 * MMA_KEYS * (d + MMA_PAD) * 2) as u32,
        };
        self.launch(
            KernelFile::AttentionMma,
            kernel,
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
        )
    }

    /// The GEMM path (see the module docs) into `out` `[B, Hq, Nq, Dv]`: q, k and v of `out`'s type. Query head `h` of batch `b` reads kv
    /// head `h / g` (g = Hq / Hkv): for each `j < g` one strided batch over the B·Hkv kv heads covers query heads
    /// `i·g + j` (i the kv head's index over the batch), so the scores of a chunk are `[B·Hkv, rows, Nk]` (rows
    /// [`score_stride`] apart).
    #[allow(clippy::too_many_arguments)]
    fn attention_by_gemm(
        &self,
        q: &Tensor<Cuda>,
        k: &Tensor<Cuda>,
        v: &Tensor<Cuda>,
        out: &Tensor<Cuda>,
        Sizes { b, hq, hkv, nq, nk, d, dv }: Sizes,
        mask: AttentionMask,
        scale: f32,
    ) -> Result<()> {
        let dt = out.dtype();
        let esize = dt.size();
        let (q32, k32) = (self.op_cast(q, DType::F32)?, self.op_cast(k, DType::F32)?);
        let g = hq / hkv;
        let batch = b * hkv;
        let chunk = chunk_rows(batch, nk, esize, nq);
        let ld = score_stride(nk);
        let scores = self.alloc((batch * chunk * ld * 4) as u64)?;
        let probs = self.alloc((batch * chunk * ld * esize) as u64)?;
        let (qp, kp, vp, op) =
            (q32.buf().ptr().0, k32.buf().ptr().0, v.buf().ptr().0, out.buf().ptr().0);
        for j in 0..g {
            for q0 in (0..nq).step_by(chunk) {
                let rows = chunk.min(nq - q0);
                self.gemm(&GemmArgs {
                    dtype: DType::F32,
                    tf32: dt != DType::F32,
                    m: rows,
                    n: nk,
                    k: d,
                    a: qp + ((j * nq + q0) * d * 4) as u64,
                    lda: d,
                    b: kp,
                    ldb: d,
                    b_transposed: true,
                    c: scores.ptr().0,
                    ldc: ld,
                    batch,
                    stride_a: g * nq * d,
                    stride_b: nk * d,
                    stride_c: rows * ld,
                })?;
                self.launch(
                    KernelFile::Attention,
                    "attention_softmax",
                    Grid::rows(batch * rows, 256),
                    &[
                        Arg::Ptr(scores.ptr().0),
                        Arg::Ptr(probs.ptr().0),
                        Arg::I32(dtype_code(dt)),
                        Arg::n(batch * rows),
                        Arg::n(rows),
                        Arg::n(nk),
                        Arg::n(ld),
                        Arg::n(nq),
                        Arg::n(q0),
                        Arg::F32(scale),
                        Arg::I32(i32::from(mask == AttentionMask::Causal)),
                    ],
                )?;
                self.gemm(&GemmArgs {
                    dtype: dt,
                    tf32: false,
                    m: rows,
                    n: dv,
                    k: nk,
                    a: probs.ptr().0,
                    lda: ld,
                    b: vp,
                    ldb: dv,
                    b_transposed: false,
                    c: op + ((j * nq + q0) * dv * esize) as u64,
                    ldc: dv,
                    batch,
                    stride_a: rows * ld,
                    stride_b: nk * dv,
                    stride_c: g * nq * dv,
                })?;
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
    use super::{by_gemm, chunk_rows, score_stride, shared_bytes};

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
    fn the_largest_head_fits_an_h200_block() {
        // 227 KiB of opt-in shared memory per block on sm_90.
        assert!(shared_bytes(8, 256, 256) <= 227 * 1024);
        assert_eq!(shared_bytes(1, 64, 64), (4 * 64 + 32 * 65 + 32 * 64) * 4);
    }
}
