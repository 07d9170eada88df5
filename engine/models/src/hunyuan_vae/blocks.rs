//! The HunyuanVideo 1.5 VAE's building blocks on frames `[n, C, H, W]` (images, or frames of a clip as
//! [`Time`] says): the channel RMS norm, residual blocks of causal convolutions, the middle attention (over
//! every frame of a clip together), and the resamples `DnSmpl` and `UpSmpl` with their parameter-free
//! shortcuts and first-frame rules. The residual blocks, middle attention and causal convolutions serve the
//! HunyuanVideo 1.0 VAE too, with its GroupNorm as their [`Norm`]. Each fetches its weights (by ComfyUI name) through [`Model::fetch`] and
//! drops them before returning; a causal convolution's stream history is kept under its weight's name.

use kiln_compute::backend::{AttentionMask, BinaryOp, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, Tensor, Weight};

use super::causal::{Time, causal_conv, concat_frames, frames, pointwise};
use super::config::resample_factor;
use super::reshape::{fold, group_mean, ratio, repeat_channels, unfold};
use crate::error::{Error, Result};
use crate::named::{fetch, weight_and_bias as wb};

/// What the norm adds under its square root: only keeps an all-zero position at zero (ComfyUI divides by
/// `max(‖x‖, 1e-12)`), too small to move any other value.
const RMS_EPS: f32 = f32::MIN_POSITIVE;

/// The channel RMS norm `x / ‖x‖ over channels · √C · γ` of `x` `[n, C, H, W]`, then `act` if given.
fn rms<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    gamma: &Weight<'_>,
    act: Option<UnaryOp>,
) -> Result<Tensor<B>> {
    let c = x.dim(1)?;
    Ok(b.channel_rms_norm(x, Some(&gamma.reshape(&[c])?), RMS_EPS, act)?)
}

/// The RMS norm `name` (its `gamma`) then SiLU.
pub(crate) fn norm_silu<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &[format!("{name}.gamma")])?;
    rms(b, x, &layer.weight(0), Some(UnaryOp::Silu))
}

/// The causal 3³ convolution `name` (a `CarriedConv3d`: its weights under `name.conv`) on frames `x` in `time`.
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

/// A norm of the HunyuanVideo VAEs' residual blocks and middle attention: this VAE's channel RMS norm
/// ([`RmsNorm`]), or the 1.0 VAE's GroupNorm ([`crate::kl_video_vae`]). Its weights come first in the layer
/// of their block, and [`residual`], [`attention`] and [`middle`] take either.
pub(crate) trait Norm {
    /// The names and shapes of the weights of norm `name` over `c` channels, in the order they are fetched.
    fn weights(&self, name: &str, c: usize) -> Vec<(String, Vec<usize>)>;

    /// Frames `x` normed by `layer`'s weights from `i` (those of [`Norm::weights`]) in `time`, then `act` if
    /// given.
    fn apply<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        i: usize,
        x: &Tensor<B>,
        time: &Time<'_, B>,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<B>>;

    /// The names of the weights of norm `name`, in the order they are fetched.
    fn names(&self, name: &str) -> Vec<String> {
        self.weights(name, 0).into_iter().map(|(name, _)| name).collect()
    }
}

/// The HunyuanVideo 1.5 VAE's channel RMS norm: its `gamma` `[C, 1, 1, 1]`, each frame alone.
pub(crate) struct RmsNorm;

impl Norm for RmsNorm {
    fn weights(&self, name: &str, c: usize) -> Vec<(String, Vec<usize>)> {
        vec![(format!("{name}.gamma"), vec![c, 1, 1, 1])]
    }

    fn apply<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        i: usize,
        x: &Tensor<B>,
        _time: &Time<'_, B>,
        act: Option<UnaryOp>,
    ) -> Result<Tensor<B>> {
        rms(b, x, &layer.weight(i), act)
    }
}

