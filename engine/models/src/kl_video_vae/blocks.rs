//! The HunyuanVideo 1.0 VAE's building blocks on frames `[n, C, H, W]` (images, or one chunk of a clip as [`Time`]
//! says): GroupNorm, residual blocks of carried convolutions, the middle attention, the downsample and the upsample.
//! Each fetches its weights (by ComfyUI name) through [`Model::fetch`] and drops them before returning; a carried
//! convolution's history is kept under its weight's name.
//!
//! ComfyUI's GroupNorm normalises whatever 5-D tensor it is given over (C/32, T, H, W): here an image's frame alone,
//! and a clip's frames together, as many as the caller passes (one of ComfyUI's chunks, or its whole latent in the
//! middle), so the caller's chunks must be ComfyUI's.

use kiln_compute::backend::{AttentionMask, BinaryOp, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor, Weight};

use super::causal::strided_conv;
use super::config::GROUPS;
use crate::error::{Error, Result};
use crate::hunyuan_vae::causal::{Time, causal_conv, concat_frames, frames, pointwise};
use crate::named::{fetch, weight_and_bias as wb};

/// GroupNorm ε of every norm.
const EPS: f32 = 1e-6;

/// The `[n, C, H, W]` of frames `x`, or an error naming `what`.
fn dims<B: Backend>(x: &Tensor<B>, what: &str) -> Result<[usize; 4]> {
    match *x.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        ref other => Err(Error::Invalid(format!("{what}: frames {other:?} are not [n, C, H, W]"))),
    }
}

/// GroupNorm (32 groups, weight `w`, bias `bias`) of frames `x` `[n, C, H, W]` in `time`: each image alone, a
/// clip's frames together (over the channels of a group in every frame).
fn group_norm<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    w: &Weight<'_>,
    bias: &Weight<'_>,
    time: &Time<'_, B>,
) -> Result<Tensor<B>> {
    let [n, c, h, ww] = dims(x, "group norm")?;
    match time {
        Time::Stream(_) if n > 1 => {
            // [n, C, H, W] → [1, C, n, H, W]: one sample whose groups span the frames.
            let clip = b.permute(x, &[1, 0, 2, 3])?.reshape(&[1, c, n, h, ww])?;
            let y = b.group_norm(&clip, GROUPS, Some(w), Some(bias), EPS)?;
            Ok(b.permute(&y.reshape(&[c, n, h, ww])?, &[1, 0, 2, 3])?)
        }
        Time::Stream(_) | Time::Alone => Ok(b.group_norm(x, GROUPS, Some(w), Some(bias), EPS)?),
    }
}

/// [`group_norm`] then SiLU.
fn norm_silu<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    w: &Weight<'_>,
    bias: &Weight<'_>,
    time: &Time<'_, B>,
) -> Result<Tensor<B>> {
    let h = group_norm(b, x, w, bias, time)?;
    Ok(b.unary(&h, UnaryOp::Silu)?)
}

/// Residual block `prefix`: `shortcut(x) + conv₂(SiLU(GN₂(conv₁(SiLU(GN₁(x))))))`, the shortcut a 1×1×1
/// convolution (uncarried) when the width changes.
pub(crate) fn residual<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let shortcut = format!("{prefix}.nin_shortcut.conv");
    let has_shortcut = model.info(&format!("{shortcut}.weight")).is_some();
    let (conv1, conv2) = (format!("{prefix}.conv1.conv"), format!("{prefix}.conv2.conv"));
    let mut names = Vec::with_capacity(10);
    names.extend(wb(&format!("{prefix}.norm1")));
    names.extend(wb(&conv1));
    names.extend(wb(&format!("{prefix}.norm2")));
    names.extend(wb(&conv2));
    if has_shortcut {
        names.extend(wb(&shortcut));
    }
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i);
    let h = norm_silu(b, x, &w(0), &w(1), time)?;
    let h = causal_conv(b, &layer, 2, &h, time, &conv1)?;
    let h = norm_silu(b, &h, &w(4), &w(5), time)?;
    let h = causal_conv(b, &layer, 6, &h, time, &conv2)?;
    let skip = if has_shortcut { pointwise(b, &layer, 8, x)? } else { x.clone() };
    Ok(b.binary(&skip, &h, BinaryOp::Add)?)
}

