//! Causal time in the HunyuanVideo 1.5 VAE, as ComfyUI's `conv_carry_causal_3d` computes it. Frames travel as
//! the batch dimension, `[n, C, H, W]`; [`Time`] says whether they are separate one-frame clips (images) or
//! consecutive frames of one clip, in which case a [`Stream`] carries each convolution's last frames from the
//! chunks before (ComfyUI's `conv_carry`), so a clip goes through a chunk at a time with the whole clip's result.
//!
//! Every convolution pads **replicating** the edges: one row and column on each side, and in front of a clip
//! its first frame twice (where ComfyUI's carry-in is absent); a carried chunk reads the last two (padded) input
//! frames of the chunk before instead. Here the padded frames are summed over the kernel's temporal taps, each a
//! 2-D convolution over the frames it reads, where they lie ([`Backend::conv2d_sum`]). A frame with no history
//! (an image, a clip's first frame) reads itself through every tap: one 2-D convolution with the taps summed,
//! so one-frame results are bit-identical however they are reached.

use std::collections::BTreeMap;

use kiln_compute::backend::{BinaryOp, Conv2dParams, ConvTerm, PadMode};
use kiln_compute::memory::Layer;
use kiln_compute::quant::Quant;
use kiln_compute::{Backend, DType, OwnedWeight, Tensor, Weight};

use crate::error::{Error, Result};

/// How the frames of a batch relate in time.
pub(crate) enum Time<'s, B: Backend> {
    /// Each frame is a clip of its own (an image): no history; temporal resamples take their first-frame path.
    Alone,
    /// The frames continue the clip of this stream.
    Stream(&'s mut Stream<B>),
}

impl<B: Backend> Time<'_, B> {
    /// How many leading frames of `n` reaching the convolution `key` are a clip's first frame: all of them for
    /// images, the first of a clip's first chunk, none after.
    pub(crate) fn first_frames(&self, key: &str, n: usize) -> usize {
        match self {
            Time::Alone => n,
            Time::Stream(stream) if stream.fresh(key) => n.min(1),
            Time::Stream(_) => 0,
        }
    }
}

/// What a clip's earlier chunks left behind: each convolution's last padded input frames, by its name.
pub(crate) struct Stream<B: Backend> {
    pub(crate) history: BTreeMap<String, Tensor<B>>,
}

impl<B: Backend> Stream<B> {
    /// A clip at its first frame.
    pub(crate) fn new() -> Stream<B> {
        Stream { history: BTreeMap::new() }
    }

    /// Whether `key` has seen nothing of the clip yet.
    pub(crate) fn fresh(&self, key: &str) -> bool {
        !self.history.contains_key(key)
    }
}

/// Frames `start..start + len` of `x` `[n, ..]`.
pub(crate) fn frames<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    start: usize,
    len: usize,
) -> Result<Tensor<B>> {
    Ok(b.slice(x, 0, start, len)?)
}

/// `parts` joined along the frame dimension.
pub(crate) fn concat_frames<B: Backend>(b: &B, parts: &[Tensor<B>]) -> Result<Tensor<B>> {
    match parts {
        [one] => Ok(one.clone()),
        _ => Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 0)?),
    }
}

/// `x` `[n, C, H, W]` with one row and column repeated on each side (torch's `replicate`).
pub(crate) fn pad_space<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let x = b.pad(x, 3, 1, 1, PadMode::Replicate)?;
    Ok(b.pad(&x, 2, 1, 1, PadMode::Replicate)?)
}

/// The dims `[O, I, kt, kh, kw]` of a 3-D convolution weight.
pub(crate) fn dims5(w: &Weight<'_>) -> Result<[usize; 5]> {
    match *w.shape() {
        [o, i, kt, kh, kw] if kt > 0 => Ok([o, i, kt, kh, kw]),
        ref other => Err(Error::Invalid(format!("a causal convolution of shape {other:?}"))),
    }
}

