//! Writing a tensor into device memory as any dtype, fp8 included, rounded to nearest even or stochastically
//! (the in-place LoRA write-back).
//!
//! Stochastic rounding picks, for a value v between two neighbours lo < |v| < hi of the target type, hi with
//! probability (|v| − lo)/(hi − lo), so the expected stored value is v. The uniform draw is a hash of the
//! seed and the element's index: the same seed stores the same bytes, whatever the thread count.

use half::{bf16, f16};
use rayon::prelude::*;

use super::Cpu;
use super::storage::read_f32;
use crate::dtype::{DType, f8e4m3_to_f32, f32_to_f8e4m3, f32_to_f8e5m2};
use crate::error::Result;
use crate::memory::DevPtr;
use crate::tensor::Tensor;

/// Elements encoded per rayon task.
const CHUNK: usize = 1 << 14;

/// Writes `x` at `dst` as `dtype` (see [`crate::Backend::store`]).
pub(crate) fn store(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    dst: DevPtr,
    dtype: DType,
    seed: Option<u64>,
) -> Result<()> {
    let values = read_f32(x, "store")?;
    let size = dtype.size();
    let mut bytes = vec![0u8; values.len() * size];
    bytes.par_chunks_mut(CHUNK * size).zip(values.par_chunks(CHUNK)).enumerate().for_each(
        |(t, (out, vals))| {
            for (i, (o, &v)) in out.chunks_exact_mut(size).zip(vals).enumerate() {
                let bits = match seed {
                    None => encode(dtype, v),
                    Some(seed) => stochastic(dtype, v, uniform(seed, (t * CHUNK + i) as u64)),
                };
                o.copy_from_slice(&bits.to_le_bytes()[..size]);
            }
        },
    );
    cpu.sim().write(dst, &bytes)
}

/// `v` in `dtype`'s encoding (little-endian in the low bytes), rounded to nearest even.
fn encode(dtype: DType, v: f32) -> u32 {
    match dtype {
        DType::F32 => v.to_bits(),
        DType::F16 => u32::from(f16::from_f32(v).to_bits()),
        DType::BF16 => u32::from(bf16::from_f32(v).to_bits()),
        DType::F8E4M3 => u32::from(f32_to_f8e4m3(v)),
        DType::F8E5M2 => u32::from(f32_to_f8e5m2(v)),
    }
}

/// The value an encoding of `dtype` holds.
fn decode(dtype: DType, bits: u32) -> f32 {
    match dtype {
        DType::F32 => f32::from_bits(bits),
        DType::F16 => f16::from_bits(bits as u16).to_f32(),
        DType::BF16 => bf16::from_bits(bits as u16).to_f32(),
        DType::F8E4M3 => f8e4m3_to_f32(bits as u8),
        DType::F8E5M2 => f16::from_bits((bits as u16) << 8).to_f32(),
    }
}

/// `v` rounded to one of its two neighbours in `dtype`, the upper (in magnitude) when `u` (in [0, 1)) falls
/// below v's position between them. Exact values, zeros, NaN, infinities and values past the largest finite
/// one round to nearest even.
fn stochastic(dtype: DType, v: f32, u: f32) -> u32 {
    let near = encode(dtype, v);
    let r = decode(dtype, near);
    if dtype == DType::F32 || !v.is_finite() || r == v || !r.is_finite() {
        return near;
    }
    // Every encoding here is sign-magnitude, so ±1 on the bits moves one step in magnitude.
    let (lo, hi) = if r.abs() < v.abs() { (near, near + 1) } else { (near - 1, near) };
    let (lo_v, hi_v) = (decode(dtype, lo).abs(), decode(dtype, hi).abs());
    if !hi_v.is_finite() {
        return lo;
    }
    let p = (v.abs() - lo_v) / (hi_v - lo_v);
    if u < p { hi } else { lo }
}

/// A uniform draw in [0, 1) from the seed and the element index (SplitMix64 finaliser, 24 bits).
fn uniform(seed: u64, index: u64) -> f32 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let z = mix(seed.wrapping_add(mix(index.wrapping_add(0x9e37_79b9_7f4a_7c15))));
    (z >> 40) as f32 * (1.0 / (1u64 << 24) as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stochastic_rounding_picks_a_neighbour_by_position() {
        // 1 + 2^-9 lies a quarter of the way from 1 to the next bf16 (1 + 2^-7).
        let v = 1.0 + 2f32.powi(-9);
        let up = encode(DType::BF16, 1.0 + 2f32.powi(-7));
        let down = encode(DType::BF16, 1.0);
        assert_eq!(stochastic(DType::BF16, v, 0.2), up);
        assert_eq!(stochastic(DType::BF16, v, 0.3), down);
        assert_eq!(stochastic(DType::BF16, -v, 0.2), encode(DType::BF16, -(1.0 + 2f32.powi(-7))));
        // e4m3 saturates rather than stepping into its NaN code.
        assert_eq!(stochastic(DType::F8E4M3, 460.0, 0.0), encode(DType::F8E4M3, 448.0));
        // f16: a value just past the largest finite never becomes infinity by chance.
        assert_eq!(stochastic(DType::F16, 65510.0, 0.0), encode(DType::F16, 65504.0));
        // Subnormal neighbours of zero, both signs.
        let tiny = 2f32.powi(-10); // half of e4m3's smallest subnormal 2^-9
        assert_eq!(stochastic(DType::F8E4M3, tiny, 0.4), 0x01);
        assert_eq!(stochastic(DType::F8E4M3, -tiny, 0.4), 0x81);
        assert_eq!(stochastic(DType::F8E4M3, -tiny, 0.6) & 0x7f, 0x00);
    }

    #[test]
    fn uniform_draws_cover_the_unit_interval() {
        let draws: Vec<f32> = (0..10_000).map(|i| uniform(7, i)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f32>() / draws.len() as f32;
        assert!((mean - 0.5).abs() < 0.01, "mean {mean}");
        assert_ne!(uniform(7, 3), uniform(8, 3));
    }
}
