//! The Wan VAEs' building blocks on frames `[n, C, H, W]` (images, or a chunk of a clip as [`Time`] says): the
//! channel RMS norm, residual blocks of causal convolutions, the middle attention (per frame), the resamples
//! with their temporal halves, and the head. Each fetches its weights (by ComfyUI name) through
//! [`Model::fetch`] and drops them before returning; a causal convolution's stream history is kept under its
//! name.

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor, Weight};

use super::causal::{Time, conv_at, time_down, time_up};
use crate::error::{Error, Result};
use crate::named::{fetch, weight_and_bias as wb};

/// What the norm adds under its square root: only keeps an all-zero position at zero (ComfyUI divides by
/// `max(‖x‖, 1e-12)`), too small to move any other value.
const RMS_EPS: f32 = f32::MIN_POSITIVE;

/// The convolution `name` (2-D, or causal 3-D) on frames `x` with `params`, in `time`.
pub(crate) fn conv<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
    params: Conv2dParams,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &wb(name))?;
    conv_at(b, &layer, 0, x, params, time, name)
}

/// The channel RMS norm `x / ‖x‖ over channels · √C · γ` of `x` `[B, C, H, W]`, then `act` if given.
fn rms<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    gamma: &Weight<'_>,
    act: Option<UnaryOp>,
) -> Result<Tensor<B>> {
    let c = x.dim(1)?;
    Ok(b.channel_rms_norm(x, Some(&gamma.reshape(&[c])?), RMS_EPS, act)?)
}

/// RMS norm then SiLU.
fn rms_silu<B: Backend>(b: &B, x: &Tensor<B>, gamma: &Weight<'_>) -> Result<Tensor<B>> {
    rms(b, x, gamma, Some(UnaryOp::Silu))
}

/// Residual block `prefix`: `shortcut(x) + conv₂(SiLU(RMS₂(conv₁(SiLU(RMS₁(x))))))`, the shortcut a 1³
/// convolution when the width changes.
pub(crate) fn residual<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let shortcut = model.info(&format!("{prefix}.shortcut.weight")).is_some();
    let mut names = vec![format!("{prefix}.residual.0.gamma")];
    names.extend(wb(&format!("{prefix}.residual.2")));
    names.push(format!("{prefix}.residual.3.gamma"));
    names.extend(wb(&format!("{prefix}.residual.6")));
    if shortcut {
        names.extend(wb(&format!("{prefix}.shortcut")));
    }
    let layer = fetch(b, model, &names)?;
    let same = Conv2dParams::same(1);
    let h = rms_silu(b, x, &layer.weight(0))?;
    let h = conv_at(b, &layer, 1, &h, same, time, &format!("{prefix}.residual.2"))?;
    let h = rms_silu(b, &h, &layer.weight(3))?;
    let h = conv_at(b, &layer, 4, &h, same, time, &format!("{prefix}.residual.6"))?;
    let skip = if shortcut {
        let key = format!("{prefix}.shortcut");
        conv_at(b, &layer, 6, x, Conv2dParams::same(0), time, &key)?
    } else {
        x.clone()
    };
    Ok(b.binary(&skip, &h, BinaryOp::Add)?)
}

/// The middle attention `prefix`: `x + proj(attn)`, one head over the H·W positions of each frame, scale
/// C^−½, q, k and v the three C-wide parts of the 1×1 `to_qkv`.
pub(crate) fn attention<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let &[n, c, hh, ww] = x.shape() else {
        return Err(Error::Invalid(format!("attention input {:?} is not [B, C, H, W]", x.shape())));
    };
    let mut names = vec![format!("{prefix}.norm.gamma")];
    names.extend(wb(&format!("{prefix}.to_qkv")));
    names.extend(wb(&format!("{prefix}.proj")));
    let layer = fetch(b, model, &names)?;
    let tokens = {
        let h = rms(b, x, &layer.weight(0), None)?;
        b.permute(&h.reshape(&[n, c, hh * ww])?, &[0, 2, 1])?
    };
    let qkv = b.linear(&tokens, &layer.weight(1).reshape(&[3 * c, c])?, Some(&layer.weight(2)))?;
    drop(tokens);
    let part = |i: usize| -> Result<Tensor<B>> {
        Ok(b.slice(&qkv, 2, i * c, c)?.reshape(&[n, 1, hh * ww, c])?)
    };
    let (q, k, v) = (part(0)?, part(1)?, part(2)?);
    drop(qkv);
    let o = b.attention(&q, &k, &v, AttentionMask::None, (c as f32).powf(-0.5))?;
    drop((q, k, v));
    let o = b.linear(
        &o.reshape(&[n, hh * ww, c])?,
        &layer.weight(3).reshape(&[c, c])?,
        Some(&layer.weight(4)),
    )?;
    let o = b.permute(&o, &[0, 2, 1])?.reshape(&[n, c, hh, ww])?;
    Ok(b.binary(x, &o, BinaryOp::Add)?)
}

/// The encoder's downsample `prefix`: zero-pad right and bottom by one, then `resample.1`, a 3×3 convolution
/// of stride 2, frame by frame; with `temporal`, then `time_conv` halves a clip's frames after the first (an
/// image skips it).
pub(crate) fn downsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    temporal: bool,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let params = Conv2dParams { stride: 2, padding: [0, 1, 0, 1] };
    let x = conv(b, model, &format!("{prefix}.resample.1"), x, params, time)?;
    match time {
        Time::Stream(stream) if temporal => {
            let name = format!("{prefix}.time_conv");
            let layer = fetch(b, model, &wb(&name))?;
            time_down(b, &layer, 0, &x, stream, &name)
        }
        _ => Ok(x),
    }
}

/// The decoder's upsample `prefix`: with `temporal`, first `time_conv` doubles a clip's frames after the first
/// (an image skips it); then, frame by frame, nearest 2× (nearest-exact is nearest at an integer factor) and
/// `resample.1`, a 3×3 convolution (2.1's halves the width, 2.2's keeps it).
pub(crate) fn upsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    temporal: bool,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let x = match time {
        Time::Stream(stream) if temporal => {
            let name = format!("{prefix}.time_conv");
            let layer = fetch(b, model, &wb(&name))?;
            time_up(b, &layer, 0, x, stream, &name)?
        }
        _ => x.clone(),
    };
    let up = b.upsample_nearest2x(&x)?;
    drop(x);
    conv(b, model, &format!("{prefix}.resample.1"), &up, Conv2dParams::same(1), time)
}

/// The closing RMS norm, SiLU and causal 3³ convolution of `side`.
pub(crate) fn head<B: Backend>(
    b: &B,
    model: &Model,
    side: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let h = {
        let layer = fetch(b, model, &[format!("{side}.head.0.gamma")])?;
        rms_silu(b, x, &layer.weight(0))?
    };
    conv(b, model, &format!("{side}.head.2"), &h, Conv2dParams::same(1), time)
}

/// The middle of `side`: residual block, attention (per frame), residual block.
pub(crate) fn middle<B: Backend>(
    b: &B,
    model: &Model,
    side: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let x = residual(b, model, &format!("{side}.middle.0"), x, time)?;
    let x = attention(b, model, &format!("{side}.middle.1"), &x)?;
    residual(b, model, &format!("{side}.middle.2"), &x, time)
}
