//! The channels Wan's image-to-video models read beside the latents (20 for Wan 2.1 I2V / FLF2V and the Wan 2.2
//! A14B I2V experts), as ComfyUI's `WAN21.concat_cond` builds them from the conditioning: a 4-channel mask, 1
//! where a frame was given (the nodes store 0 there, so it is inverted here), then the image latent
//! (`WanImageToVideo`'s conditioning video, VAE-encoded) resized to the latents and put in the model's latent
//! space; zeros where the conditioning has none.

use super::concat::{join_channels, resize_to_batch};
use super::latent::transpose;
use super::resize::resize;
use crate::models::{CondExtras, LatentFormat};
use crate::nodes::NodeError;
use crate::tensor::Tensor;

/// Mask channels a Wan image-to-video model reads before the image latent.
const MASK_CHANNELS: usize = 4;

/// The `extra` channels for latents of `shape` `[B, C, T, h, w]`, or `None` for a model that reads none.
/// `image_to_video` is ComfyUI's flag of the same name (a model with an image embedding, 2.1 I2V/FLF2V);
/// `denoise_mask` is the latent's noise mask at the latents' shape, the mask used when the conditioning has
/// none.
pub(super) fn build(
    extra: usize,
    image_to_video: bool,
    latent: &LatentFormat,
    extras: &CondExtras,
    shape: &[usize],
    denoise_mask: Option<&[f32]>,
) -> Result<Option<Tensor>, NodeError> {
    if extra == 0 {
        return Ok(None);
    }
    let &[batch, channels, frames, h, w] = shape else {
        return Err(NodeError::new(format!(
            "a Wan model takes video latents [B, C, T, h, w], not {shape:?}"
        )));
    };
    let image = match &extras.concat_latent_image {
        None => Tensor::full(vec![batch, extra, frames, h, w], 0.0),
        Some(image) => {
            let image = resize_frames(&as_video(image)?, w, h)?;
            let image = process_in_groups(latent, &image)?;
            resize_to_batch(&image, batch)?
        }
    };
    if image.shape()[2] != frames {
        return check(image, extra, frames);
    }
    let image_channels = image.shape()[1];
    if extra != image_channels + MASK_CHANNELS && (!image_to_video || extra == image_channels) {
        return check(image, extra, frames);
    }
    let image = first_channels(&image, image_channels.min(extra.saturating_sub(MASK_CHANNELS)))?;
    let mask = match (&extras.concat_mask, denoise_mask) {
        (Some(mask), _) => Some(as_video(mask)?),
        (None, Some(mask)) => Some(tensor(vec![batch, channels, frames, h, w], mask.to_vec())?),
        (None, None) => None,
    };
    let mask = match mask {
        None => Tensor::full(vec![batch, MASK_CHANNELS, frames, h, w], 0.0),
        Some(mask) => {
            let mask = if mask.shape()[1] == MASK_CHANNELS { mask } else { mean_channels(&mask)? };
            let mask = resize_frames(&mask.map(|v| 1.0 - v), w, h)?;
            let mask = pad_frames(&mask, frames)?;
            if mask.shape()[2] != frames {
                return Err(NodeError::new(format!(
                    "the conditioning's mask covers {} frames, the latents {frames}",
                    mask.shape()[2]
                )));
            }
            let mask = repeat_channels(&mask, MASK_CHANNELS)?;
            resize_to_batch(&mask, batch)?
        }
    };
    // `concat_mask_index` (Wan 2.2 Fun Control: the control latent's channels): the mask goes after that many
    // of the image's channels rather than before them all.
    let kept = image.shape()[1];
    let joined = match extras.concat_mask_index.unwrap_or(0) {
        0 => join_channels(&mask, &image)?,
        index if index >= kept => join_channels(&image, &mask)?,
        index => {
            let head = channel_range(&image, 0, index)?;
            let tail = channel_range(&image, index, kept - index)?;
            join_channels(&join_channels(&head, &mask)?, &tail)?
        }
    };
    check(joined, extra, frames)
}

/// `t` as the model reads it, or the error of channels or frames that do not fit.
pub(super) fn check(t: Tensor, extra: usize, frames: usize) -> Result<Option<Tensor>, NodeError> {
    let s = t.shape();
    if s[1] != extra || s[2] != frames {
        return Err(NodeError::new(format!(
            "the model reads {extra} channels over {frames} frames beside the latents; the conditioning's \
             image latent and mask make {} channels over {} frames (make the latent and the conditioning with \
             one node, at one length)",
            s[1], s[2]
        )));
    }
    Ok(Some(t))
}

/// A latent or mask as `[B, C, T, h, w]`: an image latent `[B, C, h, w]` is one frame.
pub(super) fn as_video(t: &Tensor) -> Result<Tensor, NodeError> {
    match *t.shape() {
        [_, _, _, _, _] => Ok(t.clone()),
        [b, c, h, w] => tensor(vec![b, c, 1, h, w], t.data().to_vec()),
        ref other => Err(NodeError::new(format!(
            "expected a video latent or mask [B, C, T, h, w], got {other:?}"
        ))),
    }
}

