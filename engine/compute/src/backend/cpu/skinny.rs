//! `x · wᵀ` for a few rows of x with AVX-512 (or AVX2), without packing: the path of `linear` when at most
//! [`MAX_ROWS`] rows meet each weight (the one row of a modulation or a timestep embedding, a short prompt).
//!
//! With few rows each weight element is used only a few times, so packing it into micro-panels (widen, then
//! transpose, then read back) costs as much as the product (issue #23: 17 % of a Qwen-Image step at 64² went to
//! packing, beside 20 % to widening). Here each task widens [`J`] weight rows at a time into an L1/L2-sized
//! scratch, in their stored order, and multiplies them with up to [`R`] rows of x in a register tile of
//! `R × J` 16-lane accumulators that run along k; each accumulator is summed across its lanes at the end
//! ([`sum_lanes`]). On CPUs without AVX-512 the AVX2 kernel takes one row of x at a time (a `1 × J` tile),
//! keeps each 16-lane accumulator as two ymm halves and sums them by the same tree, so both give the same bits.
//!
//! The widened values are those the packing path multiplies ([`super::packed_gemm::widen_simd`], scale
//! included), so a weight file and its dequantized f32 twin still give the same bits; the summation order
//! differs from the packing path's, as any two GEMM kernels' do.
//!
//! Invariant: SIMD code runs only after [`available`] said the CPU has it (AVX-512, or AVX2, FMA and F16C),
//! and every pointer a kernel reads is derived from a slice whose length was checked against the indices it
//! covers.

#![allow(unsafe_code)]

use std::cell::RefCell;

use rayon::prelude::*;

use super::avx2;
use super::gemm::Threads;
use super::packed_gemm::{
    SendPtr, WeightRows, aligned, has_avx512f, task_cols, widen_simd, with_thread_buffer,
};
use crate::dtype::DType;
use crate::error::Result;

/// The most rows of x this path takes. Measured against the packing path of [`super::packed_gemm`] on
/// Qwen-Image's shapes (`benches/cpu_ops.rs`, cases `linear_fp8_*`): 2.2–2.6× as fast for one row (the
/// modulation linears, a third of the MMDiT's weights), 1.3–1.5× for 8, even at 16, slower at 32.
pub(crate) const MAX_ROWS: usize = 8;

/// Rows of x per register tile.
const R: usize = 6;
/// Weight rows per register tile: `R × J` accumulators, J weight vectors and one x vector fit the 32 zmm
/// registers.
const J: usize = 4;
/// Lanes of a zmm register (f32).
const LANES: usize = 16;

thread_local! {
    /// A task's J widened weight rows, reused across calls on a thread.
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether this CPU runs this path.
pub(crate) fn available() -> bool {
    has_avx512f() || avx2::available()
}

/// `out [m, n] = x [m, k] · wᵀ` for x row-major and a weight `[n, k]` of `dtype` (times `scale` if given) read
/// through `weight_rows`.
///
/// The caller checks [`available`]; without it this returns without computing, which the caller's tests would
/// catch.
pub(crate) fn matmul_bt(
    x: &[f32],
    m: usize,
    n: usize,
    k: usize,
    (dtype, scale): (DType, Option<f32>),
    weight_rows: &WeightRows<'_>,
    out: &mut [f32],
) -> Result<()> {
    assert!(x.len() >= m * k && out.len() >= m * n, "skinny matmul: buffers too short");
    if !available() || m == 0 || n == 0 {
        return Ok(());
    }
    let size = dtype.size();
    // Widened rows are padded with zeros to whole vectors, so the kernel's last weight loads need no mask.
    let stride = k.next_multiple_of(LANES);
    let out_ptr = SendPtr(out.as_mut_ptr());
    let nc = task_cols(m, n, Threads::All);
    (0..n.div_ceil(nc)).into_par_iter().try_for_each(|t| {
        let n0 = t * nc;
        let cols = nc.min(n - n0);
        weight_rows(n0, cols, &mut |bytes| {
            assert_eq!(bytes.len(), cols * k * size, "skinny matmul: weight rows");
            with_thread_buffer(&WIDENED, |widened| {
                let widened = aligned(widened, J * stride);
                for j0 in (0..cols).step_by(J) {
                    let rows = J.min(cols - j0);
                    for (j, dst) in widened.chunks_exact_mut(stride).enumerate() {
                        if j < rows {
                            let at = (j0 + j) * k * size;
                            widen_simd(dtype, &bytes[at..at + k * size], &mut dst[..k], scale);
                            dst[k..].fill(0.0);
                        } else {
                            dst.fill(0.0);
                        }
                    }
                    let mut m0 = 0;
                    while m0 < m {
                        let tile_rows = R.min(m - m0);
                        let mut tile = [[0.0f32; J]; R];
                        // SAFETY: `available()` said this CPU runs a kernel; x holds rows m0..m0 + tile_rows
                        // of k elements (m·k asserted above) and `widened` holds J rows of `stride` ≥ k.
                        unsafe {
                            run_kernel(tile_rows, &x[m0 * k..], k, widened, stride, &mut tile)
                        };
                        for (r, values) in tile.iter().enumerate().take(tile_rows) {
                            // SAFETY: row m0 + r < m and columns n0 + j0..n0 + j0 + rows ≤ n0 + cols belong to
                            // this task, which no other task writes, while `out` is borrowed by this call.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    out_ptr.at((m0 + r) * n + n0 + j0),
                                    rows,
                                )
                            };
                            dst.copy_from_slice(&values[..rows]);
                        }
                        m0 += tile_rows;
                    }
                }
            });
            Ok(())
        })
    })
}

