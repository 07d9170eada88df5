//! Normalisations on the CPU: RMSNorm, LayerNorm and GroupNorm (statistics accumulated in f64), and softmax.
//!
//! Each row (or group) is independent, so the loops run in parallel over rows; outputs take the dtype of x.

use rayon::prelude::*;

use super::Cpu;
use super::elementwise::unary_slice;
use super::simd;
use super::storage::{PAR_CHUNK, read_f32, tensor_from_f32};
use super::weights::vector;
use crate::backend::UnaryOp;
use crate::dtype;
use crate::error::{Error, Result};
use crate::tensor::{Tensor, Weight};

/// The last dimension of `x`, or a shape error for a rank-0 tensor.
fn last_dim(op: &'static str, x: &Tensor<Cpu>) -> Result<usize> {
    x.shape().last().copied().ok_or_else(|| Error::shape(op, "x must have at least one dimension"))
}

/// Runs `f(input row, output row)` over the rows of `d` elements, in parallel; returns the output.
fn map_rows(x: &[f32], d: usize, f: impl Fn(&[f32], &mut [f32]) + Sync) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    if d == 0 {
        return out;
    }
    let rows_per_task = (PAR_CHUNK / d).max(1);
    out.par_chunks_mut(rows_per_task * d).zip(x.par_chunks(rows_per_task * d)).for_each(
        |(o, i)| {
            for (or, ir) in o.chunks_exact_mut(d).zip(i.chunks_exact(d)) {
                f(ir, or);
            }
        },
    );
    out
}

/// RMSNorm over the last dimension (see [`crate::Backend::rms_norm`]).
pub(crate) fn rms_norm(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    w: Option<&Weight<'_>>,
    eps: f32,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "rms_norm";
    let d = last_dim(OP, x)?;
    let w = vector(cpu.sim(), OP, "weight", w, d)?;
    let xs = read_f32(x, OP)?;
    let out = map_rows(&xs, d, |xr, or| {
        let ss: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let inv = (1.0 / (ss / d as f64 + f64::from(eps)).sqrt()) as f32;
        match &w {
            Some(w) => or.iter_mut().zip(xr).zip(w).for_each(|((o, &v), &g)| *o = v * inv * g),
            None => or.iter_mut().zip(xr).for_each(|(o, &v)| *o = v * inv),
        }
    });
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), OP)
}

/// RMSNorm over the channels of `[B, C, spatial..]`, then `act` (see [`crate::Backend::channel_rms_norm`]).
/// Each position's sum of squares accumulates channel by channel in f64, the order [`rms_norm`] sums a row in,
/// and each value is `v · inv · w`, as there: the values are bit for bit those of the transposed path.
pub(crate) fn channel_rms_norm(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    w: Option<&Weight<'_>>,
    eps: f32,
    act: Option<UnaryOp>,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "channel_rms_norm";
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(Error::shape(OP, format!("x must be [B, C, ..], got {shape:?}")));
    }
    let (batch, c) = (shape[0], shape[1]);
    let spatial: usize = shape[2..].iter().product();
    let w = vector(cpu.sim(), OP, "weight", w, c)?;
    let xs = read_f32(x, OP)?;
    let mut out = vec![0.0f32; xs.len()];
    if out.is_empty() {
        return tensor_from_f32(shape.to_vec(), out, x.dtype(), OP);
    }
    // 1 / rms of each position [B, spatial], a run of positions a task.
    let mut inv = vec![0.0f32; batch * spatial];
    let run = (PAR_CHUNK / c).clamp(1, spatial);
    inv.par_chunks_mut(spatial).enumerate().for_each(|(b, inv)| {
        let sample = &xs[b * c * spatial..(b + 1) * c * spatial];
        inv.par_chunks_mut(run).enumerate().for_each(|(r, inv)| {
            let s0 = r * run;
            let mut ss = vec![0.0f64; inv.len()];
            for channel in sample.chunks_exact(spatial) {
                for (acc, &v) in ss.iter_mut().zip(&channel[s0..s0 + inv.len()]) {
                    *acc += f64::from(v) * f64::from(v);
                }
            }
            for (i, ss) in inv.iter_mut().zip(ss) {
                *i = (1.0 / (ss / c as f64 + f64::from(eps)).sqrt()) as f32;
            }
        });
    });
    let (dtype, max) = (x.dtype(), x.dtype().max_finite());
    // Each task keeps one buffer for the rounded norm its activation reads, not one a row.
    out.par_chunks_mut(spatial).zip(xs.par_chunks(spatial)).enumerate().for_each_init(
        Vec::new,
        |normed: &mut Vec<f32>, (row, (o, xr))| {
            let (b, channel) = (row / c, row % c);
            let inv = &inv[b * spatial..(b + 1) * spatial];
            match &w {
                Some(w) => {
                    let g = w[channel];
                    o.iter_mut().zip(xr).zip(inv).for_each(|((o, &v), &i)| *o = v * i * g);
                }
                None => o.iter_mut().zip(xr).zip(inv).for_each(|((o, &v), &i)| *o = v * i),
            }
            if let Some(op) = act {
                // The activation reads the norm's values as the separate op would: rounded to x's type.
                normed.clear();
                normed.extend(o.iter().map(|&v| dtype::round_to(dtype, v)));
                unary_slice(op, max, normed, o);
            }
        },
    );
    tensor_from_f32(shape.to_vec(), out, x.dtype(), OP)
}