/// Every frame of `t` `[B, C, T, h, w]` resized bilinearly with ComfyUI's centre crop to `w` × `h`
/// (`common_upscale` on a 5-D tensor).
pub(super) fn resize_frames(t: &Tensor, w: usize, h: usize) -> Result<Tensor, NodeError> {
    let &[b, c, frames, th, tw] = t.shape() else {
        return Err(NodeError::new(format!("expected [B, C, T, h, w], got {:?}", t.shape())));
    };
    if (th, tw) == (h, w) {
        return Ok(t.clone());
    }
    let planes = tensor(vec![b, c * frames, th, tw], t.data().to_vec())?;
    let resized = resize(&transpose(&planes, true)?, w, h, "bilinear", true)?;
    let resized = transpose(&resized, false)?;
    tensor(vec![b, c, frames, h, w], resized.data().to_vec())
}

/// `t` moved into the model's space 16 (the latent's) channels at a time, as ComfyUI's `process_latent_in`
/// on each group.
pub(super) fn process_in_groups(latent: &LatentFormat, t: &Tensor) -> Result<Tensor, NodeError> {
    let s = t.shape();
    let group = latent.channels;
    if !s[1].is_multiple_of(group) {
        return Err(NodeError::new(format!(
            "an image latent of {} channels is not made of {group}-channel latents",
            s[1]
        )));
    }
    let mut grouped = s.to_vec();
    grouped[0] = s[0] * s[1] / group;
    grouped[1] = group;
    tensor(s.to_vec(), latent.process_in(t.data(), &grouped))
}

/// The first `n` channels of `t` `[B, C, …]`.
fn first_channels(t: &Tensor, n: usize) -> Result<Tensor, NodeError> {
    channel_range(t, 0, n)
}

/// Channels `start..start + n` of `t` `[B, C, …]`.
fn channel_range(t: &Tensor, start: usize, n: usize) -> Result<Tensor, NodeError> {
    let s = t.shape();
    if (start, n) == (0, s[1]) {
        return Ok(t.clone());
    }
    let plane: usize = s[2..].iter().product();
    let per = s[1] * plane;
    let values = (0..s[0])
        .flat_map(|b| t.data()[b * per + start * plane..][..n * plane].iter().copied())
        .collect();
    let mut shape = s.to_vec();
    shape[1] = n;
    tensor(shape, values)
}

/// `t` `[B, C, …]` averaged over its channels → `[B, 1, …]`.
pub(super) fn mean_channels(t: &Tensor) -> Result<Tensor, NodeError> {
    let s = t.shape();
    let (b, c) = (s[0], s[1]);
    let plane: usize = s[2..].iter().product();
    let mut out = vec![0.0f32; b * plane];
    for bi in 0..b {
        let dst = &mut out[bi * plane..][..plane];
        for ci in 0..c {
            let src = &t.data()[(bi * c + ci) * plane..][..plane];
            dst.iter_mut().zip(src).for_each(|(o, s)| *o += s);
        }
        dst.iter_mut().for_each(|o| *o /= c as f32);
    }
    let mut shape = s.to_vec();
    shape[1] = 1;
    tensor(shape, out)
}

/// `t` `[B, C, T, h, w]` with zero frames appended up to `frames` (ComfyUI pads a shorter mask).
pub(super) fn pad_frames(t: &Tensor, frames: usize) -> Result<Tensor, NodeError> {
    let &[b, c, have, h, w] = t.shape() else {
        return Err(NodeError::new(format!("expected [B, C, T, h, w], got {:?}", t.shape())));
    };
    if have >= frames {
        return Ok(t.clone());
    }
    let (plane, missing) = (h * w, (frames - have) * h * w);
    let mut out = Vec::with_capacity(b * c * frames * plane);
    for chunk in t.data().chunks_exact(have * plane) {
        out.extend_from_slice(chunk);
        out.extend(std::iter::repeat_n(0.0, missing));
    }
    tensor(vec![b, c, frames, h, w], out)
}

/// A one-channel `t` repeated to `n` channels; other channel counts unchanged.
fn repeat_channels(t: &Tensor, n: usize) -> Result<Tensor, NodeError> {
    let s = t.shape();
    if s[1] != 1 {
        return Ok(t.clone());
    }
    let per: usize = s[2..].iter().product();
    let mut out = Vec::with_capacity(t.data().len() * n);
    for sample in t.data().chunks_exact(per.max(1)) {
        for _ in 0..n {
            out.extend_from_slice(sample);
        }
    }
    let mut shape = s.to_vec();
    shape[1] = n;
    tensor(shape, out)
}

