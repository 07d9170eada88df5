//! Flash-style attention on the CPU: O(N) memory, grouped-query heads, optional causal mask.
//!
//! Each task takes a block of [`BQ`] queries of one head and walks the keys in blocks of [`BK`]: the scores
//! of the block (`q · kᵀ · scale`, one GEMM), an online softmax that rescales what was accumulated when the
//! running maximum grows, and `p · v` accumulated straight into the output rows (a second GEMM). The only
//! scratch is one `BQ × BK` score block per task; an `Nq × Nk` score matrix never exists. Tasks run in
//! parallel over heads and query blocks; each GEMM runs on its task's thread.

use rayon::prelude::*;

use super::Cpu;
use super::gemm::{Mat, MatMut, Threads, gemm};
use super::simd;
use super::storage::{read_f32, tensor_from_f32};
use crate::backend::AttentionMask;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Queries per block: the row count of both block products, so larger is faster up to the point where the
/// score block (`BQ × BK` f32, 512 KiB) leaves L2. Measured at Z-Image's 30 heads × 4096 tokens
/// (`benches/cpu_ops.rs`): 512 × 256 took 14% less CPU time than 128 × 256.
pub(crate) const BQ: usize = 512;
/// Keys per block.
pub(crate) const BK: usize = 256;

/// The geometry of one head's problem.
#[derive(Clone, Copy)]
struct Dims {
    nk: usize,
    d: usize,
    dv: usize,
    /// With a causal mask, Nk − Nq: query i attends to keys 0..=i + offset.
    causal_offset: Option<isize>,
    scale: f32,
}

/// Per-task scratch: one score block and the running max and sum of each query row.
struct Scratch {
    s: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch { s: vec![0.0; BQ * BK], m: vec![0.0; BQ], l: vec![0.0; BQ] }
    }
}

/// `softmax(q·kᵀ·scale + mask)·v` (see [`crate::Backend::attention`]). A query that may attend to no key
/// (causal with Nq > Nk) gets zeros, as flash-attention kernels give.
pub(crate) fn attention(
    q: &Tensor<Cpu>,
    k: &Tensor<Cpu>,
    v: &Tensor<Cpu>,
    mask: AttentionMask,
    scale: f32,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "attention";
    let shapes = || format!("q {:?}, k {:?}, v {:?}", q.shape(), k.shape(), v.shape());
    let (&[b, hq, nq, d], &[bk, hkv, nk, dk], &[bv, hv, nv, dv]) =
        (q.shape(), k.shape(), v.shape())
    else {
        return Err(Error::shape(OP, format!("q, k and v must be [B, H, N, D]: {}", shapes())));
    };
    if bk != b || bv != b || hv != hkv || nv != nk || dk != d {
        return Err(Error::shape(OP, format!("mismatched shapes: {}", shapes())));
    }
    if hkv == 0 || !hq.is_multiple_of(hkv) {
        return Err(Error::shape(
            OP,
            format!("{hq} query heads are not a multiple of {hkv} kv heads"),
        ));
    }
    let causal_offset = match mask {
        AttentionMask::None => None,
        AttentionMask::Causal => Some(nk as isize - nq as isize),
    };
    let dims = Dims { nk, d, dv, causal_offset, scale };
    let (qs, ks, vs) = (read_f32(q, OP)?, read_f32(k, OP)?, read_f32(v, OP)?);
    // Each kv head's keys transposed to `[D, Nk]`, once, so every score block's product reads rows.
    let kt = transpose_heads(&ks, nk, d);
    let mut out = vec![0.0f32; b * hq * nq * dv];
    let group = hq / hkv.max(1);
    if nq > 0 && dv > 0 {
        out.par_chunks_mut(nq * dv).enumerate().for_each(|(bh, o_head)| {
            let (bi, h) = (bh / hq, bh % hq);
            let kvh = bi * hkv + h / group;
            let q_head = &qs[bh * nq * d..(bh + 1) * nq * d];
            let k_head = &kt[kvh * nk * d..(kvh + 1) * nk * d];
            let v_head = &vs[kvh * nk * dv..(kvh + 1) * nk * dv];
            o_head.par_chunks_mut(BQ * dv).enumerate().for_each_init(
                Scratch::new,
                |scratch, (qb, o)| {
                    let q0 = qb * BQ;
                    let rows = o.len() / dv;
                    let q_blk = &q_head[q0 * d..(q0 + rows) * d];
                    query_block(dims, q_blk, q0, k_head, v_head, o, scratch);
                },
            );
        });
    }
    tensor_from_f32(vec![b, hq, nq, dv], out, q.dtype(), OP)
}

