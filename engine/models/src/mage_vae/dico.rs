//! The DiCo blocks both halves stack, on channels-last tokens `[B, h, w, C]` (ComfyUI runs them on `[B, C, h, w]`;
//! its 1×1 convolutions are Linears here, its `LayerNorm2d`s LayerNorms over the last dimension): the 1×1 `conv1`,
//! the depthwise 3×3 `conv2`, GELU, the channel attention `ca` (global average, 1×1 conv, sigmoid), the 1×1
//! `conv3`, then the feed-forward `conv4`, GELU, `conv5`, each half residual; the encoder's head blocks with
//! affine norms, the others modulated (adaLN: shift, scale, gate per half) by the timestep's features. Also the
//! timestep MLP those features come from.
//!
//! Each block fetches its weights in one [`Model::fetch`] and drops them before returning.

use kiln_compute::backend::{BinaryOp, PadMode, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::EPS;
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::named::{fetch, weight_and_bias as wb};

/// The parts of a DiCo block, in the order [`block`] fetches them (weight then bias each).
const PARTS: [&str; 6] = ["conv1", "conv2", "conv3", "ca.1", "conv4", "conv5"];

/// `x · wᵀ + b` for a 1×1 convolution's weight `[O, I, 1, 1]` (or a Linear's `[O, I]`) and bias.
pub(crate) fn pointwise<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    w: &Weight<'_>,
    bias: &Weight<'_>,
) -> Result<Tensor<B>> {
    let w = w.reshape(&w.shape()[..2])?;
    Ok(b.linear(x, &w, Some(bias))?)
}

/// The timestep features every modulated block of one half reads, SiLU applied (each block's
/// `adaLN_modulation` starts with it): `SiLU(mlp.2(SiLU(mlp.0(emb))))` with `emb` the sinusoid of t = 0 for
/// each of `batch` samples (`frequencies` features: cos then sin, a zero last when odd), `[batch, C]`.
pub(crate) fn timestep<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    batch: usize,
    frequencies: usize,
) -> Result<Tensor<B>> {
    let mut row = crate::timestep::sinusoid([0.0], frequencies / 2, 1.0);
    row.resize(frequencies, 0.0);
    let emb = b.from_f32(&[batch, frequencies], &row.repeat(batch), b.compute_dtype())?;
    let mut names = wb(&format!("{prefix}.mlp.0")).to_vec();
    names.extend(wb(&format!("{prefix}.mlp.2")));
    let layer = fetch(b, model, &names)?;
    let h = b.linear(&emb, &layer.weight(0), Some(&layer.weight(1)))?;
    let h = b.unary(&h, UnaryOp::Silu)?;
    let c = b.linear(&h, &layer.weight(2), Some(&layer.weight(3)))?;
    Ok(b.unary(&c, UnaryOp::Silu)?)
}

/// DiCo block `prefix` on `x` `[B, h, w, C]`: modulated by `t` (the [`timestep`] features `[B, C]`), or with
/// the affine norms `norm1`, `norm2` of an encoder head block when `t` is `None`.
pub(crate) fn block<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    t: Option<&Tensor<B>>,
) -> Result<Tensor<B>> {
    let &[n, hh, ww, c] = x.shape() else {
        return Err(Error::Invalid(format!(
            "a DiCo block's input {:?} is not [B, h, w, C]",
            x.shape()
        )));
    };
    let mut names = Vec::with_capacity(16);
    for part in PARTS {
        names.extend(wb(&format!("{prefix}.{part}")));
    }
    let tail = if t.is_some() { ["adaLN_modulation.1"].as_slice() } else { &["norm1", "norm2"] };
    for part in tail {
        names.extend(wb(&format!("{prefix}.{part}")));
    }
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i);
    let tokens = x.reshape(&[n, hh * ww, c])?;
    let sets = match t {
        Some(t) => {
            let m = b.linear(t, &w(12), Some(&w(13)))?;
            Some(Modulation::sets(b, &m, c, 2)?)
        }
        None => None,
    };
    // Each half's normalised input: modulated (no affine), or through the head block's affine norm.
    let norm = |x: &Tensor<B>, half: usize| -> Result<Tensor<B>> {
        match &sets {
            Some(sets) => sets[half].modulated(b, x, EPS),
            None => Ok(b.layer_norm(x, Some(&w(12 + 2 * half)), Some(&w(13 + 2 * half)), EPS)?),
        }
    };
    // Each half's residual: gated, or plain.
    let residual = |x: &Tensor<B>, y: &Tensor<B>, half: usize| -> Result<Tensor<B>> {
        match &sets {
            Some(sets) => sets[half].gated_add(b, x, y),
            None => Ok(b.binary(x, y, BinaryOp::Add)?),
        }
    };

    let h = pointwise(b, &norm(&tokens, 0)?, &w(0), &w(1))?;
    let h = depthwise3(b, &h.reshape(&[n, hh, ww, c])?, &w(2), &w(3))?;
    let h = b.unary(&h.reshape(&[n, hh * ww, c])?, UnaryOp::Gelu)?;
    let h = channel_attention(b, &h, &w(6), &w(7))?;
    let h = pointwise(b, &h, &w(4), &w(5))?;
    let x = residual(&tokens, &h, 0)?;
    drop(tokens);
    let h = pointwise(b, &norm(&x, 1)?, &w(8), &w(9))?;
    let h = pointwise(b, &b.unary(&h, UnaryOp::Gelu)?, &w(10), &w(11))?;
    Ok(residual(&x, &h, 1)?.reshape(&[n, hh, ww, c])?)
}

