//! Attention and RoPE on CUDA: the flash-attention kernel (`attention.cu`) and the rotary embedding (`rope.cu`).

use super::Cuda;
use super::kernels::{Arg, Grid, KernelFile, dtype_code};
use crate::backend::{AttentionMask, RopeLayout};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Query rows per warp and keys per tile (`ATT_R`, `ATT_BK` in `attention.cu`).
const ROWS_PER_WARP: usize = 4;
const KEYS_PER_TILE: usize = 32;
/// The largest head dimension the kernel's registers hold (`ATT_DV_CHUNKS` × 32).
const MAX_HEAD_DIM: usize = 256;

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
        if d > MAX_HEAD_DIM || dv > MAX_HEAD_DIM || d == 0 {
            return Err(Error::Unsupported(format!(
                "attention with head dims {d}/{dv} (at most {MAX_HEAD_DIM})"
            )));
        }
        let out = self.empty(vec![b, hq, nq, dv], dt)?;
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

#[cfg(test)]
mod tests {
    use super::shared_bytes;

    #[test]
    fn the_largest_head_fits_an_h200_block() {
        // 227 KiB of opt-in shared memory per block on sm_90.
        assert!(shared_bytes(8, 256, 256) <= 227 * 1024);
        assert_eq!(shared_bytes(1, 64, 64), (4 * 64 + 32 * 65 + 32 * 64) * 4);
    }
}
