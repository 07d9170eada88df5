//! Products with SIMD micro-kernels, accumulating in f32: `x · wᵀ` for a stored weight `w` `[n, k]`
//! ([`matmul_bt`], for `linear`) and strided f32 products ([`gemm_f32`], behind [`super::gemm::gemm`] and the
//! convolutions). The kernels here are AVX-512's; on CPUs without it, [`F32`]'s weight products run their AVX2
//! forms ([`super::avx2`]) and the strided products [`super::avx2_product`], which both give the same bits.
//!
//! Two kinds of product share the micro-kernel interface ([`Kind`]):
//! - [`Bf16`]: bf16 activations times bf16 weights with AVX512-BF16 (`vdpbf16ps`). A product of two bf16
//!   values is exact in f32 and `vdpbf16ps` adds pairs of them into f32 accumulators, so this computes what
//!   widening both operands and multiplying in f32 computes (up to summation order; like every AVX512-BF16
//!   kernel it treats bf16 subnormals as zero), at twice the rate of f32 FMAs, reading the stored bytes as is.
//! - [`F32`]: f32 activations times a weight of any stored dtype, widened while it is packed, so the widened
//!   weight exists only as packed panels, each built once per call. With AVX-512, or AVX2, FMA and F16C.
//!
//! Layout (GotoBLAS-style): each task owns up to [`NC`] output columns ([`task_cols`]) (weight rows, or columns of the right
//! operand). For each block of inputs it packs them into micro-panels of [`NR`] columns, inputs outermost,
//! then walks all rows of x in tiles of [`MR`]: the micro-kernel keeps an `MR × NR` f32 tile in 24 zmm
//! registers (AVX2: a quarter of it at a time in 12 ymm) and broadcasts x, so x is read in place and never
//! packed. (The AVX2 strided products of [`super::avx2_product`] block differently and pack both operands.)
//!
//! Invariant: SIMD code runs only after [`Kind::available`] (or the check of its own instruction set) said the
//! CPU has it, and every pointer a kernel reads is derived from a slice whose length was checked against the
//! indices it covers.

#![allow(unsafe_code)]

use std::cell::RefCell;
use std::sync::OnceLock;

use rayon::prelude::*;

use super::gemm::{Mat, MatMut, Threads};
use super::{avx2, avx2_product};
use crate::dtype::{DType, widen_into_inline};
use crate::error::Result;

/// Rows of x per micro-tile. With [`NV`] = 4 the tile is 24 zmm accumulators; 64-column panels divide the
/// widths models use (128, 256, 3840, 10240), where 48 wasted up to a third of a panel.
pub(super) const MR: usize = 6;
/// zmm vectors (16 columns each) per micro-tile row.
const NV: usize = 4;
/// Columns per micro-tile.
pub(super) const NR: usize = 16 * NV;
/// Most output columns per task. Each task streams all of x once per input block, so for many rows of x wide
/// tasks (8 panels) win, 2–4% at Z-Image's shapes with 4096 rows; for few rows the packed panels matter more
/// and 4 panels, which stay in L2, were 10% faster at 256 rows.
const NC: usize = NR * 8;

/// Output columns per task for `m × n` outputs: 8 panels for many rows, 4 for few; with [`Threads::All`]
/// narrower where that splits the panels evenly over the rayon pool's threads (60 panels in tasks of 8 leave
/// one of two threads idle for the last half task) or gives each thread at least four tasks.
pub(super) fn task_cols(m: usize, n: usize, threads: Threads) -> usize {
    let widest = if m >= 1024 { NC } else { NC / 2 } / NR;
    let per_task = match threads {
        Threads::One => widest,
        Threads::All => {
            let (panels, pool) = (n.div_ceil(NR), rayon::current_num_threads());
            let even = |p: usize| panels.is_multiple_of(p) && (panels / p).is_multiple_of(pool);
            let enough = |p: usize| panels.div_ceil(p) >= 4 * pool;
            (1..=widest)
                .rev()
                .find(|&p| even(p) && panels / p >= pool)
                .or_else(|| (1..=widest).rev().find(|&p| enough(p)))
                .unwrap_or(1)
        }
    };
    per_task * NR
}

/// Rows of x per block: x's block (48 rows of an input block, 192 KiB for bf16) stays in L2 while every
/// panel of the task multiplies it.
const MB: usize = MR * 8;

/// Inputs per block when [`F32`] widens a panel (scratch of `NR × PACK_STEPS` f32, 16 KiB).
const PACK_STEPS: usize = 64;

/// Whether this CPU has AVX512F (checked once).
pub(super) fn has_avx512f() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    #[cfg(target_arch = "x86_64")]
    return *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"));
    #[cfg(not(target_arch = "x86_64"))]
    return *HAS.get_or_init(|| false);
}

/// Whether this CPU has AVX512F, AVX512BW and AVX512VL (checked once).
fn has_avx512bw() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    #[cfg(target_arch = "x86_64")]
    return *HAS.get_or_init(|| {
        has_avx512f()
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    });
    #[cfg(not(target_arch = "x86_64"))]
    return *HAS.get_or_init(|| false);
}

/// Whether this CPU has AVX512F and AVX512-BF16 (checked once).
fn has_avx512bf16() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    #[cfg(target_arch = "x86_64")]
    return *HAS.get_or_init(|| has_avx512f() && std::arch::is_x86_feature_detected!("avx512bf16"));
    #[cfg(not(target_arch = "x86_64"))]
    return *HAS.get_or_init(|| false);
}

/// A kind of product: what x and the packed panels hold, how weights are packed and the micro-kernel.
pub(crate) trait Kind: Sized {
    /// An element of x.
    type A: Copy + Sync;
    /// An element of a packed panel.
    type P: Copy + Default + Send + 'static;
    /// Inputs (k) per block.
    const KC: usize;
    /// Inputs per packed element (2 for bf16 pairs).
    const STEP: usize;

    /// Whether this CPU can run the kernel.
    fn available() -> bool;

    /// This thread's packed panels, reused across products.
    fn panels() -> &'static std::thread::LocalKey<RefCell<Vec<Self::P>>>;

