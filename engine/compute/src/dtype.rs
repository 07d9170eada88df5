//! Element types: what weights are stored as (f32, f16, bf16, fp8 e4m3fn/e5m2, and the int8 and packed 4-bit
//! bytes of ComfyUI's quantized formats) and what activations are computed in (f32, f16, bf16), with the exact
//! conversions between them.
//!
//! Conversions are little-endian byte slices in and out, because that is how safetensors files, the pinned
//! host pool and device pages hold them. Narrowing rounds to nearest, ties to even, as torch's casts do.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

/// An element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE binary32.
    F32,
    /// IEEE binary16.
    F16,
    /// bfloat16 (the top half of an f32).
    BF16,
    /// fp8 e4m3fn: 4 exponent bits (bias 7), 3 mantissa bits, no infinities, max 448 (torch `float8_e4m3fn`).
    F8E4M3,
    /// fp8 e5m2: 5 exponent bits (bias 15), 2 mantissa bits, the top byte of an f16 (torch `float8_e5m2`).
    F8E5M2,
    /// Signed 8-bit integers: the weights of ComfyUI's `int8_tensorwise` format (storage only; widened, an
    /// element is its integer value).
    I8,
    /// Unsigned bytes: the packed 4-bit codes of ComfyUI's NVFP4 format (storage only; widened, an element is
    /// the byte's value, which only [`crate::quant`] decodes).
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::F8E4M3 | DType::F8E5M2 | DType::I8 | DType::U8 => 1,
        }
    }

    /// The name safetensors and torch use (`F32`, `BF16`, `F8_E4M3`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::F8E5M2 => "F8_E5M2",
            DType::I8 => "I8",
            DType::U8 => "U8",
        }
    }

    /// The largest finite value of this type.
    pub fn max_finite(self) -> f32 {
        match self {
            DType::F32 => f32::MAX,
            DType::F16 => f16::MAX.to_f32(),
            DType::BF16 => bf16::MAX.to_f32(),
            DType::F8E4M3 => 448.0,
            DType::F8E5M2 => 57344.0,
            DType::I8 => 127.0,
            DType::U8 => 255.0,
        }
    }

    /// Whether activations may be held in this type (fp8 and the integer types are storage only).
    pub fn is_compute(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// The element type of a safetensors tensor, or `None` for types Kiln does not compute with.
    pub fn from_safetensors(dtype: safetensors::Dtype) -> Option<DType> {
        match dtype {
            safetensors::Dtype::F32 => Some(DType::F32),
            safetensors::Dtype::F16 => Some(DType::F16),
            safetensors::Dtype::BF16 => Some(DType::BF16),
            safetensors::Dtype::F8_E4M3 => Some(DType::F8E4M3),
            safetensors::Dtype::F8_E5M2 => Some(DType::F8E5M2),
            safetensors::Dtype::I8 => Some(DType::I8),
            safetensors::Dtype::U8 => Some(DType::U8),
            _ => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Widens `bytes` (elements of `dtype`, little-endian) into `out`; `out.len()` elements are read.
///
/// # Panics
/// If `bytes` is shorter than `out.len()` elements.
pub fn widen_into(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    widen_into_inline(dtype, bytes, out);
}

/// [`widen_into`], inlined into its caller, so that a caller compiled for wider vectors (the CPU backend's
/// AVX-512 packing) gets this loop compiled for them too.
#[inline(always)]
pub(crate) fn widen_into_inline(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    let n = out.len();
    assert!(
        bytes.len() >= n * dtype.size(),
        "widen_into: {} bytes hold fewer than {n} {dtype} values",
        bytes.len()
    );
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        // In chunks: `half` converts a slice with the hardware instruction where the CPU has it (F16C) after one
        // feature check, where value by value it checked for every value and could not vectorise.
        DType::F16 => {
            let mut halves = [f16::ZERO; 64];
            for (o, c) in out.chunks_mut(64).zip(bytes.chunks(128)) {
                let h = &mut halves[..o.len()];
                for (v, b) in h.iter_mut().zip(c.chunks_exact(2)) {
                    *v = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
                h.convert_to_f32_slice(o);
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
            }
        }
        // Branch-free bit moves (below) that the compiler vectorises: the weights of an fp8 model are widened
        // at every use on the CPU, so this loop is the product's packing step.
        DType::F8E4M3 => {
            for (o, &b) in out.iter_mut().zip(bytes) {
                *o = e4m3_bits_to_f32(b);
            }
        }
        DType::F8E5M2 => {
            for (o, &b) in out.iter_mut().zip(bytes) {
                *o = e5m2_bits_to_f32(b);
            }
        }
        DType::I8 => {
            for (o, &b) in out.iter_mut().zip(bytes) {
                *o = f32::from(b as i8);
            }
        }
        DType::U8 => {
            for (o, &b) in out.iter_mut().zip(bytes) {
                *o = f32::from(b);
            }
        }
    }
}

/// Widens a whole byte slice of `dtype` elements into a new vector.
pub fn widen(dtype: DType, bytes: &[u8]) -> Vec<f32> {
    let mut out = vec![0.0; bytes.len() / dtype.size()];
    widen_into(dtype, bytes, &mut out);
    out
}

/// Narrows `values` into `dtype` elements (little-endian), rounding to nearest even.
pub fn narrow(dtype: DType, values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * dtype.size());
    match dtype {
        DType::F32 => values.iter().for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DType::F16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&f16::from_f32(*v).to_bits().to_le_bytes())),
        DType::BF16 => values
            .iter()
            .for_each(|v| out.extend_from_slice(&bf16::from_f32(*v).to_bits().to_le_bytes())),
        DType::F8E4M3 => out.extend(values.iter().map(|&v| f32_to_f8e4m3(v))),
        DType::F8E5M2 => out.extend(values.iter().map(|&v| f32_to_f8e5m2(v))),
        DType::I8 => {
            out.extend(values.iter().map(|&v| round_half_even(v).clamp(-128.0, 127.0) as i8 as u8))
        }
        DType::U8 => out.extend(values.iter().map(|&v| round_half_even(v).clamp(0.0, 255.0) as u8)),
    }
    out
}

