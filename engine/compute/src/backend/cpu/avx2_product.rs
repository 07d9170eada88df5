//! The strided f32 product ([`super::packed_gemm::gemm_f32`]) on x86-64 CPUs with AVX2 and FMA but without
//! AVX-512 (AMD Zen 2 and 3, Intel's desktop cores), blocked for their caches as BLIS blocks its Zen kernels.
//!
//! - The micro-tile is [`MR`] × [`NR`] = 6 × 16 outputs in twelve ymm accumulators; each step loads two vectors
//!   of the right operand's packed micro-panel and broadcasts six values of the left operand.
//! - The right operand is packed per block of [`KC`] inputs into micro-panels of 16 columns (`[KC][16]`, 64 KiB,
//!   streamed from L2), so the shifted rows of a convolution's padded image are copied once per block and read
//!   contiguously.
//! - The left operand is packed once per block of inputs for every task, in tiles of six rows (`[KC][MR]`), where
//!   a task has enough column panels to repay the copy; for a few columns it is read in place. A task walks it
//!   in blocks of [`MC`] rows (in L2), each multiplied by every panel in turn.
//! - Tasks split the columns where there are many, each packing its own columns, and otherwise the rows, over
//!   the right operand packed once for all of them.
//!
//! Every output sums each block of [`KC`] inputs from zero in one fused multiply-add chain, inputs in order,
//! and then sets or adds `scale` times that sum into the destination: the order the AVX-512 kernel of
//! `packed_gemm` keeps, so a product gives the same bits on either kind of CPU.
//!
//! Invariant: the functions marked `target_feature` run only after [`super::avx2::available`] said the CPU has
//! AVX2 and FMA, and every pointer a kernel reads or writes is derived from a slice or a destination whose
//! bounds were checked against the indices it covers.

#![allow(unsafe_code)]

use std::ops::Range;

use rayon::prelude::*;

use super::gemm::{Mat, MatMut, Threads};
use super::packed_gemm::{F32, Kind, Rhs, SendPtr, aligned, with_thread_buffer};

/// Rows per micro-tile.
const MR: usize = 6;
/// Columns per micro-tile (two ymm vectors).
pub(super) const NR: usize = 16;
/// Inputs summed from zero before they meet the destination: `packed_gemm`'s block, for the same bits.
const KC: usize = F32::KC;
/// Rows of the left operand packed together: 72 × 1024 f32 (288 KiB) stay in L2 while every column panel of
/// the task multiplies them.
const MC: usize = MR * 12;
/// Most columns a task packs: 1024 × 1024 f32 (4 MiB) of the right operand a block, in L3.
const NC: usize = NR * 64;
/// Fewest column panels a task needs before the left operand is packed. With fewer, each six-row tile read in
/// place (in L1) meets every panel in turn, and the packing would cost about what it saves: on an AVX2 EPYC
/// (`examples/conv_probe.rs`, 3×3, 2 threads) a 1024-channel 8² convolution (4 panels) took 0.0125 s in place
/// against 0.0175 s packed, a 512-channel 16² one (18 panels) 0.0101–0.0111 s against 0.012 s; from 34 panels
/// (256 channels at 32²) the two are even.
const PACK_A_PANELS: usize = 24;

