//! The exact integer products of int8 activations and int8 weights (comfy-kitchen's `int8_linear`): every dot of
//! a block of activation rows with a block of weight rows, in i32.
//!
//! With AVX-512 VNNI each `vpdpbusd` multiplies 64 pairs of bytes and adds them in fours into 16 i32 lanes. It
//! takes one side unsigned, so the activations are stored once as x + 128 ([`I8Rows`]) and the product corrected
//! by 128·Σw per weight row: Σ(x + 128)·w − 128·Σw = Σx·w, exactly (|(x + 128)·w| ≤ 255·128 and at most 4·⌈K/64⌉
//! of them meet in a lane, far from overflow for any K a model has). Two activation rows by four weight rows per
//! pass keep eight accumulators in registers and load each byte once for several products. Elsewhere each pair
//! is one [`dot_i8`] (AVX2 or portable).

#![allow(unsafe_code)]

use std::sync::OnceLock;

use super::simd::dot_i8;

/// Whether the CPU has AVX-512 VNNI with the byte loads it needs (checked once).
fn vnni() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Activation rows of `k` int8 values, prepared once for any number of [`dots`] calls: with VNNI also their
/// unsigned image x + 128.
pub(crate) struct I8Rows<'a> {
    x: &'a [i8],
    biased: Option<Vec<u8>>,
    k: usize,
}

impl<'a> I8Rows<'a> {
    /// `x` as rows of `k` values (`k` > 0).
    pub(crate) fn new(x: &'a [i8], k: usize) -> I8Rows<'a> {
        let biased = vnni().then(|| x.iter().map(|&v| (v as u8) ^ 0x80).collect());
        I8Rows { x, biased, k }
    }

    fn rows(&self) -> usize {
        self.x.len() / self.k
    }
}

/// `out[i·n + j] = Σ x[i]·w[j]` for every activation row `i` of `x` and weight row `j` of `w` (`n` rows of the
/// same `k` values), exactly.
pub(crate) fn dots(x: &I8Rows<'_>, w: &[i8], out: &mut [i32]) {
    let (k, m) = (x.k, x.rows());
    let n = w.len() / k;
    assert_eq!(out.len(), m * n, "int8 dots: an output of {m}×{n}");
    #[cfg(target_arch = "x86_64")]
    if let Some(xu) = &x.biased {
        // SAFETY: `biased` is only made when `vnni` found every feature `dots_vnni` is compiled with; the slices
        // hold m·k, n·k and m·n values, which is what it reads and writes.
        unsafe { dots_vnni(xu, w, k, out) };
        return;
    }
    for (i, row) in out.chunks_exact_mut(n.max(1)).enumerate().take(m) {
        let xi = &x.x[i * k..(i + 1) * k];
        for (o, wj) in row.iter_mut().zip(w.chunks_exact(k)) {
            *o = dot_i8(xi, wj);
        }
    }
}

/// [`dots`] with VNNI: `xu` the activations plus 128 (`m` rows), `w` `n` rows, both of `k` bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn dots_vnni(xu: &[u8], w: &[i8], k: usize, out: &mut [i32]) {
    let (m, n) = (xu.len() / k, w.len() / k);
    let wsum: Vec<i32> = w.chunks_exact(k).map(|r| r.iter().map(|&v| i32::from(v)).sum()).collect();
    let (m2, n4) = (m / 2 * 2, n / 4 * 4);
    for i in (0..m2).step_by(2) {
        for j in (0..n4).step_by(4) {
            let b = block::<2, 4>(xu, w, k, i, j);
            for (r, row) in b.iter().enumerate() {
                for (c, &v) in row.iter().enumerate() {
                    out[(i + r) * n + j + c] = v - 128 * wsum[j + c];
                }
            }
        }
        for j in n4..n {
            for r in i..i + 2 {
                out[r * n + j] = block::<1, 1>(xu, w, k, r, j)[0][0] - 128 * wsum[j];
            }
        }
    }
    for i in m2..m {
        for j in 0..n {
            out[i * n + j] = block::<1, 1>(xu, w, k, i, j)[0][0] - 128 * wsum[j];
        }
    }
}

