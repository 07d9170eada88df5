//! Writing a tensor into device memory as any dtype, fp8 included, rounded to nearest even or stochastically
//! (the in-place LoRA write-back).
//!
//! Stochastic rounding picks, for a value v between two neighbours lo < |v| < hi of the target type, hi with
//! probability (|v| − lo)/(hi − lo), so the expected stored value is v. The uniform draw is a hash of the
//! seed and the element's index: the same seed stores the same bytes, whatever the thread count.
//!
//! This file is the reference both backends follow: the CUDA kernel `store` (`cuda/kernels/cast.cu`)
//! transliterates [`mix`], [`uniform`] and [`stochastic`] line by line, so a weight patched on either backend
//! holds the same bytes. The tests pin known (seed, index, value) → bytes cases here and check that the
//! kernel keeps its transliterated lines (marked `[spec]` there) verbatim.

use half::{bf16, f16};
use rayon::prelude::*;

use super::Cpu;
use super::storage::{Data, data, read_f32};
use crate::dtype::{DType, f8e4m3_to_f32, f32_to_f8e4m3, f32_to_f8e5m2};
use crate::error::{Error, Result};
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
    if matches!(dtype, DType::I8 | DType::U8) && seed.is_some() {
        // Integer weights are quantized formats' values, re-quantized with new scales by their caller
        // (`memory::lora::apply_requantized_int8`), which rounds them itself.
        return Err(Error::Unsupported(format!(
            "storing into {dtype} weight bytes stochastically"
        )));
    }
    // The same dtype, rounded to nearest: the values' bytes as they are (the tensors hold little-endian
    // elements on a little-endian host).
    if seed.is_none()
        && cfg!(target_endian = "little")
        && let Data::F32(values) = data(x, "store")?
        && dtype == DType::F32
    {
        return cpu.sim().write(dst, bytemuck::cast_slice(values));
    }
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
        DType::I8 | DType::U8 => u32::from(crate::dtype::narrow(dtype, &[v])[0]),
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
        DType::I8 => f32::from(bits as u8 as i8),
        DType::U8 => f32::from(bits as u8),
    }
}

/// `v` rounded to one of its two neighbours in `dtype`, the upper (in magnitude) when `u` (in [0, 1)) falls
/// below v's position between them. Exact values, zeros, NaN, infinities and values whose nearest rounding
/// is not finite (past f16's, bf16's or e5m2's largest finite: they stay infinite) round to nearest even;
/// the upper neighbour is never taken when it is not finite (just below infinity, e4m3's NaN code).
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

