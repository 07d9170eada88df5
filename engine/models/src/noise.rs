//! torch's CPU random generator and `randn`, bit for bit, so a seed gives the noise ComfyUI draws.
//!
//! ComfyUI draws a latent's initial noise on the CPU with torch's default generator (`torch.manual_seed(seed)`,
//! then one `torch.randn(shape, dtype=float32)`), and its ancestral samplers draw their per-step noise from a
//! second CPU generator. [`TorchGenerator`] reproduces that generator: MT19937 seeded from the low 32 bits of the
//! seed, torch's uniform conversions, and its two normal algorithms (a block-of-16 Box–Muller in f32 for tensors
//! of 16 or more values, a cached f64 Box–Muller for smaller ones). The f32 block transform exists in two builds
//! of torch that differ in the last bit of some values; [`NormalMath`] selects one (see there).
//!
//! References: PyTorch's `MT19937RNGEngine.h`, `CPUGeneratorImpl.cpp`, `TransformationHelper.h`,
//! `DistributionsHelper.h` and `DistributionKernels.cpp` / `DistributionTemplates.h` (`normal_fill`,
//! `normal_fill_AVX2`), and `avx_mathfun.h` (the Cephes polynomials of the AVX2 build).

use crate::{Error, Result};

/// MT19937's state size.
const N: usize = 624;
/// MT19937's shift offset.
const M: usize = 397;

/// Which f32 maths torch's block-of-16 normal transform uses (n ≥ 16 values, f32).
///
/// torch compiles that transform twice: an AVX2 version with Cephes polynomials (`log256_ps`, `sincos256_ps`,
/// [`NormalMath::Avx2`]), and a scalar version calling the C library's `logf`/`cosf`/`sinf`
/// ([`NormalMath::Libm`]). Which one runs depends on the torch build and the CPU. torch 2.15's x86 wheel runs the
/// AVX2 version on AVX2 and AVX-512 CPUs (checked on an AVX-512 machine: its output equals
/// `ATEN_CPU_CAPABILITY=avx2`'s bit for bit), which is the default here; the scalar version runs with
/// `ATEN_CPU_CAPABILITY=default` and on CPUs or builds without AVX2 (aarch64: Apple silicon). The two differ by
/// about one ulp in some values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NormalMath {
    /// The AVX2 kernel: Cephes-style f32 polynomials for log and sin/cos, with the fused multiply-adds the
    /// compiler formed in torch's build (each product that feeds only an addition is fused; found by matching
    /// torch's output bit for bit).
    #[default]
    Avx2,
    /// The scalar kernel: f32 `logf`, `cosf`, `sinf` and `sqrtf` from the C library (Rust's `f32` methods call
    /// the same functions on Linux), the angle rounded to f32 from an f64 product.
    Libm,
}

/// torch's CPU generator (`torch.Generator()` / the global default one), seeded like `torch.manual_seed`.
///
/// Consecutive [`TorchGenerator::randn`] calls give the values of consecutive `torch.randn` calls on the same
/// generator, including the normal torch caches between calls of fewer than 16 values.
#[derive(Clone)]
pub struct TorchGenerator {
    state: Box<[u32; N]>,
    index: usize,
    next_double_normal: Option<f64>,
    math: NormalMath,
}

impl std::fmt::Debug for TorchGenerator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TorchGenerator")
            .field("index", &self.index)
            .field("math", &self.math)
            .finish_non_exhaustive()
    }
}

impl TorchGenerator {
    /// A generator after `manual_seed(seed)`: only the low 32 bits of the seed count (seeds that differ above
    /// bit 31 give the same values, as in torch), with the default [`NormalMath`].
    pub fn new(seed: u64) -> Self {
        Self::with_math(seed, NormalMath::default())
    }

    /// [`TorchGenerator::new`] with a chosen f32 normal transform.
    pub fn with_math(seed: u64, math: NormalMath) -> Self {
        let mut state = Box::new([0u32; N]);
        // `manual_seed` keeps the low 32 bits (torch's mt19937 takes a 64-bit seed but stores `seed & 0xffffffff`).
        state[0] = (seed & 0xFFFF_FFFF) as u32;
        for j in 1..N {
            let prev = state[j - 1];
            state[j] = 1_812_433_253u32.wrapping_mul(prev ^ (prev >> 30)).wrapping_add(j as u32);
        }
        Self { state, index: N, next_double_normal: None, math }
    }

    /// The f32 normal transform this generator uses.
    pub fn math(&self) -> NormalMath {
        self.math
    }

