//! Vector kernels for the hot elementwise loops (softmax rows, exp-based activations), compiled twice: for
//! AVX2+FMA, chosen at run time when the CPU has them, and for the baseline target.
//!
//! The crate builds for baseline x86-64 (SSE2), so without this a loop of `exp` would run four lanes at a
//! time at best and `mul_add` would call libm. Each kernel is written once as plain Rust over slices, with
//! lane-array accumulators LLVM vectorises; [`multiversion!`] wraps it in a `#[target_feature]` copy and a
//! dispatcher. Invariant: the `unsafe` call of the AVX2 copy happens only after [`avx2_fma`] said yes.

#![allow(unsafe_code)]

use std::sync::OnceLock;

/// Whether the CPU has AVX2 and FMA (checked once).
pub(crate) fn avx2_fma() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Defines `fn $name(args) -> ret` that runs `body` compiled for AVX2+FMA when the CPU has them.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                fn fast($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::backend::cpu::simd::avx2_fma() {
                    // SAFETY: `avx2_fma` checked at run time that this CPU has AVX2 and FMA, the only target
                    // features `fast` was compiled with; it takes and returns plain safe Rust values.
                    return unsafe { fast($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

/// Lanes of the accumulators in reductions (two AVX2 registers).
const LANES: usize = 16;

/// e^x in f32, branch-free so it vectorises: Cephes' polynomial on x − n·ln2, scaled by 2^n through the
/// exponent bits. Relative error about 2e-7; 0 below −87.3 (where e^x leaves the normal range), NaN in, NaN
/// out; inputs above 88.37 give about 2.4e38 rather than infinity.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23: adding it rounds to an integer kept in the low mantissa bits.
    const LO: f32 = -87.336_54;
    const HI: f32 = 88.376_26;
    let xc = x.clamp(LO, HI);
    let t = xc.mul_add(LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = n.mul_add(-LN2_HI, xc);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = 1.987_569_1e-4f32;
    p = p.mul_add(r, 1.398_199_9e-3);
    p = p.mul_add(r, 8.333_452e-3);
    p = p.mul_add(r, 4.166_579_6e-2);
    p = p.mul_add(r, 1.666_666_5e-1);
    p = p.mul_add(r, 0.5);
    let e = p.mul_add(r * r, r) + 1.0;
    let pow2 = f32::from_bits(((t.to_bits() as i32 - 0x4b40_0000 + 127) << 23) as u32);
    let y = e * pow2;
    if x < LO {
        0.0
    } else if x.is_nan() {
        x
    } else {
        y
    }
}

/// The largest value of `v` (−∞ for an empty slice; NaNs are skipped).
#[inline(always)]
fn max_of(v: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    }
    let mut m = tail.iter().fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    for a in acc {
        m = if a > m { a } else { m };
    }
    m
}

/// Replaces each `v[i]` by e^(v[i]·scale − shift) and returns their sum.
#[inline(always)]
fn exp_sum(v: &mut [f32], scale: f32, shift: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = v.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            let e = exp(c[i].mul_add(scale, -shift));
            c[i] = e;
            acc[i] += e;
        }
    }
    let mut s = 0.0;
    for x in chunks.into_remainder() {
        *x = exp(x.mul_add(scale, -shift));
        s += *x;
    }
    s + acc.iter().sum::<f32>()
}

/// Σ a[i]·b[i] of int8 values (over the shorter slice) in exact i32 arithmetic (comfy-kitchen's int8 products):
/// sign-extended to i16 and multiply-added in pairs (`vpmaddwd`) when the CPU has AVX2, in lanes of i32 otherwise.
/// |a[i]·b[i]| ≤ 2¹⁴, so no accumulator overflows below 2¹⁶ terms per lane.
pub(crate) fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: `avx2_fma` checked at run time that this CPU has AVX2, the only target feature `dot_i8_avx2`
        // was compiled with; it takes and returns plain safe Rust values.
        return unsafe { dot_i8_avx2(a, b) };
    }
    dot_i8_lanes(a, b)
}

