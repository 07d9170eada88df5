//! Elementwise ops on the CPU: unary functions, binary ops with numpy broadcasting, scalar affine, gated
//! activations and DiT scale/shift modulation. All compute in f32 and write the dtype of their first input.

use rayon::prelude::*;

use super::Cpu;
use super::simd;
use super::storage::{PAR_CHUNK, read_f32, tensor_from_f32};
use crate::backend::{BinaryOp, UnaryOp};
use crate::error::{Error, Result};
use crate::tensor::{Tensor, numel};

/// `op` of each element of `x` into `out` (equal lengths), for a tensor whose largest finite value is `max`.
pub(crate) fn unary_slice(op: UnaryOp, max: f32, x: &[f32], out: &mut [f32]) {
    match op {
        UnaryOp::Silu => simd::silu(x, out),
        UnaryOp::Gelu => simd::gelu_erf(x, out),
        UnaryOp::GeluTanh => simd::gelu_tanh(x, out),
        UnaryOp::Sigmoid => simd::sigmoid(x, out),
        UnaryOp::Exp => simd::exp_slice(x, out),
        UnaryOp::Tanh => out.iter_mut().zip(x).for_each(|(o, v)| *o = v.tanh()),
        UnaryOp::Neg => out.iter_mut().zip(x).for_each(|(o, v)| *o = -v),
        UnaryOp::Relu => out.iter_mut().zip(x).for_each(|(o, v)| *o = v.max(0.0)),
        UnaryOp::NanToNum => out
            .iter_mut()
            .zip(x)
            .for_each(|(o, v)| *o = if v.is_nan() { 0.0 } else { v.clamp(-max, max) }),
    }
}

/// `f(input chunk, output chunk)` over `x` in parallel chunks; returns the output.
fn map_chunks(x: &[f32], f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    out.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(|(o, i)| f(i, o));
    out
}

/// `op(x)` (see [`crate::Backend::unary`]).
pub(crate) fn unary(x: &Tensor<Cpu>, op: UnaryOp) -> Result<Tensor<Cpu>> {
    let xs = read_f32(x, "unary")?;
    let max = x.dtype().max_finite();
    let out = map_chunks(&xs, |i, o| unary_slice(op, max, i, o));
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), "unary")
}

/// `x · mul + add` (see [`crate::Backend::affine`]).
pub(crate) fn affine(x: &Tensor<Cpu>, mul: f32, add: f32) -> Result<Tensor<Cpu>> {
    let xs = read_f32(x, "affine")?;
    let out = map_chunks(&xs, |i, o| o.iter_mut().zip(i).for_each(|(o, &v)| *o = v * mul + add));
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), "affine")
}

/// `act(gate) · up` (see [`crate::Backend::gated`]).
pub(crate) fn gated(gate: &Tensor<Cpu>, up: &Tensor<Cpu>, act: UnaryOp) -> Result<Tensor<Cpu>> {
    const OP: &str = "gated";
    if gate.shape() != up.shape() {
        return Err(Error::shape(
            OP,
            format!("gate {:?} and up {:?} differ", gate.shape(), up.shape()),
        ));
    }
    let (g, u) = (read_f32(gate, OP)?, read_f32(up, OP)?);
    let max = gate.dtype().max_finite();
    let mut out = vec![0.0f32; g.len()];
    out.par_chunks_mut(PAR_CHUNK)
        .zip(g.par_chunks(PAR_CHUNK))
        .zip(u.par_chunks(PAR_CHUNK))
        .for_each(|((o, g), u)| {
            unary_slice(act, max, g, o);
            o.iter_mut().zip(u).for_each(|(o, &u)| *o *= u);
        });
    tensor_from_f32(gate.shape().to_vec(), out, gate.dtype(), OP)
}

fn apply(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
    }
}

/// The numpy broadcast of two shapes, or `None` when they do not broadcast.
fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| if i < rank - s.len() { 1 } else { s[i - (rank - s.len())] };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Strides of `shape` read as `out`-shaped (aligned from the right; 0 where the dimension repeats).
fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut s = 1;
    for i in (0..shape.len()).rev() {
        strides[pad + i] = if shape[i] == 1 { 0 } else { s };
        s *= shape[i];
    }
    strides
}

/// Merges neighbouring dimensions that both operands walk through contiguously, so the inner loop is long.
fn coalesce(out: &[usize], sa: &[usize], sb: &[usize]) -> (Vec<usize>, Vec<usize>, Vec<usize>) {
    let (mut d, mut a, mut b) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..out.len() {
        if out[i] == 1 {
            continue;
        }
        if let (Some(&la), Some(&lb)) = (a.last(), b.last())
            && la == sa[i] * out[i]
            && lb == sb[i] * out[i]
        {
            let last = d.len() - 1;
            d[last] *= out[i];
            a[last] = sa[i];
            b[last] = sb[i];
            continue;
        }
        d.push(out[i]);
        a.push(sa[i]);
        b.push(sb[i]);
    }
    if d.is_empty() {
        (d, a, b) = (vec![1], vec![0], vec![0]);
    }
    (d, a, b)
}

