//! The AVX2 forms of the packed product's pieces ([`super::packed_gemm`]), for x86-64 CPUs without AVX-512
//! (AMD Zen 2 and 3, Intel's desktop cores): the f32 micro-kernel, the 16 × 16 transpose that packs a panel
//! and the widening of f16 and fp8 weights with F16C.
//!
//! Each computes bit for bit what its AVX-512 twin computes: the micro-kernel runs the same fused multiply-add
//! chain for every output (one accumulator per output, inputs in order), only eight lanes at a time, and the
//! conversions are exact. So a product gives the same bits on either kind of CPU.
//!
//! Invariant: the functions marked `target_feature` run only after [`available`] said the CPU has AVX2, FMA
//! and F16C, and every pointer a kernel reads is derived from a slice whose length was checked against the
//! indices it covers.

#![allow(unsafe_code)]

use std::sync::OnceLock;

#[cfg(target_arch = "x86_64")]
use super::packed_gemm::{MR, NR};

/// Whether this CPU has AVX2, FMA and F16C (checked once).
pub(super) fn available() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    #[cfg(target_arch = "x86_64")]
    return *HAS.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
    });
    #[cfg(not(target_arch = "x86_64"))]
    return *HAS.get_or_init(|| false);
}

/// The f32 micro-kernel: `tile[r][j] = Σ_s a[r·lda + s] · panel[s·NR + j]` for `R` rows, as
/// `packed_gemm`'s AVX-512 kernel computes it. The 64 columns of a panel go in four passes of 16 (two ymm
/// accumulators a row, twelve for six rows), each pass reading one cache line of the panel per step.
///
/// # Safety
/// [`available`] is true; `a.len() ≥ (R − 1)·lda + steps`; `panel.len() ≥ steps · NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn f32_kernel<const R: usize>(
    a: &[f32],
    lda: usize,
    panel: &[f32],
    steps: usize,
    tile: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(R <= MR && a.len() >= (R - 1) * lda + steps && panel.len() >= steps * NR);
    let (a, b) = (a.as_ptr(), panel.as_ptr());
    for pass in 0..NR / 16 {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for p in 0..steps {
            // SAFETY: p < steps and 16·pass + 16 ≤ NR, so both loads lie in panel[p·NR..(p + 1)·NR]; the x
            // reads are at r·lda + p, inside row r of a (asserted above). Loads are unaligned.
            unsafe {
                let bp = b.add(p * NR + 16 * pass);
                let bv = [_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8))];
                for (r, acc_r) in acc.iter_mut().enumerate() {
                    let av = _mm256_set1_ps(*a.add(r * lda + p));
                    acc_r[0] = _mm256_fmadd_ps(av, bv[0], acc_r[0]);
                    acc_r[1] = _mm256_fmadd_ps(av, bv[1], acc_r[1]);
                }
            }
        }
        for (trow, acc_r) in tile.iter_mut().zip(&acc) {
            for (half, &v) in acc_r.iter().enumerate() {
                // SAFETY: 16·pass + 8·half + 8 ≤ NR, inside the tile row.
                unsafe { _mm256_storeu_ps(trow.as_mut_ptr().add(16 * pass + 8 * half), v) };
            }
        }
    }
}

/// `dst[s·stride + i] = rows[i][s]` for i, s < 16, as four 8 × 8 register transposes.
///
/// # Safety
/// [`available`] is true; each row holds at least 16 values; `dst.len() ≥ 15·stride + 16`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose16_f32(rows: [&[f32]; 16], dst: &mut [f32], stride: usize) {
    use std::arch::x86_64::*;
    assert!(rows.iter().all(|r| r.len() >= 16) && dst.len() >= 15 * stride + 16);
    for (i0, s0) in [(0, 0), (0, 8), (8, 0), (8, 8)] {
        // SAFETY: rows i0..i0 + 8 hold values s0..s0 + 8 (16 each, asserted); unaligned loads.
        let r: [__m256; 8] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(rows[i0 + i].as_ptr().add(s0)) });
        for (c, column) in transpose8(r).into_iter().enumerate() {
            // SAFETY: row s0 + c of dst (< 16) holds columns i0..i0 + 8 (asserted).
            unsafe { _mm256_storeu_ps(dst.as_mut_ptr().add((s0 + c) * stride + i0), column) };
        }
    }
}