/// Each `[n, d]` matrix of `x` transposed to `[d, n]`.
fn transpose_heads(x: &[f32], n: usize, d: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    if n * d > 0 {
        out.par_chunks_mut(n * d).zip(x.par_chunks(n * d)).for_each(|(t, h)| {
            // In tiles of 32 keys, so the reads and the writes both stay within a few cache lines.
            for j0 in (0..n).step_by(32) {
                for e in 0..d {
                    for j in j0..(j0 + 32).min(n) {
                        t[e * n + j] = h[j * d + e];
                    }
                }
            }
        });
    }
    out
}

/// Attention of `rows` queries starting at query `q0` of one head over all its keys (`kt`, transposed to
/// `[D, Nk]`), into `o` (`rows × dv`).
fn query_block(
    dims: Dims,
    q: &[f32],
    q0: usize,
    kt: &[f32],
    v: &[f32],
    o: &mut [f32],
    scratch: &mut Scratch,
) {
    let Dims { nk, d, dv, causal_offset, scale } = dims;
    let rows = o.len() / dv;
    let (m, l) = (&mut scratch.m[..rows], &mut scratch.l[..rows]);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    o.fill(0.0);
    // Keys the last query of the block may see; later key blocks are skipped entirely.
    let kend = match causal_offset {
        None => nk,
        Some(off) => ((q0 + rows) as isize + off).clamp(0, nk as isize) as usize,
    };
    let mut k0 = 0;
    while k0 < kend {
        let kb = BK.min(kend - k0);
        let s = &mut scratch.s[..rows * kb];
        gemm(
            rows,
            kb,
            d,
            MatMut::rows(s, kb),
            Mat::rows(q, d),
            Mat { data: &kt[k0..], rs: nk, cs: 1 },
            false,
            scale,
            Threads::One,
        );
        for r in 0..rows {
            let row = &mut s[r * kb..(r + 1) * kb];
            if let Some(off) = causal_offset {
                // Query q0 + r sees keys up to q0 + r + off; mask the rest of this block.
                let last = (q0 + r) as isize + off;
                let visible = (last - k0 as isize + 1).clamp(0, kb as isize) as usize;
                row[visible..].fill(f32::NEG_INFINITY);
            }
            let (m_new, sum) = simd::online_softmax_step(row, 1.0, m[r]);
            if m_new == f32::NEG_INFINITY {
                continue;
            }
            let corr = simd::exp(m[r] - m_new);
            l[r] = l[r] * corr + sum;
            m[r] = m_new;
            if corr != 1.0 {
                simd::scale(&mut o[r * dv..(r + 1) * dv], corr);
            }
        }
        let v_blk = &v[k0 * dv..(k0 + kb) * dv];
        gemm(
            rows,
            dv,
            kb,
            MatMut::rows(o, dv),
            Mat::rows(s, kb),
            Mat::rows(v_blk, dv),
            true,
            1.0,
            Threads::One,
        );
        k0 += kb;
    }
    for r in 0..rows {
        let inv = if l[r] > 0.0 { 1.0 / l[r] } else { 0.0 };
        simd::scale(&mut o[r * dv..(r + 1) * dv], inv);
    }
}
