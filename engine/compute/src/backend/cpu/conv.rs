//! 2-D convolution on the CPU, as GEMMs.
//!
//! - Stride 1 (a VAE's 3×3 and 1×1 convs): the input is zero-padded once. Computing the output over the
//!   padded width (and dropping the extra columns) makes the input shifted by a kernel tap (ky, kx) a plain
//!   strided matrix, so no im2col buffer is built. Small images go through together, stacked in height (the
//!   rows that straddle two of them dropped like the extra columns), so the kernel is packed once for all of
//!   them. Where the packed product runs (AVX-512, or AVX2 and FMA) all taps are one GEMM whose right
//!   operand's rows are those shifted planes (K = C·kh·kw); otherwise each tap is one GEMM
//!   `w[:, :, ky, kx] · shifted input` accumulated into the output. A 1×1 conv without padding is a single
//!   GEMM on each input.
//! - Small planes (a video VAE's first blocks, 4² or 8²), where the padded columns would be a large part of
//!   the product, and other strides: im2col, one product over the columns of every image (small planes) or
//!   over bands of output rows (bounded scratch). Its right operand holds the same values in the same order as
//!   the padded form, so on the packed product both give the same bits. Without it (no AVX2) small planes stay
//!   on the padded form, whose per-tap products were measured there.

use std::ops::Range;

use rayon::prelude::*;

use super::gemm::{Mat, MatMut, Threads, gemm};
use super::packed_gemm::{self, F32, Kind, Rhs};
use super::storage::{PAR_CHUNK, read_f32_range, tensor_from_f32};
use super::weights::{vector, with_f32};
use super::{Cpu, avx2_product};
use crate::backend::{Conv2dParams, ConvGeometry, ConvTerm};
use crate::error::Result;
use crate::tensor::{Tensor, Weight};

/// Largest im2col matrix, in elements; with whole images together, also the largest output gathered back.
const IM2COL_ELEMS: usize = 1 << 23;
/// Largest padded input of images convolved together, in elements (the output over the padded planes is
/// about as large per output channel): a single image of any size goes alone.
const STACKED_ELEMS: usize = 1 << 22;

/// 2-D convolution (see [`crate::Backend::conv2d`]).
pub(crate) fn conv2d(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    w: &Weight<'_>,
    bias: Option<&Weight<'_>>,
    params: Conv2dParams,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "conv2d";
    let batch = x.shape().first().copied().unwrap_or(0);
    let (mut out, shape) = convolve(cpu, x, 0..batch, w, params, OP)?;
    add_bias(cpu, &mut out, bias, shape, OP)?;
    tensor_from_f32(shape.to_vec(), out, x.dtype(), OP)
}