    /// Packs a micro-panel: `rows[j]` holds the stored bytes of `steps · STEP` inputs of weight row j (at
    /// most NR rows), of `stored.0`, standing for their values times `stored.1` when a scale is given;
    /// `panel[s·NR + j]` gets step s of row j, and zeros past the last row.
    fn pack(
        rows: &[&[u8]],
        stored: (DType, Option<f32>),
        steps: usize,
        panel: &mut [Self::P],
        scratch: &mut [f32],
    );

    /// The micro-kernel: `tile[r][j] = Σ_s x[r][step s] · panel[s][j]` for `R` rows.
    ///
    /// # Safety
    /// [`Kind::available`] is true; `a` holds R rows of stride `lda` with `steps · STEP` elements each
    /// (`a.len() ≥ (R − 1)·lda + steps·STEP`); `panel.len() ≥ steps · NR`.
    unsafe fn kernel<const R: usize>(
        a: &[Self::A],
        lda: usize,
        panel: &[Self::P],
        steps: usize,
        tile: &mut [[f32; NR]; MR],
    );
}

/// bf16 activations times bf16 weights (see the module doc).
pub(crate) struct Bf16;

/// f32 activations times weights of any stored dtype (see the module doc).
pub(crate) struct F32;

impl Kind for Bf16 {
    type A = u16;
    type P = u32;
    /// A packed micro-panel is `KC/2 × NR` u32 (256 KiB), streamed from L2: measured faster than L1-sized
    /// blocks, which write the output tile more often.
    const KC: usize = 2048;
    const STEP: usize = 2;

    fn available() -> bool {
        has_avx512bf16()
    }

