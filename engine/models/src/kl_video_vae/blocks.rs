//! The HunyuanVideo 1.0 VAE's building blocks on frames `[n, C, H, W]` (images, or one chunk of a clip as [`Time`]
//! says): GroupNorm, the head, the 1×1×1 convolutions, the downsample and the upsample. Its residual blocks of
//! carried convolutions, its middle attention and its carried 3×3×3 convolutions are the 1.5 VAE's
//! ([`crate::hunyuan_vae::blocks`]) with [`GroupNorm`] for their norms. Each fetches its weights (by ComfyUI name)
//! through [`Model::fetch`] and drops them before returning; a carried convolution's history is kept under its
//! weight's name.
//!
//! ComfyUI's GroupNorm normalises whatever 5-D tensor it is given over (C/32, T, H, W): here an image's frame alone,
//! and a clip's frames together, as many as the caller passes (one of ComfyUI's chunks, or its whole latent in the
//! middle), so the caller's chunks must be ComfyUI's.

use kiln_compute::backend::UnaryOp;
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, Tensor, Weight};

use super::causal::strided_conv;
use super::config::GROUPS;
use crate::error::{Error, Result};
use crate::hunyuan_vae::blocks::{Norm, conv};
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

/// The HunyuanVideo 1.0 VAE's GroupNorm ([`group_norm`]: its weight and bias `[C]`) as a [`Norm`] of the
/// residual blocks and middle attention it shares with the 1.5 VAE.
pub(crate) struct GroupNorm;

impl Norm for GroupNorm {
    fn weights(&self, name: &str, c: usize) -> Vec<(String, Vec<usize>)> {
        vec![(format!("{name}.weight"), vec![c]), (format!("{name}.bias"), vec![c])]
    }

    fn apply<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        i: usize,
        x: &Tensor<B>,
        time: &Time<'_, B>,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<B>> {
        let h = group_norm(b, x, &layer.weight(i), &layer.weight(i + 1), time)?;
        match act {
            Some(op) => Ok(b.unary(&h, op)?),
            None => Ok(h),
        }
    }
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
        GroupNorm.apply(b, &layer, 0, x, time, Some(UnaryOp::Silu))?
    };
    conv(b, model, &format!("{side}.conv_out"), &h, time)
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