/// The depthwise 3×3 convolution (zero padding 1, one kernel per channel: `w` `[C, 1, 3, 3]`, `bias` `[C]`) of
/// `x` `[B, h, w, C]`, as the sum of its nine taps, each a shifted window of the padded input times that tap's
/// per-channel weights (the backend's convolution has no groups). The taps accumulate in f32 and the result is
/// rounded once to `x`'s type, as torch's convolution accumulates.
fn depthwise3<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    w: &Weight<'_>,
    bias: &Weight<'_>,
) -> Result<Tensor<B>> {
    let &[_, hh, ww, c] = x.shape() else {
        return Err(Error::Invalid(format!(
            "a depthwise input {:?} is not [B, h, w, C]",
            x.shape()
        )));
    };
    let padded = b.cast(x, DType::F32)?;
    let padded = b.pad(&padded, 1, 1, 1, PadMode::Constant(0.0))?;
    let padded = b.pad(&padded, 2, 1, 1, PadMode::Constant(0.0))?;
    // Tap t = 3·ky + kx as row t of [9, C].
    let taps = b.permute(&b.weight_to_tensor(w, DType::F32)?.reshape(&[c, 9])?, &[1, 0])?;
    let mut acc: Option<Tensor<B>> = None;
    for t in 0..9 {
        let (ky, kx) = (t / 3, t % 3);
        let window = b.slice(&b.slice(&padded, 1, ky, hh)?, 2, kx, ww)?;
        let tap = b.slice(&taps, 0, t, 1)?.reshape(&[c])?;
        let product = b.binary(&window, &tap, BinaryOp::Mul)?;
        acc = Some(match acc {
            Some(sum) => b.binary(&sum, &product, BinaryOp::Add)?,
            None => product,
        });
    }
    let acc = acc.ok_or_else(|| Error::Invalid("a depthwise convolution without taps".into()))?;
    let out = b.binary(&acc, &b.weight_to_tensor(bias, DType::F32)?, BinaryOp::Add)?;
    Ok(b.cast(&out, x.dtype())?)
}

/// The channel attention of `x` `[B, N, C]`: `x · sigmoid(W · mean(x) + b)`, the mean over the N positions
/// (ComfyUI's `AdaptiveAvgPool2d(1)`; here a sum through a matmul with ones, then scaled by 1/N, both in f32 and
/// rounded once to `x`'s type, as torch averages).
fn channel_attention<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    w: &Weight<'_>,
    bias: &Weight<'_>,
) -> Result<Tensor<B>> {
    let &[n, positions, _] = x.shape() else {
        return Err(Error::Invalid(format!(
            "a channel attention input {:?} is not [B, N, C]",
            x.shape()
        )));
    };
    let ones = b.full(&[n, 1, positions], 1.0, DType::F32)?;
    let sum = b.matmul(&ones, &b.cast(x, DType::F32)?, false)?;
    let mean = b.cast(&b.affine(&sum, 1.0 / positions as f32, 0.0)?, x.dtype())?;
    let a = b.unary(&pointwise(b, &mean, w, bias)?, UnaryOp::Sigmoid)?;
    Ok(b.binary(x, &a, BinaryOp::Mul)?)
}