/// A host tensor, or the error of a shape that does not fit its values.
fn tensor(shape: Vec<usize>, values: Vec<f32>) -> Result<Tensor, NodeError> {
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latent(shape: Vec<usize>, f: impl Fn(usize) -> f32) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(shape, (0..n).map(f).collect()).unwrap()
    }

    #[test]
    fn a_start_image_puts_the_inverted_mask_before_the_normalised_image() {
        let format = LatentFormat::WAN21;
        let image = latent(vec![1, 16, 3, 2, 2], |i| i as f32 * 0.01);
        // WanImageToVideo's mask: 0 on the first latent frame, 1 after.
        let mut mask = vec![1.0; 3 * 4];
        mask[..4].iter_mut().for_each(|m| *m = 0.0);
        let extras = CondExtras {
            concat_latent_image: Some(image.clone()),
            concat_mask: Some(Tensor::new(vec![1, 1, 3, 2, 2], mask).unwrap()),
            ..CondExtras::default()
        };
        let out = build(20, true, &format, &extras, &[2, 16, 3, 2, 2], None).unwrap().unwrap();
        assert_eq!(out.shape(), &[2, 20, 3, 2, 2]);
        let at = |b: usize, c: usize, t: usize| out.data()[((b * 20 + c) * 3 + t) * 4];
        for c in 0..4 {
            assert_eq!(
                (at(1, c, 0), at(1, c, 1), at(1, c, 2)),
                (1.0, 0.0, 0.0),
                "mask channel {c}"
            );
        }
        let expected = format.process_in(&image.data()[..1], &[1, 16, 3, 2, 2])[0];
        assert_eq!(at(0, 4, 0), expected);
        // Image channel 5 (output channel 9), first frame, first pixel: 0.6 in VAE space, normalised by
        // Wan 2.1's mean and std of that channel; the batch repeats the one image.
        assert!((at(1, 9, 0) - (0.6 - 0.9653) / 1.7708).abs() < 1e-6);
    }

    #[test]
    fn a_mask_index_puts_the_mask_between_the_control_and_the_start_latents() {
        // Wan22FunControlToVideo on a Wan 2.1-space model (52 channels in): control 16, mask 4, start 16.
        let format = LatentFormat::WAN21;
        let image = latent(vec![1, 32, 2, 1, 1], |i| if i < 32 { 1.0 } else { 2.0 });
        let extras = CondExtras {
            concat_latent_image: Some(image.clone()),
            concat_mask: Some(Tensor::full(vec![1, 4, 2, 1, 1], 1.0)),
            concat_mask_index: Some(16),
            ..CondExtras::default()
        };
        let out = build(36, false, &format, &extras, &[1, 16, 2, 1, 1], None).unwrap().unwrap();
        assert_eq!(out.shape(), &[1, 36, 2, 1, 1]);
        let processed = process_in_groups(&format, &image).unwrap();
        let channel = |t: &Tensor, c: usize| t.data()[c * 2..][..2].to_vec();
        for c in 0..16 {
            assert_eq!(channel(&out, c), channel(&processed, c), "control channel {c}");
            assert_eq!(channel(&out, 20 + c), channel(&processed, 16 + c), "start channel {c}");
        }
        // The nodes' 1 (nothing given) is the model's 0.
        for c in 16..20 {
            assert_eq!(channel(&out, c), vec![0.0, 0.0], "mask channel {c}");
        }
    }

    #[test]
    fn no_image_gives_zeros_of_the_extra_channels() {
        let out =
            build(20, false, &LatentFormat::WAN21, &CondExtras::default(), &[1, 16, 2, 4, 4], None)
                .unwrap()
                .unwrap();
        assert_eq!(out.shape(), &[1, 20, 2, 4, 4]);
        assert!(out.data().iter().all(|&v| v == 0.0));
    }

    #[test]
    fn a_short_mask_is_padded_with_given_frames_and_a_long_image_refused() {
        let extras = CondExtras {
            concat_latent_image: Some(Tensor::full(vec![1, 16, 2, 4, 4], 0.0)),
            concat_mask: Some(Tensor::full(vec![1, 1, 1, 4, 4], 1.0)),
            ..CondExtras::default()
        };
        let err =
            build(20, true, &LatentFormat::WAN21, &extras, &[1, 16, 3, 4, 4], None).unwrap_err();
        assert!(err.message.contains("20 channels over 3 frames"), "{}", err.message);
        let extras = CondExtras {
            concat_latent_image: Some(Tensor::full(vec![1, 16, 3, 4, 4], 0.0)),
            ..extras
        };
        let out = build(20, true, &LatentFormat::WAN21, &extras, &[1, 16, 3, 4, 4], None)
            .unwrap()
            .unwrap();
        // 1 − 1 on the given frame, zero padding after.
        assert!(out.data()[..4 * 3 * 16].iter().all(|&v| v == 0.0));
    }
}