/// Σ xu[i + r]·w[j + c] for `R` activation rows from `i` and `C` weight rows from `j` (unsigned by signed
/// bytes, 64 at a time; the last partial chunk through masked loads, whose zeros add nothing).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
#[inline]
fn block<const R: usize, const C: usize>(
    xu: &[u8],
    w: &[i8],
    k: usize,
    i: usize,
    j: usize,
) -> [[i32; C]; R] {
    use std::arch::x86_64::{
        __m512i, _mm512_dpbusd_epi32, _mm512_loadu_epi8, _mm512_maskz_loadu_epi8,
        _mm512_reduce_add_epi32, _mm512_setzero_si512,
    };
    assert!((i + R) * k <= xu.len() && (j + C) * k <= w.len(), "int8 block out of range");
    let xp: [*const i8; R] = std::array::from_fn(|r| xu[(i + r) * k..].as_ptr().cast::<i8>());
    let wp: [*const i8; C] = std::array::from_fn(|c| w[(j + c) * k..].as_ptr());
    let mut acc = [[_mm512_setzero_si512(); C]; R];
    let whole = k / 64 * 64;
    let mut off = 0;
    while off < whole {
        let a: [__m512i; R] = std::array::from_fn(|r| {
            // SAFETY: off + 64 ≤ k, so the load reads 64 bytes inside row i + r (checked above); unaligned.
            unsafe { _mm512_loadu_epi8(xp[r].add(off)) }
        });
        let b: [__m512i; C] = std::array::from_fn(|c| {
            // SAFETY: as above, inside weight row j + c.
            unsafe { _mm512_loadu_epi8(wp[c].add(off)) }
        });
        for r in 0..R {
            for c in 0..C {
                acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], a[r], b[c]);
            }
        }
        off += 64;
    }
    if whole < k {
        let mask = (1u64 << (k - whole)) - 1;
        let a: [__m512i; R] = std::array::from_fn(|r| {
            // SAFETY: the mask enables the k − whole bytes left in row i + r and suppresses the others, which
            // are neither read nor faulted.
            unsafe { _mm512_maskz_loadu_epi8(mask, xp[r].add(whole)) }
        });
        let b: [__m512i; C] = std::array::from_fn(|c| {
            // SAFETY: as above, for weight row j + c.
            unsafe { _mm512_maskz_loadu_epi8(mask, wp[c].add(whole)) }
        });
        for r in 0..R {
            for c in 0..C {
                acc[r][c] = _mm512_dpbusd_epi32(acc[r][c], a[r], b[c]);
            }
        }
    }
    std::array::from_fn(|r| std::array::from_fn(|c| _mm512_reduce_add_epi32(acc[r][c])))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: usize) -> Vec<i8> {
        (0..n)
            .map(|i| match (i * 7 + seed) % 11 {
                0 => -128,
                1 => 127,
                _ => ((i * 37 + seed * 91) % 256) as u8 as i8,
            })
            .collect()
    }

    #[test]
    fn block_products_are_exact_for_every_shape_and_tail() {
        // Row counts off the 2×4 block, lengths off the 64-byte chunk, the extremes −128 and 127 throughout.
        for (m, n, k) in [
            (1, 1, 1),
            (2, 4, 64),
            (3, 5, 65),
            (5, 9, 127),
            (4, 8, 5120),
            (7, 3, 13824),
            (1, 6, 33),
        ] {
            let (x, w) = (values(m * k, 1), values(n * k, 2));
            let rows = I8Rows::new(&x, k);
            let mut got = vec![0i32; m * n];
            dots(&rows, &w, &mut got);
            for i in 0..m {
                for j in 0..n {
                    let want: i64 = x[i * k..(i + 1) * k]
                        .iter()
                        .zip(&w[j * k..(j + 1) * k])
                        .map(|(&a, &b)| i64::from(a) * i64::from(b))
                        .sum();
                    assert_eq!(i64::from(got[i * n + j]), want, "{m}×{n}×{k} at ({i}, {j})");
                }
            }
        }
    }
}