thread_local! {
    /// The left operand packed for every task of a product, kept by the calling thread for its next one.
    static SHARED_A: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The right operand packed once for the row tasks of a product, kept as [`SHARED_A`].
    static SHARED_B: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// The right operand's packed micro-panels of a column task, reused across calls on a thread.
    static PACK_B: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `dst = scale · a · b` (or `dst += …` with `accumulate`): the contract of
/// [`super::packed_gemm::gemm_f32`], which checked the shapes, strides and bounds and that the CPU has AVX2.
pub(super) fn gemm_f32(
    (m, n, k): (usize, usize, usize),
    dst: MatMut<'_>,
    a: Mat<'_>,
    b: Rhs<'_>,
    accumulate: bool,
    scale: f32,
    threads: Threads,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let pool = match threads {
        Threads::One => 1,
        Threads::All => rayon::current_num_threads().max(1),
    };
    let product = Product { a, b, m, ldo: dst.rs, scale, out: SendPtr(dst.data.as_mut_ptr()) };
    let panels = n.div_ceil(NR);
    // Many columns, or too few row tiles for every thread: column tasks of whole panels, as many as the pool
    // has threads or a multiple of it, each packing its own. Otherwise the right operand packed once and the
    // rows split between the tasks.
    let by_columns = panels >= 16 * pool || m.div_ceil(MR) < 2 * pool.min(panels);
    let width = if by_columns {
        let tasks = panels.div_ceil(NC / NR).div_ceil(pool) * pool;
        panels.div_ceil(tasks.min(panels)) * NR
    } else {
        panels * NR
    };
    let rows = if by_columns { m } else { m.div_ceil(2 * pool).next_multiple_of(MR) };
    let tasks = if by_columns { n.div_ceil(width) } else { m.div_ceil(rows) };
    with_thread_buffer(&SHARED_A, |packed_a| {
        with_thread_buffer(&SHARED_B, |packed_b| {
            let mut k0 = 0;
            while k0 < k {
                let kb = KC.min(k - k0);
                let set = k0 == 0 && !accumulate;
                // The left operand's block, packed once for every task where each task has the panels to
                // repay it.
                let a_block = if width / NR >= PACK_A_PANELS {
                    let tiles = aligned(packed_a, m.next_multiple_of(MR) * kb);
                    product.pack_a(k0, kb, tiles, threads);
                    A::Packed(tiles)
                } else {
                    A::InPlace(&a.data[k0..], a.rs)
                };
                let shared_b: &[f32] = if by_columns {
                    &[]
                } else {
                    let panels_b = aligned(packed_b, panels * kb * NR);
                    product.pack_b(k0, kb, (0, n), panels_b, threads);
                    panels_b
                };
                let task = |t: usize| {
                    if by_columns {
                        let (c0, cols) = (t * width, width.min(n - t * width));
                        with_thread_buffer(&PACK_B, |buf| {
                            let panels_b = aligned(buf, cols.div_ceil(NR) * kb * NR);
                            product.pack_b(k0, kb, (c0, cols), panels_b, Threads::One);
                            // SAFETY: `gemm_f32`'s checks cover rows 0..m of a and inputs k0..k0 + kb of b;
                            // this task alone writes columns c0..c0 + cols of dst.
                            unsafe { product.block(a_block, 0..m, (kb, set), panels_b, (c0, cols)) }
                        });
                    } else {
                        // Row tasks start at multiples of MR, where a packed tile starts.
                        let r0 = t * rows;
                        let task_rows = r0..(r0 + rows).min(m);
                        // SAFETY: as above; this task alone writes rows r0..r0 + rows of dst.
                        unsafe { product.block(a_block, task_rows, (kb, set), shared_b, (0, n)) }
                    }
                };
                match threads {
                    Threads::One => (0..tasks).for_each(task),
                    Threads::All => (0..tasks).into_par_iter().for_each(task),
                }
                k0 += kb;
            }
        })
    });
}

/// One product's operands and its destination.
struct Product<'a> {
    a: Mat<'a>,
    b: Rhs<'a>,
    /// Rows of a and of the destination.
    m: usize,
    /// The destination's row stride.
    ldo: usize,
    scale: f32,
    /// The destination's first element.
    out: SendPtr,
}

