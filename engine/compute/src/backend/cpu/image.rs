//! Image layout ops on the CPU: nearest 2× upsampling, and patchify/unpatchify in NextDiT's feature order.
//!
//! Like the other layout ops they move stored elements without widening (see [`super::layout`]).

use super::Cpu;
use super::layout::{Elem, Relayout, fill_rows, relayout};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, numel};

/// `[B, C, H, W]` of `x`, or a shape error naming `op`.
fn bchw(op: &'static str, x: &Tensor<Cpu>) -> Result<[usize; 4]> {
    match *x.shape() {
        [b, c, h, w] => Ok([b, c, h, w]),
        ref s => Err(Error::shape(op, format!("x must be [B, C, H, W], got {s:?}"))),
    }
}

struct Upsample2x {
    rows: usize,
    h: usize,
    w: usize,
}

impl Relayout for Upsample2x {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        let (h, w) = (self.h, self.w);
        let mut out = vec![T::default(); self.rows * 4 * h * w];
        // Output row r (of 2W) is input row (r / 2H)·H + (r mod 2H) / 2, each element twice.
        fill_rows(&mut out, 2 * w, |r, dst| {
            let plane = r / (2 * h);
            let y = r % (2 * h) / 2;
            let src = &srcs[0][(plane * h + y) * w..(plane * h + y + 1) * w];
            for (pair, &v) in dst.chunks_exact_mut(2).zip(src) {
                pair[0] = v;
                pair[1] = v;
            }
        });
        out
    }
}

/// Nearest 2× upsampling (see [`crate::Backend::upsample_nearest2x`]).
pub(crate) fn upsample_nearest2x(x: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    const OP: &str = "upsample_nearest2x";
    let [b, c, h, w] = bchw(OP, x)?;
    relayout(OP, &[x], vec![b, c, 2 * h, 2 * w], &Upsample2x { rows: b * c, h, w })
}

struct Patchify {
    b: usize,
    c: usize,
    h: usize,
    w: usize,
    p: usize,
}

impl Relayout for Patchify {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        let Patchify { b, c, h, w, p } = *self;
        let (gh, gw) = (h / p, w / p);
        let feat = p * p * c;
        let mut out = vec![T::default(); b * gh * gw * feat];
        // Token row (b, r, s): feature (py·p + px)·C + ch = x[b, ch, p·r + py, p·s + px].
        fill_rows(&mut out, feat, |t, dst| {
            let (bi, r, s) = (t / (gh * gw), t / gw % gh, t % gw);
            let img = &srcs[0][bi * c * h * w..(bi + 1) * c * h * w];
            for py in 0..p {
                for px in 0..p {
                    let at = (p * r + py) * w + p * s + px;
                    let f0 = (py * p + px) * c;
                    for (ch, o) in dst[f0..f0 + c].iter_mut().enumerate() {
                        *o = img[ch * h * w + at];
                    }
                }
            }
        });
        out
    }
}

/// Image to patch tokens (see [`crate::Backend::patchify`]).
pub(crate) fn patchify(x: &Tensor<Cpu>, p: usize) -> Result<Tensor<Cpu>> {
    const OP: &str = "patchify";
    let [b, c, h, w] = bchw(OP, x)?;
    if p == 0 || !h.is_multiple_of(p) || !w.is_multiple_of(p) {
        return Err(Error::shape(OP, format!("{h}×{w} is not a multiple of patch size {p}")));
    }
    relayout(OP, &[x], vec![b, (h / p) * (w / p), p * p * c], &Patchify { b, c, h, w, p })
}

impl Patchify {
    /// The inverse: image rows (b, ch, y) of W elements from tokens.
    fn invert<T: Elem>(&self, tokens: &[T]) -> Vec<T> {
        let Patchify { b, c, h, w, p } = *self;
        let (gh, gw) = (h / p, w / p);
        let feat = p * p * c;
        let mut out = vec![T::default(); b * c * h * w];
        fill_rows(&mut out, w, |row, dst| {
            let (bi, ch, y) = (row / (c * h), row / h % c, row % h);
            let (r, py) = (y / p, y % p);
            for (xx, o) in dst.iter_mut().enumerate() {
                let (s, px) = (xx / p, xx % p);
                let token = (bi * gh + r) * gw + s;
                *o = tokens[token * feat + (py * p + px) * c + ch];
            }
        });
        out
    }
}

struct Unpatchify(Patchify);

impl Relayout for Unpatchify {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        self.0.invert(srcs[0])
    }
}

/// Patch tokens back to an image (see [`crate::Backend::unpatchify`]).
pub(crate) fn unpatchify(
    x: &Tensor<Cpu>,
    p: usize,
    channels: usize,
    h: usize,
    w: usize,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "unpatchify";
    if p == 0 || !h.is_multiple_of(p) || !w.is_multiple_of(p) {
        return Err(Error::shape(OP, format!("{h}×{w} is not a multiple of patch size {p}")));
    }
    let &[b, t, f] = x.shape() else {
        return Err(Error::shape(
            OP,
            format!("x must be [B, tokens, features], got {:?}", x.shape()),
        ));
    };
    if t != (h / p) * (w / p) || f != p * p * channels {
        return Err(Error::shape(
            OP,
            format!(
                "{:?} is not the patch tokens of a {channels}×{h}×{w} image with patch size {p}",
                x.shape()
            ),
        ));
    }
    debug_assert_eq!(numel(x.shape()), b * channels * h * w);
    relayout(OP, &[x], vec![b, channels, h, w], &Unpatchify(Patchify { b, c: channels, h, w, p }))
}
