//! Layout ops on the CPU: concat, slice, pad and permute, plus the machinery the image layout ops share.
//!
//! These only move elements, so they run on the storage type itself (f32, f16 or bf16 through [`Elem`]):
//! no widening, no rounding, and a bf16 tensor stays bit-exact. Inputs of mixed dtypes are first cast to the
//! first input's dtype, which is the output's.

use half::{bf16, f16};
use rayon::prelude::*;

use super::Cpu;
use super::storage::{Data, PAR_CHUNK, cast, data, tensor_from_data};
use crate::backend::PadMode;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, numel, resolve_dim};

/// An element type a CPU tensor can be stored in.
pub(crate) trait Elem: Copy + Send + Sync + Default + 'static {
    /// `v` rounded to this type (nearest even).
    fn from_f32(v: f32) -> Self;
}

impl Elem for f32 {
    fn from_f32(v: f32) -> f32 {
        v
    }
}

impl Elem for f16 {
    fn from_f32(v: f32) -> f16 {
        f16::from_f32(v)
    }
}

impl Elem for bf16 {
    fn from_f32(v: f32) -> bf16 {
        bf16::from_f32(v)
    }
}

/// A function that builds an output by moving elements of its inputs, for any element type.
pub(crate) trait Relayout: Sync {
    /// The output elements, from the inputs' elements (all of one type).
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T>;
}

/// Runs `f` on the storage of `xs` (cast to the first one's dtype) and wraps the result as `shape`.
pub(crate) fn relayout(
    op: &'static str,
    xs: &[&Tensor<Cpu>],
    shape: Vec<usize>,
    f: &impl Relayout,
) -> Result<Tensor<Cpu>> {
    let first = xs.first().ok_or_else(|| Error::shape(op, "no inputs"))?;
    let dtype = first.dtype();
    let owned: Vec<Tensor<Cpu>> = xs.iter().map(|x| cast(x, dtype)).collect::<Result<_>>()?;
    let datas: Vec<&Data> = owned.iter().map(|x| data(x, op)).collect::<Result<_>>()?;
    macro_rules! run {
        ($variant:ident) => {{
            let srcs: Vec<&[_]> = datas
                .iter()
                .map(|d| match d {
                    Data::$variant(v) => v.as_slice(),
                    _ => unreachable!("every input was cast to the first one's dtype"),
                })
                .collect();
            Data::$variant(f.run(&srcs))
        }};
    }
    let out = match datas[0] {
        Data::F32(_) => run!(F32),
        Data::F16(_) => run!(F16),
        Data::BF16(_) => run!(BF16),
    };
    Ok(tensor_from_data(shape, out))
}

/// Fills `out` row by row in parallel: `f(row index, row)` for rows of `row_len` elements.
pub(crate) fn fill_rows<T: Elem>(
    out: &mut [T],
    row_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    if row_len == 0 {
        return;
    }
    let rows_per_task = (PAR_CHUNK / row_len).max(1);
    out.par_chunks_mut(rows_per_task * row_len).enumerate().for_each(|(t, chunk)| {
        for (r, row) in chunk.chunks_mut(row_len).enumerate() {
            f(t * rows_per_task + r, row);
        }
    });
}

struct Concat {
    outer: usize,
    /// Elements each input contributes per outer index.
    inners: Vec<usize>,
}

impl Relayout for Concat {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        let row: usize = self.inners.iter().sum();
        let mut out = vec![T::default(); self.outer * row];
        fill_rows(&mut out, row, |o, dst| {
            let mut at = 0;
            for (src, &len) in srcs.iter().zip(&self.inners) {
                dst[at..at + len].copy_from_slice(&src[o * len..(o + 1) * len]);
                at += len;
            }
        });
        out
    }
}

/// Joins `xs` along `dim` (see [`crate::Backend::concat`]).
pub(crate) fn concat(xs: &[&Tensor<Cpu>], dim: isize) -> Result<Tensor<Cpu>> {
    const OP: &str = "concat";
    let first = xs.first().ok_or_else(|| Error::shape(OP, "no tensors to join"))?;
    let rank = first.shape().len();
    let d = resolve_dim(dim, rank)
        .map_err(|_| Error::shape(OP, format!("dim {dim} of {:?}", first.shape())))?;
    let mut shape = first.shape().to_vec();
    shape[d] = 0;
    for x in xs {
        let s = x.shape();
        let same = s.len() == rank && (0..rank).all(|i| i == d || s[i] == first.shape()[i]);
        if !same {
            return Err(Error::shape(
                OP,
                format!("{s:?} does not join {:?} along dim {d}", first.shape()),
            ));
        }
        shape[d] += s[d];
    }
    let outer = numel(&shape[..d]);
    let tail = numel(&shape[d + 1..]);
    let inners = xs.iter().map(|x| x.shape()[d] * tail).collect();
    relayout(OP, xs, shape, &Concat { outer, inners })
}

struct Slice {
    outer: usize,
    /// Elements per outer index in the input.
    row: usize,
    start: usize,
    len: usize,
}