/// Eight rows of eight f32 transposed in registers: `out[c]` holds value c of row i in lane i.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
pub(super) fn transpose8(r: [std::arch::x86_64::__m256; 8]) -> [std::arch::x86_64::__m256; 8] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then pairs of pairs: t[4g + c] holds columns c and c + 4 of rows 4g..4g + 4 in
    // its two 128-bit halves.
    let u = [
        _mm256_unpacklo_ps(r[0], r[1]),
        _mm256_unpackhi_ps(r[0], r[1]),
        _mm256_unpacklo_ps(r[2], r[3]),
        _mm256_unpackhi_ps(r[2], r[3]),
        _mm256_unpacklo_ps(r[4], r[5]),
        _mm256_unpackhi_ps(r[4], r[5]),
        _mm256_unpacklo_ps(r[6], r[7]),
        _mm256_unpackhi_ps(r[6], r[7]),
    ];
    let t = [
        _mm256_shuffle_ps::<0x44>(u[0], u[2]),
        _mm256_shuffle_ps::<0xee>(u[0], u[2]),
        _mm256_shuffle_ps::<0x44>(u[1], u[3]),
        _mm256_shuffle_ps::<0xee>(u[1], u[3]),
        _mm256_shuffle_ps::<0x44>(u[4], u[6]),
        _mm256_shuffle_ps::<0xee>(u[4], u[6]),
        _mm256_shuffle_ps::<0x44>(u[5], u[7]),
        _mm256_shuffle_ps::<0xee>(u[5], u[7]),
    ];
    std::array::from_fn(|c| {
        let (lo, hi) = (t[c % 4], t[4 + c % 4]);
        if c < 4 {
            _mm256_permute2f128_ps::<0x20>(lo, hi)
        } else {
            _mm256_permute2f128_ps::<0x31>(lo, hi)
        }
    })
}

/// f16 values widened 8 at a time by F16C (`out.len()` a multiple of 8, `bytes` at least twice as long),
/// times `scale` if given: `packed_gemm`'s `f16_wide` in eight lanes.
///
/// # Safety
/// [`available`] is true.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn f16_wide(bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
    use std::arch::x86_64::*;
    assert!(out.len().is_multiple_of(8) && bytes.len() >= 2 * out.len(), "f16_wide: lengths");
    let factor = _mm256_set1_ps(scale.unwrap_or(1.0));
    for (src, dst) in bytes.chunks_exact(16).zip(out.chunks_exact_mut(8)) {
        // SAFETY: `src` holds 16 bytes (8 f16) and `dst` 8 f32s (chunks_exact); unaligned loads and stores.
        unsafe {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().cast()));
            let v = if scale.is_some() { _mm256_mul_ps(v, factor) } else { v };
            _mm256_storeu_ps(dst.as_mut_ptr(), v);
        }
    }
}

