//! What every autoencoder family does at its edges, as ComfyUI's `VAE` wrapper does: checking a latent
//! before decoding, and checking an image and centre-cropping it to the downscale before encoding.

use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};

/// `z` cast to the compute dtype, after checking it is `[B, channels, h, w]` for a VAE that has a decoder.
pub(crate) fn latent_in<B: Backend>(
    b: &B,
    z: &Tensor<B>,
    has_decoder: bool,
    channels: usize,
) -> Result<Tensor<B>> {
    if !has_decoder {
        return Err(Error::Invalid("this VAE file has no decoder".into()));
    }
    let &[_, c, _, _] = z.shape() else {
        return Err(Error::Invalid(format!("a latent must be [B, C, h, w], got {:?}", z.shape())));
    };
    if c != channels {
        return Err(Error::Invalid(format!(
            "a latent of {c} channels for a VAE of {channels} ({:?})",
            z.shape()
        )));
    }
    Ok(b.cast(z, b.compute_dtype())?)
}

/// `x` `[B, channels, H, W]` cast to the compute dtype and cropped to the largest multiples of `ratio`,
/// centred (offset `(H mod ratio) / 2`), as ComfyUI's `VAE.encode` does, after checking the VAE has an encoder
/// and the image is at least `ratio` on each side.
pub(crate) fn image_in<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    has_encoder: bool,
    channels: usize,
    ratio: usize,
) -> Result<Tensor<B>> {
    if !has_encoder {
        return Err(Error::Invalid("this VAE file has no encoder".into()));
    }
    let &[_, c, hh, ww] = x.shape() else {
        return Err(Error::Invalid(format!("an image must be [B, C, H, W], got {:?}", x.shape())));
    };
    if c != channels || hh < ratio || ww < ratio {
        return Err(Error::Invalid(format!(
            "an image {:?} for a VAE of {channels} channels that needs at least {ratio}×{ratio} pixels",
            x.shape()
        )));
    }
    crop_center(b, &b.cast(x, b.compute_dtype())?, hh / ratio * ratio, ww / ratio * ratio)
}

/// Crops `x` `[B, C, H, W]` to the centre `h × w` (ComfyUI's `vae_encode_crop_pixels`: offset (H − h) / 2).
pub(crate) fn crop_center<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    h: usize,
    w: usize,
) -> Result<Tensor<B>> {
    let (hh, ww) = (x.dim(2)?, x.dim(3)?);
    let x = if hh != h { b.slice(x, 2, (hh - h) / 2, h)? } else { x.clone() };
    Ok(if ww != w { b.slice(&x, 3, (ww - w) / 2, w)? } else { x })
}
