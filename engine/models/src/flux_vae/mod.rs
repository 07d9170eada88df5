//! The Flux VAE (ComfyUI's `ae.safetensors`): a 16-channel KL autoencoder, 8× downscale, decoder and encoder.
//! The same code runs any classic KL autoencoder of that family (SD's, with their 1×1 quant convs), every
//! width derived from the file, and the FLUX.2 VAE (`flux2-vae.safetensors`): z 32 with both quant convs, its
//! latent 2×2-patchified to 128 channels at 16× and normalised by the BatchNorm statistics the file carries
//! ([`Config::latent_bn`]), as ComfyUI's `AutoencodingEngineLegacy` does inside the VAE.
//!
//! - [`detect`] recognises the file in ComfyUI's (LDM) layout or diffusers' and derives its [`Config`];
//!   [`load_plan`] names every weight by its LDM name (diffusers' names mapped there, never copied).
//! - [`FluxVae::decode`] and [`FluxVae::encode`] work in VAE space: the latent format's scale and shift
//!   (Flux: 0.3611, 0.1159) belong to the sampler, never to the VAE. FLUX.2's patchify and BatchNorm are the
//!   VAE's (its latent format is the identity).
//!
//! Invariant: weights are read only through `Model::fetch`, one block (ResnetBlock, attention, conv) at a
//! time, each `Layer` dropped before the next fetch; activations are dropped as soon as the next one exists,
//! so a 1024² decode holds a few of its largest activations at once, never all of them.
//!
//! Conventions as ComfyUI: GroupNorm 32 groups ε 1e-6 with affine, SiLU, nearest-2× upsample then a 3×3 conv,
//! downsample = zero-pad right and bottom by one then a stride-2 3×3 conv, one attention block per side (in
//! the mid block, one head over the H·W positions), no tanh on the output, the encoder's **mean** as the
//! latent.

pub(crate) mod blocks;
mod config;
pub mod family;

pub use config::{Config, Layout, detect, load_plan};

use kiln_compute::backend::{BinaryOp, Conv2dParams};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::named::fetch;
use config::{BN_MEAN, BN_VAR, PATCH};

/// ε of the FLUX.2 latent's BatchNorm (ComfyUI's `bn_eps`).
const BN_EPS: f32 = 1e-4;

/// A loaded KL autoencoder: its shape and its weights (under LDM names, from [`load_plan`]).
pub struct FluxVae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl FluxVae {
    /// The autoencoder of `config` with `weights` loaded from [`load_plan`].
    pub fn new(config: Config, weights: Model) -> FluxVae {
        FluxVae { config, weights }
    }

