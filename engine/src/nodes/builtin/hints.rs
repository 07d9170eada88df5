//! The control images of ControlNets and model patches as the model takes them ("hints"): resized to the
//! latents' size in pixels, VAE-encoded into the model's latent space, with mask channels, and broadcast to a
//! model call's batch. Shared by `controlnet.rs`, `model_patch.rs` and the sampler.

use super::mask::tensor;
use super::resize::resize;
use super::vae::encode;
use crate::compute::Compute;
use crate::models::{DiffusionModel, Vae};
use crate::nodes::{Context, ErrorKind, NodeError};
use crate::tensor::Tensor;

/// How a control image becomes the VAE's pixels: the resize method, and a map of each value after it (a
/// ControlNet's `preprocess_image`), if any.
pub(super) struct HintPixels<'a> {
    /// ComfyUI's upscale method name (`nearest-exact`, `area`).
    pub(super) method: &'a str,
    /// The per-value map.
    pub(super) preprocess: Option<&'a dyn Fn(f32) -> f32>,
}

/// `image` resized by `pixels.method` (centre crop) to the size in pixels of latents of `latent_shape` (`[B, C, h, w]`
/// or one frame), each pixel value through `pixels.preprocess` if given, VAE-encoded and in `model`'s latent space:
/// `[B, C, h, w]`.
pub(super) fn encoded_hint(
    compute: &Compute,
    model: &DiffusionModel,
    vae: &Vae,
    image: &Tensor,
    latent_shape: &[usize],
    pixels: HintPixels<'_>,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    let HintPixels { method, preprocess } = pixels;
    let (h, w) = match *latent_shape {
        [_, _, h, w] | [_, _, 1, h, w] => (h, w),
        ref other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("a control image steers image latents [B, C, h, w], got {other:?}"),
            ));
        }
    };
    let scale = vae.net.family().latent().spatial_downscale;
    let pixels = resize(image, w * scale, h * scale, method, true)?;
    let pixels = match preprocess {
        Some(f) => tensor(pixels.shape().to_vec(), pixels.data().iter().map(|&a| f(a)).collect())?,
        None => pixels,
    };
    let encoded = encode(compute, vae, &pixels, ctx)?;
    let values = model.latent.process_in(encoded.data(), encoded.shape());
    tensor(encoded.shape().to_vec(), values)
}

/// `encoded` `[B, C, h, w]` with `copies` channels of `mask` `[Bm, h, w, 1]` after each sample's (the masks
/// cycled over the batch, as ComfyUI's `repeat_to_batch_size`).
pub(super) fn with_mask_channels(
    encoded: &Tensor,
    mask: &Tensor,
    copies: usize,
) -> Result<Tensor, NodeError> {
    let &[batch, channels, h, w] = encoded.shape() else {
        return Err(NodeError::new(format!("an encoded hint {:?}", encoded.shape())));
    };
    let plane = h * w;
    let masks = mask.shape()[0];
    if masks == 0 || mask.data().len() != masks * plane {
        return Err(NodeError::new(format!(
            "a mask {:?} for a hint {:?}",
            mask.shape(),
            encoded.shape()
        )));
    }
    let mut out = Vec::with_capacity(batch * (channels + copies) * plane);
    for (i, sample) in encoded.data().chunks_exact(channels * plane).enumerate() {
        out.extend_from_slice(sample);
        for _ in 0..copies {
            out.extend_from_slice(&mask.data()[(i % masks) * plane..][..plane]);
        }
    }
    tensor(vec![batch, channels + copies, h, w], out)
}

/// A hint of `hb` samples for a model call of `batch` samples split into `parts` (positive and negative run
/// together): ComfyUI's `broadcast_image_to`, each part getting the first samples (cycled); one sample serves
/// every sample as it is.
pub(super) fn broadcast_hint(
    hint: &Tensor,
    batch: usize,
    parts: usize,
) -> Result<Tensor, NodeError> {
    let hb = hint.shape().first().copied().unwrap_or(0);
    if hb == 1 || hb == batch {
        return Ok(hint.clone());
    }
    if hb == 0 || parts == 0 || !batch.is_multiple_of(parts) {
        return Err(NodeError::new(format!(
            "a control image batch of {hb} for a model call of {batch} samples in {parts} parts"
        )));
    }
    let per_part = batch / parts;
    let sample = hint.data().len() / hb.max(1);
    let mut data = Vec::with_capacity(batch * sample);
    for _ in 0..parts {
        for i in 0..per_part {
            data.extend_from_slice(&hint.data()[(i % hb) * sample..][..sample]);
        }
    }
    let mut shape = hint.shape().to_vec();
    shape[0] = per_part * parts;
    tensor(shape, data)
}

#[cfg(test)]
mod tests {
    use super::{broadcast_hint, with_mask_channels};
    use crate::tensor::Tensor;

    #[test]
    fn a_hint_is_broadcast_per_part_as_comfyui_does() {
        // Two hint samples for a call of 3 samples per part, positive and negative: 0 1 0 | 0 1 0.
        let hint = Tensor::new(vec![2, 1, 1, 1], vec![0.0, 1.0]).unwrap();
        let out = broadcast_hint(&hint, 6, 2).unwrap();
        assert_eq!(
            (out.shape(), out.data()),
            (&[6, 1, 1, 1][..], &[0.0, 1.0, 0.0, 0.0, 1.0, 0.0][..])
        );
        // One sample serves every sample as it is; as many as the batch are taken as they are.
        assert_eq!(broadcast_hint(&hint, 2, 2).unwrap().shape(), [2, 1, 1, 1]);
        let one = Tensor::new(vec![1, 1, 1, 1], vec![5.0]).unwrap();
        assert_eq!(broadcast_hint(&one, 4, 2).unwrap().shape(), [1, 1, 1, 1]);
        assert!(broadcast_hint(&hint, 3, 2).is_err(), "a batch that does not split into its parts");
    }

    #[test]
    fn mask_channels_follow_each_sample_cycling_the_masks() {
        let encoded = Tensor::new(vec![2, 1, 1, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let mask = Tensor::new(vec![1, 1, 2, 1], vec![0.5, 0.25]).unwrap();
        let out = with_mask_channels(&encoded, &mask, 2).unwrap();
        assert_eq!(out.shape(), [2, 3, 1, 2]);
        assert_eq!(out.data(), &[1.0, 2.0, 0.5, 0.25, 0.5, 0.25, 3.0, 4.0, 0.5, 0.25, 0.5, 0.25]);
        let wrong = Tensor::new(vec![1, 1, 3, 1], vec![0.0; 3]).unwrap();
        assert!(with_mask_channels(&encoded, &wrong, 1).is_err());
    }
}
