//! `x · wᵀ` for bf16 activations and bf16 weights with AVX512-BF16 (`vdpbf16ps`), accumulating in f32.
//!
//! A product of two bf16 values is exact in f32 and `vdpbf16ps` adds pairs of them into f32 accumulators, so
//! this computes what widening both operands and multiplying in f32 computes (up to summation order; like
//! every AVX512-BF16 kernel it treats bf16 subnormals as zero), at twice the rate of f32 FMAs. It runs only
//! on CPUs that have the instructions ([`available`]); [`super::linear`] uses the f32 path otherwise.
//!
//! Layout (GotoBLAS-style): each rayon task owns [`NC`] output columns (weight rows). For each block of
//! [`KC`] inputs it packs its weight rows into micro-panels of [`NR`] columns, k-pairs outermost (each u32
//! holds the two bf16 values one `vdpbf16ps` lane multiplies), then walks all rows of x in tiles of [`MR`]:
//! the micro-kernel keeps an `MR × NR` f32 tile in 24 zmm registers and broadcasts one k-pair of x per row.
//!
//! Invariant: the one place that executes AVX512 code ([`matmul_bt`]) checks [`available`] first, and every
//! pointer the kernel reads is derived from a slice whose length was checked against the indices it covers.

#![allow(unsafe_code)]

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::error::Result;

/// Rows of x per micro-tile.
const MR: usize = 8;
/// zmm vectors (16 columns each) per micro-tile row.
const NV: usize = 3;
/// Columns per micro-tile.
const NR: usize = 16 * NV;
/// Inputs (k) per block; a packed micro-panel is `KC/2 × NR` u32 (192 KiB), streamed from L2 (measured
/// faster than L1-sized blocks, which write the output tile more often).
const KC: usize = 2048;
/// Output columns per task.
const NC: usize = NR * 4;

