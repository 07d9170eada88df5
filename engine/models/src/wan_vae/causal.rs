//! Causal time in the Wan VAEs. Frames travel as the batch dimension, `[n, C, H, W]`; [`Time`] says whether
//! they are separate one-frame clips (images) or consecutive frames of one clip, in which case a [`Stream`]
//! carries what each causal convolution and temporal resample remembers from the chunks before (ComfyUI's
//! `feat_cache`), so a clip goes through a chunk at a time with the result of the whole clip at once.
//!
//! A causal 3-D convolution of `kt` temporal taps pads time with `kt − 1` zero frames in front; here it is a sum
//! of 2-D convolutions, one per tap, over the frames that tap reads, the zero frames skipped, added into one
//! output ([`Backend::conv2d_sum`]). Its stream history
//! is its last `kt − 1` input frames. A frame with no history (an image, a clip's first frame) reads only the
//! last tap, exactly the one convolution the image path has always made, so one-frame results are bit-identical
//! however they are reached.
//!
//! The temporal resamples keep the first-frame rules of ComfyUI's `Resample`: the encoder's `time_conv`
//! (stride 2, no padding) passes a clip's first frame through and convolves every later pair with the frame
//! before it; the decoder's (C → 2C, causal) emits one frame for a clip's first frame and two for each later
//! one, its convolution seeing only the frames after the first.

use std::collections::BTreeMap;
use std::rc::Rc;

use kiln_compute::backend::{Conv2dParams, ConvTerm};
use kiln_compute::memory::Layer;
use kiln_compute::quant::Quant;
use kiln_compute::{Backend, DType, OwnedWeight, Tensor, Weight};

use crate::error::{Error, Result};

/// How the frames of a batch relate in time.
pub(crate) enum Time<'s, B: Backend> {
    /// Each frame is a clip of its own (an image): no history, no temporal resampling.
    Alone,
    /// The frames continue the clip of this stream.
    Stream(&'s mut Stream<B>),
}

/// What a clip's earlier chunks left behind, by the name of the convolution (or resample) that keeps it.
pub(crate) struct Stream<B: Backend> {
    history: BTreeMap<String, History<B>>,
    /// Each causal convolution's taps, reordered on its first chunk.
    taps: BTreeMap<String, Rc<Taps>>,
}

/// One convolution's memory of the clip.
enum History<B: Backend> {
    /// A temporal resample has passed the clip's first frame; its convolution has seen nothing yet.
    Started,
    /// The last input frames of a causal convolution (at most `kt − 1`), or the last frame an encoder's time
    /// convolution read.
    Frames(Tensor<B>),
}

impl<B: Backend> Stream<B> {
    /// A clip at its first frame.
    pub(crate) fn new() -> Stream<B> {
        Stream { history: BTreeMap::new(), taps: BTreeMap::new() }
    }

    /// Whether `key` has seen nothing of the clip yet.
    pub(crate) fn fresh(&self, key: &str) -> bool {
        !self.history.contains_key(key)
    }

    /// The taps of `key`'s weight `w`, reordered on its first use in the clip.
    fn taps(&mut self, b: &B, key: &str, w: &Weight<'_>) -> Result<Rc<Taps>> {
        if let Some(taps) = self.taps.get(key) {
            return Ok(taps.clone());
        }
        let taps = Rc::new(Taps::of(b, w, 0)?);
        self.taps.insert(key.to_owned(), taps.clone());
        Ok(taps)
    }

    /// The frames `key` remembers, if any.
    fn frames(&self, key: &str) -> Option<&Tensor<B>> {
        match self.history.get(key) {
            Some(History::Frames(t)) => Some(t),
            Some(History::Started) | None => None,
        }
    }
}

/// The largest activation (in bytes, at the decoder's top level) of the frames a temporal upsample made that
/// still go on together, by default: a small clip's frames share each convolution, as ComfyUI's do; a large
/// one's go one at a time, which bounds memory by one frame at full size.
pub const FRAMES_TOGETHER_BYTES: usize = 256 << 20;