impl Product<'_> {
    /// Packs inputs `k0..k0 + kb`, columns `c0..c0 + cols` of b into micro-panels of [`NR`] columns
    /// (`[kb][NR]` each, zeros past the last column).
    fn pack_b(
        &self,
        k0: usize,
        kb: usize,
        (c0, cols): (usize, usize),
        dst: &mut [f32],
        threads: Threads,
    ) {
        let data = self.b.data();
        let pack_panel = |(q, panel): (usize, &mut [f32])| {
            let (from, width) = (c0 + q * NR, NR.min(cols - q * NR));
            for (s, dst) in panel.chunks_exact_mut(NR).enumerate() {
                let (row, cs) = self.b.row(k0 + s);
                let at = row + from * cs;
                if cs == 1 {
                    dst[..width].copy_from_slice(&data[at..at + width]);
                } else {
                    dst[..width].iter_mut().enumerate().for_each(|(j, d)| *d = data[at + j * cs]);
                }
                dst[width..].fill(0.0);
            }
        };
        match threads {
            Threads::One => dst.chunks_exact_mut(kb * NR).enumerate().for_each(pack_panel),
            Threads::All => dst.par_chunks_exact_mut(kb * NR).enumerate().for_each(pack_panel),
        }
    }

    /// Packs inputs `k0..k0 + kb` of every row of a into tiles of [`MR`] rows, `[kb][MR]` each (a last tile of
    /// fewer rows keeps the stride, its missing rows unset).
    fn pack_a(&self, k0: usize, kb: usize, dst: &mut [f32], threads: Threads) {
        let pack_tile = |(t, tile): (usize, &mut [f32])| {
            let r0 = t * MR;
            let count = MR.min(self.m - r0);
            let rows: [&[f32]; MR] = std::array::from_fn(|r| {
                &self.a.data[(r0 + r.min(count - 1)) * self.a.rs + k0..][..kb]
            });
            pack_rows(&rows[..count], tile);
        };
        match threads {
            Threads::One => dst.chunks_exact_mut(kb * MR).enumerate().for_each(pack_tile),
            Threads::All => dst.par_chunks_exact_mut(kb * MR).enumerate().for_each(pack_tile),
        }
    }

    /// Rows `rows` of a (`a`: its current block of `kb` inputs) times the packed columns `panels`, set
    /// (`set`) or added into columns `c0..c0 + cols` of the destination.
    ///
    /// # Safety
    /// The operands cover `rows` and the block's inputs; the destination is valid for writes of those rows and
    /// columns, which nobody else accesses meanwhile; `panels` holds `cols.div_ceil(NR)` packed micro-panels of
    /// `kb` inputs; the CPU has AVX2 and FMA.
    unsafe fn block(
        &self,
        a: A<'_>,
        rows: Range<usize>,
        (kb, set): (usize, bool),
        panels: &[f32],
        (c0, cols): (usize, usize),
    ) {
        let tile = |r0: usize, q: usize, panel: &[f32], last: usize| {
            let tile = Tile {
                rows: MR.min(last - r0),
                width: NR.min(cols - q * NR),
                out: self.out.at(r0 * self.ldo + c0 + q * NR),
                ldo: self.ldo,
                set,
                scale: self.scale,
            };
            // SAFETY: the tile's rows and columns lie in the caller's block; `a` holds row r0 on (r0 is a
            // multiple of MR where a is packed) over kb inputs, the panel kb · NR values.
            unsafe { a.tile(r0, panel, kb, tile) };
        };
        let panels = panels.chunks_exact(kb * NR).enumerate();
        match a {
            // Blocks of MC packed rows (in L2), each multiplied by every panel in turn (in L1 and L2).
            A::Packed(_) => {
                for i0 in rows.clone().step_by(MC) {
                    let last = (i0 + MC).min(rows.end);
                    for (q, panel) in panels.clone() {
                        (i0..last).step_by(MR).for_each(|r0| tile(r0, q, panel, last));
                    }
                }
            }
            // Rows in place: each tile's rows (in L1) times every panel, the few panels in L2.
            A::InPlace(..) => {
                for r0 in rows.clone().step_by(MR) {
                    panels.clone().for_each(|(q, panel)| tile(r0, q, panel, rows.end));
                }
            }
        }
    }
}

/// Packs up to [`MR`] rows of equal length into `tile` (`[len][MR]`): eight inputs of six rows at a time by an
/// 8 × 8 register transpose where the tile is whole and the CPU has AVX2, element by element otherwise.
fn pack_rows(rows: &[&[f32]], tile: &mut [f32]) {
    let len = rows.first().map_or(0, |r| r.len());
    let from = if rows.len() == MR { by_transposes(rows, tile) } else { 0 };
    for (r, row) in rows.iter().enumerate() {
        for (s, v) in row.iter().enumerate().take(len).skip(from) {
            tile[s * MR + r] = *v;
        }
    }
}