/// Whether this CPU has AVX512F and AVX512-BF16 (checked once).
pub(crate) fn available() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// `out [m, n] = x [m, k] · wᵀ` for x as bf16 bits (row-major) and `w` `[n, k]` bf16 read by `read_rows`.
///
/// `read_rows(row, bytes)` fills `bytes` with weight rows `row..` (little-endian bf16). `k` must be even and
/// [`available`] true; the caller checks both (this returns without computing otherwise, which the caller's
/// tests would catch).
pub(crate) fn matmul_bt(
    x: &[u16],
    m: usize,
    n: usize,
    k: usize,
    read_rows: &(dyn Fn(usize, &mut [u8]) -> Result<()> + Sync),
    out: &mut [f32],
) -> Result<()> {
    assert!(x.len() >= m * k && out.len() >= m * n, "bf16 matmul: buffers too short");
    if !available() || k % 2 != 0 || m == 0 || n == 0 {
        return Ok(());
    }
    // Each task writes the output columns of its weight rows; the rows of `out` interleave them, so tasks
    // share `out` through a pointer and write disjoint columns.
    let out_ptr = SendPtr(out.as_mut_ptr());
    (0..n.div_ceil(NC)).into_par_iter().try_for_each_init(
        || (Vec::new(), vec![0u32; NC / NR * (KC / 2) * NR]),
        |(bytes, packed): &mut (Vec<u8>, Vec<u32>), t| {
            let n0 = t * NC;
            let cols = NC.min(n - n0);
            bytes.resize(cols * k * 2, 0);
            read_rows(n0, bytes)?;
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available` said this CPU has AVX512F and AVX512-BF16. `bytes` holds `cols` weight rows
            // of k elements and x holds m rows of k; `out` holds m rows of n and this task writes only columns
            // n0..n0 + cols, which no other task writes, for as long as `out` is borrowed by this call.
            unsafe {
                task(x, m, n, k, bytes, cols, packed, out_ptr.at(n0));
            }
            Ok(())
        },
    )
}

/// The output's base pointer, shared by the tasks (each writes its own columns).
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);

impl SendPtr {
    /// The address `i` elements on. A method, so closures capture the whole `SendPtr` (which is `Sync`),
    /// not its raw-pointer field.
    fn at(self, i: usize) -> *mut f32 {
        self.0.wrapping_add(i)
    }
}
// SAFETY: the pointer is only used to write disjoint columns from different tasks (see `matmul_bt`).
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

/// One task: `cols` output columns starting at `out` (row stride n).
///
/// # Safety
/// AVX512F and AVX512-BF16 are available; `w` holds `cols · k` bf16 bytes; `out` is valid for writes of
/// rows `0..m` (stride n), columns `0..cols`, and nobody else accesses those elements meanwhile.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn task(
    x: &[u16],
    m: usize,
    n: usize,
    k: usize,
    w: &[u8],
    cols: usize,
    packed: &mut [u32],
    out: *mut f32,
) {
    let panels = cols.div_ceil(NR);
    let mut k0 = 0;
    while k0 < k {
        let kb = KC.min(k - k0);
        let kp = kb / 2;
        // Pack: panel q, pair p, column j = the two bf16 at w[q·NR + j][k0 + 2p ..], zeros past `cols`.
        for q in 0..panels {
            let panel = &mut packed[q * (KC / 2) * NR..][..kp * NR];
            for j in 0..NR {
                let col = q * NR + j;
                if col < cols {
                    let row = &w[(col * k + k0) * 2..(col * k + k0 + kb) * 2];
                    for (p, pair) in row.chunks_exact(4).enumerate() {
                        panel[p * NR + j] =
                            u32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]);
                    }
                } else {
                    for p in 0..kp {
                        panel[p * NR + j] = 0;
                    }
                }
            }
        }
        let mut m0 = 0;
        while m0 < m {
            let rows = MR.min(m - m0);
            let a = &x[m0 * k + k0..];
            for q in 0..panels {
                let panel = &packed[q * (KC / 2) * NR..][..kp * NR];
                let mut tile = [[0.0f32; NR]; MR];
                // SAFETY: the features are enabled in this function; `a` holds `rows` rows of stride k from
                // k0 with at least kb elements each, `panel` holds kp·NR packed pairs.
                unsafe {
                    match rows {
                        8 => kernel::<8>(a, k, panel, kp, &mut tile),
                        7 => kernel::<7>(a, k, panel, kp, &mut tile),
                        6 => kernel::<6>(a, k, panel, kp, &mut tile),
                        5 => kernel::<5>(a, k, panel, kp, &mut tile),
                        4 => kernel::<4>(a, k, panel, kp, &mut tile),
                        3 => kernel::<3>(a, k, panel, kp, &mut tile),
                        2 => kernel::<2>(a, k, panel, kp, &mut tile),
                        _ => kernel::<1>(a, k, panel, kp, &mut tile),
                    }
                }
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
            }
            m0 += rows;
        }
        k0 += kb;
    }
}

/// The micro-kernel: `tile[r][j] = Σ_p x[r][k-pair p] · panel[p][j]` for `R` rows.
///
/// # Safety
/// AVX512F and AVX512-BF16 are available; `a` holds R rows of stride `lda` with 2·kp elements each
/// (`a.len() ≥ (R − 1)·lda + 2·kp`); `panel.len() ≥ kp · NR`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn kernel<const R: usize>(
    a: &[u16],
    lda: usize,
    panel: &[u32],
    kp: usize,
    tile: &mut [[f32; NR]; MR],
) {
    use std::arch::x86_64::*;
    assert!(a.len() >= (R - 1) * lda + 2 * kp && panel.len() >= kp * NR);
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    let a = a.as_ptr();
    let b = panel.as_ptr();
    for p in 0..kp {
        // SAFETY: p < kp, so the three 16-lane loads cover panel[p·NR .. p·NR + 48], inside the panel; the
        // x reads are at (r·lda + 2p), inside row r of a (asserted above). Unaligned loads are used throughout.
        unsafe {
            let bp = b.add(p * NR);
            let bv: [__m512bh; NV] = [
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(16).cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(bp.add(32).cast())),
            ];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let pair = a.add(r * lda + 2 * p).cast::<i32>().read_unaligned();
                let av = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair));
                for (acc_rv, &bvv) in acc_r.iter_mut().zip(&bv) {
                    *acc_rv = _mm512_dpbf16_ps(*acc_rv, av, bvv);
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (v, &accv) in acc_r.iter().enumerate() {
            // SAFETY: tile row r has NR = 16·NV floats; lanes 16v..16v + 16 are inside it.
            unsafe { _mm512_storeu_ps(tile[r].as_mut_ptr().add(16 * v), accv) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    #[test]
    fn matches_an_f32_product_of_the_widened_operands() {
        if !available() {
            eprintln!("skipped: this CPU has no AVX512-BF16");
            return;
        }
        for (m, n, k) in [(11, 50, 64), (8, 48, 2), (3, 200, 1030), (17, 5, 6)] {
            let xv: Vec<bf16> =
                (0..m * k).map(|i| bf16::from_f32(((i * 7 % 13) as f32 - 6.0) / 8.0)).collect();
            let wv: Vec<bf16> =
                (0..n * k).map(|i| bf16::from_f32(((i * 5 % 11) as f32 - 5.0) / 4.0)).collect();
            let wbytes: Vec<u8> = wv.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
            let xbits: Vec<u16> = xv.iter().map(|v| v.to_bits()).collect();
            let mut out = vec![f32::NAN; m * n];
            let read = |row: usize, dst: &mut [u8]| -> Result<()> {
                dst.copy_from_slice(&wbytes[row * k * 2..row * k * 2 + dst.len()]);
                Ok(())
            };
            matmul_bt(&xbits, m, n, k, &read, &mut out).expect("matmul");
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
}