/// Whether the frames `x` `[n, C, H, W]` that a decoder's temporal upsample made, with `ups` spatial
/// upsamples (each 4× the elements) still ahead, go on one at a time: frames of a clip (in a [`Stream`]) once
/// they would pass `together` bytes at the top. The estimate keeps this level's width, which the top level
/// narrows 4× in both Wan VAEs, so it errs towards one at a time. Every layer after is causal or per frame:
/// on the CPU either way gives the same bits (on CUDA, cuDNN may choose another algorithm for another batch).
pub(crate) fn one_frame_at_a_time<B: Backend>(
    x: &Tensor<B>,
    time: &Time<'_, B>,
    ups: usize,
    together: usize,
) -> bool {
    let growth = 4usize.saturating_pow(u32::try_from(ups).unwrap_or(u32::MAX));
    let top = x.numel().saturating_mul(x.dtype().size()).saturating_mul(growth);
    matches!(time, Time::Stream(_)) && x.shape().first().is_some_and(|&n| n > 1) && top > together
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

/// The taps of a causal 3-D weight `[O, I, kt, kh, kw]` as 2-D kernels `[O, I, kh, kw]`: the weight reordered
/// once to `[kt, O, I, kh, kw]` on the device ([`Backend::causal_taps`]), in its own dtype (the same values),
/// so that tap j is a view of its j-th block. A [`Stream`] keeps each convolution's, so a clip's later chunks
/// reorder nothing.
struct Taps {
    reordered: OwnedWeight,
    shape: [usize; 5],
    /// The first tap kept (an image's convolution keeps only the last).
    first: usize,
}

impl Taps {
    /// Taps `first..` of `w`.
    fn of<B: Backend>(b: &B, w: &Weight<'_>, first: usize) -> Result<Taps> {
        let &[o, i, kt, kh, kw] = w.shape() else {
            return Err(Error::Invalid(format!("a causal convolution of shape {:?}", w.shape())));
        };
        // Plain float weights keep their dtype, which holds their values exactly; a scaled or quantized one
        // is kept dequantized.
        let dtype = match w.dtype() {
            d @ (DType::F32 | DType::F16 | DType::BF16 | DType::F8E4M3 | DType::F8E5M2)
                if w.quant() == Quant::None =>
            {
                d
            }
            _ => DType::F32,
        };
        let reordered = b.causal_taps(w, first, dtype)?;
        Ok(Taps { reordered, shape: [o, i, kt, kh, kw], first })
    }

    /// Temporal taps.
    fn len(&self) -> usize {
        self.shape[2]
    }

    /// Every tap, tap j at index j, each a 2-D kernel `[O, I, kh, kw]` (the taps of a [`Stream`], which keeps
    /// them all).
    fn all(&self) -> Result<Vec<Weight<'_>>> {
        (0..self.len()).map(|j| self.tap(j)).collect()
    }

    /// Tap `j` as a 2-D kernel `[O, I, kh, kw]`.
    fn tap(&self, j: usize) -> Result<Weight<'_>> {
        let [o, i, _, kh, kw] = self.shape;
        let kept = j.checked_sub(self.first).ok_or_else(|| {
            Error::Invalid(format!("tap {j} of a convolution that kept taps {}..", self.first))
        })?;
        Ok(self.reordered.view().rows(kept, 1)?.reshape(&[o, i, kh, kw])?)
    }
}

/// The convolution of `layer`'s weights `i` (weight) and `i + 1` (bias) on frames `x` `[n, C, H, W]`, `params`
/// its spatial geometry: a 2-D weight frame by frame; a causal 3-D one as [`Time`] says, `key` naming its
/// history in a stream.
pub(crate) fn conv_at<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
    params: Conv2dParams,
    time: &mut Time<'_, B>,
    key: &str,
) -> Result<Tensor<B>> {
    let w = layer.weight(i);
    let bias = layer.weight(i + 1);
    match (w.shape().len(), time) {
        (4, _) => Ok(b.conv2d(x, &w, Some(&bias), params)?),
        (5, Time::Alone) => {
            let last = w.shape()[2].checked_sub(1).ok_or_else(|| {
                Error::Invalid(format!("a causal convolution of shape {:?}", w.shape()))
            })?;
            let taps = Taps::of(b, &w, last)?;
            Ok(b.conv2d(x, &taps.tap(last)?, Some(&bias), params)?)
        }
        (5, Time::Stream(stream)) => causal(b, &w, &bias, x, params, stream, key),
        _ => Err(Error::Invalid(format!("a convolution weight of shape {:?}", w.shape()))),
    }
}