/// The type the reordered taps of `w` are kept in: a plain float weight's own (which holds its values exactly),
/// else f32 (a scaled or quantized weight dequantized).
pub(crate) fn taps_dtype(w: &Weight<'_>) -> DType {
    match w.dtype() {
        d @ (DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
            if w.quant() == Quant::None =>
        {
            d
        }
        _ => DType::F32,
    }
}

/// Bytes of a weight widened to f32 at once while its taps are summed ([`collapsed`]): the released decoder's
/// widest kernel (8192 × 1024 × 27) goes a block of output channels at a time.
const COLLAPSE_BLOCK_BYTES: usize = 64 << 20;

/// The 2-D kernel `[O, I, kh, kw]` that a frame convolved with itself through every temporal tap of `w` sees:
/// the taps summed in f32, a block of output channels at a time, kept in the compute type.
pub(crate) fn collapsed<B: Backend>(b: &B, w: &Weight<'_>) -> Result<OwnedWeight> {
    collapsed_in_blocks(b, w, COLLAPSE_BLOCK_BYTES)
}

/// [`collapsed`], widening at most `block_bytes` of `w` at once (at least one output channel).
fn collapsed_in_blocks<B: Backend>(
    b: &B,
    w: &Weight<'_>,
    block_bytes: usize,
) -> Result<OwnedWeight> {
    let [o, i, kt, kh, kw] = dims5(w)?;
    let row_bytes = i * kt * kh * kw * DType::F32.size();
    let per = (block_bytes / row_bytes.max(1)).clamp(1, o.max(1));
    let mut parts = Vec::new();
    for start in (0..o).step_by(per) {
        let len = per.min(o - start);
        let taps = b.weight_to_tensor(&w.rows(start, len)?, DType::F32)?;
        let taps = taps.reshape(&[len * i, kt, kh * kw])?;
        let mut sum = b.slice(&taps, 1, 0, 1)?;
        for j in 1..kt {
            sum = b.binary(&sum, &b.slice(&taps, 1, j, 1)?, BinaryOp::Add)?;
        }
        parts.push(b.cast(&sum, b.compute_dtype())?.reshape(&[len, i, kh, kw])?);
    }
    Ok(OwnedWeight::from_tensor(b, &concat_frames(b, &parts)?, b.compute_dtype())?)
}

/// The causal 3-D convolution of `layer`'s weights `i` (`[O, I, kt, kh, kw]`) and `i + 1` (bias) on frames `x`
/// `[n, C, H, W]`, replicate-padded, in `time`; `key` names its history in a stream.
pub(crate) fn causal_conv<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
    time: &mut Time<'_, B>,
    key: &str,
) -> Result<Tensor<B>> {
    let (w, bias) = (layer.weight(i), layer.weight(i + 1));
    let kt = dims5(&w)?[2];
    let xp = pad_space(b, x)?;
    let n = xp.dim(0)?;
    match time {
        Time::Stream(stream) if !stream.fresh(key) || n > 1 => {
            let history = match stream.history.remove(key) {
                Some(h) => h,
                None => repeat_first(b, &xp, kt - 1)?,
            };
            let y = streamed(b, &w, &bias, &xp, &history, kt)?;
            stream.history.insert(key.to_owned(), last_frames(b, &history, &xp, kt - 1)?);
            Ok(y)
        }
        Time::Stream(stream) => {
            let y = b.conv2d(&xp, &collapsed(b, &w)?.view(), Some(&bias), Conv2dParams::same(0))?;
            stream.history.insert(key.to_owned(), repeat_first(b, &xp, kt - 1)?);
            Ok(y)
        }
        Time::Alone => {
            Ok(b.conv2d(&xp, &collapsed(b, &w)?.view(), Some(&bias), Conv2dParams::same(0))?)
        }
    }
}

/// `k` copies of the first frame of `x`: the replicated front of a clip.
pub(crate) fn repeat_first<B: Backend>(b: &B, x: &Tensor<B>, k: usize) -> Result<Tensor<B>> {
    let first = frames(b, x, 0, 1)?;
    let copies: Vec<&Tensor<B>> = std::iter::repeat_n(&first, k).collect();
    Ok(b.concat(&copies, 0)?)
}