/// Rounds `v` to the nearest value `dtype` can hold (what a cast to `dtype` and back gives).
pub fn round_to(dtype: DType, v: f32) -> f32 {
    match dtype {
        DType::F32 => v,
        DType::F16 => f16::from_f32(v).to_f32(),
        DType::BF16 => bf16::from_f32(v).to_f32(),
        DType::F8E4M3 => f8e4m3_to_f32(f32_to_f8e4m3(v)),
        DType::F8E5M2 => f16::from_bits(u16::from(f32_to_f8e5m2(v)) << 8).to_f32(),
        DType::I8 => round_half_even(v).clamp(-128.0, 127.0),
        DType::U8 => round_half_even(v).clamp(0.0, 255.0),
    }
}

/// [`f8e4m3_to_f32`] without branches, so the compiler vectorises it: a normal value's exponent and mantissa
/// bits moved into an f32's with the exponent rebiased by an integer add (7 → 127), a subnormal one
/// (exponent 0) as its mantissa times 2^-9. Both are exact. (Moving a subnormal's bits into an f32 subnormal
/// and multiplying by 2^120 is exact too, but every f32 subnormal operand costs a microcode assist, and a
/// good part of a model's fp8 weights are fp8 subnormals.)
#[inline(always)]
pub(crate) fn e4m3_bits_to_f32(b: u8) -> f32 {
    let b = u32::from(b);
    let normal = f32::from_bits(((b & 0x7f) << 20) + ((127 - 7) << 23));
    let subnormal = (b & 0x07) as f32 * f32::from_bits((127 - 9) << 23);
    let magnitude = if b & 0x78 == 0 { subnormal } else { normal };
    let signed = f32::from_bits(magnitude.to_bits() | ((b & 0x80) << 24));
    if b & 0x7f == 0x7f { f32::NAN } else { signed }
}