const _: () = assert!(R == 6, "run_kernel has one arm per row count up to R");

/// Runs the kernel for `rows` (1..=R) rows of x: [`kernel`] with AVX-512, else [`kernel_avx2`] row by row.
///
/// # Safety
/// As [`kernel`] for that row count, with AVX-512 or else AVX2 and FMA available.
unsafe fn run_kernel(
    rows: usize,
    x: &[f32],
    ldx: usize,
    w: &[f32],
    stride: usize,
    tile: &mut [[f32; J]; R],
) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's promise for this row count; `available()` said the CPU has AVX-512, or else AVX2
    // and FMA.
    unsafe {
        if has_avx512f() {
            match rows {
                6 => kernel::<6>(x, ldx, w, stride, tile),
                5 => kernel::<5>(x, ldx, w, stride, tile),
                4 => kernel::<4>(x, ldx, w, stride, tile),
                3 => kernel::<3>(x, ldx, w, stride, tile),
                2 => kernel::<2>(x, ldx, w, stride, tile),
                _ => kernel::<1>(x, ldx, w, stride, tile),
            }
        } else {
            for (r, trow) in tile.iter_mut().enumerate().take(rows) {
                kernel_avx2(&x[r * ldx..], ldx, w, stride, trow);
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (rows, x, ldx, w, stride, tile);
        unreachable!("available() is false off x86-64")
    }
}

/// `tile[r][j] = Σ_l x[r·ldx + l] · w[j·stride + l]` over l < ldx (= k) for `RR` rows of x and [`J`] widened
/// weight rows.
///
/// # Safety
/// AVX512F is available; `x.len() ≥ (RR − 1)·ldx + ldx`; `w.len() ≥ J·stride` with `stride` a multiple of 16
/// and at least ldx.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn kernel<const RR: usize>(
    x: &[f32],
    ldx: usize,
    w: &[f32],
    stride: usize,
    tile: &mut [[f32; J]; R],
) {
    use std::arch::x86_64::*;
    let k = ldx;
    assert!(RR <= R && x.len() >= RR * k && w.len() >= J * stride && stride >= k);
    assert!(stride.is_multiple_of(LANES));
    let mut acc = [[_mm512_setzero_ps(); J]; RR];
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let full = k / LANES * LANES;
    for l in (0..full).step_by(LANES) {
        // SAFETY: l + 16 ≤ full ≤ k ≤ stride, so each load stays inside row j of w (J·stride elements,
        // asserted) and row r of x (RR·k elements, asserted). Loads are unaligned.
        unsafe {
            let wv: [__m512; J] = std::array::from_fn(|j| _mm512_loadu_ps(wp.add(j * stride + l)));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(xp.add(r * k + l));
                for (a, &wvj) in acc_r.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, wvj, *a);
                }
            }
        }
    }
    if full < k {
        // The last k − full inputs: x through a mask (its lanes past k are neither read nor faulted), w as
        // a whole vector (its padding is zeros, inside `stride`).
        let mask: __mmask16 = (1u16 << (k - full)) - 1;
        // SAFETY: full + 16 ≤ stride, so the weight loads stay inside row j of w; the masked x loads read
        // only lanes below k − full, inside row r of x.
        unsafe {
            let wv: [__m512; J] =
                std::array::from_fn(|j| _mm512_loadu_ps(wp.add(j * stride + full)));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(mask, xp.add(r * k + full));
                for (a, &wvj) in acc_r.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, wvj, *a);
                }
            }
        }
    }
    for (dst, acc_r) in tile.iter_mut().zip(&acc) {
        for (d, &a) in dst.iter_mut().zip(acc_r) {
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` holds 16 f32; unaligned store.
            unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), a) };
            *d = sum_lanes(lanes);
        }
    }
}

/// `out[j] = Σ_l x[l] · w[j·stride + l]` over l < k for [`J`] widened weight rows, as [`kernel`]
/// computes one row of its tile: each 16-lane accumulator is two ymm halves (lanes 0–7 and 8–15) fed the same
/// inputs in the same order, then summed by [`sum_lanes`].
///
/// # Safety
/// AVX2 and FMA are available; `x.len() ≥ k`; `w.len() ≥ J·stride` with `stride` a multiple of 16 and at
/// least k.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_avx2(x: &[f32], k: usize, w: &[f32], stride: usize, out: &mut [f32; J]) {
    use std::arch::x86_64::*;
    assert!(x.len() >= k && w.len() >= J * stride && stride >= k && stride.is_multiple_of(LANES));
    let mut acc = [[_mm256_setzero_ps(); 2]; J];
    let (xp, wp) = (x.as_ptr(), w.as_ptr());
    let full = k / LANES * LANES;
    for l in (0..full).step_by(LANES) {
        // SAFETY: l + 16 ≤ full ≤ k ≤ stride, so each load stays inside x (k elements, asserted) and row j of
        // w. Loads are unaligned.
        unsafe {
            let xv = [_mm256_loadu_ps(xp.add(l)), _mm256_loadu_ps(xp.add(l + 8))];
            for (j, acc_j) in acc.iter_mut().enumerate() {
                for (half, a) in acc_j.iter_mut().enumerate() {
                    let wv = _mm256_loadu_ps(wp.add(j * stride + l + 8 * half));
                    *a = _mm256_fmadd_ps(xv[half], wv, *a);
                }
            }
        }
    }
    if full < k {
        // The last k − full inputs: x through masks (its lanes past k are neither read nor faulted, and a half
        // with none is zeros), w as whole vectors (its padding is zeros, inside `stride`).
        let rest = k - full;
        let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let xv: [__m256; 2] = std::array::from_fn(|half| {
            let count = rest.saturating_sub(8 * half);
            if count == 0 {
                return _mm256_setzero_ps();
            }
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(count as i32), lane);
            // SAFETY: full + 8·half < k, so the address lies inside x, and the mask reads only lanes below
            // k − full − 8·half.
            unsafe { _mm256_maskload_ps(xp.add(full + 8 * half), mask) }
        });
        for (j, acc_j) in acc.iter_mut().enumerate() {
            for (half, a) in acc_j.iter_mut().enumerate() {
                // SAFETY: full + 16 ≤ stride, so the load stays inside row j of w.
                let wv = unsafe { _mm256_loadu_ps(wp.add(j * stride + full + 8 * half)) };
                *a = _mm256_fmadd_ps(xv[half], wv, *a);
            }
        }
    }
    for (d, acc_j) in out.iter_mut().zip(&acc) {
        let mut lanes = [0.0f32; LANES];
        // SAFETY: `lanes` holds 16 f32, the two halves 8 each; unaligned stores.
        unsafe {
            _mm256_storeu_ps(lanes.as_mut_ptr(), acc_j[0]);
            _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc_j[1]);
        }
        *d = sum_lanes(lanes);
    }
}

/// The sum of an accumulator's 16 lanes by a fixed tree (lanes i and i + 8, then i and i + 4, i and i + 2, and
/// the last two), which both kernels share so they round alike.
#[cfg(target_arch = "x86_64")]
fn sum_lanes(v: [f32; LANES]) -> f32 {
    let h8: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
    let h4: [f32; 4] = std::array::from_fn(|i| h8[i] + h8[i + 4]);
    (h4[0] + h4[2]) + (h4[1] + h4[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_loops_for_every_weight_dtype_and_row_count() {
        if !available() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2");
            return;
        }
        // Row counts below, at and above a tile (6); weight rows that do and do not fill a tile (4) and a
        // task; k below one vector, at one, and with a tail.
        let cases = [(1, 50, 64), (6, 64, 1), (7, 200, 1030), (13, 5, 7), (32, 300, 16)];
        crate::backend::cpu::packed_gemm::check_f32_product(&cases, &matmul_bt);
    }

    #[test]
    fn a_weight_read_error_is_returned() {
        if !available() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2");
            return;
        }
        let read = |_: usize, _: usize, _: &mut dyn FnMut(&[u8]) -> Result<()>| -> Result<()> {
            Err(crate::error::Error::shape("test", "the weight cannot be read"))
        };
        let mut out = vec![0.0f32; 4];
        let result = matmul_bt(&[1.0; 8], 2, 2, 4, (DType::F32, None), &read, &mut out);
        assert!(result.is_err(), "the read error reaches the caller");
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_kernel_gives_the_avx512_bits() {
        if !(has_avx512f() && avx2::available()) {
            eprintln!("skipped: this CPU lacks AVX-512 or AVX2");
            return;
        }
        // Values whose products and sums round; k with no tail, a tail under one half and one over it.
        for k in [1024usize, 1030, 1037, 5] {
            let stride = k.next_multiple_of(LANES);
            let x: Vec<f32> = (0..k).map(|i| ((i as f32) * 0.618).sin()).collect();
            let w: Vec<f32> = (0..J * stride)
                .map(|i| if i % stride < k { ((i as f32) * 0.377).cos() / 3.0 } else { 0.0 })
                .collect();
            let mut wide = [[0.0f32; J]; R];
            let mut narrow = [0.0f32; J];
            // SAFETY: both instruction sets are present (checked above); x holds k values, w J rows of
            // stride ≥ k, zero-padded.
            unsafe {
                kernel::<1>(&x, k, &w, stride, &mut wide);
                kernel_avx2(&x, k, &w, stride, &mut narrow);
            }
            assert_eq!(wide[0], narrow, "k = {k}");
        }
    }
}