/// A causal 3-D convolution over a chunk of a clip: output frame k sums tap j over padded input frame
/// k + j, the padded input being `kt − 1` zero frames, then the history, then `x`, less the zeros the history
/// replaces; each tap convolves the frames it reads (none over zeros) where they lie, in the history or the
/// chunk, all into one output ([`Backend::conv2d_sum`]).
fn causal<B: Backend>(
    b: &B,
    w: &Weight<'_>,
    bias: &Weight<'_>,
    x: &Tensor<B>,
    params: Conv2dParams,
    stream: &mut Stream<B>,
    key: &str,
) -> Result<Tensor<B>> {
    let taps = stream.taps(b, key, w)?;
    let kt = taps.len();
    let n = x.dim(0)?;
    let history = stream.frames(key);
    let p = history.map_or(Ok(0), |h| h.dim(0))?;
    // The zero frames still in front: the history fills the rest of the padding.
    let zeros = (kt - 1).checked_sub(p).ok_or_else(|| {
        Error::Invalid(format!("{key}: {p} frames of history for a kernel of {kt}"))
    })?;
    // Frames `start..start + len` of the history followed by the chunk, copied no more than they must be.
    let read = |start: usize, len: usize| -> Result<Tensor<B>> {
        match history {
            Some(h) if start < p && start + len > p => {
                let (old, new) =
                    (frames(b, h, start, p - start)?, frames(b, x, 0, start + len - p)?);
                Ok(b.concat(&[&old, &new], 0)?)
            }
            Some(h) if start < p => frames(b, h, start, len),
            _ if start == p && len == n => Ok(x.clone()),
            _ => frames(b, x, start - p, len),
        }
    };
    let kernels = taps.all()?;
    let (earlier, last) = kernels.split_at(kt - 1);
    // The last tap reads the chunk itself, frame for frame, into every output frame.
    let mut terms = vec![ConvTerm::whole(x, &last[0], 0)];
    for (j, w) in earlier.iter().enumerate() {
        // Output k reads padded frame k + j: zero before `zeros`, then frame k + j − zeros of the history
        // followed by the chunk. Outputs before `first` read only zeros through this tap; the others read
        // frames `start..start + len` of the history and the chunk, each part where it lies.
        let first = zeros.saturating_sub(j);
        if first >= n {
            continue;
        }
        let (start, len) = (first + j - zeros, n - first);
        if let Some(h) = history
            && start < p
        {
            let n = len.min(p - start);
            terms.push(ConvTerm { x: h, from: start, n, w, at: first });
        }
        if start + len > p {
            let from = start.max(p);
            let at = first + (from - start);
            terms.push(ConvTerm { x, from: from - p, n: start + len - from, w, at });
        }
    }
    let out = b.conv2d_sum(&terms, Some(bias), params, n)?;
    let keep = (kt - 1).min(p + n);
    if keep > 0 {
        let last = read(p + n - keep, keep)?;
        stream.history.insert(key.to_owned(), History::Frames(last));
    }
    Ok(out)
}