/// The middle attention `prefix`: `x + proj_out(attn)`, one head, scale C^−½, q, k and v 1×1×1 convolutions of the
/// GroupNormed input; over all the positions of every frame of a clip together (ComfyUI's 5-D `AttnBlock`: no mask
/// between frames), over each frame's alone for images.
pub(crate) fn attention<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    time: &Time<'_, B>,
) -> Result<Tensor<B>> {
    let [n, c, hh, ww] = dims(x, "attention")?;
    let mut names = Vec::with_capacity(10);
    for p in ["norm", "q", "k", "v", "proj_out"] {
        names.extend(wb(&format!("{prefix}.{p}")));
    }
    let layer = fetch(b, model, &names)?;
    // A clip's frames are one sequence; images are a batch of sequences.
    let (groups, tokens) = match time {
        Time::Stream(_) => (1, n * hh * ww),
        Time::Alone => (n, hh * ww),
    };
    let seq = {
        let h = group_norm(b, x, &layer.weight(0), &layer.weight(1), time)?;
        b.permute(&h.reshape(&[n, c, hh * ww])?, &[0, 2, 1])?.reshape(&[groups, tokens, c])?
    };
    let project = |i: usize, t: &Tensor<B>| -> Result<Tensor<B>> {
        Ok(b.linear(t, &layer.weight(i).reshape(&[c, c])?, Some(&layer.weight(i + 1)))?)
    };
    let head =
        |i: usize| -> Result<Tensor<B>> { Ok(project(i, &seq)?.reshape(&[groups, 1, tokens, c])?) };
    let (q, k, v) = (head(2)?, head(4)?, head(6)?);
    drop(seq);
    let o = b.attention(&q, &k, &v, AttentionMask::None, (c as f32).powf(-0.5))?;
    drop((q, k, v));
    let o = project(8, &o.reshape(&[groups, tokens, c])?)?;
    let o = b.permute(&o.reshape(&[n, hh * ww, c])?, &[0, 2, 1])?.reshape(&[n, c, hh, ww])?;
    Ok(b.binary(x, &o, BinaryOp::Add)?)
}

/// The middle of `side`: residual block, attention, residual block.
pub(crate) fn middle<B: Backend>(
    b: &B,
    model: &Model,
    side: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let x = residual(b, model, &format!("{side}.mid.block_1"), x, time)?;
    let x = attention(b, model, &format!("{side}.mid.attn_1"), &x, time)?;
    residual(b, model, &format!("{side}.mid.block_2"), &x, time)
}

/// The closing norm, SiLU and carried convolution of `side` (`{side}.norm_out`, `{side}.conv_out`).
pub(crate) fn head<B: Backend>(
    b: &B,
    model: &Model,
    side: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let h = {
        let layer = fetch(b, model, &wb(&format!("{side}.norm_out")))?;
        norm_silu(b, x, &layer.weight(0), &layer.weight(1), time)?
    };
    conv(b, model, &format!("{side}.conv_out"), &h, time)
}

/// The carried 3×3×3 convolution `name` (its weights under `name.conv`) on frames `x` in `time`.
pub(crate) fn conv<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let key = format!("{name}.conv");
    let layer = fetch(b, model, &wb(&key))?;
    causal_conv(b, &layer, 0, x, time, &key)
}

/// The 1×1×1 convolution `name` (`quant_conv`, `post_quant_conv`) on frames `x`.
pub(crate) fn pointwise_conv<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &wb(name))?;
    pointwise(b, &layer, 0, x)
}

/// The encoder's downsample `prefix`: its carried convolution, stride 2 in space and, with `temporal`, in time.
pub(crate) fn downsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    temporal: bool,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let key = format!("{prefix}.conv.conv");
    let layer = fetch(b, model, &wb(&key))?;
    strided_conv(b, &layer, 0, x, temporal, time, &key)
}

/// Frames `x` `[n, ..]` each repeated twice in place → `[2n, ..]` (nearest 2× in time).
fn double_frames<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "a temporal upsample")?;
    let x3 = x.reshape(&[n, 1, c * h * w])?;
    Ok(b.concat(&[&x3, &x3], 1)?.reshape(&[2 * n, c, h, w])?)
}

/// The decoder's upsample `prefix`: nearest 2× in space and, with `temporal`, in time, then its carried
/// convolution. A clip's first frame (every image) is upsampled in space only: one frame in, one out.
pub(crate) fn upsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    temporal: bool,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let key = format!("{prefix}.conv.conv");
    let n = x.dim(0)?;
    let lead = if temporal { time.first_frames(&key, n) } else { n };
    // Nearest resampling is separable: the frames are repeated first, where they are smallest.
    let x = match lead {
        l if l >= n => x.clone(),
        0 => double_frames(b, x)?,
        l => concat_frames(b, &[frames(b, x, 0, l)?, double_frames(b, &frames(b, x, l, n - l)?)?])?,
    };
    let up = b.upsample_nearest2x(&x)?;
    drop(x);
    let layer = fetch(b, model, &wb(&key))?;
    causal_conv(b, &layer, 0, &up, time, &key)
}