/// The sum of 2-D convolutions into one output (see [`crate::Backend::conv2d_sum`]): each term's f32 values
/// added into an f32 output, the bias after them, rounded once.
pub(crate) fn conv2d_sum(
    cpu: &Cpu,
    terms: &[ConvTerm<'_, Cpu>],
    bias: Option<&Weight<'_>>,
    params: Conv2dParams,
    batch: usize,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "conv2d_sum";
    ConvTerm::check_sum(OP, terms, batch)?;
    let first = &terms[0];
    if terms.len() == 1 && first.at == 0 && first.n == batch && first.x.shape()[0] == batch {
        return conv2d(cpu, first.x, first.w, bias, params);
    }
    let g = ConvGeometry::of(OP, first.x.shape(), first.w.shape(), params)?;
    let sample = g.o * g.oh * g.ow;
    let shape = [batch, g.o, g.oh, g.ow];
    let mut out = vec![0.0f32; batch * sample];
    for t in terms {
        let values = convolve(cpu, t.x, t.from..t.from + t.n, t.w, params, OP)?.0;
        let dst = &mut out[t.at * sample..(t.at + t.n) * sample];
        dst.par_chunks_mut(PAR_CHUNK).zip(values.par_chunks(PAR_CHUNK)).for_each(|(d, v)| {
            d.iter_mut().zip(v).for_each(|(d, v)| *d += v);
        });
    }
    add_bias(cpu, &mut out, bias, shape, OP)?;
    tensor_from_f32(shape.to_vec(), out, first.x.dtype(), OP)
}

/// Adds `bias` `[O]` to every plane of `out` `[B, O, OH, OW]`.
fn add_bias(
    cpu: &Cpu,
    out: &mut [f32],
    bias: Option<&Weight<'_>>,
    [_, o, oh, ow]: [usize; 4],
    op: &'static str,
) -> Result<()> {
    let Some(bias) = vector(cpu.sim(), op, "bias", bias, o)? else {
        return Ok(());
    };
    let plane = oh * ow;
    if plane > 0 {
        out.par_chunks_mut(plane).enumerate().for_each(|(i, plane)| {
            let v = bias[i % o];
            plane.iter_mut().for_each(|x| *x += v);
        });
    }
    Ok(())
}

/// The convolution of `samples` of `x` `[B, C, H, W]` with `w` `[O, C, kh, kw]` in f32, no bias, not rounded: its
/// values and their shape `[samples, O, OH, OW]`.
fn convolve(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    samples: Range<usize>,
    w: &Weight<'_>,
    params: Conv2dParams,
    op: &'static str,
) -> Result<(Vec<f32>, [usize; 4])> {
    let g = ConvGeometry::of(op, x.shape(), w.shape(), params)?;
    let b = samples.len();
    // A range past x's samples is a shape error of the read.
    let per_sample = g.c * g.h * g.w;
    let xs = read_f32_range(x, samples.start * per_sample..samples.end * per_sample, op)?;
    let (o, plane_out) = (g.o, g.oh * g.ow);
    let mut out = vec![0.0f32; b * o * plane_out];
    // Without input elements (no channels, or rows only of padding) every product is 0.
    if plane_out > 0 && o > 0 && per_sample > 0 {
        // The kernel in f32 once for every sample: read where it lies, or widened into the thread's buffer.
        with_f32(cpu.sim(), w, |weights| {
            let packed = packed_gemm::F32::available();
            if g.stride == 1 && !(packed && padding_dominates(&g)) {
                let n = stacked(&g, b);
                for (xi, oi) in xs.chunks(n * per_sample).zip(out.chunks_mut(n * o * plane_out)) {
                    conv_taps(&g, xi, weights, oi, packed);
                }
            } else {
                conv_im2col(&g, &xs, weights, &mut out);
            }
            Ok(())
        })?;
    }
    Ok((out, [b, o, g.oh, g.ow]))
}

/// How many of `b` images [`conv_taps`] takes together: as many as keep their padded planes within
/// [`STACKED_ELEMS`], at least one.
fn stacked(g: &ConvGeometry, b: usize) -> usize {
    let [top, bottom, left, right] = g.pad;
    let padded = g.c.max(g.o) * (g.h + top + bottom) * (g.w + left + right);
    (STACKED_ELEMS / padded.max(1)).clamp(1, b.max(1))
}

/// Columns of [`conv_taps`]' product for `n` images: their padded planes stacked in height, down to the last
/// image's last output row.
fn stacked_cols(g: &ConvGeometry, n: usize) -> usize {
    let [top, bottom, left, right] = g.pad;
    let (hp, wp) = (g.h + top + bottom, g.w + left + right);
    ((n.max(1) - 1) * hp + g.oh) * wp
}

/// Whether one image's padded columns ([`conv_taps`]' product, rounded to whole micro-panels) would exceed its
/// output columns by more than a fifth: a 4² plane computes 24 columns (32 in panels of 16) for 16 outputs,
/// an 8² one 80 for 64; from 16² (288 for 256) the padded form is cheaper than building im2col's columns.
/// Measured with AVX2's panels; AVX-512's are wider (64), which only makes the padding's share larger.
fn padding_dominates(g: &ConvGeometry) -> bool {
    let panel = avx2_product::NR;
    let padded = stacked_cols(g, 1).next_multiple_of(panel);
    5 * padded > 6 * (g.oh * g.ow).next_multiple_of(panel)
}

/// Stride-1 convolution of images `x` `[n, C, H, W]` into `out` `[n, O, OH, OW]`: one GEMM over all of them
/// (or one per kernel tap), the images' padded planes stacked in height; a 1 × 1 kernel without padding is one
/// GEMM per image, on the packed kernel too when `fused`. The packed product sums each output in the same order
/// however many images go together; the `gemm` crate's blocking of K can depend on the
/// column count (above 512 channels), so there a stacked image may round differently from a lone one.
fn conv_taps(g: &ConvGeometry, x: &[f32], w: &[f32], out: &mut [f32], fused: bool) {
    let [top, bottom, left, right] = g.pad;
    let taps = g.kh * g.kw;
    let wrow = g.c * taps;
    let image = g.c * g.h * g.w;
    let n = x.len() / image.max(1);
    let plane = g.oh * g.ow;
    if taps == 1 && g.pad == [0; 4] {
        for (x, out) in x.chunks(image).zip(out.chunks_mut(g.o * plane)) {
            product(fused, (g.o, plane, g.c), MatMut::rows(out, plane), w, x);
        }
        return;
    }
    let (hp, wp) = (g.h + top + bottom, g.w + left + right);
    // The padded input `[C, n·hp, wp]` (channel c's planes of every image, one under the other), with kw − 1
    // spare zeros so the last channel's shifted views stay in bounds.
    let stack = n * hp * wp;
    let mut padded = vec![0.0f32; g.c * stack + g.kw - 1];
    padded[..g.c * stack].par_chunks_mut(hp * wp).enumerate().for_each(|(i, dst)| {
        let (ch, image_at) = (i / n, i % n);
        let src = &x[image_at * image + ch * g.h * g.w..][..g.h * g.w];
        for (y, row) in src.chunks(g.w).enumerate() {
            let at = (y + top) * wp + left;
            dst[at..at + g.w].copy_from_slice(row);
        }
    });
    // The output over the stacked padded planes: column y·wp + x, of which rows y = i·hp + oy (oy < oh) and
    // columns x < ow are image i's.
    let cols = stacked_cols(g, n);
    let direct = n == 1 && g.ow == wp;
    let mut wide = if direct { Vec::new() } else { vec![0.0f32; g.o * cols] };
    let dst_buf: &mut [f32] = if direct { out } else { &mut wide };
    if fused {
        // One product over every (channel, tap) pair: row c·taps + t of the right operand is channel c's
        // padded planes shifted by tap t, and the weight as stored, `[O, C·kh·kw]`, is the left operand.
        let offsets: Vec<usize> = (0..g.c * taps)
            .map(|r| {
                let (ch, t) = (r / taps, r % taps);
                ch * stack + t / g.kw * wp + t % g.kw
            })
            .collect();
        let rhs = Rhs::Rows { data: &padded, offsets: &offsets };
        let dst = MatMut::rows(dst_buf, cols);
        packed_gemm::gemm_f32(
            (g.o, cols, g.c * taps),
            dst,
            Mat::rows(w, wrow),
            rhs,
            false,
            1.0,
            Threads::All,
        );
    } else {
        conv_tap_by_tap(g, w, (&padded, stack, wp), cols, dst_buf);
    }
    if !direct {
        // Output plane i (image i / O, channel i % O) from rows (i / O)·hp.. of the wide channel i % O.
        out.par_chunks_mut(plane).enumerate().for_each(|(i, dst)| {
            let (image_at, ch) = (i / g.o, i % g.o);
            let src = &wide[ch * cols + image_at * hp * wp..];
            for (drow, srow) in dst.chunks_mut(g.ow).zip(src.chunks(wp)) {
                drow.copy_from_slice(&srow[..g.ow]);
            }
        });
    }
}

/// The portable form of [`conv_taps`]' product: one GEMM per kernel tap, accumulated into `dst`
/// (`[O, cols]`); each channel's padded planes are `stack` elements of `padded`, rows of `wp`.
fn conv_tap_by_tap(
    g: &ConvGeometry,
    w: &[f32],
    (padded, stack, wp): (&[f32], usize, usize),
    cols: usize,
    dst: &mut [f32],
) {
    let taps = g.kh * g.kw;
    // Each tap's weights as a contiguous `[O, C]` matrix (the GEMMs read rows of the left operand).
    let mut tap_w = vec![0.0f32; taps * g.o * g.c];
    for (i, v) in w.iter().enumerate() {
        let (row, t) = (i / taps, i % taps);
        tap_w[t * g.o * g.c + row] = *v;
    }
    for ky in 0..g.kh {
        for kx in 0..g.kw {
            let t = ky * g.kw + kx;
            let lhs = Mat::rows(&tap_w[t * g.o * g.c..(t + 1) * g.o * g.c], g.c);
            let rhs = Mat { data: &padded[ky * wp + kx..], rs: stack, cs: 1 };
            gemm(g.o, cols, g.c, MatMut::rows(dst, cols), lhs, rhs, t > 0, 1.0, Threads::All);
        }
    }
}

/// Convolution of images `x` `[n, C, H, W]` (any stride) into `out` `[n, O, OH, OW]` by im2col: whole images
/// together where their columns fit [`IM2COL_ELEMS`] (the product's output then gathered back per image), else
/// each image in bands of output rows.
fn conv_im2col(g: &ConvGeometry, x: &[f32], w: &[f32], out: &mut [f32]) {
    let krows = g.c * g.kh * g.kw;
    let (image, plane) = (g.c * g.h * g.w, g.oh * g.ow);
    let n = x.len() / image.max(1);
    let fit = IM2COL_ELEMS / krows.max(1);
    let packed = F32::available();
    if plane <= fit {
        // Columns and gathered outputs both within the bound.
        let group = (IM2COL_ELEMS / krows.max(g.o).max(1) / plane).clamp(1, n.max(1));
        let mut col = vec![0.0f32; krows * group * plane];
        let mut wide = vec![0.0f32; if group > 1 { g.o * group * plane } else { 0 }];
        for (xs, outs) in x.chunks(group * image).zip(out.chunks_mut(group * g.o * plane)) {
            let cols = xs.len() / image * plane;
            let col = &mut col[..krows * cols];
            im2col(g, xs, 0..g.oh, col);
            if cols == plane {
                product(packed, (g.o, cols, krows), MatMut::rows(outs, plane), w, col);
                continue;
            }
            let wide = &mut wide[..g.o * cols];
            product(packed, (g.o, cols, krows), MatMut::rows(wide, cols), w, col);
            // Output plane i (image i / O, channel i % O) from columns of image i / O in row i % O.
            outs.par_chunks_mut(plane).enumerate().for_each(|(i, dst)| {
                let (image_at, ch) = (i / g.o, i % g.o);
                dst.copy_from_slice(&wide[ch * cols + image_at * plane..][..plane]);
            });
        }
        return;
    }
    let band = (fit / g.ow.max(1)).clamp(1, g.oh);
    let mut col = vec![0.0f32; krows * band * g.ow];
    for (xi, oi) in x.chunks(image).zip(out.chunks_mut(g.o * plane)) {
        for y0 in (0..g.oh).step_by(band) {
            let rows = y0..(y0 + band).min(g.oh);
            let cols = rows.len() * g.ow;
            let col = &mut col[..krows * cols];
            im2col(g, xi, rows, col);
            let dst = MatMut { data: &mut oi[y0 * g.ow..], rs: plane, cs: 1 };
            product(packed, (g.o, cols, krows), dst, w, col);
        }
    }
}

/// The im2col matrix of output rows `rows` of the images `x` `[n, C, H, W]` into `col`: row (c, ky, kx), column
/// (i, y − rows.start, x) holds input (i, c, y·s + ky − top, x·s + kx − left), zero outside.
fn im2col(g: &ConvGeometry, x: &[f32], rows: Range<usize>, col: &mut [f32]) {
    let [top, _, left, _] = g.pad;
    let taps = g.kh * g.kw;
    let (image, per_image) = (g.c * g.h * g.w, rows.len() * g.ow);
    let cols = x.len() / image.max(1) * per_image;
    if cols == 0 {
        return;
    }
    let rows_per_task = (PAR_CHUNK / cols).max(1);
    col.par_chunks_mut(rows_per_task * cols).enumerate().for_each(|(t, chunk)| {
        for (i, crow) in chunk.chunks_mut(cols).enumerate() {
            let r = t * rows_per_task + i;
            let (ch, ky, kx) = (r / taps, r % taps / g.kw, r % g.kw);
            for (image_at, dst) in crow.chunks_mut(per_image).enumerate() {
                let src = &x[image_at * image + ch * g.h * g.w..][..g.h * g.w];
                for (j, v) in dst.iter_mut().enumerate() {
                    let (oy, ox) = (rows.start + j / g.ow, j % g.ow);
                    let iy = (oy * g.stride + ky) as isize - top as isize;
                    let ix = (ox * g.stride + kx) as isize - left as isize;
                    let inside = (0..g.h as isize).contains(&iy) && (0..g.w as isize).contains(&ix);
                    *v = if inside { src[iy as usize * g.w + ix as usize] } else { 0.0 };
                }
            }
        }
    });
}

/// `dst = w · col` for the kernel `w` `[O, K]` (`m × k`) and columns `col` `[K, n]`: the packed product
/// (`packed`, where it runs), else the `gemm` crate.
fn product(
    packed: bool,
    (m, n, k): (usize, usize, usize),
    dst: MatMut<'_>,
    w: &[f32],
    col: &[f32],
) {
    let (lhs, rhs) = (Mat::rows(w, k), Mat::rows(col, n));
    if packed {
        packed_gemm::gemm_f32((m, n, k), dst, lhs, Rhs::Strided(rhs), false, 1.0, Threads::All);
    } else {
        gemm(m, n, k, dst, lhs, rhs, false, 1.0, Threads::All);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_one_paths_agree_with_im2col_one_image_or_stacked() {
        let padded = ConvGeometry {
            c: 3,
            h: 5,
            w: 6,
            o: 4,
            kh: 3,
            kw: 2,
            stride: 1,
            pad: [1, 0, 2, 1],
            oh: 4,
            ow: 8,
        };
        let pointwise = ConvGeometry { kh: 1, kw: 1, pad: [0; 4], oh: 5, ow: 6, ..padded };
        for g in [padded, pointwise] {
            agree_with_im2col(&g);
        }
    }

    fn agree_with_im2col(g: &ConvGeometry) {
        let image = g.c * g.h * g.w;
        let plane = g.o * g.oh * g.ow;
        let w: Vec<f32> =
            (0..g.o * g.c * g.kh * g.kw).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        for n in [1, 3] {
            let x: Vec<f32> =
                (0..n * image).map(|i| (i % 7) as f32 - 3.0 + (i / image) as f32).collect();
            let mut want = vec![f32::NAN; n * plane];
            for (x, want) in x.chunks(image).zip(want.chunks_mut(plane)) {
                conv_im2col(g, x, &w, want);
            }
            // im2col over every image at once, and the padded path fused wherever its kernel runs.
            let mut together = vec![f32::NAN; want.len()];
            conv_im2col(g, &x, &w, &mut together);
            assert_eq!(together, want, "{g:?}: {n} images by im2col together");
            for fused in [false, F32::available()] {
                let mut got = vec![f32::NAN; want.len()];
                conv_taps(g, &x, &w, &mut got, fused);
                assert_eq!(got, want, "{g:?}: {n} images, fused {fused}");
            }
        }
    }

    #[test]
    fn im2col_and_the_padded_product_give_the_same_bits() {
        if !F32::available() {
            return;
        }
        // Inexact values, so any change in the order of the sums would show; 120 channels make two blocks of
        // the product's 1024 inputs.
        for (c, hw) in [(40, 4), (120, 8)] {
            let g = ConvGeometry {
                c,
                h: hw,
                w: hw,
                o: 20,
                kh: 3,
                kw: 3,
                stride: 1,
                pad: [1; 4],
                oh: hw,
                ow: hw,
            };
            let (image, plane) = (g.c * g.h * g.w, g.o * g.oh * g.ow);
            let w: Vec<f32> =
                (0..g.o * g.c * 9).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.3).collect();
            let x: Vec<f32> = (0..3 * image).map(|i| ((i * 53 % 97) as f32 - 48.0) / 3.7).collect();
            let mut want = vec![f32::NAN; 3 * plane];
            conv_taps(&g, &x, &w, &mut want, true);
            let mut got = vec![f32::NAN; 3 * plane];
            conv_im2col(&g, &x, &w, &mut got);
            let same = got.iter().zip(&want).filter(|(a, b)| a.to_bits() == b.to_bits()).count();
            assert_eq!(same, want.len(), "{c} channels at {hw}²: outputs with the same bits");
        }
    }

    #[test]
    fn small_planes_go_by_im2col_where_padding_would_dominate() {
        let g = |c, hw| ConvGeometry {
            c,
            h: hw,
            w: hw,
            o: c,
            kh: 3,
            kw: 3,
            stride: 1,
            pad: [1; 4],
            oh: hw,
            ow: hw,
        };
        // A video VAE's first planes: 4 × 6 padded columns (two panels) for 16 outputs, 8 × 10 for 64.
        assert!(padding_dominates(&g(1024, 4)));
        assert!(padding_dominates(&g(1024, 8)));
        assert_eq!(stacked_cols(&g(1024, 4), 2), (6 + 4) * 6);
        assert!(!padding_dominates(&g(512, 16)));
        assert!(!padding_dominates(&g(512, 128)));
    }

    #[test]
    fn small_images_are_stacked_up_to_the_bound() {
        let g = |c, h, w| ConvGeometry {
            c,
            h,
            w,
            o: c,
            kh: 3,
            kw: 3,
            stride: 1,
            pad: [1; 4],
            oh: h,
            ow: w,
        };
        assert_eq!(stacked(&g(4, 6, 6), 5), 5);
        assert_eq!(stacked(&g(1024, 30, 30), 9), STACKED_ELEMS / (1024 * 32 * 32));
        assert_eq!(stacked(&g(256, 720, 1280), 4), 1);
        assert_eq!(stacked(&g(4, 6, 6), 0), 1);
    }
}