/// Mean and biased variance of `v`, in f64.
fn moments(v: &[f32]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = v.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / n;
    (mean, var)
}

/// LayerNorm over the last dimension (see [`crate::Backend::layer_norm`]).
pub(crate) fn layer_norm(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    w: Option<&Weight<'_>>,
    b: Option<&Weight<'_>>,
    eps: f32,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "layer_norm";
    let d = last_dim(OP, x)?;
    let w = vector(cpu.sim(), OP, "weight", w, d)?;
    let b = vector(cpu.sim(), OP, "bias", b, d)?;
    let xs = read_f32(x, OP)?;
    let out = map_rows(&xs, d, |xr, or| {
        let (mean, var) = moments(xr);
        let inv = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
        let mean = mean as f32;
        for (i, (o, &v)) in or.iter_mut().zip(xr).enumerate() {
            let y = (v - mean) * inv;
            let y = match &w {
                Some(w) => y * w[i],
                None => y,
            };
            *o = match &b {
                Some(b) => y + b[i],
                None => y,
            };
        }
    });
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), OP)
}

/// GroupNorm of `[B, C, spatial..]` (see [`crate::Backend::group_norm`]).
pub(crate) fn group_norm(
    cpu: &Cpu,
    x: &Tensor<Cpu>,
    groups: usize,
    w: Option<&Weight<'_>>,
    b: Option<&Weight<'_>>,
    eps: f32,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "group_norm";
    let shape = x.shape();
    if shape.len() < 2 {
        return Err(Error::shape(OP, format!("x must be [B, C, ..], got {shape:?}")));
    }
    let c = shape[1];
    if groups == 0 || !c.is_multiple_of(groups) {
        return Err(Error::shape(OP, format!("{c} channels do not split into {groups} groups")));
    }
    let w = vector(cpu.sim(), OP, "weight", w, c)?;
    let b = vector(cpu.sim(), OP, "bias", b, c)?;
    let spatial: usize = shape[2..].iter().product();
    let per_group = c / groups * spatial;
    let xs = read_f32(x, OP)?;
    let mut out = vec![0.0f32; xs.len()];
    if per_group > 0 {
        out.par_chunks_mut(per_group).zip(xs.par_chunks(per_group)).enumerate().for_each(
            |(i, (o, xg))| {
                let (mean, var) = moments(xg);
                let inv = (1.0 / (var + f64::from(eps)).sqrt()) as f32;
                let mean = mean as f32;
                let c0 = (i % groups) * (c / groups);
                for (j, (oc, xc)) in o.chunks_mut(spatial).zip(xg.chunks(spatial)).enumerate() {
                    let ch = c0 + j;
                    let g = w.as_ref().map_or(1.0, |w| w[ch]);
                    let s = b.as_ref().map_or(0.0, |b| b[ch]);
                    let a = inv * g;
                    for (o, &v) in oc.iter_mut().zip(xc) {
                        *o = (v - mean) * a + s;
                    }
                }
            },
        );
    }
    tensor_from_f32(shape.to_vec(), out, x.dtype(), OP)
}

/// Softmax over the last dimension (see [`crate::Backend::softmax`]).
pub(crate) fn softmax(x: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    const OP: &str = "softmax";
    let d = last_dim(OP, x)?;
    let xs = read_f32(x, OP)?;
    let out = map_rows(&xs, d, |xr, or| simd::softmax_rows(xr, or, d));
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), OP)
}