/// An fp8 e5m2 byte as f32 without branches, as [`e4m3_bits_to_f32`] (e5m2 is the top byte of an f16:
/// exponent bias 15, subnormals the mantissa times 2^-16, infinities at exponent 31 with a zero mantissa and
/// NaN with any other).
#[inline(always)]
pub(crate) fn e5m2_bits_to_f32(b: u8) -> f32 {
    let b = u32::from(b);
    let normal = f32::from_bits(((b & 0x7f) << 21) + ((127 - 15) << 23));
    let subnormal = (b & 0x03) as f32 * f32::from_bits((127 - 16) << 23);
    let special = if b & 0x03 == 0 { f32::INFINITY } else { f32::NAN };
    let magnitude = if b & 0x7c == 0 { subnormal } else { normal };
    let magnitude = if b & 0x7c == 0x7c { special } else { magnitude };
    f32::from_bits(magnitude.to_bits() | ((b & 0x80) << 24))
}

/// An fp8 e4m3fn byte as f32 (0x7f and 0xff are NaN; there are no infinities).
pub fn f8e4m3_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && b & 0x07 == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// f32 to fp8 e4m3fn, round to nearest even, saturating to ±448 (torch saturates only with `saturate=True`;
/// finite weights never exceed the range, and saturation keeps an out-of-range value finite). NaN stays NaN.
pub fn f32_to_f8e4m3(v: f32) -> u8 {
    let bits = v.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return 0x7f;
    }
    if a >= 0x43e0_0000 {
        // |v| >= 448 (infinity included): saturate.
        return sign | 0x7e;
    }
    if a < 0x3c80_0000 {
        // Below the smallest normal, 2^-6: multiples of 2^-9, 0 ..= 8 of them (8 is the smallest normal). The
        // product is exact (a power-of-two scaling of a value this small).
        return sign | (f32::from_bits(a) * 512.0).round_ties_even() as u8;
    }
    // A normal: keep 3 of f32's 23 mantissa bits, rounding the dropped 20 to nearest even (a carry moves into
    // the exponent, as it should); the exponent's bias goes from 127 to 7. Below 448 the result is at most 0x7e.
    let rounded = (a + 0x7_ffff + ((a >> 20) & 1)) >> 20;
    sign | (rounded - (120 << 3)) as u8
}

/// f32 to fp8 e5m2 (the top byte of an f16, rounded to nearest even on the dropped byte).
pub fn f32_to_f8e5m2(v: f32) -> u8 {
    let h = f16::from_f32(v).to_bits();
    if f16::from_bits(h).is_nan() {
        return ((h >> 8) as u8) | 0x02;
    }
    let lower = h & 0xff;
    let mut upper = h >> 8;
    if lower > 0x80 || (lower == 0x80 && upper & 1 == 1) {
        upper += 1;
    }
    upper as u8
}

