//! The Wan VAE's building blocks on single frames: the channel RMS norm, causal 3-D convolutions reduced to
//! the one temporal tap a frame without history sees, residual blocks, the middle attention and the spatial
//! resamples. Each fetches its weights (by ComfyUI name) through [`Model::fetch`] and drops them before
//! returning.

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, OwnedWeight, Tensor, Weight};

use crate::error::{Error, Result};
use crate::named::{fetch, weight_and_bias as wb};

/// What the norm adds under its square root: only keeps an all-zero position at zero (ComfyUI divides by
/// `max(‖x‖, 1e-12)`), too small to move any other value.
const RMS_EPS: f32 = f32::MIN_POSITIVE;

/// A convolution weight as the 2-D kernel a single frame sees: a 4-D weight as it is; of a causal 3-D weight
/// `[O, I, kt, kh, kw]`, its last temporal tap (the frames before the first are zero padding), copied on the
/// device.
enum Kernel<'w> {
    Plain(Weight<'w>),
    Tap(OwnedWeight),
}

impl Kernel<'_> {
    fn of<'w, B: Backend>(b: &B, w: Weight<'w>) -> Result<Kernel<'w>> {
        match *w.shape() {
            [_, _, _, _] => Ok(Kernel::Plain(w)),
            [o, i, kt, kh, kw] => {
                let full = b.weight_to_tensor(&w, DType::F32)?;
                let tap = b.slice(&full.reshape(&[o * i, kt, kh * kw])?, 1, kt - 1, 1)?;
                let tap = tap.reshape(&[o, i, kh, kw])?;
                Ok(Kernel::Tap(OwnedWeight::from_tensor(b, &tap, DType::F32)?))
            }
            _ => Err(Error::Invalid(format!("a convolution weight of shape {:?}", w.shape()))),
        }
    }

    fn view(&self) -> Weight<'_> {
        match self {
            Kernel::Plain(w) => w.clone(),
            Kernel::Tap(w) => w.view(),
        }
    }
}

/// The convolution of `layer`'s weights `i` (weight) and `i + 1` (bias) on a single frame.
fn conv_at<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
    params: Conv2dParams,
) -> Result<Tensor<B>> {
    let kernel = Kernel::of(b, layer.weight(i))?;
    Ok(b.conv2d(x, &kernel.view(), Some(&layer.weight(i + 1)), params)?)
}

/// The convolution `name` (2-D, or causal 3-D on a single frame) with `params`.
pub(crate) fn conv<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
    params: Conv2dParams,
) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &wb(name))?;
    conv_at(b, &layer, 0, x, params)
}

/// The channel RMS norm: `x / ‖x‖ over channels · √C · γ` for `x` `[B, C, H, W]`.
fn rms<B: Backend>(b: &B, x: &Tensor<B>, gamma: &Weight<'_>) -> Result<Tensor<B>> {
    let &[n, c, hh, ww] = x.shape() else {
        return Err(Error::Invalid(format!(
            "a feature map must be [B, C, H, W], got {:?}",
            x.shape()
        )));
    };
    let rows = b.permute(&x.reshape(&[n, c, hh * ww])?, &[0, 2, 1])?;
    let normed = b.rms_norm(&rows, Some(&gamma.reshape(&[c])?), RMS_EPS)?;
    Ok(b.permute(&normed, &[0, 2, 1])?.reshape(&[n, c, hh, ww])?)
}

/// RMS norm then SiLU.
fn rms_silu<B: Backend>(b: &B, x: &Tensor<B>, gamma: &Weight<'_>) -> Result<Tensor<B>> {
    Ok(b.unary(&rms(b, x, gamma)?, UnaryOp::Silu)?)
}

/// Residual block `prefix`: `shortcut(x) + conv₂(SiLU(RMS₂(conv₁(SiLU(RMS₁(x))))))`, the shortcut a 1³
/// convolution when the width changes.
pub(crate) fn residual<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
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
    let h = rms_silu(b, x, &layer.weight(0))?;
    let h = conv_at(b, &layer, 1, &h, Conv2dParams::same(1))?;
    let h = rms_silu(b, &h, &layer.weight(3))?;
    let h = conv_at(b, &layer, 4, &h, Conv2dParams::same(1))?;
    let skip = if shortcut { conv_at(b, &layer, 6, x, Conv2dParams::same(0))? } else { x.clone() };
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
        let h = rms(b, x, &layer.weight(0))?;
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

/// The encoder's spatial downsample `prefix`: zero-pad right and bottom by one, then `resample.1`, a 3×3
/// convolution of stride 2. (A frame without history skips the temporal half of a `downsample3d`.)
pub(crate) fn downsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let params = Conv2dParams { stride: 2, padding: [0, 1, 0, 1] };
    conv(b, model, &format!("{prefix}.resample.1"), x, params)
}

/// The decoder's spatial upsample `prefix`: nearest 2× (nearest-exact is nearest at an integer factor), then
/// `resample.1`, a 3×3 convolution that halves the width. (The first latent frame skips the temporal half of an
/// `upsample3d`.)
pub(crate) fn upsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let up = b.upsample_nearest2x(x)?;
    conv(b, model, &format!("{prefix}.resample.1"), &up, Conv2dParams::same(1))
}

/// The closing RMS norm, SiLU and causal 3³ convolution of `side`.
pub(crate) fn head<B: Backend>(
    b: &B,
    model: &Model,
    side: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let h = {
        let layer = fetch(b, model, &[format!("{side}.head.0.gamma")])?;
        rms_silu(b, x, &layer.weight(0))?
    };
    conv(b, model, &format!("{side}.head.2"), &h, Conv2dParams::same(1))
}
