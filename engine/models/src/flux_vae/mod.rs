//! The Flux VAE (ComfyUI's `ae.safetensors`): a 16-channel KL autoencoder, 8× downscale, decoder and encoder.
//! The same code runs any classic KL autoencoder of that family (SD's, with their 1×1 quant convs), every
//! width derived from the file.
//!
//! - [`detect`] recognises the file in ComfyUI's (LDM) layout or diffusers' and derives its [`Config`];
//!   [`load_plan`] names every weight by its LDM name (diffusers' names mapped there, never copied).
//! - [`FluxVae::decode`] and [`FluxVae::encode`] work in VAE space: the latent format's scale and shift
//!   (Flux: 0.3611, 0.1159) belong to the sampler, never to the VAE.
//!
//! Invariant: weights are read only through `Model::fetch`, one block (ResnetBlock, attention, conv) at a
//! time, each `Layer` dropped before the next fetch; activations are dropped as soon as the next one exists,
//! so a 1024² decode holds a few of its largest activations at once, never all of them.
//!
//! Conventions as ComfyUI: GroupNorm 32 groups ε 1e-6 with affine, SiLU, nearest-2× upsample then a 3×3 conv,
//! downsample = zero-pad right and bottom by one then a stride-2 3×3 conv, one attention block per side (in
//! the mid block, one head over the H·W positions), no tanh on the output, the encoder's **mean** as the
//! latent.

mod blocks;
mod config;
pub mod family;

pub use config::{Config, Layout, detect, load_plan};

use kiln_compute::backend::Conv2dParams;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::Result;

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

    /// Decodes latents z `[B, z_channels, h, w]` in VAE space (no scale or shift applied here) into images
    /// `[B, out_channels, 8h, 8w]` (for the 4-level Flux VAE), f32, about [−1, 1] but not clamped.
    pub fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut x = crate::vae_io::latent_in(b, z, cfg.has_decoder, cfg.z_channels)?;
        let (m, g) = (&self.weights, cfg.groups);
        if cfg.post_quant_conv {
            x = blocks::conv(b, m, "post_quant_conv", &x, Conv2dParams::same(0))?;
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
    /// `[B, z_channels, H/8, W/8]` (for the 4-level Flux VAE), f32, in VAE space.
    ///
    /// H and W that are not multiples of 8 are cropped to the largest multiples, centred (offset
    /// `(H mod 8) / 2`), as ComfyUI's `VAE.encode` does; an image smaller than 8×8 is an [`crate::Error::Invalid`].
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
            x = blocks::conv(b, m, "quant_conv", &x, Conv2dParams::same(0))?;
        }
        let mean = b.slice(&x, 1, 0, cfg.z_channels)?;
        Ok(b.cast(&mean, DType::F32)?)
    }

    /// The mid block of `side`: resnet, attention, resnet.
    fn mid<B: Backend>(&self, b: &B, side: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let (m, g) = (&self.weights, self.config.groups);
        let x = blocks::resnet(b, m, &format!("{side}.mid.block_1"), g, x)?;
        let x = blocks::attention(b, m, &format!("{side}.mid.attn_1"), g, &x)?;
        blocks::resnet(b, m, &format!("{side}.mid.block_2"), g, &x)
    }
}