/// [`transpose6x8`] where the CPU has AVX2: how many inputs of the six `rows` it packed (0 without AVX2).
fn by_transposes(rows: &[&[f32]], tile: &mut [f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if super::avx2::available() {
        let rows: [&[f32]; MR] = std::array::from_fn(|r| rows[r]);
        // SAFETY: the CPU has AVX2; `transpose6x8` checks the lengths.
        return unsafe { transpose6x8(rows, tile) };
    }
    let _ = (rows, tile);
    0
}

/// `tile[s·MR + r] = rows[r][s]` for whole blocks of eight `s`; returns how many `s` it packed. Each input's
/// six values are stored as a vector of eight, in order, so the two extra lanes land where the next input's
/// first two go (written after them, by the next store or by [`pack_rows`]' remainder); only a store that would
/// pass the tile's end keeps to its six.
///
/// # Safety
/// The CPU has AVX2. The lengths are asserted.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn transpose6x8(rows: [&[f32]; MR], tile: &mut [f32]) -> usize {
    use std::arch::x86_64::*;
    let len = rows[0].len();
    assert!(rows.iter().all(|r| r.len() == len) && tile.len() >= len * MR);
    let whole = len / 8 * 8;
    for s0 in (0..whole).step_by(8) {
        // Six rows and two of zeros.
        let r: [__m256; 8] = std::array::from_fn(|i| {
            if i < MR {
                // SAFETY: s0 + 8 ≤ len for every row (asserted); unaligned loads.
                unsafe { _mm256_loadu_ps(rows[i].as_ptr().add(s0)) }
            } else {
                _mm256_setzero_ps()
            }
        });
        for (c, column) in super::avx2::transpose8(r).into_iter().enumerate() {
            let at = (s0 + c) * MR;
            if at + 8 <= tile.len() {
                // SAFETY: at + 8 ≤ tile.len(), checked.
                unsafe { _mm256_storeu_ps(tile.as_mut_ptr().add(at), column) };
            } else {
                let mut lanes = [0.0f32; 8];
                // SAFETY: `lanes` holds eight values.
                unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), column) };
                tile[at..at + MR].copy_from_slice(&lanes[..MR]);
            }
        }
    }
    whole
}

/// The left operand of a micro-tile.
#[derive(Clone, Copy)]
enum A<'a> {
    /// Packed by [`Product::pack_a`].
    Packed(&'a [f32]),
    /// In place: row r at `r · stride`.
    InPlace(&'a [f32], usize),
}

impl A<'_> {
    /// The micro-tile of rows `r0..r0 + tile.rows` (of this block) times `panel`.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA; the rows hold `kb` inputs each; `tile.out` is valid as [`Tile`] says.
    unsafe fn tile(self, r0: usize, panel: &[f32], kb: usize, tile: Tile) {
        // SAFETY: the caller's promise; each arm's slice starts at the tile's first row.
        unsafe {
            match self {
                A::Packed(p) => dispatch::<true>(&p[r0 / MR * kb * MR..], MR, panel, kb, tile),
                A::InPlace(d, stride) => {
                    dispatch::<false>(&d[r0 * stride..], stride, panel, kb, tile)
                }
            }
        }
    }
}

/// Where a micro-tile's sums go: `rows` × `width` outputs at `out` (row stride `ldo`), set to `scale` times
/// the sum or added to.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct Tile {
    rows: usize,
    width: usize,
    out: *mut f32,
    ldo: usize,
    set: bool,
    scale: f32,
}