    fn panels() -> &'static std::thread::LocalKey<RefCell<Vec<u32>>> {
        &PACK_BF16
    }

    fn pack(
        rows: &[&[u8]],
        _stored: (DType, Option<f32>),
        steps: usize,
        panel: &mut [u32],
        _scratch: &mut [f32],
    ) {
        // Each u32 holds the two bf16 values one `vdpbf16ps` lane multiplies. Whole 16 × 16 blocks go
        // through a register transpose; the edges element by element.
        let (full_j, full_s) = (rows.len() / 16 * 16, steps / 16 * 16);
        for j0 in (0..full_j).step_by(16) {
            for s0 in (0..full_s).step_by(16) {
                let block: [&[u8]; 16] =
                    std::array::from_fn(|i| &rows[j0 + i][4 * s0..4 * s0 + 64]);
                transpose16(block, &mut panel[s0 * NR + j0..], NR);
            }
        }
        for (j, row) in rows.iter().enumerate() {
            let from = if j < full_j { full_s } else { 0 };
            for s in from..steps {
                panel[s * NR + j] = u32::from_le_bytes([
                    row[4 * s],
                    row[4 * s + 1],
                    row[4 * s + 2],
                    row[4 * s + 3],
                ]);
            }
        }
        if rows.len() < NR {
            panel.chunks_exact_mut(NR).take(steps).for_each(|dst| dst[rows.len()..].fill(0));
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn kernel<const R: usize>(
        a: &[u16],
        lda: usize,
        panel: &[u32],
        steps: usize,
        tile: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: the caller's promise (the trait's contract) is this function's.
        unsafe { bf16_kernel::<R>(a, lda, panel, steps, tile) }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn kernel<const R: usize>(
        _: &[u16],
        _: usize,
        _: &[u32],
        _: usize,
        _: &mut [[f32; NR]; MR],
    ) {
        unreachable!("available() is false off x86-64")
    }
}

impl Kind for F32 {
    type A = f32;
    type P = f32;
    /// A packed micro-panel is `KC × NR` f32 (256 KiB), as for bf16 (half the block took 8% more time).
    const KC: usize = 1024;
    const STEP: usize = 1;

    fn available() -> bool {
        has_avx512f() || avx2::available()
    }

    fn panels() -> &'static std::thread::LocalKey<RefCell<Vec<f32>>> {
        &PACK
    }

    fn pack(
        rows: &[&[u8]],
        (dtype, scale): (DType, Option<f32>),
        steps: usize,
        panel: &mut [f32],
        scratch: &mut [f32],
    ) {
        // In blocks of PACK_STEPS inputs: widen each row's block into scratch (an L1-sized NR × PACK_STEPS
        // tile), scaled as ComfyUI dequantizes on the CPU (f32(q) · scale), then transpose it into the
        // panel, whole 16 × 16 blocks in registers and the edges element by element.
        let size = dtype.size();
        for s0 in (0..steps).step_by(PACK_STEPS) {
            let sb = PACK_STEPS.min(steps - s0);
            // The rows lie k values apart, too many streams for the hardware prefetcher to follow: each
            // row's next block is asked for while this one is widened.
            let next = (s0 + PACK_STEPS).min(steps)..(s0 + 2 * PACK_STEPS).min(steps);
            for row in rows {
                prefetch(&row[next.start * size..next.end * size]);
            }
            for (j, row) in rows.iter().enumerate() {
                let block = &mut scratch[j * PACK_STEPS..j * PACK_STEPS + sb];
                widen_simd(dtype, &row[s0 * size..(s0 + sb) * size], block, scale);
            }
            let (full_j, full_s) = (rows.len() / 16 * 16, sb / 16 * 16);
            for j0 in (0..full_j).step_by(16) {
                for s in (0..full_s).step_by(16) {
                    let block: [&[f32]; 16] = std::array::from_fn(|i| {
                        let at = (j0 + i) * PACK_STEPS + s;
                        &scratch[at..at + 16]
                    });
                    transpose16_f32(block, &mut panel[(s0 + s) * NR + j0..], NR);
                }
            }
            for j in 0..rows.len() {
                let from = if j < full_j { full_s } else { 0 };
                for s in from..sb {
                    panel[(s0 + s) * NR + j] = scratch[j * PACK_STEPS + s];
                }
            }
            if rows.len() < NR {
                for dst in panel[s0 * NR..].chunks_exact_mut(NR).take(sb) {
                    dst[rows.len()..].fill(0.0);
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    unsafe fn kernel<const R: usize>(
        a: &[f32],
        lda: usize,
        panel: &[f32],
        steps: usize,
        tile: &mut [[f32; NR]; MR],
    ) {
        // SAFETY: the caller's promise (the trait's contract) is this function's; `available()` said the CPU
        // has AVX-512, or else AVX2, FMA and F16C.
        unsafe {
            if has_avx512f() {
                f32_kernel::<R>(a, lda, panel, steps, tile)
            } else {
                avx2::f32_kernel::<R>(a, lda, panel, steps, tile)
            }
        }
    }

    #[cfg(not(target_arch = "x86_64"))]
    unsafe fn kernel<const R: usize>(
        _: &[f32],
        _: usize,
        _: &[f32],
        _: usize,
        _: &mut [[f32; NR]; MR],
    ) {
        unreachable!("available() is false off x86-64")
    }
}

/// Asks the CPU to bring `bytes` into its caches ahead of their use: a hint, which reads nothing and cannot
/// fault.
#[inline(always)]
fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for at in (0..bytes.len()).step_by(64) {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: a prefetch is only a hint (no load, no fault); the address lies within `bytes`.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(at).cast()) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// [`crate::dtype::widen_into`], then times `scale` if given, compiled for AVX-512 (the f16 and fp8 decodes
/// 16 lanes at a time) or else AVX2 with F16C (8 lanes); the same values either way.
pub(super) fn widen_simd(dtype: DType, bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
    #[inline(always)]
    fn body(dtype: DType, bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
        widen_into_inline(dtype, bytes, out);
        if let Some(scale) = scale {
            out.iter_mut().for_each(|v| *v *= scale);
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
        fn wide(dtype: DType, bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
            let whole = out.len() / 16 * 16;
            match dtype {
                DType::F8E4M3 => {
                    e4m3_via_f16(&bytes[..whole], &mut out[..whole], scale);
                    body(dtype, &bytes[whole..], &mut out[whole..], scale)
                }
                DType::F16 => {
                    f16_wide(&bytes[..2 * whole], &mut out[..whole], scale);
                    body(dtype, &bytes[2 * whole..], &mut out[whole..], scale)
                }
                _ => body(dtype, bytes, out, scale),
            }
        }
        #[target_feature(enable = "avx2,fma,f16c")]
        fn wide_avx2(dtype: DType, bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
            let whole = out.len() / 8 * 8;
            match dtype {
                DType::F8E4M3 => {
                    // SAFETY: this function runs only where `avx2::available()` said the CPU has AVX2, FMA
                    // and F16C.
                    unsafe { avx2::e4m3_via_f16(&bytes[..whole], &mut out[..whole], scale) };
                    body(dtype, &bytes[whole..], &mut out[whole..], scale)
                }
                DType::F16 => {
                    // SAFETY: as above.
                    unsafe { avx2::f16_wide(&bytes[..2 * whole], &mut out[..whole], scale) };
                    body(dtype, &bytes[2 * whole..], &mut out[whole..], scale)
                }
                _ => body(dtype, bytes, out, scale),
            }
        }
        if has_avx512bw() {
            // SAFETY: `has_avx512bw` checked at run time that this CPU has the features `wide` was compiled
            // with; it takes and returns plain safe Rust values.
            return unsafe { wide(dtype, bytes, out, scale) };
        }
        if avx2::available() {
            // SAFETY: `avx2::available` checked at run time that this CPU has the features `wide_avx2` was
            // compiled with; it takes and returns plain safe Rust values.
            return unsafe { wide_avx2(dtype, bytes, out, scale) };
        }
    }
    body(dtype, bytes, out, scale);
}

/// fp8 e4m3fn bytes widened 16 at a time (`out.len()` a multiple of 16, `bytes` at least as long), times
/// `scale` if given. An e4m3 byte's magnitude bits shifted left by 7 are an f16 whose value is the e4m3 value /
/// 256, subnormals included (they are f16 subnormals, which the conversion instruction takes at full speed), so
/// the decode is a shift, the hardware f16 → f32 conversion and one multiply by 256 (or 256 · scale, the same
/// single rounding as `f32(q) · scale`); 0x7f and 0xff become NaN. Exactly [`crate::dtype::widen_into`]'s
/// values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn e4m3_via_f16(bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
    use std::arch::x86_64::*;
    assert!(out.len().is_multiple_of(16) && bytes.len() >= out.len(), "e4m3_via_f16: lengths");
    let factor = _mm512_set1_ps(256.0 * scale.unwrap_or(1.0));
    let (low7, sign) = (_mm256_set1_epi16(0x7f), _mm256_set1_epi16(0x80));
    for (src, dst) in bytes.chunks_exact(16).zip(out.chunks_exact_mut(16)) {
        // SAFETY: `src` holds 16 bytes and `dst` 16 f32s (chunks_exact); unaligned loads and stores.
        unsafe {
            let b = _mm256_cvtepu8_epi16(_mm_loadu_si128(src.as_ptr().cast()));
            let magnitude = _mm256_and_si256(b, low7);
            let half = _mm256_or_si256(
                _mm256_slli_epi16::<7>(magnitude),
                _mm256_slli_epi16::<8>(_mm256_and_si256(b, sign)),
            );
            let v = _mm512_mul_ps(_mm512_cvtph_ps(half), factor);
            let nan = _mm256_cmpeq_epi16_mask(magnitude, low7);
            _mm512_storeu_ps(
                dst.as_mut_ptr(),
                _mm512_mask_mov_ps(v, nan, _mm512_set1_ps(f32::NAN)),
            );
        }
    }
}

/// f16 values widened 16 at a time by the hardware conversion (`out.len()` a multiple of 16, `bytes` at least
/// twice as long), times `scale` if given (`f32(h) · scale`, one rounding). The conversion is exact, as
/// [`crate::dtype::widen_into`]'s; done value by value in software, it was most of the packing of an f16
/// weight.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
fn f16_wide(bytes: &[u8], out: &mut [f32], scale: Option<f32>) {
    use std::arch::x86_64::*;
    assert!(out.len().is_multiple_of(16) && bytes.len() >= 2 * out.len(), "f16_wide: lengths");
    let factor = _mm512_set1_ps(scale.unwrap_or(1.0));
    for (src, dst) in bytes.chunks_exact(32).zip(out.chunks_exact_mut(16)) {
        // SAFETY: `src` holds 32 bytes (16 f16) and `dst` 16 f32s (chunks_exact); unaligned loads and stores.
        unsafe {
            let v = _mm512_cvtph_ps(_mm256_loadu_si256(src.as_ptr().cast()));
            let v = if scale.is_some() { _mm512_mul_ps(v, factor) } else { v };
            _mm512_storeu_ps(dst.as_mut_ptr(), v);
        }
    }
}

/// A weight's stored rows as the matmul kernels read them: `rows(row, count, f)` calls `f` with the stored bytes
/// of weight rows `row..row + count`, borrowed where they lie in memory or in a mapped file, else read first.
pub(crate) type WeightRows<'a> =
    dyn Fn(usize, usize, &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> + Sync + 'a;

/// `out [m, n] = x [m, k] · wᵀ` for x row-major and a weight `[n, k]` of `dtype` read through `weight_rows`.
///
/// The caller checks
/// `K::available()` (and, for [`Bf16`], an even k and a bf16 weight); without them this returns without
/// computing, which the caller's tests would catch.
pub(crate) fn matmul_bt<K: Kind>(
    x: &[K::A],
    m: usize,
    n: usize,
    k: usize,
    (dtype, scale): (DType, Option<f32>),
    weight_rows: &WeightRows<'_>,
    out: &mut [f32],
) -> Result<()> {
    assert!(x.len() >= m * k && out.len() >= m * n, "packed matmul: buffers too short");
    if !K::available() || !k.is_multiple_of(K::STEP) || m == 0 || n == 0 {
        return Ok(());
    }
    // Each task writes the output columns of its weight rows; the rows of `out` interleave them, so tasks
    // share `out` through a pointer and write disjoint columns.
    let out_ptr = SendPtr(out.as_mut_ptr());
    let size = dtype.size();
    let nc = task_cols(m, n, Threads::All);
    (0..n.div_ceil(nc)).into_par_iter().try_for_each_init(
        || vec![0.0f32; NR * PACK_STEPS],
        |scratch: &mut Vec<f32>, t| {
            let n0 = t * nc;
            let cols = nc.min(n - n0);
            weight_rows(n0, cols, &mut |bytes| {
                assert_eq!(bytes.len(), cols * k * size, "packed matmul: weight rows");
                with_thread_buffer(K::panels(), |packed| {
                    let packed = aligned(packed, nc / NR * (K::KC / K::STEP) * NR);
                    // SAFETY: `K::available` said this CPU runs the kernel. `bytes` holds `cols` weight rows
                    // of k elements of `dtype` and x holds m rows of k; `out` holds m rows of n and this task
                    // writes only columns n0..n0 + cols, which no other task writes, while `out` is
                    // borrowed by this call.
                    unsafe {
                        task::<K>(
                            x,
                            m,
                            n,
                            k,
                            (bytes, dtype, scale),
                            cols,
                            (packed, scratch),
                            out_ptr.at(n0),
                        );
                    }
                });
                Ok(())
            })
        },
    )
}

/// Whether [`super::gemm::gemm`] takes [`gemm_f32`] for the strided products of attention and `matmul`: with
/// AVX-512. On AVX2 [`super::avx2_product`] and the `gemm` crate were even on attention
/// (`benches/cpu_ops.rs` on an AVX2 EPYC, 30 heads of 4096 × 128: 2.09–2.49 s against 2.18 s), so those keep
/// the `gemm` crate's bits there; convolutions take [`gemm_f32`] wherever [`F32::available`].
pub(crate) fn strided_available() -> bool {
    has_avx512f()
}

/// `dst = scale · a · b` (or `dst += …` with `accumulate`) for f32 strided matrices with the [`F32`]
/// micro-kernel: a `m × k` with unit column stride, b `k × n` with any strides (packed per block), dst
/// `m × n` with unit column stride. Without AVX-512, [`avx2_product`] computes it, blocked for AVX2 CPUs'
/// caches, with the same bits. The callers ([`super::gemm::gemm`] where [`strided_available`], the
/// convolutions wherever [`F32::available`]) check the strides and the bounds; with [`Threads::All`] blocks
/// of columns (or, on AVX2 for few columns, of rows) run in parallel.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    dst: MatMut<'_>,
    a: Mat<'_>,
    b: Rhs<'_>,
    accumulate: bool,
    scale: f32,
    threads: Threads,
) {
    let span = |rows: usize, cols: usize, rs: usize, cs: usize| {
        if rows == 0 || cols == 0 { 0 } else { (rows - 1) * rs + (cols - 1) * cs + 1 }
    };
    assert!(
        F32::available() && a.cs == 1 && dst.cs == 1,
        "gemm_f32: needs AVX-512 or AVX2 and unit column strides"
    );
    assert!(dst.data.len() >= span(m, n, dst.rs, 1) && (m <= 1 || dst.rs >= n), "gemm_f32: dst");
    assert!(a.data.len() >= span(m, k, a.rs, 1) && b.covers(k, n), "gemm_f32: inputs");
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    if !has_avx512f() {
        avx2_product::gemm_f32((m, n, k), dst, a, b, accumulate, scale, threads);
        return;
    }
    let dst_ptr = SendPtr(dst.data.as_mut_ptr());
    let dst_rs = dst.rs;
    let nc = task_cols(m, n, threads);
    let block = |t: usize| {
        let c0 = t * nc;
        let cols = nc.min(n - c0);
        PACK.with_borrow_mut(|packed| {
            let packed = aligned(packed, nc / NR * F32::KC * NR);
            // SAFETY: `F32::available()` (asserted); a holds m rows of stride a.rs with k elements, b covers
            // k × n at its strides, dst holds m rows of stride dst_rs ≥ n, and this block writes only
            // columns c0..c0 + cols, which no other block writes, while `dst` is borrowed by this call.
            unsafe {
                strided_task(
                    a,
                    b,
                    (m, k, c0, cols),
                    packed,
                    (dst_ptr.at(c0), dst_rs),
                    accumulate,
                    scale,
                )
            };
        });
    };
    match threads {
        Threads::One => (0..n.div_ceil(nc)).for_each(block),
        Threads::All => (0..n.div_ceil(nc)).into_par_iter().for_each(block),
    }
}

/// The right operand of [`gemm_f32`].
#[derive(Clone, Copy)]
pub(crate) enum Rhs<'a> {
    /// A strided matrix.
    Strided(Mat<'a>),
    /// Row `kk` is `data[offsets[kk]..]` with unit column stride: the shifted views of a padded image that a
    /// convolution multiplies, one per (channel, kernel tap), without an im2col copy.
    Rows {
        /// The elements.
        data: &'a [f32],
        /// Where each row starts.
        offsets: &'a [usize],
    },
}

impl Rhs<'_> {
    pub(super) fn data(&self) -> &[f32] {
        match self {
            Rhs::Strided(m) => m.data,
            Rhs::Rows { data, .. } => data,
        }
    }

    /// Where row `kk` starts, and the column stride.
    pub(super) fn row(&self, kk: usize) -> (usize, usize) {
        match self {
            Rhs::Strided(m) => (kk * m.rs, m.cs),
            Rhs::Rows { offsets, .. } => (offsets[kk], 1),
        }
    }

    /// Whether the view holds every element of a `k × n` matrix.
    fn covers(&self, k: usize, n: usize) -> bool {
        if k == 0 || n == 0 {
            return true;
        }
        match self {
            Rhs::Strided(m) => m.data.len() > (k - 1) * m.rs + (n - 1) * m.cs,
            Rhs::Rows { data, offsets } => {
                offsets.len() >= k && offsets[..k].iter().all(|&o| o + n <= data.len())
            }
        }
    }
}

thread_local! {
    /// Packed f32 panels ([`gemm_f32`] and [`matmul_bt`] with [`F32`]), reused across calls on a thread.
    static PACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// Packed bf16 pairs of [`matmul_bt`] with [`Bf16`], reused across calls on a thread.
    static PACK_BF16: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's buffer `key`, or on a new one while the thread's is in use (a rayon task that
/// waits inside it, say while a weight is read in parallel, may run another task of the same product here).
pub(super) fn with_thread_buffer<T: 'static, R>(
    key: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    f: impl FnOnce(&mut Vec<T>) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut Vec::new()),
    })
}

/// One column block of [`gemm_f32`]: columns `c0..c0 + cols` of b and dst (dst at `out`, row stride `ldo`).
///
/// # Safety
/// `F32::available()`; the views cover the indices described in [`gemm_f32`]; `out` is valid for writes of
/// rows `0..m` (stride `ldo`), columns `0..cols`, and nobody else accesses those elements meanwhile.
unsafe fn strided_task(
    a: Mat<'_>,
    b: Rhs<'_>,
    (m, k, c0, cols): (usize, usize, usize, usize),
    packed: &mut [f32],
    (out, ldo): (*mut f32, usize),
    accumulate: bool,
    scale: f32,
) {
    let panels = cols.div_ceil(NR);
    let panel_len = F32::KC * NR;
    let mut k0 = 0;
    while k0 < k {
        let kb = F32::KC.min(k - k0);
        for q in 0..panels {
            let panel = &mut packed[q * panel_len..][..kb * NR];
            let width = NR.min(cols - q * NR);
            for s in 0..kb {
                let dst = &mut panel[s * NR..(s + 1) * NR];
                let (row, cs) = b.row(k0 + s);
                let (data, at) = (b.data(), row + (c0 + q * NR) * cs);
                if cs == 1 {
                    dst[..width].copy_from_slice(&data[at..at + width]);
                } else {
                    for (j, d) in dst[..width].iter_mut().enumerate() {
                        *d = data[at + j * cs];
                    }
                }
                dst[width..].fill(0.0);
            }
        }
        let mut m0 = 0;
        while m0 < m {
            let rows = MR.min(m - m0);
            let ar = &a.data[m0 * a.rs + k0..];
            for q in 0..panels {
                let panel = &packed[q * panel_len..][..kb * NR];
                let mut tile = [[0.0f32; NR]; MR];
                // SAFETY: `F32::available()` (this function's contract); `ar` holds `rows` rows of stride
                // a.rs from k0 with at least kb elements each, and `panel` holds kb·NR packed elements.
                unsafe { run_kernel::<F32>(rows, ar, a.rs, panel, kb, &mut tile) };
                let width = NR.min(cols - q * NR);
                for (r, trow) in tile.iter().enumerate().take(rows) {
                    // SAFETY: row m0 + r < m and columns q·NR..q·NR + width ≤ cols lie in this block.
                    let d = unsafe {
                        std::slice::from_raw_parts_mut(out.add((m0 + r) * ldo + q * NR), width)
                    };
                    if k0 == 0 && !accumulate {
                        d.iter_mut().zip(trow).for_each(|(d, t)| *d = scale * t);
                    } else {
                        d.iter_mut().zip(trow).for_each(|(d, t)| *d += scale * t);
                    }
                }
            }
            m0 += rows;
        }
        k0 += kb;
    }
}

const _: () = assert!(MR == 6, "run_kernel has one arm per row count up to MR");

/// Runs `K`'s micro-kernel for `rows` (1..=MR) rows.
///
/// # Safety
/// As [`Kind::kernel`] for R = rows.
unsafe fn run_kernel<K: Kind>(
    rows: usize,
    a: &[K::A],
    lda: usize,
    panel: &[K::P],
    steps: usize,
    tile: &mut [[f32; NR]; MR],
) {
    // SAFETY: the caller's promise for R = rows.
    unsafe {
        match rows {
            6 => K::kernel::<6>(a, lda, panel, steps, tile),
            5 => K::kernel::<5>(a, lda, panel, steps, tile),
            4 => K::kernel::<4>(a, lda, panel, steps, tile),
            3 => K::kernel::<3>(a, lda, panel, steps, tile),
            2 => K::kernel::<2>(a, lda, panel, steps, tile),
            _ => K::kernel::<1>(a, lda, panel, steps, tile),
        }
    }
}

/// `dst[s·stride + i] = u32 at bytes 4s.. of rows[i]`, for i, s < 16: a 16 × 16 transpose in registers.
///
/// # Panics
/// Without AVX512F, if a row is shorter than 64 bytes, or if `dst` is shorter than `15·stride + 16`.
fn transpose16(rows: [&[u8]; 16], dst: &mut [u32], stride: usize) {
    assert!(has_avx512f() && rows.iter().all(|r| r.len() >= 64) && dst.len() >= 15 * stride + 16);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: checked above: the CPU has AVX512F, each row holds 16 u32, `dst` holds 16 rows of `stride`.
    unsafe {
        transpose16_avx512(rows.map(<[u8]>::as_ptr), dst.as_mut_ptr(), stride)
    }
}

/// `dst[s·stride + i] = rows[i][s]` for i, s < 16: [`transpose16`] of f32 values, with AVX2 where the CPU
/// has no AVX-512.
///
/// # Panics
/// Without AVX512F or AVX2, if a row holds fewer than 16 values, or if `dst` is shorter than
/// `15·stride + 16`.
fn transpose16_f32(rows: [&[f32]; 16], dst: &mut [f32], stride: usize) {
    assert!(rows.iter().all(|r| r.len() >= 16) && dst.len() >= 15 * stride + 16);
    #[cfg(target_arch = "x86_64")]
    if !has_avx512f() {
        assert!(avx2::available(), "transpose16_f32: needs AVX-512 or AVX2");
        // SAFETY: checked above: the CPU has AVX2, each row holds 16 values, `dst` holds 16 rows of `stride`.
        return unsafe { avx2::transpose16_f32(rows, dst, stride) };
    }
    assert!(has_avx512f(), "transpose16_f32: needs AVX-512 or AVX2");
    #[cfg(target_arch = "x86_64")]
    // SAFETY: checked above: the CPU has AVX512F, each row holds 16 f32 (64 bytes), `dst` holds 16 rows of
    // `stride` f32, which have the size and alignment of the u32 the transpose moves.
    unsafe {
        transpose16_avx512(
            rows.map(|r| r.as_ptr().cast::<u8>()),
            dst.as_mut_ptr().cast::<u32>(),
            stride,
        )
    }
}

/// The register transpose behind [`transpose16`]: unpack 32-bit, unpack 64-bit, then two rounds of 128-bit
/// lane shuffles.
///
/// # Safety
/// AVX512F is available; each `rows[i]` is readable for 64 bytes; `dst` is writable for 16 rows of `stride`
/// u32 (16 each).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn transpose16_avx512(rows: [*const u8; 16], dst: *mut u32, stride: usize) {
    use std::arch::x86_64::*;
    // SAFETY: the loads read 64 bytes of each row and the stores write 16 u32 of each dst row, as promised.
    unsafe {
        let r: [__m512i; 16] = std::array::from_fn(|i| _mm512_loadu_si512(rows[i].cast()));
        // Lane l of u[4g + c] holds column 4l + c of rows 4g..4g + 4.
        let mut u = [_mm512_setzero_si512(); 16];
        for g in 0..4 {
            let (a, b, c, d) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
            let (lo_ab, hi_ab) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
            let (lo_cd, hi_cd) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
            u[4 * g] = _mm512_unpacklo_epi64(lo_ab, lo_cd);
            u[4 * g + 1] = _mm512_unpackhi_epi64(lo_ab, lo_cd);
            u[4 * g + 2] = _mm512_unpacklo_epi64(hi_ab, hi_cd);
            u[4 * g + 3] = _mm512_unpackhi_epi64(hi_ab, hi_cd);
        }
        // Pair groups (0, 1) and (2, 3): lanes 0 and 2, then 1 and 3, of each.
        let mut t = [_mm512_setzero_si512(); 16];
        for c in 0..4 {
            t[c] = _mm512_shuffle_i32x4::<0x88>(u[c], u[4 + c]);
            t[4 + c] = _mm512_shuffle_i32x4::<0xdd>(u[c], u[4 + c]);
            t[8 + c] = _mm512_shuffle_i32x4::<0x88>(u[8 + c], u[12 + c]);
            t[12 + c] = _mm512_shuffle_i32x4::<0xdd>(u[8 + c], u[12 + c]);
        }
        // Column c (c < 4), 4 + c, 8 + c and 12 + c of all 16 rows.
        for c in 0..4 {
            let out = [
                (c, _mm512_shuffle_i32x4::<0x88>(t[c], t[8 + c])),
                (4 + c, _mm512_shuffle_i32x4::<0x88>(t[4 + c], t[12 + c])),
                (8 + c, _mm512_shuffle_i32x4::<0xdd>(t[c], t[8 + c])),
                (12 + c, _mm512_shuffle_i32x4::<0xdd>(t[4 + c], t[12 + c])),
            ];
            for (col, v) in out {
                _mm512_storeu_si512(dst.add(col * stride).cast(), v);
            }
        }
    }
}