    /// One 32-bit output of the engine (torch's `random()`).
    pub fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9D2C_5680;
        y ^= (y << 15) & 0xEFC6_0000;
        y ^ (y >> 18)
    }

    /// Two outputs joined, the first in the high half (torch's `random64()`).
    pub fn next_u64(&mut self) -> u64 {
        let hi = u64::from(self.next_u32());
        let lo = u64::from(self.next_u32());
        (hi << 32) | lo
    }

    /// `torch.randperm(n, generator=…)` on the CPU (n < 2³² / 20): 0..n shuffled by Fisher–Yates, position i
    /// swapped with i + `random() % (n − i)`.
    pub fn randperm(&mut self, n: usize) -> Vec<usize> {
        let mut perm: Vec<usize> = (0..n).collect();
        for i in 0..n.saturating_sub(1) {
            let z = (u64::from(self.next_u32()) % (n - i) as u64) as usize;
            perm.swap(i, i + z);
        }
        perm
    }

    /// `n` values of the unit exponential distribution, as one f32 `torch.empty(n).exponential_()` call on
    /// the CPU makes them: per value one f64 uniform u (two outputs, 53 bits), −ln(1 − u) in f64, rounded.
    pub fn exponential(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| -(-self.uniform_f64()).ln_1p() as f32).collect()
    }

    /// `n` standard normal values, as one `torch.randn(n)` call (f32, contiguous) makes them; any shape with
    /// `n` values gives the same values in row-major order.
    pub fn randn(&mut self, n: usize) -> Vec<f32> {
        if n >= 16 {
            self.randn_blocks(n)
        } else {
            (0..n).map(|_| self.normal_f64() as f32).collect()
        }
    }

    fn twist(&mut self) {
        const UPPER: u32 = 0x8000_0000;
        const LOWER: u32 = 0x7FFF_FFFF;
        const MATRIX: u32 = 0x9908_B0DF;
        let s = &mut self.state;
        for i in 0..N {
            let y = (s[i] & UPPER) | (s[(i + 1) % N] & LOWER);
            let mag = if y & 1 == 1 { MATRIX } else { 0 };
            s[i] = s[(i + M) % N] ^ (y >> 1) ^ mag;
        }
        self.index = 0;
    }

    /// An f32 uniform in [0, 1): 24 random bits, exactly.
    fn uniform_f32(&mut self) -> f32 {
        (self.next_u32() & 0xFF_FFFF) as f32 * (1.0 / (1u32 << 24) as f32)
    }

    /// An f64 uniform in [0, 1): 53 random bits, exactly.
    fn uniform_f64(&mut self) -> f64 {
        (self.next_u64() & ((1u64 << 53) - 1)) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// One f64 normal (torch's `normal_distribution<double>`): the cached sine half if there is one, else a
    /// fresh Box–Muller pair whose sine half is cached.
    fn normal_f64(&mut self) -> f64 {
        if let Some(cached) = self.next_double_normal.take() {
            return cached;
        }
        let u1 = self.uniform_f64();
        let u2 = self.uniform_f64();
        let r = (-2.0 * (-u2).ln_1p()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u1;
        self.next_double_normal = Some(r * theta.sin());
        r * theta.cos()
    }

    /// The f32 path for n ≥ 16: n uniforms, transformed 16 at a time; when n is not a multiple of 16, the last
    /// 16 positions are overwritten with 16 fresh uniforms and transformed again.
    fn randn_blocks(&mut self, n: usize) -> Vec<f32> {
        let mut data: Vec<f32> = (0..n).map(|_| self.uniform_f32()).collect();
        let mut start = 0;
        while start + 16 <= n {
            self.block(&mut data[start..start + 16]);
            start += 16;
        }
        if !n.is_multiple_of(16) {
            let tail = n - 16;
            for v in &mut data[tail..] {
                *v = self.uniform_f32();
            }
            self.block(&mut data[tail..]);
        }
        data
    }

    fn block(&self, block: &mut [f32]) {
        for j in 0..8 {
            let u1 = 1.0 - block[j];
            let u2 = block[j + 8];
            let (cos, sin) = match self.math {
                NormalMath::Libm => {
                    let radius = (-2.0 * u1.ln()).sqrt();
                    let theta = (2.0 * std::f64::consts::PI * f64::from(u2)) as f32;
                    (radius * theta.cos(), radius * theta.sin())
                }
                NormalMath::Avx2 => {
                    let radius = (-2.0 * cephes_log(u1)).sqrt();
                    let theta = 6.283_185_5_f32 * u2;
                    let (s, c) = cephes_sincos(theta);
                    (radius * c, radius * s)
                }
            };
            block[j] = cos;
            block[j + 8] = sin;
        }
    }
}

/// `log256_ps` of `avx_mathfun.h` for one lane, x in (0, 1] (the only inputs the normal transform gives it),
/// with the multiply-adds fused as in torch's build.
#[allow(clippy::excessive_precision)] // avx_mathfun.h's literals, as written there
fn cephes_log(x: f32) -> f32 {
    const P: [f32; 9] = [
        7.037_683_629_2e-2,
        -1.151_461_031_0e-1,
        1.167_699_874_0e-1,
        -1.242_014_084_6e-1,
        1.424_932_278_7e-1,
        -1.666_805_766_5e-1,
        2.000_071_476_5e-1,
        -2.499_999_399_3e-1,
        3.333_333_117_4e-1,
    ];
    const Q1: f32 = -2.121_944_40e-4;
    const Q2: f32 = 0.693_359_375;
    const SQRTHF: f32 = std::f32::consts::FRAC_1_SQRT_2;
    let x = x.max(f32::MIN_POSITIVE);
    let bits = x.to_bits();
    let mut e = ((bits >> 23) as i32 - 0x7f) as f32 + 1.0;
    let m = f32::from_bits((bits & !0x7f80_0000) | 0.5f32.to_bits());
    let x = if m < SQRTHF {
        e -= 1.0;
        (m - 1.0) + m
    } else {
        m - 1.0
    };
    let z = x * x;
    let mut y = P[0];
    for p in &P[1..] {
        y = fma(y, x, *p);
    }
    y = fma(y * x, z, e * Q1);
    y = fma(-z, 0.5, y);
    fma(e, Q2, x + y)
}

/// `sincos256_ps` of `avx_mathfun.h` for one lane, x ≥ 0, with the multiply-adds fused as in torch's build:
/// returns (sin, cos).
#[allow(clippy::excessive_precision)] // avx_mathfun.h's literals, as written there
fn cephes_sincos(x: f32) -> (f32, f32) {
    const FOPI: f32 = 1.273_239_544_735_16;
    const DP1: f32 = -0.785_156_25;
    const DP2: f32 = -2.418_756_484_985_351_562_5e-4;
    const DP3: f32 = -3.774_894_977_445_941_08e-8;
    let j = (((x * FOPI) as i32) + 1) & !1;
    let y = j as f32;
    let x = fma(y, DP3, fma(y, DP2, fma(y, DP1, x)));
    let z = x * x;
    let mut c = 2.443_315_711_809_948e-5_f32;
    c = fma(c, z, -1.388_731_625_493_765e-3);
    c = fma(c, z, 4.166_664_568_298_827e-2);
    c = fma(c * z, z, -(z * 0.5));
    c += 1.0;
    let mut s = -1.951_529_589_1e-4_f32;
    s = fma(s, z, 8.332_160_873_6e-3);
    s = fma(s, z, -1.666_665_461_1e-1);
    s *= z;
    s = fma(s, x, x);
    let (mut sin, mut cos) = if j & 2 == 0 { (s, c) } else { (c, s) };
    if j & 4 != 0 {
        sin = -sin;
    }
    if (j - 2) & 4 == 0 {
        cos = -cos;
    }
    (sin, cos)
}

/// a·b + c rounded once (the `vfmadd` the compiler emitted).
fn fma(a: f32, b: f32, c: f32) -> f32 {
    a.mul_add(b, c)
}

/// ComfyUI's initial noise (`comfy/sample.py` `prepare_noise`) for a latent of `shape` (batch first), f32,
/// row-major.
///
/// Without `batch_index`: one `randn` of the whole shape after `manual_seed(seed)`. With it (the LATENT's
/// `batch_index`): draws of one sample each (`shape[1..]`) for i = 0..=max(index) in sequence, and the output
/// holds, for each entry of `batch_index` in order, draw number `entry` (repeated entries share a draw); its
/// batch size is `batch_index.len()`. A negative index is an error (ComfyUI fails on one too).
pub fn initial_noise(seed: u64, shape: &[usize], batch_index: Option<&[i64]>) -> Result<Vec<f32>> {
    let mut generator = TorchGenerator::new(seed);
    let Some(indices) = batch_index else {
        return Ok(generator.randn(shape.iter().product()));
    };
    let sample: usize = shape.iter().skip(1).product();
    let mut wanted = Vec::with_capacity(indices.len());
    for &i in indices {
        let i = usize::try_from(i)
            .map_err(|_| Error::Invalid(format!("noise: batch_index {i} is negative")))?;
        wanted.push(i);
    }
    let Some(&last) = wanted.iter().max() else {
        return Ok(Vec::new());
    };
    let mut draws: Vec<Option<Vec<f32>>> = vec![None; last + 1];
    for (i, slot) in draws.iter_mut().enumerate() {
        let draw = generator.randn(sample);
        if wanted.contains(&i) {
            *slot = Some(draw);
        }
    }
    let mut out = Vec::with_capacity(sample * wanted.len());
    for &i in &wanted {
        if let Some(draw) = &draws[i] {
            out.extend_from_slice(draw);
        }
    }
    Ok(out)
}