impl Relayout for Slice {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        let mut out = vec![T::default(); self.outer * self.len];
        fill_rows(&mut out, self.len, |o, dst| {
            let from = o * self.row + self.start;
            dst.copy_from_slice(&srcs[0][from..from + self.len]);
        });
        out
    }
}

/// `len` entries of `dim` from `start` (see [`crate::Backend::slice`]).
pub(crate) fn slice(x: &Tensor<Cpu>, dim: isize, start: usize, len: usize) -> Result<Tensor<Cpu>> {
    const OP: &str = "slice";
    let d = resolve_dim(dim, x.shape().len())
        .map_err(|_| Error::shape(OP, format!("dim {dim} of {:?}", x.shape())))?;
    let size = x.shape()[d];
    if start.checked_add(len).is_none_or(|end| end > size) {
        return Err(Error::shape(
            OP,
            format!("{start}..{start}+{len} of dim {d} of {:?}", x.shape()),
        ));
    }
    let tail = numel(&x.shape()[d + 1..]);
    let mut shape = x.shape().to_vec();
    shape[d] = len;
    let f = Slice {
        outer: numel(&x.shape()[..d]),
        row: size * tail,
        start: start * tail,
        len: len * tail,
    };
    relayout(OP, &[x], shape, &f)
}

struct Pad {
    outer: usize,
    size: usize,
    tail: usize,
    before: usize,
    after: usize,
    mode: PadMode,
}

impl Relayout for Pad {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        let new = self.size + self.before + self.after;
        let fill = match self.mode {
            PadMode::Constant(v) => T::from_f32(v),
            PadMode::Circular | PadMode::Replicate => T::default(),
        };
        let mut out = vec![fill; self.outer * new * self.tail];
        let t = self.tail;
        fill_rows(&mut out, new * t, |o, dst| {
            let src = &srcs[0][o * self.size * t..(o + 1) * self.size * t];
            for p in 0..new {
                let i = p as isize - self.before as isize;
                let from = match self.mode {
                    _ if (0..self.size as isize).contains(&i) => i as usize,
                    PadMode::Constant(_) => continue,
                    PadMode::Circular => i.rem_euclid(self.size as isize) as usize,
                    PadMode::Replicate => i.clamp(0, self.size as isize - 1) as usize,
                };
                dst[p * t..(p + 1) * t].copy_from_slice(&src[from * t..(from + 1) * t]);
            }
        });
        out
    }
}

/// Pads `dim` (see [`crate::Backend::pad`]).
pub(crate) fn pad(
    x: &Tensor<Cpu>,
    dim: isize,
    before: usize,
    after: usize,
    mode: PadMode,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "pad";
    let d = resolve_dim(dim, x.shape().len())
        .map_err(|_| Error::shape(OP, format!("dim {dim} of {:?}", x.shape())))?;
    let size = x.shape()[d];
    let copies = !matches!(mode, PadMode::Constant(_));
    if copies && size == 0 && before + after > 0 {
        return Err(Error::shape(
            OP,
            format!("{mode:?} padding of an empty dim {d} of {:?}", x.shape()),
        ));
    }
    let mut shape = x.shape().to_vec();
    shape[d] = size + before + after;
    let f = Pad {
        outer: numel(&x.shape()[..d]),
        size,
        tail: numel(&x.shape()[d + 1..]),
        before,
        after,
        mode,
    };
    relayout(OP, &[x], shape, &f)
}

struct Permute {
    /// Output shape.
    shape: Vec<usize>,
    /// For each output dimension, the stride of the input dimension it reads.
    strides: Vec<usize>,
}

impl Relayout for Permute {
    fn run<T: Elem>(&self, srcs: &[&[T]]) -> Vec<T> {
        let src = srcs[0];
        let mut out = vec![T::default(); numel(&self.shape)];
        let Some((&inner, outer_dims)) = self.shape.split_last() else {
            out.copy_from_slice(src);
            return out;
        };
        let inner_stride = self.strides[self.strides.len() - 1];
        fill_rows(&mut out, inner, |r, dst| {
            let mut idx = r;
            let mut base = 0;
            for d in (0..outer_dims.len()).rev() {
                base += idx % outer_dims[d] * self.strides[d];
                idx /= outer_dims[d];
            }
            if inner_stride == 1 {
                dst.copy_from_slice(&src[base..base + inner]);
            } else {
                for (j, o) in dst.iter_mut().enumerate() {
                    *o = src[base + j * inner_stride];
                }
            }
        });
        out
    }
}

/// Reorders dimensions (see [`crate::Backend::permute`]).
pub(crate) fn permute(x: &Tensor<Cpu>, perm: &[usize]) -> Result<Tensor<Cpu>> {
    const OP: &str = "permute";
    let rank = x.shape().len();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank
        && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(Error::shape(
            OP,
            format!("{perm:?} is not a permutation of the dims of {:?}", x.shape()),
        ));
    }
    let mut in_strides = vec![1; rank];
    for i in (0..rank.saturating_sub(1)).rev() {
        in_strides[i] = in_strides[i + 1] * x.shape()[i + 1];
    }
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let strides = perm.iter().map(|&p| in_strides[p]).collect();
    relayout(OP, &[x], shape.clone(), &Permute { shape, strides })
}