/// `len` elements of `v` starting at a 64-byte boundary (growing `v` as needed), so every 16-lane load of a
/// packed panel reads one cache line rather than two.
pub(super) fn aligned<T: Copy + Default>(v: &mut Vec<T>, len: usize) -> &mut [T] {
    let slack = 64 / std::mem::size_of::<T>();
    if v.len() < len + slack {
        v.resize(len + slack, T::default());
    }
    let at = v.as_ptr().align_offset(64).min(slack);
    &mut v[at..at + len]
}

/// The output's base pointer, shared by the tasks (each writes its own columns).
#[derive(Clone, Copy)]
pub(super) struct SendPtr(pub(super) *mut f32);

impl SendPtr {
    /// The address `i` elements on. A method, so closures capture the whole `SendPtr` (which is `Sync`),
    /// not its raw-pointer field.
    pub(super) fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}

// SAFETY: the pointer is only used to write disjoint parts of the output from different tasks: columns (see
// `matmul_bt`, `gemm_f32`), or rows or columns (`avx2_product`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// One task: `cols` output columns starting at `out` (row stride n).
///
/// # Safety
/// `K::available()`; `w` holds `cols · k` elements of its dtype; `out` is valid for writes of rows `0..m`
/// (stride n), columns `0..cols`, and nobody else accesses those elements meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn task<K: Kind>(
    x: &[K::A],
    m: usize,
    n: usize,
    k: usize,
    (w, dtype, scale): (&[u8], DType, Option<f32>),
    cols: usize,
    (packed, scratch): (&mut [K::P], &mut [f32]),
    out: *mut f32,
) {
    let size = dtype.size();
    let panels = cols.div_ceil(NR);
    let panel_len = (K::KC / K::STEP) * NR;
    let mut k0 = 0;
    while k0 < k {
        let kb = K::KC.min(k - k0);
        let steps = kb / K::STEP;
        for q in 0..panels {
            let panel = &mut packed[q * panel_len..][..steps * NR];
            let mut rows: [&[u8]; NR] = [&[]; NR];
            let width = NR.min(cols - q * NR);
            for (j, row) in rows.iter_mut().enumerate().take(width) {
                let col = q * NR + j;
                *row = &w[(col * k + k0) * size..(col * k + k0 + kb) * size];
            }
            K::pack(&rows[..width], (dtype, scale), steps, panel, scratch);
        }
        // Blocks of MB rows of x (in L2), each multiplied by every panel in turn, so a panel is read from
        // L3 once per block rather than once per micro-tile.
        for (mb0, q) in (0..m).step_by(MB).flat_map(|mb0| (0..panels).map(move |q| (mb0, q))) {
            let mut m0 = mb0;
            while m0 < (mb0 + MB).min(m) {
                let rows = MR.min(m - m0);
                let a = &x[m0 * k + k0..];
                let panel = &packed[q * panel_len..][..steps * NR];
                let mut tile = [[0.0f32; NR]; MR];
                // SAFETY: `K::available()` (this function's contract); `a` holds `rows` rows of stride k from
                // k0 with at least kb elements each, and `panel` holds steps·NR packed elements.
                unsafe { run_kernel::<K>(rows, a, k, panel, steps, &mut tile) };
                let c0 = q * NR;
                let width = NR.min(cols - c0);
                for (r, trow) in tile.iter().enumerate().take(rows) {
                    // SAFETY: row m0 + r < m and columns c0..c0 + width ≤ cols lie in this task's block.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(out.add((m0 + r) * n + c0), width)
                    };
                    if k0 == 0 {
                        dst.copy_from_slice(&trow[..width]);
                    } else {
                        dst.iter_mut().zip(trow).for_each(|(d, t)| *d += t);
                    }
                }
                m0 += rows;
            }
        }
        k0 += kb;
    }
}