/// [`dot_i8`] with AVX2: 16 values of each side at a time, widened to i16, multiplied and added in pairs into
/// eight i32 lanes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn dot_i8_avx2(a: &[i8], b: &[i8]) -> i32 {
    use std::arch::x86_64::{
        _mm_loadu_si128, _mm256_add_epi32, _mm256_cvtepi8_epi16, _mm256_madd_epi16,
        _mm256_setzero_si256, _mm256_storeu_si256,
    };
    let len = a.len().min(b.len());
    let whole = len / 16 * 16;
    let mut acc = _mm256_setzero_si256();
    for i in (0..whole).step_by(16) {
        // SAFETY: i + 16 ≤ whole ≤ the length of both slices; the loads are unaligned.
        let (va, vb) = unsafe {
            (_mm_loadu_si128(a.as_ptr().add(i).cast()), _mm_loadu_si128(b.as_ptr().add(i).cast()))
        };
        acc = _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_cvtepi8_epi16(va), _mm256_cvtepi8_epi16(vb)),
        );
    }
    let mut lanes = [0i32; 8];
    // SAFETY: `lanes` holds the eight i32 of one 256-bit register; the store is unaligned.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), acc) };
    lanes.iter().sum::<i32>() + dot_i8_lanes(&a[whole..len], &b[whole..len])
}

/// [`dot_i8`] in plain Rust: pairs of products summed into lanes of i32.
fn dot_i8_lanes(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = [0i32; LANES];
    let (a_chunks, b_chunks) = (a.chunks_exact(2 * LANES), b.chunks_exact(2 * LANES));
    let (a_rest, b_rest) = (a_chunks.remainder(), b_chunks.remainder());
    for (ca, cb) in a_chunks.zip(b_chunks) {
        for l in 0..LANES {
            let (x0, x1) = (i32::from(ca[2 * l]), i32::from(ca[2 * l + 1]));
            let (y0, y1) = (i32::from(cb[2 * l]), i32::from(cb[2 * l + 1]));
            acc[l] += x0 * y0 + x1 * y1;
        }
    }
    let rest: i32 = a_rest.iter().zip(b_rest).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
    acc.iter().sum::<i32>() + rest
}

multiversion! {
    /// One step of an online softmax over a row of scores: with `m` the running maximum of the scaled scores
    /// so far, replaces `row` by e^(row·scale − m') where m' = max(m, max(row)·scale), and returns
    /// (m', Σ e^(..)). A row of −∞ with `m` = −∞ gives zeros and m' = −∞. `scale` must be positive.
    pub(crate) fn online_softmax_step(row: &mut [f32], scale: f32, m: f32) -> (f32, f32) {
        let mx = max_of(row) * scale;
        let m_new = if mx > m { mx } else { m };
        if m_new == f32::NEG_INFINITY {
            row.fill(0.0);
            return (m_new, 0.0);
        }
        let s = exp_sum(row, scale, m_new);
        (m_new, s)
    }
}

multiversion! {
    /// Softmax of each row of `x` (rows of `d`) into `out`.
    pub(crate) fn softmax_rows(x: &[f32], out: &mut [f32], d: usize) {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            or.copy_from_slice(xr);
            let m = max_of(or);
            if m == f32::NEG_INFINITY || m.is_nan() {
                // All −∞ (or NaN): torch gives NaN.
                or.fill(f32::NAN);
                continue;
            }
            let s = exp_sum(or, 1.0, m);
            let inv = 1.0 / s;
            for v in or.iter_mut() {
                *v *= inv;
            }
        }
    }
}

multiversion! {
    /// `v[i] *= a` for every i.
    pub(crate) fn scale(v: &mut [f32], a: f32) {
        for x in v.iter_mut() {
            *x *= a;
        }
    }
}

multiversion! {
    /// x·sigmoid(x) for each element of `x` into `out`.
    pub(crate) fn silu(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = v / (1.0 + exp(-v));
        }
    }
}

multiversion! {
    /// sigmoid(x) for each element of `x` into `out`.
    pub(crate) fn sigmoid(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = 1.0 / (1.0 + exp(-v));
        }
    }
}