/// The last `k` frames of `history` followed by `x`.
pub(crate) fn last_frames<B: Backend>(
    b: &B,
    history: &Tensor<B>,
    x: &Tensor<B>,
    k: usize,
) -> Result<Tensor<B>> {
    let n = x.dim(0)?;
    if n >= k {
        return frames(b, x, n - k, k);
    }
    let old = frames(b, history, history.dim(0)? - (k - n), k - n)?;
    Ok(b.concat(&[&old, x], 0)?)
}

/// A chunk `xp` (padded in space) after `history` (its `kt − 1` padded frames before): output k sums tap j over
/// frame k + j of history and chunk together, each tap's frames read where they lie.
fn streamed<B: Backend>(
    b: &B,
    w: &Weight<'_>,
    bias: &Weight<'_>,
    xp: &Tensor<B>,
    history: &Tensor<B>,
    kt: usize,
) -> Result<Tensor<B>> {
    let [o, i, _, kh, kw] = dims5(w)?;
    let k = kt - 1;
    if history.dim(0)? != k {
        return Err(Error::Invalid(format!(
            "{} frames of history for a kernel of {kt}",
            history.dim(0)?
        )));
    }
    let n = xp.dim(0)?;
    let taps = b.causal_taps(w, 0, taps_dtype(w))?;
    let kernels: Vec<Weight<'_>> = (0..kt)
        .map(|j| Ok(taps.view().rows(j, 1)?.reshape(&[o, i, kh, kw])?))
        .collect::<Result<_>>()?;
    // The last tap reads the chunk itself, frame for frame, into every output frame.
    let mut terms = vec![ConvTerm::whole(xp, &kernels[k], 0)];
    for (j, kernel) in kernels[..k].iter().enumerate() {
        // Outputs 0..k − j read history frames j..k; outputs from k − j read the chunk from its first frame.
        let from_history = (k - j).min(n);
        terms.push(ConvTerm { x: history, from: j, n: from_history, w: kernel, at: 0 });
        if n > k - j {
            terms.push(ConvTerm { x: xp, from: 0, n: n - (k - j), w: kernel, at: k - j });
        }
    }
    Ok(b.conv2d_sum(&terms, Some(bias), Conv2dParams::same(0), n)?)
}

/// The 1³ convolution of `layer`'s weights `i` (`[O, I, 1, 1, 1]`) and `i + 1` on frames `x` `[n, I, H, W]`.
pub(crate) fn pointwise<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let w = layer.weight(i);
    let [o, c, 1, 1, 1] = dims5(&w)? else {
        return Err(Error::Invalid(format!("a 1³ convolution of shape {:?}", w.shape())));
    };
    Ok(b.conv2d(x, &w.reshape(&[o, c, 1, 1])?, Some(&layer.weight(i + 1)), Conv2dParams::same(0))?)
}

#[cfg(test)]
mod tests {
    use kiln_compute::backend::cpu::Cpu;
    use kiln_compute::{Backend, DType, OwnedWeight};

    use super::collapsed_in_blocks;

    #[test]
    fn taps_sum_the_same_in_blocks_of_output_channels() {
        let b = Cpu::new(1 << 20);
        let shape = [5, 2, 3, 3, 3];
        let values: Vec<f32> = (0..270).map(|v| (v as f32 * 0.37).sin()).collect();
        let w = OwnedWeight::from_f32(b.memory(), DType::F32, &shape, &values).expect("a weight");
        let sum = |block: usize| {
            let k = collapsed_in_blocks(&b, &w.view(), block).expect("collapsed");
            assert_eq!(k.view().shape(), [5, 2, 3, 3]);
            b.to_f32(&b.weight_to_tensor(&k.view(), DType::F32).expect("a tensor")).expect("read")
        };
        let whole = sum(usize::MAX);
        // Output channel 3, input channel 1, position (2, 0): its three taps summed.
        let at = |t: usize| values[((3 * 2 + 1) * 3 + t) * 9 + 6];
        assert_eq!(whole[(3 * 2 + 1) * 9 + 6], at(0) + at(1) + at(2));
        assert_eq!(sum(0), whole);
        assert_eq!(sum(2 * 27 * 4 * 2), whole);
    }
}