/// [`Bf16`]'s micro-kernel (see [`Kind::kernel`]; a step is a pair of inputs).
///
/// # Safety
/// As [`Kind::kernel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_kernel<const R: usize>(
    a: &[u16],
    lda: usize,
    panel: &[u32],
    steps: usize,
    tile: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(a.len() >= (R - 1) * lda + 2 * steps && panel.len() >= steps * NR);
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    let a = a.as_ptr();
    let b = panel.as_ptr();
    for p in 0..steps {
        // SAFETY: p < steps, so the NV 16-lane loads cover panel[p·NR .. (p + 1)·NR], inside the panel; the
        // x reads are at (r·lda + 2p), inside row r of a (asserted above). Loads are unaligned.
        unsafe {
            let bp = b.add(p * NR);
            let bv: [__m512bh; NV] = std::array::from_fn(|v| {
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(16 * v).cast()))
            });
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let pair = a.add(r * lda + 2 * p).cast::<i32>().read_unaligned();
                let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                for (acc_rv, &bvv) in acc_r.iter_mut().zip(&bv) {
                    *acc_rv = _mm512_dpbf16_ps(*acc_rv, av, bvv);
                }
            }
        }
    }
    store_tile(&acc, tile);
}

/// [`F32`]'s micro-kernel (see [`Kind::kernel`]; a step is one input).
///
/// # Safety
/// As [`Kind::kernel`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn f32_kernel<const R: usize>(
    a: &[f32],
    lda: usize,
    panel: &[f32],
    steps: usize,
    tile: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(a.len() >= (R - 1) * lda + steps && panel.len() >= steps * NR);
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    let a = a.as_ptr();
    let b = panel.as_ptr();
    for p in 0..steps {
        // SAFETY: p < steps, so the NV 16-lane loads cover panel[p·NR .. (p + 1)·NR], inside the panel; the
        // x reads are at (r·lda + p), inside row r of a (asserted above). Loads are unaligned.
        unsafe {
            let bp = b.add(p * NR);
            let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(bp.add(16 * v)));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let av = _mm512_set1_ps(*a.add(r * lda + p));
                for (acc_rv, &bvv) in acc_r.iter_mut().zip(&bv) {
                    *acc_rv = _mm512_fmadd_ps(av, bvv, *acc_rv);
                }
            }
        }
    }
    store_tile(&acc, tile);
}