/// fp8 e4m3fn bytes widened 8 at a time (`out.len()` a multiple of 8, `bytes` at least as long), times `scale`
/// if given: `packed_gemm`'s `e4m3_via_f16` in eight lanes (the magnitude bits shifted into an f16 of the
/// value / 256, converted, times 256 · scale; 0x7f and 0xff become NaN).
///
/// # Safety
/// [`available`] is true.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,f16c")]
pub(super) unsafe fn e4m3_via_f16(bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
    use std::arch::x86_64::*;
    assert!(out.len().is_multiple_of(8) && bytes.len() >= out.len(), "e4m3_via_f16: lengths");
    let factor = _mm256_set1_ps(256.0 * scale.unwrap_or(1.0));
    let (low7, sign) = (_mm_set1_epi16(0x7f), _mm_set1_epi16(0x80));
    let nan = _mm256_set1_ps(f32::NAN);
    for (src, dst) in bytes.chunks_exact(8).zip(out.chunks_exact_mut(8)) {
        // SAFETY: `src` holds 8 bytes (one 64-bit load) and `dst` 8 f32s (chunks_exact); unaligned.
        unsafe {
            let b = _mm_cvtepu8_epi16(_mm_loadl_epi64(src.as_ptr().cast()));
            let magnitude = _mm_and_si128(b, low7);
            let half = _mm_or_si128(
                _mm_slli_epi16::<7>(magnitude),
                _mm_slli_epi16::<8>(_mm_and_si128(b, sign)),
            );
            let v = _mm256_mul_ps(_mm256_cvtph_ps(half), factor);
            let is_nan = _mm256_cvtepi16_epi32(_mm_cmpeq_epi16(magnitude, low7));
            _mm256_storeu_ps(
                dst.as_mut_ptr(),
                _mm256_blendv_ps(v, nan, _mm256_castsi256_ps(is_nan)),
            );
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn the_micro_kernel_matches_loops_for_every_row_count() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
            return;
        }
        let (lda, steps) = (37, 29);
        let a: Vec<f32> = (0..MR * lda).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
        let panel: Vec<f32> = (0..steps * NR).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
        for rows in 1..=MR {
            let mut tile = [[f32::NAN; NR]; MR];
            // SAFETY: `available()`; a holds MR rows of lda ≥ steps values, panel steps·NR.
            unsafe {
                match rows {
                    1 => f32_kernel::<1>(&a, lda, &panel, steps, &mut tile),
                    2 => f32_kernel::<2>(&a, lda, &panel, steps, &mut tile),
                    3 => f32_kernel::<3>(&a, lda, &panel, steps, &mut tile),
                    4 => f32_kernel::<4>(&a, lda, &panel, steps, &mut tile),
                    5 => f32_kernel::<5>(&a, lda, &panel, steps, &mut tile),
                    _ => f32_kernel::<6>(&a, lda, &panel, steps, &mut tile),
                }
            }
            for (r, trow) in tile.iter().enumerate().take(rows) {
                for (j, &got) in trow.iter().enumerate() {
                    // Small values over powers of two: every partial sum is exact, in any order.
                    let want: f32 = (0..steps).map(|s| a[r * lda + s] * panel[s * NR + j]).sum();
                    assert_eq!(got, want, "{rows} rows, at ({r}, {j})");
                }
            }
        }
    }

    #[test]
    fn transpose16_transposes() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
            return;
        }
        let src: Vec<Vec<f32>> =
            (0..16).map(|i| (0..20).map(|s| (i * 100 + s) as f32).collect()).collect();
        let mut dst = vec![0.0f32; 15 * 21 + 16];
        // SAFETY: `available()`; rows of 20 values, dst of 15·21 + 16.
        unsafe { transpose16_f32(std::array::from_fn(|i| &src[i][..]), &mut dst, 21) };
        for s in 0..16 {
            for i in 0..16 {
                assert_eq!(dst[s * 21 + i], (i * 100 + s) as f32, "row {s}, column {i}");
            }
        }
    }

    #[test]
    fn f16_and_fp8_widen_to_exactly_the_scalar_values() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX2, FMA and F16C");
            return;
        }
        // Every f16 bit pattern (subnormals, infinities and NaNs included) and every e4m3 byte.
        let halves: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
        let bytes: Vec<u8> = (0..=255u8).collect();
        for scale in [None, Some(0.37f32), Some(3.0e-3)] {
            let mut fast = vec![0.0f32; halves.len() / 2];
            // SAFETY: `available()`.
            unsafe { f16_wide(&halves, &mut fast, scale) };
            for (h, &got) in halves.chunks(2).zip(&fast) {
                let h = u16::from_le_bytes([h[0], h[1]]);
                let want = half::f16::from_bits(h).to_f32() * scale.unwrap_or(1.0);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "f16 {h:#06x} scale {scale:?}: {got} != {want}"
                );
            }
            let mut fast = vec![0.0f32; bytes.len()];
            // SAFETY: `available()`.
            unsafe { e4m3_via_f16(&bytes, &mut fast, scale) };
            for (&b, &got) in bytes.iter().zip(&fast) {
                let want = crate::dtype::f8e4m3_to_f32(b) * scale.unwrap_or(1.0);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "byte {b:#04x} scale {scale:?}: {got} != {want}"
                );
            }
        }
    }
}