/// `x` rounded to the nearest integer, ties to even (torch's `round`).
pub fn round_half_even(x: f32) -> f32 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 { r - x.signum() } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e4m3_round_trips_every_finite_byte() {
        for b in 0u8..=255 {
            let v = f8e4m3_to_f32(b);
            if v.is_nan() {
                assert!(b & 0x7f == 0x7f);
                continue;
            }
            let back = f32_to_f8e4m3(v);
            // +0 and -0 are distinct bytes with equal values.
            assert_eq!(f8e4m3_to_f32(back), v, "byte {b:#04x} = {v}");
        }
        assert_eq!(f8e4m3_to_f32(0x7e), 448.0);
        assert_eq!(f8e4m3_to_f32(0x01), 2f32.powi(-9));
    }

    #[test]
    fn e4m3_rounds_to_nearest_even() {
        // 1.0625 lies halfway between 1.0 (mantissa 0) and 1.125 (mantissa 1): ties go to the even mantissa.
        assert_eq!(f8e4m3_to_f32(f32_to_f8e4m3(1.0625)), 1.0);
        assert_eq!(f8e4m3_to_f32(f32_to_f8e4m3(1.1875)), 1.25);
        assert_eq!(f8e4m3_to_f32(f32_to_f8e4m3(1000.0)), 448.0);
        assert_eq!(f8e4m3_to_f32(f32_to_f8e4m3(-0.3)), -0.3125);
    }

    /// The nearest e4m3fn value by search over every finite byte (ties to the even mantissa, saturating).
    fn nearest_e4m3(v: f32) -> u8 {
        if v.is_nan() {
            return 0x7f;
        }
        let sign = if v.is_sign_negative() { 0x80 } else { 0 };
        let a = f64::from(v.abs());
        let mut best = 0u8;
        for b in 1u8..=0x7e {
            let (d, db) = (
                (f64::from(f8e4m3_to_f32(b)) - a).abs(),
                (f64::from(f8e4m3_to_f32(best)) - a).abs(),
            );
            if d < db || (d == db && b % 2 == 0) {
                best = b;
            }
        }
        sign | best
    }

    #[test]
    fn e4m3_is_the_nearest_value_for_every_kind_of_f32() {
        // A stride through every bit pattern, then each midpoint between neighbouring values and one ulp either
        // side of it, and the edges.
        let mut values: Vec<f32> =
            (0..u32::MAX / 65_521).map(|i| f32::from_bits(i * 65_521)).collect();
        for b in 0u8..0x7e {
            let mid = (f8e4m3_to_f32(b) + f8e4m3_to_f32(b + 1)) / 2.0;
            for m in [mid, mid.next_down(), mid.next_up()] {
                values.extend([m, -m]);
            }
        }
        values.extend([
            0.0,
            -0.0,
            448.0,
            464.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MIN_POSITIVE,
        ]);
        for v in values {
            assert_eq!(f32_to_f8e4m3(v), nearest_e4m3(v), "{v:e} ({:#010x})", v.to_bits());
        }
    }

    #[test]
    fn e5m2_is_the_top_byte_of_f16() {
        for b in 0u8..=255 {
            let v = f16::from_bits(u16::from(b) << 8).to_f32();
            if v.is_nan() {
                continue;
            }
            assert_eq!(f32_to_f8e5m2(v), b);
        }
        assert_eq!(round_to(DType::F8E5M2, 1.1), 1.0);
        assert_eq!(round_to(DType::F8E5M2, 1.2), 1.25);
    }

    #[test]
    fn fp8_widening_gives_every_byte_its_exact_value() {
        let bytes: Vec<u8> = (0u8..=255).collect();
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        for (b, v) in bytes.iter().zip(widen(DType::F8E4M3, &bytes)) {
            assert!(same(v, f8e4m3_to_f32(*b)), "e4m3 byte {b:#04x}: {v}");
        }
        for (b, v) in bytes.iter().zip(widen(DType::F8E5M2, &bytes)) {
            let f16_value = f16::from_bits(u16::from(*b) << 8).to_f32();
            assert!(same(v, f16_value), "e5m2 byte {b:#04x}: {v} is not {f16_value}");
        }
    }

    #[test]
    fn f16_widening_gives_every_value_its_exact_f32() {
        // Every bit pattern, from bytes longer than the values read and over a partial last chunk.
        let halves: Vec<u16> = (0..=u16::MAX).collect();
        let mut bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        bytes.extend([0xff; 6]);
        let mut out = vec![0.0f32; halves.len() - 5];
        widen_into(DType::F16, &bytes, &mut out);
        for (&h, &v) in halves.iter().zip(&out) {
            let want = f16::from_bits(h).to_f32();
            assert!(
                v.to_bits() == want.to_bits() || (v.is_nan() && want.is_nan()),
                "f16 {h:#06x}: {v}"
            );
        }
    }

    #[test]
    fn widen_and_narrow_are_inverse_on_representable_values() {
        let values = [0.0f32, 1.0, -2.5, 0.15625, 96.0, -448.0];
        for dtype in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2] {
            let bytes = narrow(dtype, &values);
            assert_eq!(bytes.len(), values.len() * dtype.size());
            assert_eq!(widen(dtype, &bytes), values, "{dtype}");
        }
    }

    #[test]
    fn bf16_narrowing_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values; the tie goes to the even one (1.0).
        assert_eq!(round_to(DType::BF16, 1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(round_to(DType::BF16, 1.0 + 3.0 * 2f32.powi(-8)), 1.0 + 2f32.powi(-6));
    }
}