/// Residual block `prefix`: `shortcut(x) + conv₂(SiLU(norm₂(conv₁(SiLU(norm₁(x))))))`, the shortcut a 1³
/// convolution (uncarried) when the width changes.
pub(crate) fn residual<B: Backend, N: Norm>(
    b: &B,
    model: &Model,
    norm: &N,
    prefix: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let shortcut = format!("{prefix}.nin_shortcut.conv");
    let has_shortcut = model.info(&format!("{shortcut}.weight")).is_some();
    let (conv1, conv2) = (format!("{prefix}.conv1.conv"), format!("{prefix}.conv2.conv"));
    let mut names = norm.names(&format!("{prefix}.norm1"));
    // Each norm's weight count: norm₁, conv₁, norm₂, conv₂ and the shortcut follow one another in the layer.
    let k = names.len();
    names.extend(wb(&conv1));
    names.extend(norm.names(&format!("{prefix}.norm2")));
    names.extend(wb(&conv2));
    if has_shortcut {
        names.extend(wb(&shortcut));
    }
    let layer = fetch(b, model, &names)?;
    let h = norm.apply(b, &layer, 0, x, time, Some(UnaryOp::Silu))?;
    let h = causal_conv(b, &layer, k, &h, time, &conv1)?;
    let h = norm.apply(b, &layer, k + 2, &h, time, Some(UnaryOp::Silu))?;
    let h = causal_conv(b, &layer, 2 * k + 2, &h, time, &conv2)?;
    let skip = if has_shortcut { pointwise(b, &layer, 2 * k + 4, x)? } else { x.clone() };
    Ok(b.binary(&skip, &h, BinaryOp::Add)?)
}

/// The middle attention `prefix`: `x + proj_out(attn)`, one head, scale C^−½, q, k and v 1³ convolutions of
/// the normed input; over all the positions of every frame of a clip together (ComfyUI's 5-D `AttnBlock`: no
/// mask between frames), over each frame's alone for images.
pub(crate) fn attention<B: Backend, N: Norm>(
    b: &B,
    model: &Model,
    norm: &N,
    prefix: &str,
    x: &Tensor<B>,
    time: &Time<'_, B>,
) -> Result<Tensor<B>> {
    let &[n, c, hh, ww] = x.shape() else {
        return Err(Error::Invalid(format!("attention input {:?} is not [n, C, H, W]", x.shape())));
    };
    let mut names = norm.names(&format!("{prefix}.norm"));
    // The projections' weights start after the norm's.
    let first = names.len();
    for p in ["q", "k", "v", "proj_out"] {
        names.extend(wb(&format!("{prefix}.{p}")));
    }
    let layer = fetch(b, model, &names)?;
    // A clip's frames are one sequence; images are a batch of sequences.
    let (groups, tokens) = match time {
        Time::Stream(_) => (1, n * hh * ww),
        Time::Alone => (n, hh * ww),
    };
    let seq = {
        let h = norm.apply(b, &layer, 0, x, time, None)?;
        b.permute(&h.reshape(&[n, c, hh * ww])?, &[0, 2, 1])?.reshape(&[groups, tokens, c])?
    };
    let project = |i: usize, t: &Tensor<B>| -> Result<Tensor<B>> {
        Ok(b.linear(t, &layer.weight(i).reshape(&[c, c])?, Some(&layer.weight(i + 1)))?)
    };
    let head =
        |i: usize| -> Result<Tensor<B>> { Ok(project(i, &seq)?.reshape(&[groups, 1, tokens, c])?) };
    let (q, k, v) = (head(first)?, head(first + 2)?, head(first + 4)?);
    drop(seq);
    let o = b.attention(&q, &k, &v, AttentionMask::None, (c as f32).powf(-0.5))?;
    drop((q, k, v));
    let o = project(first + 6, &o.reshape(&[groups, tokens, c])?)?;
    let o = b.permute(&o.reshape(&[n, hh * ww, c])?, &[0, 2, 1])?.reshape(&[n, c, hh, ww])?;
    Ok(b.binary(x, &o, BinaryOp::Add)?)
}

/// The middle of `side`: residual block, attention, residual block.
pub(crate) fn middle<B: Backend, N: Norm>(
    b: &B,
    model: &Model,
    norm: &N,
    side: &str,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let x = residual(b, model, norm, &format!("{side}.mid.block_1"), x, time)?;
    let x = attention(b, model, norm, &format!("{side}.mid.attn_1"), &x, time)?;
    residual(b, model, norm, &format!("{side}.mid.block_2"), &x, time)
}