/// Stores `R` rows of accumulators into the tile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn store_tile<const R: usize>(
    acc: &[[std::arch::x86_64::__m512; NV]; R],
    tile: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    for (r, acc_r) in acc.iter().enumerate() {
        for (v, &accv) in acc_r.iter().enumerate() {
            // SAFETY: tile row r (r < R ≤ MR) has NR = 16·NV floats; lanes 16v..16v + 16 are inside it.
            unsafe { _mm512_storeu_ps(tile[r].as_mut_ptr().add(16 * v), accv) };
        }
    }
}

/// An f32 product with a stored weight, as [`matmul_bt`] and `skinny::matmul_bt` take one.
#[cfg(test)]
pub(super) type F32Product = dyn Fn(
    &[f32],
    usize,
    usize,
    usize,
    (DType, Option<f32>),
    &WeightRows<'_>,
    &mut [f32],
) -> Result<()>;

/// Checks `product` against f64 loops for each `(m, n, k)` of `cases`, every weight dtype, with and without a
/// scale (small values over powers of two; within 1e-4 relative).
#[cfg(test)]
pub(super) fn check_f32_product(cases: &[(usize, usize, usize)], product: &F32Product) {
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::F8E5M2] {
        for &(m, n, k) in cases {
            let xv: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 8.0).collect();
            let wv: Vec<f32> = (0..n * k).map(|i| ((i * 5 % 11) as f32 - 5.0) / 4.0).collect();
            let wbytes = crate::dtype::narrow(dtype, &wv);
            let wr = crate::dtype::widen(dtype, &wbytes);
            let size = dtype.size();
            let read = |row: usize, count: usize, f: &mut dyn FnMut(&[u8]) -> Result<()>| {
                f(&wbytes[row * k * size..(row + count) * k * size])
            };
            for scale in [None, Some(0.375f32)] {
                let mut out = vec![f32::NAN; m * n];
                product(&xv, m, n, k, (dtype, scale), &read, &mut out).expect("matmul");
                let s = f64::from(scale.unwrap_or(1.0));
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k)
                            .map(|l| f64::from(xv[i * k + l]) * f64::from(wr[j * k + l]) * s)
                            .sum();
                        let got = f64::from(out[i * n + j]);
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{dtype} ({m}, {n}, {k}) scale {scale:?} at ({i}, {j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn fp8_e4m3_widens_through_f16_to_exactly_the_scalar_values() {
        // With AVX-512, AVX2 or neither, whichever this CPU has. Every byte, at every lane and in the scalar
        // tail (259 values: 16 chunks of 16 and 3 left over, or 32 of 8 and 3).
        let bytes: Vec<u8> = (0..259u32).map(|i| (i * 7 % 256) as u8).collect();
        for scale in [None, Some(0.37f32), Some(3.0e-3)] {
            let mut fast = vec![0.0f32; bytes.len()];
            widen_simd(DType::F8E4M3, &bytes, &mut fast, scale);
            for (&b, &got) in bytes.iter().zip(&fast) {
                let want = crate::dtype::f8e4m3_to_f32(b) * scale.unwrap_or(1.0);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "byte {b:#04x} scale {scale:?}: {got} != {want}"
                );
            }
        }
    }

    #[test]
    fn f16_widens_to_exactly_the_scalar_values() {
        // With AVX-512, AVX2 or neither, whichever this CPU has. Every f16 bit pattern (subnormals, infinities
        // and NaNs included), then 5 more in the scalar tail.
        let halves: Vec<u16> =
            (0..=u16::MAX).chain([0x0001, 0x03ff, 0x7c00, 0xfbff, 0x8000]).collect();
        let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        for scale in [None, Some(0.37f32)] {
            let mut fast = vec![0.0f32; halves.len()];
            widen_simd(DType::F16, &bytes, &mut fast, scale);
            for (&h, &got) in halves.iter().zip(&fast) {
                let want = half::f16::from_bits(h).to_f32() * scale.unwrap_or(1.0);
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "f16 {h:#06x} scale {scale:?}: {got} != {want}"
                );
            }
        }
    }

    #[test]
    fn transpose16_transposes() {
        if !has_avx512f() {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let src: Vec<Vec<u8>> = (0..16u32)
            .map(|i| (0..20u32).flat_map(|s| (i * 100 + s).to_le_bytes()).collect())
            .collect();
        let mut dst = vec![0u32; 15 * 20 + 16];
        transpose16(std::array::from_fn(|i| &src[i][..]), &mut dst, 20);
        for s in 0..16 {
            for i in 0..16 {
                assert_eq!(dst[s * 20 + i], i as u32 * 100 + s as u32, "row {s}, column {i}");
            }
        }
    }

    #[test]
    fn bf16_matches_an_f32_product_of_the_widened_operands() {
        if !Bf16::available() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        for (m, n, k) in [(11, 50, 64), (6, 64, 2), (3, 200, 1030), (17, 5, 6)] {
            let xv: Vec<bf16> =
                (0..m * k).map(|i| bf16::from_f32(((i * 7 % 13) as f32 - 6.0) / 8.0)).collect();
            let wv: Vec<bf16> =
                (0..n * k).map(|i| bf16::from_f32(((i * 5 % 11) as f32 - 5.0) / 4.0)).collect();
            let wbytes: Vec<u8> = wv.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            let xbits: Vec<u16> = xv.iter().map(|v| v.to_bits()).collect();
            let mut out = vec![f32::NAN; m * n];
            let read = |row: usize, count: usize, f: &mut dyn FnMut(&[u8]) -> Result<()>| {
                f(&wbytes[row * k * 2..(row + count) * k * 2])
            };
            matmul_bt::<Bf16>(&xbits, m, n, k, (DType::BF16, None), &read, &mut out)
                .expect("matmul");
            for i in 0..m {
                for j in 0..n {
                    // Small integers over powers of two: every partial sum is exact in f32.
                    let want: f32 =
                        (0..k).map(|l| xv[i * k + l].to_f32() * wv[j * k + l].to_f32()).sum();
                    assert_eq!(out[i * n + j], want, "({m}, {n}, {k}) at ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn f32_matches_loops_for_every_weight_dtype() {
        if !F32::available() {
            eprintln!("skipped: this CPU has neither AVX-512 nor AVX2");
            return;
        }
        let cases = [(11, 50, 64), (6, 64, 1), (3, 200, 1030), (17, 5, 7)];
        check_f32_product(&cases, &matmul_bt::<F32>);
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn the_avx2_micro_kernel_gives_the_avx512_bits() {
        if !(has_avx512f() && avx2::available()) {
            eprintln!("skipped: this CPU lacks AVX-512 or AVX2");
            return;
        }
        // Values whose products and sums round: the two kernels must round them alike.
        let (lda, steps) = (1030, 1024);
        let a: Vec<f32> = (0..MR * lda).map(|i| ((i as f32) * 0.618).sin()).collect();
        let panel: Vec<f32> = (0..steps * NR).map(|i| ((i as f32) * 0.377).cos() / 3.0).collect();
        let (mut wide, mut narrow) = ([[0.0f32; NR]; MR], [[0.0f32; NR]; MR]);
        // SAFETY: both instruction sets are present (checked above); a holds MR rows of lda ≥ steps, the
        // panel steps·NR values.
        unsafe {
            f32_kernel::<MR>(&a, lda, &panel, steps, &mut wide);
            avx2::f32_kernel::<MR>(&a, lda, &panel, steps, &mut narrow);
        }
        assert_eq!(wide, narrow);
    }
}