/// The encoder's temporal downsample `time_conv` (`[C, C, 3, 1, 1]`, stride 2, no padding, weights `i` and
/// `i + 1` of `layer`) on frames `x` of a clip: the clip's first frame passes through untouched; after it,
/// frames come in pairs and output frame k is the convolution of frames 2k − 2, 2k − 1 and 2k.
pub(crate) fn time_down<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
    stream: &mut Stream<B>,
    key: &str,
) -> Result<Tensor<B>> {
    let mut out = Vec::new();
    let mut rest = Some(x.clone());
    if stream.fresh(key) {
        let first = frames(b, x, 0, 1)?;
        stream.history.insert(key.to_owned(), History::Frames(first.clone()));
        out.push(first);
        rest = after_first(b, x)?;
    }
    if let Some(rest) = rest {
        let n = rest.dim(0)?;
        if n % 2 != 0 {
            return Err(Error::Invalid(format!(
                "{key}: after a clip's first frame, frames reach a temporal downsample in pairs, got {n}"
            )));
        }
        let Some(last) = stream.frames(key) else {
            return Err(Error::Invalid(format!("{key}: no previous frame")));
        };
        let shape = rest.shape().to_vec();
        let frame: usize = shape[1..].iter().product();
        let m = n / 2;
        let full = b.concat(&[last, &rest], 0)?;
        // Tap 0 reads frames 0, 2, …; taps 1 and 2 read 1, 3, … and 2, 4, … of [previous, rest].
        let even = frames(b, &full, 0, n)?.reshape(&[m, 2, frame])?;
        let odd = frames(b, &full, 1, n)?.reshape(&[m, 2, frame])?;
        let pick = |t: &Tensor<B>, k: usize| -> Result<Tensor<B>> {
            let mut s = shape.clone();
            s[0] = m;
            Ok(b.slice(t, 1, k, 1)?.reshape(&s)?)
        };
        let picked = [pick(&odd, 1)?, pick(&even, 0)?, pick(&odd, 0)?];
        let taps = stream.taps(b, key, &layer.weight(i))?;
        let kernels = taps.all()?;
        let terms =
            [(0, 2), (1, 0), (2, 1)].map(|(k, j)| ConvTerm::whole(&picked[k], &kernels[j], 0));
        let bias = layer.weight(i + 1);
        let y = b.conv2d_sum(&terms, Some(&bias), Conv2dParams::same(0), m)?;
        let newest = frames(b, &rest, n - 1, 1)?;
        stream.history.insert(key.to_owned(), History::Frames(newest));
        out.push(y);
    }
    concat_frames(b, &out)
}

/// The decoder's temporal upsample `time_conv` (`[2C, C, 3, 1, 1]`, causal, weights `i` and `i + 1` of
/// `layer`) on frames `x` of a clip: the clip's first frame passes through as one frame; every later frame
/// becomes two, the two C-channel halves of the convolution (the first half the earlier frame), which sees
/// the frames after the first only.
pub(crate) fn time_up<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
    stream: &mut Stream<B>,
    key: &str,
) -> Result<Tensor<B>> {
    let mut out = Vec::new();
    let mut rest = Some(x.clone());
    if stream.fresh(key) {
        stream.history.insert(key.to_owned(), History::Started);
        out.push(frames(b, x, 0, 1)?);
        rest = after_first(b, x)?;
    }
    if let Some(rest) = rest {
        let &[n, c, h, w] = rest.shape() else {
            return Err(Error::Invalid(format!("frames {:?} are not [n, C, H, W]", rest.shape())));
        };
        let y = causal(
            b,
            &layer.weight(i),
            &layer.weight(i + 1),
            &rest,
            Conv2dParams::same(0),
            stream,
            key,
        )?;
        // [n, 2C, H, W] → [n, 2, C, H, W] → frames (t, half).
        out.push(y.reshape(&[2 * n, c, h, w])?);
    }
    concat_frames(b, &out)
}

/// The frames of `x` after its first, if there are any.
fn after_first<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Option<Tensor<B>>> {
    let n = x.dim(0)?;
    if n > 1 { Ok(Some(frames(b, x, 1, n - 1)?)) } else { Ok(None) }
}

/// `parts` joined along the frame dimension.
pub(crate) fn concat_frames<B: Backend>(b: &B, parts: &[Tensor<B>]) -> Result<Tensor<B>> {
    match parts {
        [one] => Ok(one.clone()),
        _ => Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 0)?),
    }
}