multiversion! {
    /// e^x for each element of `x` into `out`.
    pub(crate) fn exp_slice(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = exp(v);
        }
    }
}

multiversion! {
    /// GELU with the tanh approximation, for each element of `x` into `out`, as x·sigmoid(2u) (which equals
    /// x·(1 + tanh u)/2 without its cancellation for large negative x).
    pub(crate) fn gelu_tanh(x: &[f32], out: &mut [f32]) {
        const C: f32 = 0.797_884_6; // sqrt(2/π)
        for (o, &v) in out.iter_mut().zip(x) {
            let u = C * v.mul_add(0.044_715 * v * v, v);
            *o = v / (1.0 + exp(-2.0 * u));
        }
    }
}

multiversion! {
    /// GELU with erf, for each element of `x` into `out`.
    pub(crate) fn gelu_erf(x: &[f32], out: &mut [f32]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = 0.5 * v * (1.0 + erf(v * std::f32::consts::FRAC_1_SQRT_2));
        }
    }
}

/// erf(x) to about 2e-7: erf's Taylor series for |x| < 0.5 (accurate relative to x near 0) and 1 − erfc
/// beyond, with Numerical Recipes' Chebyshev fit of erfc (`erfcc`, 1.2e-7 relative).
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    let a = x.abs();
    // Taylor: 2/√π · (x − x³/3 + x⁵/10 − x⁷/42 + x⁹/216 − x¹¹/1320).
    let x2 = x * x;
    let mut s = -1.0f32 / 1320.0;
    s = s.mul_add(x2, 1.0 / 216.0);
    s = s.mul_add(x2, -1.0 / 42.0);
    s = s.mul_add(x2, 1.0 / 10.0);
    s = s.mul_add(x2, -1.0 / 3.0);
    s = s.mul_add(x2, 1.0);
    let small = std::f32::consts::FRAC_2_SQRT_PI * x * s;
    let t = 1.0 / (0.5f32).mul_add(a, 1.0);
    let mut p = 0.170_872_77f32;
    p = p.mul_add(t, -0.822_152_23);
    p = p.mul_add(t, 1.488_515_9);
    p = p.mul_add(t, -1.135_204);
    p = p.mul_add(t, 0.278_868_07);
    p = p.mul_add(t, -0.186_288_06);
    p = p.mul_add(t, 0.096_784_18);
    p = p.mul_add(t, 0.374_091_96);
    p = p.mul_add(t, 1.000_023_7);
    p = p.mul_add(t, -1.265_512_2);
    let erfc = t * exp(p - a * a);
    let large = (1.0 - erfc).copysign(x);
    if a < 0.5 { small } else { large }
}

multiversion! {
    /// f32 values rounded to bf16 (`dst[i]` the bits of `src[i]`), as `half::bf16::from_f32` rounds: to nearest
    /// even, NaNs kept NaN (quiet), branch-free so it runs eight lanes at a time.
    pub(crate) fn narrow_bf16(src: &[f32], dst: &mut [half::bf16]) {
        for (d, &v) in dst.iter_mut().zip(src) {
            let x = v.to_bits();
            let rounded = x.wrapping_add(0x7fff + ((x >> 16) & 1)) >> 16;
            let quiet = (x >> 16) | 0x40;
            let bits = if x & 0x7fff_ffff > 0x7f80_0000 { quiet } else { rounded };
            *d = half::bf16::from_bits(bits as u16);
        }
    }
}