/// The SplitMix64 finaliser (`mix(state + γ)` is SplitMix64's output for `state`).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform draw in [0, 1) from the seed and the element index:
/// `(mix(seed + mix(index + 0x9e3779b97f4a7c15)) >> 40) · 2⁻²⁴` (24 bits, exact in f32; sums wrap).
pub(crate) fn uniform(seed: u64, index: u64) -> f32 {
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
    fn the_draw_is_splitmix64_of_the_index_mixed_with_the_seed() {
        // The finaliser gives SplitMix64's published sequence from state 0.
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15), 0xe220_a839_7b1d_cdaf);
        assert_eq!(mix(0x9e37_79b9_7f4a_7c15u64.wrapping_mul(2)), 0x6e78_9e6a_a1b9_65f4);
        // (seed, index) → the 24-bit draw, computed independently of this code.
        for (seed, index, bits) in [
            (0u64, 0u64, 4_727_170u32),
            (7, 1, 2_038_198),
            (0xdead_beef, 0, 207_294),
            (42, 20_000, 11_606_194),
            (u64::MAX, 16_384, 7_562_654),
        ] {
            assert_eq!(
                uniform(seed, index),
                bits as f32 / (1u32 << 24) as f32,
                "({seed}, {index})"
            );
        }
    }

    /// (dtype, seed, element index, value) → the stored bits, with the draw each case gets.
    const PINNED: [(DType, u64, usize, f32, u32); 14] = [
        // 1 + 2^-9 is a quarter of the way from 1 to the next bf16: up when the draw is below 0.25.
        (DType::BF16, 7, 1, 1.0 + 1.0 / 512.0, 0x3f81), // u = 0.121
        (DType::BF16, 0, 16_383, 1.0 + 1.0 / 512.0, 0x3f81), // u = 0.236
        (DType::BF16, 0, 0, 1.0 + 1.0 / 512.0, 0x3f80), // u = 0.282
        (DType::BF16, 0, 20_000, -(1.0 + 1.0 / 512.0), 0xbf80), // u = 0.289
        // f16: 1 + 2^-12 is a quarter of an ulp above 1.
        (DType::F16, 0xdead_beef, 0, 1.0 + 1.0 / 4096.0, 0x3c01), // u = 0.012
        (DType::F16, 1, 0, 1.0 + 1.0 / 4096.0, 0x3c00),           // u = 0.916
        // e4m3: 1.09375 is three quarters of the way from 1 to 1.125.
        (DType::F8E4M3, 42, 3, 1.093_75, 0x39), // u = 0.486
        (DType::F8E4M3, 42, 2, 1.093_75, 0x38), // u = 0.954
        // e5m2: -1.0625 is a quarter of the way from -1 to -1.25.
        (DType::F8E5M2, u64::MAX, 2, -1.0625, 0xbd), // u = 0.101
        // Nearest rounding overflows: the value stays infinite whatever the draw.
        (DType::F16, 0, 3, 70_000.0, 0x7c00),
        (DType::BF16, 0, 3, f32::MAX, 0x7f80),
        (DType::F8E5M2, 0, 3, -61_440.0, 0xfc),
        // The upper neighbour is infinity (f16) or NaN (e4m3): never taken, even by a draw of 0.012.
        (DType::F16, 0xdead_beef, 0, 65_510.0, 0x7bff),
        (DType::F8E4M3, 0xdead_beef, 0, 460.0, 0x7e),
    ];

    #[test]
    fn stochastic_stores_give_the_pinned_bytes() {
        let cpu = Cpu::new(1 << 20);
        for (dtype, seed, index, v, bits) in PINNED {
            assert_eq!(stochastic(dtype, v, uniform(seed, index as u64)), bits, "{dtype} {v}");
            // Through the whole store: the element's index, not its place in a rayon chunk, drives the draw.
            let n = index + 1;
            let mut values = vec![0.0f32; n];
            values[index] = v;
            let x = crate::Backend::from_f32(&cpu, &[n], &values, DType::F32).expect("tensor");
            let dst =
                crate::memory::DeviceMemory::alloc(cpu.sim().as_ref(), (n * dtype.size()) as u64)
                    .expect("alloc");
            crate::Backend::store(&cpu, &x, dst, dtype, Some(seed)).expect("store");
            let mut out = vec![0u8; dtype.size()];
            cpu.sim().read(dst.offset((index * dtype.size()) as u64), &mut out).expect("read");
            let mut le = [0u8; 4];
            le[..out.len()].copy_from_slice(&out);
            assert_eq!(u32::from_le_bytes(le), bits, "{dtype} {v} at {index} with seed {seed}");
            crate::memory::DeviceMemory::free(cpu.sim().as_ref(), dst).expect("free");
        }
    }

    /// The CUDA kernel's lines that transliterate `mix`, `uniform` and `stochastic` (code only, comments
    /// stripped); each must appear in `cast.cu` exactly so, and every line marked `[spec]` there must be one.
    const CUDA_SPEC: [&str; 12] = [
        "z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;",
        "z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;",
        "return z ^ (z >> 31);",
        "u64 z = sr_mix(seed + sr_mix(index + 0x9e3779b97f4a7c15ull));",
        "return (float)(z >> 40) * 5.9604644775390625e-8f;",
        "if (!sr_finite(v) || r == v || !sr_finite(r)) return nearest;",
        "u32 lo = fabsf(r) < fabsf(v) ? nearest : nearest - 1u;",
        "u32 hi = fabsf(r) < fabsf(v) ? nearest + 1u : nearest;",
        "if (!sr_finite(hi_v)) return lo;",
        "float p = (fabsf(v) - lo_v) / (hi_v - lo_v);",
        "return u < p ? hi : lo;",
        "put(dst, ddt, i, stochastic ? sr_round(ddt, v, sr_uniform(seed, (u64)i)) : enc(ddt, v));",
    ];

    #[test]
    fn the_cuda_kernel_keeps_the_reference_lines() {
        let src = include_str!("../cuda/kernels/cast.cu");
        let code = |line: &str| line.split("//").next().unwrap_or("").trim().to_owned();
        // Code lines marked `// [spec]` (the file's header comment names the marker too).
        let marked: Vec<String> = src
            .lines()
            .filter(|l| l.contains("// [spec]"))
            .map(code)
            .filter(|c| !c.is_empty())
            .collect();
        let all: Vec<String> = src.lines().map(code).collect();
        for line in CUDA_SPEC {
            assert!(all.iter().any(|l| l == line), "cast.cu lost the line `{line}`");
        }
        for line in &marked {
            assert!(
                CUDA_SPEC.contains(&line.as_str()),
                "cast.cu marks `{line}` [spec]; list it here"
            );
        }
        assert_eq!(marked.len(), CUDA_SPEC.len(), "each reference line is marked once");
        assert!(!src.contains("splitmix64(seed ^"), "the old draw is gone");
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