/// Frames `..lead` and `lead..` of `x`, each `None` when empty (no copy when the other is).
type Split<B> = (Option<Tensor<B>>, Option<Tensor<B>>);

/// [`Split`] of `x` at frame `lead`.
fn split<B: Backend>(b: &B, x: &Tensor<B>, lead: usize) -> Result<Split<B>> {
    let n = x.dim(0)?;
    Ok(match lead {
        0 => (None, Some(x.clone())),
        l if l >= n => (Some(x.clone()), None),
        l => (Some(frames(b, x, 0, l)?), Some(frames(b, x, l, n - l)?)),
    })
}

/// The encoder's downsample `prefix` (`DnSmpl`): the causal convolution to `out / f` channels, its output's
/// 2×2 patches (and with `temporal` frame pairs, f = 8; else f = 4) folded into `out` channels, plus the
/// input folded the same way and averaged over channel groups down to `out`. With `temporal`, a clip's first
/// frame (every image) is folded alone: its convolution's 4C channels twice, its input's groups half as wide.
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
    let lead = if temporal { time.first_frames(&key, x.dim(0)?) } else { 0 };
    let h = causal_conv(b, &layer, 0, x, time, &key)?;
    drop(layer);
    let out = h.dim(1)? * resample_factor(temporal);
    let ((h_first, h_rest), (x_first, x_rest)) = (split(b, &h, lead)?, split(b, x, lead)?);
    let mut parts = Vec::new();
    if let (Some(h), Some(x)) = (h_first, x_first) {
        let h = fold(b, &h, 1)?;
        let h = b.concat(&[&h, &h], 1)?;
        let x = group_mean(b, &fold(b, &x, 1)?, out)?;
        parts.push(b.binary(&h, &x, BinaryOp::Add)?);
    }
    if let (Some(h), Some(x)) = (h_rest, x_rest) {
        let r = if temporal { 2 } else { 1 };
        let h = fold(b, &h, r)?;
        let x = group_mean(b, &fold(b, &x, r)?, out)?;
        parts.push(b.binary(&h, &x, BinaryOp::Add)?);
    }
    concat_frames(b, &parts)
}

/// The decoder's upsample `prefix` (`UpSmpl`): the causal convolution to `out · f` channels unfolded into 2×2
/// patches (and with `temporal` frame pairs, f = 8; else f = 4) of `out` channels, plus the input's channels
/// repeated to as many and unfolded the same way. With `temporal`, a clip's first frame (every image) gives
/// one frame: the first `out` channels of its convolution unfolded as 2×2 patches of `2·out`, plus its input
/// repeated half as often.
pub(crate) fn upsample<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    temporal: bool,
    time: &mut Time<'_, B>,
) -> Result<Tensor<B>> {
    let key = format!("{prefix}.conv.conv");
    let layer = fetch(b, model, &wb(&key))?;
    let lead = if temporal { time.first_frames(&key, x.dim(0)?) } else { 0 };
    let h = causal_conv(b, &layer, 0, x, time, &key)?;
    drop(layer);
    let factor = resample_factor(temporal);
    let out = ratio(h.dim(1)?, factor, "an upsample's convolution")?;
    let repeats = ratio(factor * out, x.dim(1)?, "an upsample's shortcut")?;
    let ((h_first, h_rest), (x_first, x_rest)) = (split(b, &h, lead)?, split(b, x, lead)?);
    let mut parts = Vec::new();
    if let (Some(h), Some(x)) = (h_first, x_first) {
        let h = b.slice(&unfold(b, &h, 1)?, 1, 0, out)?;
        let half = ratio(repeats, 2, "a first frame's upsample shortcut")?;
        let x = unfold(b, &repeat_channels(b, &x, half)?, 1)?;
        parts.push(b.binary(&h, &x, BinaryOp::Add)?);
    }
    if let (Some(h), Some(x)) = (h_rest, x_rest) {
        let r = if temporal { 2 } else { 1 };
        let h = unfold(b, &h, r)?;
        let x = unfold(b, &repeat_channels(b, &x, repeats)?, r)?;
        parts.push(b.binary(&h, &x, BinaryOp::Add)?);
    }
    concat_frames(b, &parts)
}