multiversion! {
    /// bf16 values widened to f32 as `half::bf16::to_f32` widens them: the bits shifted into the high half,
    /// a signalling NaN made quiet.
    pub(crate) fn widen_bf16(src: &[half::bf16], dst: &mut [f32]) {
        for (d, &h) in dst.iter_mut().zip(src) {
            let x = u32::from(h.to_bits());
            let quiet = if x & 0x7fff > 0x7f80 { 0x40 } else { 0 };
            *d = f32::from_bits((x | quiet) << 16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn int8_dots_are_exact_at_any_length() {
        // The extremes (−128·−128 and 127·−128) at every length around the lane width, and a long mixed row.
        for n in [0, 1, 15, 16, 17, 33, 5120, 13824] {
            let a: Vec<i8> = (0..n)
                .map(|i| if i % 3 == 0 { -128 } else { ((i * 37) % 256) as u8 as i8 })
                .collect();
            let b: Vec<i8> = (0..n)
                .map(|i| if i % 5 == 0 { -128 } else { ((i * 91 + 7) % 256) as u8 as i8 })
                .collect();
            let want: i64 = a.iter().zip(&b).map(|(&x, &y)| i64::from(x) * i64::from(y)).sum();
            assert_eq!(i64::from(dot_i8(&a, &b)), want, "length {n}");
            assert_eq!(i64::from(dot_i8_lanes(&a, &b)), want, "length {n}, portable");
        }
    }

    #[test]
    fn exp_matches_std_to_a_few_ulp() {
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            assert!(((got - want) / want).abs() < 4e-7, "exp({x}) = {got}, want {want}");
            x += 0.0137;
        }
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(-100.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
    }

    #[test]
    fn erf_is_accurate_across_the_range() {
        // Reference: erf by its Taylor series in f64 (exact enough for |x| <= 4) and 1 beyond.
        fn erf64(x: f64) -> f64 {
            if x.abs() > 4.0 {
                return x.signum();
            }
            let (mut term, mut sum, mut n) = (x, x, 0.0f64);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -x * x / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        }
        let mut x = -5.0f32;
        while x < 5.0 {
            let got = f64::from(erf(x));
            assert!((got - erf64(f64::from(x))).abs() < 3e-7, "erf({x}) = {got}");
            x += 0.00731;
        }
    }

    #[test]
    fn online_softmax_step_tracks_the_maximum() {
        let mut row = vec![1.0f32, 3.0, 2.0];
        let (m, s) = online_softmax_step(&mut row, 2.0, 1.0);
        assert_eq!(m, 6.0);
        let want: Vec<f32> = [2.0f32 - 6.0, 0.0, -2.0].iter().map(|v| v.exp()).collect();
        for (g, w) in row.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6);
        }
        assert!((s - want.iter().sum::<f32>()).abs() < 1e-6);
        let mut masked = vec![f32::NEG_INFINITY; 4];
        assert_eq!(
            online_softmax_step(&mut masked, 1.0, f32::NEG_INFINITY),
            (f32::NEG_INFINITY, 0.0)
        );
        assert_eq!(masked, vec![0.0; 4]);
    }

    #[test]
    fn bf16_narrowing_and_widening_give_halfs_bits() {
        // Every sign and exponent with mantissas that probe each rounding case, plus the specials.
        let mut values: Vec<f32> =
            [0u32, 1, 0x7fff, 0x8000, 0x8001, 0x1_7fff, 0x1_8000, 0x7f_ffff, 0x40_0001]
                .iter()
                .flat_map(|&m| (0..512u32).map(move |se| f32::from_bits((se << 23) | m)))
                .collect();
        values.extend([
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::MAX,
            f32::MIN_POSITIVE,
        ]);
        values.push(f32::from_bits(0x7f80_0001)); // a signalling NaN
        let mut narrow = vec![half::bf16::ZERO; values.len()];
        narrow_bf16(&values, &mut narrow);
        for (v, got) in values.iter().zip(&narrow) {
            assert_eq!(
                got.to_bits(),
                half::bf16::from_f32(*v).to_bits(),
                "{v:e} ({:#x})",
                v.to_bits()
            );
        }
        // Every bf16, signalling NaNs (0x7f81, 0xff81) among them.
        let every: Vec<half::bf16> = (0..=u16::MAX).map(half::bf16::from_bits).collect();
        let mut wide = vec![0.0f32; every.len()];
        widen_bf16(&every, &mut wide);
        for (h, got) in every.iter().zip(&wide) {
            assert_eq!(got.to_bits(), h.to_f32().to_bits(), "{:#x}", h.to_bits());
        }
    }
}