/// Runs [`kernel`] for the tile's row count.
///
/// # Safety
/// As [`kernel`] for `R = tile.rows`.
unsafe fn dispatch<const PACKED: bool>(
    a: &[f32],
    lda: usize,
    panel: &[f32],
    kb: usize,
    tile: Tile,
) {
    // SAFETY: the caller's promise for R = tile.rows.
    unsafe {
        match tile.rows {
            6 => kernel::<6, PACKED>(a, lda, panel, kb, tile),
            5 => kernel::<5, PACKED>(a, lda, panel, kb, tile),
            4 => kernel::<4, PACKED>(a, lda, panel, kb, tile),
            3 => kernel::<3, PACKED>(a, lda, panel, kb, tile),
            2 => kernel::<2, PACKED>(a, lda, panel, kb, tile),
            _ => kernel::<1, PACKED>(a, lda, panel, kb, tile),
        }
    }
}

/// The micro-kernel: `R` rows of a times the `[kb][NR]` panel, each output one FMA chain from zero, then
/// `out = scale · sum` (`tile.set`) or `out += scale · sum` for the tile's first `width` columns. Packed, a's
/// step p of row r is `a[p·MR + r]`; in place it is `a[r·lda + p]`.
///
/// # Safety
/// The CPU has AVX2 and FMA; `tile.out` is valid for reads and writes of `R` rows (stride `tile.ldo`) of
/// `tile.width` values, which nobody else accesses meanwhile. The slices' lengths are asserted.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel<const R: usize, const PACKED: bool>(
    a: &[f32],
    lda: usize,
    panel: &[f32],
    kb: usize,
    tile: Tile,
) {
    use std::arch::x86_64::*;
    let a_len = if PACKED { (kb - 1) * MR + R } else { (R - 1) * lda + kb };
    assert!(R <= MR && kb > 0 && a.len() >= a_len && panel.len() >= kb * NR);
    let (ap, bp) = (a.as_ptr(), panel.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for p in 0..kb {
        // SAFETY: p < kb, so the two loads lie in panel[p·NR..(p + 1)·NR] and the reads of a at p·MR + r
        // (packed) or r·lda + p (in place) lie within a_len (asserted). The prefetch is a hint.
        unsafe {
            let b = bp.add(p * NR);
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(8 * NR).cast());
            let bv = [_mm256_loadu_ps(b), _mm256_loadu_ps(b.add(8))];
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let at = if PACKED { p * MR + r } else { r * lda + p };
                let av = _mm256_broadcast_ss(&*ap.add(at));
                acc_r[0] = _mm256_fmadd_ps(av, bv[0], acc_r[0]);
                acc_r[1] = _mm256_fmadd_ps(av, bv[1], acc_r[1]);
            }
        }
    }
    let scale = _mm256_set1_ps(tile.scale);
    for (r, acc_r) in acc.iter().enumerate() {
        // SAFETY: row r < R of the tile, `width` values (the caller's promise).
        let row = unsafe { tile.out.add(r * tile.ldo) };
        let sums = [_mm256_mul_ps(scale, acc_r[0]), _mm256_mul_ps(scale, acc_r[1])];
        if tile.width == NR {
            for (half, &v) in sums.iter().enumerate() {
                // SAFETY: 8·half + 8 ≤ NR = width values of the row.
                unsafe {
                    let d = row.add(8 * half);
                    let v = if tile.set { v } else { _mm256_add_ps(_mm256_loadu_ps(d), v) };
                    _mm256_storeu_ps(d, v);
                }
            }
        } else {
            let mut vals = [0.0f32; NR];
            // SAFETY: `vals` holds NR = 16 values.
            unsafe {
                _mm256_storeu_ps(vals.as_mut_ptr(), sums[0]);
                _mm256_storeu_ps(vals.as_mut_ptr().add(8), sums[1]);
            }
            for (j, v) in vals.iter().take(tile.width).enumerate() {
                // SAFETY: j < width.
                unsafe {
                    let d = row.add(j);
                    *d = if tile.set { *v } else { *d + v };
                }
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn kernel<const R: usize, const PACKED: bool>(
    _: &[f32],
    _: usize,
    _: &[f32],
    _: usize,
    _: Tile,
) {
    unreachable!("AVX2 is x86-64's")
}

#[cfg(test)]
mod tests {
    use super::super::avx2;
    use super::*;

    /// The product by loops in the kernels' order: per block of KC inputs one chain from zero (each step
    /// `fma`), then set or added as `scale · sum`.
    fn by_loops(
        (m, n, k): (usize, usize, usize),
        dst: &mut [f32],
        a: &[f32],
        b: &[f32],
        accumulate: bool,
        scale: f32,
    ) {
        for i in 0..m {
            for j in 0..n {
                for k0 in (0..k).step_by(KC) {
                    let sum = (k0..(k0 + KC).min(k))
                        .fold(0.0f32, |acc, p| a[i * k + p].mul_add(b[p * n + j], acc));
                    let d = &mut dst[i * n + j];
                    *d = if k0 == 0 && !accumulate { scale * sum } else { *d + scale * sum };
                }
            }
        }
    }

    /// The product of `b` given as each right operand form against the loops, with every pool size.
    fn check(shape: (usize, usize, usize), a: &[f32], b: &[f32], forms: &[(&str, Rhs<'_>)]) {
        let (m, n, k) = shape;
        let start: Vec<f32> = (0..m * n).map(|i| (i % 3) as f32 - 1.0).collect();
        for (accumulate, scale) in [(false, 1.0), (false, -0.75), (true, 0.5)] {
            let mut want = start.clone();
            by_loops(shape, &mut want, a, b, accumulate, scale);
            // Pools of 1, 2, 3 and 7 threads take different splits (rows or columns, packed or in place).
            for pool in [1, 2, 3, 7] {
                let pool =
                    rayon::ThreadPoolBuilder::new().num_threads(pool).build().expect("a pool");
                for threads in [Threads::One, Threads::All] {
                    for (form, rhs) in forms {
                        let mut got = start.clone();
                        pool.install(|| {
                            let dst = MatMut::rows(&mut got, n);
                            gemm_f32(shape, dst, Mat::rows(a, k), *rhs, accumulate, scale, threads)
                        });
                        assert!(
                            got.iter().zip(&want).all(|(g, w)| g.to_bits() == w.to_bits()),
                            "{m}×{n}×{k} ({form}), accumulate {accumulate}, scale {scale}, {threads:?}, \
                             {} threads",
                            pool.current_num_threads()
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn matches_loops_bit_for_bit_over_every_split() {
        if !avx2::available() {
            return;
        }
        // Shapes that take each split and path: few columns (rows split), many (column tasks), a read in place
        // (few panels a task) or packed (from PACK_A_PANELS; whole blocks of eight inputs by the register
        // transpose, the rest one by one; more rows than one block of MC), edges of rows and columns, and more
        // inputs than one block.
        let shapes = [
            (7, 5, 9),
            (13, 40, 30),
            (80, 100, 20),
            (9, 600, 17),
            (75, 300, 1100),
            (1, 33, 5),
            (6, 16, 2049),
            (20, 1000, 40),
            (4, 1000, 20),
            (50, 420, 30),
            (149, 400, 30),
        ];
        for (m, n, k) in shapes {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7 % 23) as f32 - 11.0) * 0.37).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5 % 19) as f32 - 9.0) * 0.29).collect();
            // b as a row-major matrix, as its transpose's transpose (column stride k), and as rows at offsets
            // (a convolution's shifted views): row p of b at p·(n + 3) in a wider buffer.
            let bt: Vec<f32> = (0..n * k).map(|i| b[(i % k) * n + i / k]).collect();
            let wide: Vec<f32> = (0..k * (n + 3))
                .map(|i| if i % (n + 3) < n { b[i / (n + 3) * n + i % (n + 3)] } else { 7.0 })
                .collect();
            let offsets: Vec<usize> = (0..k).map(|p| p * (n + 3)).collect();
            let forms = [
                ("rows", Rhs::Strided(Mat::rows(&b, n))),
                ("transposed", Rhs::Strided(Mat::rows_t(&bt, k))),
                ("offsets", Rhs::Rows { data: &wide, offsets: &offsets }),
            ];
            check((m, n, k), &a, &b, &forms);
        }
    }
}