    /// Decodes latents z `[B, latent_channels, h, w]` in VAE space (no scale or shift applied here) into
    /// images `[B, out_channels, 8h, 8w]` (16h, 16w for FLUX.2), f32, about [−1, 1] but not clamped.
    pub fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut x = crate::vae_io::latent_in(b, z, cfg.has_decoder, cfg.latent_channels())?;
        let (m, g) = (&self.weights, cfg.groups);
        if cfg.latent_bn {
            x = self.unnormalize(b, &x)?;
        }
        if cfg.post_quant_conv {
            x = crate::named::conv2d(b, m, "post_quant_conv", &x, Conv2dParams::same(0))?;
        }
        x = blocks::conv3(b, m, "decoder.conv_in", &x)?;
        x = self.mid(b, "decoder", &x)?;
        for i in (0..cfg.levels()).rev() {
            for j in 0..=cfg.num_res_blocks {
                x = blocks::resnet(b, m, &format!("decoder.up.{i}.block.{j}"), g, &x)?;
            }
            if i > 0 {
                x = blocks::upsample(b, m, &format!("decoder.up.{i}.upsample.conv"), &x)?;
            }
        }
        x = blocks::head(b, m, "decoder", g, &x)?;
        Ok(b.cast(&x, DType::F32)?)
    }

    /// Encodes images x `[B, in_channels, H, W]` with values in [−1, 1] into the latent mean
    /// `[B, z_channels, H/8, W/8]` (for the 4-level Flux VAE; FLUX.2's patchified and normalised
    /// `[B, 128, H/16, W/16]`), f32, in VAE space.
    ///
    /// H and W that are not multiples of the downscale d (8; 16 for FLUX.2) are cropped to the largest
    /// multiples, centred (offset `(H mod d) / 2`), as ComfyUI's `VAE.encode` does; an image smaller than d×d
    /// is an [`crate::Error::Invalid`].
    pub fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut x =
            crate::vae_io::image_in(b, x, cfg.has_encoder, cfg.in_channels, cfg.downscale())?;
        let (m, g) = (&self.weights, cfg.groups);
        x = blocks::conv3(b, m, "encoder.conv_in", &x)?;
        for i in 0..cfg.levels() {
            for j in 0..cfg.num_res_blocks {
                x = blocks::resnet(b, m, &format!("encoder.down.{i}.block.{j}"), g, &x)?;
            }
            if i + 1 < cfg.levels() {
                x = blocks::downsample(b, m, &format!("encoder.down.{i}.downsample.conv"), &x)?;
            }
        }
        x = self.mid(b, "encoder", &x)?;
        x = blocks::head(b, m, "encoder", g, &x)?;
        if cfg.quant_conv {
            x = crate::named::conv2d(b, m, "quant_conv", &x, Conv2dParams::same(0))?;
        }
        let mean = b.cast(&b.slice(&x, 1, 0, cfg.z_channels)?, DType::F32)?;
        if cfg.latent_bn { self.normalize(b, &mean) } else { Ok(mean) }
    }

    /// FLUX.2's encoder side of the latent: z `[B, C, 2h, 2w]` (f32) patchified to `[B, 4C, h, w]` (channel
    /// `c·4 + py·2 + px` at (r, s) = z[c, 2r + py, 2s + px]), then `(z − mean) / √(var + ε)` per channel.
    fn normalize<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        let &[n, c, hh, ww] = z.shape() else {
            return Err(Error::Invalid(format!("a latent {:?} is not [B, C, H, W]", z.shape())));
        };
        if hh % PATCH != 0 || ww % PATCH != 0 {
            return Err(Error::Invalid(format!("a latent {:?} of odd height or width", z.shape())));
        }
        let (h, w) = (hh / PATCH, ww / PATCH);
        let split = z.reshape(&[n, c, h, PATCH, w, PATCH])?;
        let patches =
            b.permute(&split, &[0, 1, 3, 5, 2, 4])?.reshape(&[n, c * PATCH * PATCH, h, w])?;
        let (mean, std) = self.statistics(b)?;
        let centred = b.binary(&patches, &mean, BinaryOp::Sub)?;
        Ok(b.binary(&centred, &std, BinaryOp::Div)?)
    }

    /// The inverse of [`FluxVae::normalize`]: z `[B, 4C, h, w]` → `z·√(var + ε) + mean`, unpatchified to
    /// `[B, C, 2h, 2w]`, in the compute dtype (the arithmetic in f32).
    fn unnormalize<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        let &[n, cp, h, w] = z.shape() else {
            return Err(Error::Invalid(format!("a latent {:?} is not [B, C, h, w]", z.shape())));
        };
        let c = cp / (PATCH * PATCH);
        let (mean, std) = self.statistics(b)?;
        let scaled = b.binary(&b.cast(z, DType::F32)?, &std, BinaryOp::Mul)?;
        let z = b.binary(&scaled, &mean, BinaryOp::Add)?;
        let split = z.reshape(&[n, c, PATCH, PATCH, h, w])?;
        let x = b.permute(&split, &[0, 1, 4, 2, 5, 3])?.reshape(&[n, c, h * PATCH, w * PATCH])?;
        Ok(b.cast(&x, b.compute_dtype())?)
    }

    /// The latent BatchNorm's mean and `√(var + ε)` as f32 `[1, 4·z, 1, 1]` (computed on the host: 128
    /// values).
    fn statistics<B: Backend>(&self, b: &B) -> Result<(Tensor<B>, Tensor<B>)> {
        let c = self.config.latent_channels();
        let (mean, var) = {
            let layer = fetch(b, &self.weights, &[BN_MEAN.to_string(), BN_VAR.to_string()])?;
            let read = |i: usize| -> Result<Vec<f32>> {
                Ok(b.to_f32(&b.weight_to_tensor(&layer.weight(i), DType::F32)?)?)
            };
            (read(0)?, read(1)?)
        };
        if mean.len() != c || var.len() != c {
            return Err(Error::Invalid(format!(
                "the latent BatchNorm has {} means and {} variances for {c} channels",
                mean.len(),
                var.len()
            )));
        }
        let std: Vec<f32> = var.iter().map(|v| (v + BN_EPS).sqrt()).collect();
        Ok((
            b.from_f32(&[1, c, 1, 1], &mean, DType::F32)?,
            b.from_f32(&[1, c, 1, 1], &std, DType::F32)?,
        ))
    }

    /// The mid block of `side`: resnet, attention, resnet.
    fn mid<B: Backend>(&self, b: &B, side: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let (m, g) = (&self.weights, self.config.groups);
        let x = blocks::resnet(b, m, &format!("{side}.mid.block_1"), g, x)?;
        let x = blocks::attention(b, m, &format!("{side}.mid.attn_1"), g, &x)?;
        blocks::resnet(b, m, &format!("{side}.mid.block_2"), g, &x)
    }
}