/// `op(a, b)` with broadcasting (see [`crate::Backend::binary`]).
pub(crate) fn binary(a: &Tensor<Cpu>, b: &Tensor<Cpu>, op: BinaryOp) -> Result<Tensor<Cpu>> {
    const OP: &str = "binary";
    let shape = broadcast_shape(a.shape(), b.shape()).ok_or_else(|| {
        Error::shape(OP, format!("{:?} and {:?} do not broadcast", a.shape(), b.shape()))
    })?;
    let (av, bv) = (read_f32(a, OP)?, read_f32(b, OP)?);
    let n = numel(&shape);
    let out = if a.shape() == b.shape() {
        let mut out = vec![0.0f32; n];
        out.par_chunks_mut(PAR_CHUNK)
            .zip(av.par_chunks(PAR_CHUNK))
            .zip(bv.par_chunks(PAR_CHUNK))
            .for_each(|((o, a), b)| {
                o.iter_mut().zip(a).zip(b).for_each(|((o, &a), &b)| *o = apply(op, a, b))
            });
        out
    } else {
        let (dims, sa, sb) = coalesce(
            &shape,
            &broadcast_strides(a.shape(), &shape),
            &broadcast_strides(b.shape(), &shape),
        );
        let inner = *dims.last().expect("coalesce keeps one dimension");
        let (ia, ib) = (sa[sa.len() - 1], sb[sb.len() - 1]);
        let outer_dims = &dims[..dims.len() - 1];
        let mut out = vec![0.0f32; n];
        let rows_per_task = (PAR_CHUNK / inner.max(1)).max(1);
        if inner > 0 {
            out.par_chunks_mut(rows_per_task * inner).enumerate().for_each(|(t, chunk)| {
                for (r, row) in chunk.chunks_mut(inner).enumerate() {
                    // Offsets of this row in a and b, from its index in the outer dimensions.
                    let mut idx = t * rows_per_task + r;
                    let (mut oa, mut ob) = (0, 0);
                    for d in (0..outer_dims.len()).rev() {
                        let i = idx % outer_dims[d];
                        idx /= outer_dims[d];
                        oa += i * sa[d];
                        ob += i * sb[d];
                    }
                    match (ia, ib) {
                        (1, 1) => row
                            .iter_mut()
                            .zip(&av[oa..oa + inner])
                            .zip(&bv[ob..ob + inner])
                            .for_each(|((o, &x), &y)| *o = apply(op, x, y)),
                        (1, 0) => {
                            let y = bv[ob];
                            row.iter_mut()
                                .zip(&av[oa..oa + inner])
                                .for_each(|(o, &x)| *o = apply(op, x, y));
                        }
                        (0, 1) => {
                            let x = av[oa];
                            row.iter_mut()
                                .zip(&bv[ob..ob + inner])
                                .for_each(|(o, &y)| *o = apply(op, x, y));
                        }
                        _ => row.iter_mut().enumerate().for_each(|(j, o)| {
                            *o = apply(op, av[oa + j * ia], bv[ob + j * ib]);
                        }),
                    }
                }
            });
        }
        out
    };
    tensor_from_f32(shape, out, a.dtype(), OP)
}

/// `x · (1 + scale) + shift` per sample (see [`crate::Backend::modulate`]).
pub(crate) fn modulate(
    x: &Tensor<Cpu>,
    scale: &Tensor<Cpu>,
    shift: Option<&Tensor<Cpu>>,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "modulate";
    let &[bsz, n, d] = x.shape() else {
        return Err(Error::shape(OP, format!("x must be [B, N, D], got {:?}", x.shape())));
    };
    let check = |t: &Tensor<Cpu>, what: &str| match t.shape() {
        [b, dd] | [b, 1, dd] if *b == bsz && *dd == d => Ok(()),
        s => Err(Error::shape(
            OP,
            format!("{what} must be [{bsz}, {d}] for x {:?}, got {s:?}", x.shape()),
        )),
    };
    check(scale, "scale")?;
    if let Some(s) = shift {
        check(s, "shift")?;
    }
    let xs = read_f32(x, OP)?;
    let sc = read_f32(scale, OP)?;
    let sh = shift.map(|s| read_f32(s, OP)).transpose()?;
    let mut out = vec![0.0f32; xs.len()];
    if let Some(rows_per_task) = PAR_CHUNK.checked_div(d) {
        let rows_per_task = rows_per_task.max(1);
        out.par_chunks_mut(rows_per_task * d)
            .zip(xs.par_chunks(rows_per_task * d))
            .enumerate()
            .for_each(|(t, (o, xi))| {
                for (r, (or, xr)) in o.chunks_exact_mut(d).zip(xi.chunks_exact(d)).enumerate() {
                    let bi = (t * rows_per_task + r) / n.max(1);
                    let s = &sc[bi * d..(bi + 1) * d];
                    match &sh {
                        Some(sh) => {
                            let h = &sh[bi * d..(bi + 1) * d];
                            for j in 0..d {
                                or[j] = xr[j] * (1.0 + s[j]) + h[j];
                            }
                        }
                        None => {
                            for j in 0..d {
                                or[j] = xr[j] * (1.0 + s[j]);
                            }
                        }
                    }
                }
            });
    }
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), OP)
}
