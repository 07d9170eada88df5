//! The Wan 2.1 VAE (`wan_2.1_vae.safetensors`, and Qwen-Image's `qwen_image_vae.safetensors`, a fine-tune of
//! it): a causal 3-D autoencoder, 16 latent channels, 8× down in space and 4× in time, here on images, which
//! are single frames.
//!
//! - [`detect`] recognises the file in ComfyUI's (the original Wan) layout or diffusers' and derives its
//!   [`Config`]; [`load_plan`] names every weight by its ComfyUI name.
//! - [`WanVae::decode`] and [`WanVae::encode`] work in VAE space on `[B, C, H, W]` images and `[B, 16, h, w]`
//!   latents, each image its own one-frame video: the latent format's per-channel mean and standard deviation
//!   belong to the sampler. A single frame sees only the last temporal tap of each causal convolution (the
//!   frames before it are zero padding) and skips the temporal resamples, as in ComfyUI and diffusers.
//!
//! Conventions as ComfyUI: RMS norm over channels (`x / ‖x‖ · √C · γ`), SiLU, one attention head in the middle
//! block of each side, downsample = zero-pad right and bottom by one then a stride-2 3×3 convolution, upsample
//! = nearest 2× then a 3×3 convolution that halves the width, no tanh on the output, the encoder's **mean**
//! (the first 16 of its 32 channels) as the latent.

mod blocks;
mod config;
pub mod family;

pub use config::{Config, DIM_MULT, Layout, RES_BLOCKS, TEMPORAL_DOWNSAMPLE, detect, load_plan};

use kiln_compute::backend::Conv2dParams;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::Result;
pub(crate) use config::expected;
use config::{decoder_index, encoder_index};

/// A loaded Wan 2.1 VAE: its shape and its weights (under ComfyUI names, from [`load_plan`]).
pub struct WanVae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl WanVae {
    /// The autoencoder of `config` with `weights` loaded from [`load_plan`].
    pub fn new(config: Config, weights: Model) -> WanVae {
        WanVae { config, weights }
    }

    /// Decodes latents z `[B, 16, h, w]` in VAE space into images `[B, out_channels, 8h, 8w]`, f32, about
    /// [−1, 1] but not clamped.
    pub fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut x = crate::vae_io::latent_in(b, z, cfg.has_decoder, cfg.z_channels)?;
        let m = &self.weights;
        x = blocks::conv(b, m, "conv2", &x, Conv2dParams::same(0))?;
        x = blocks::conv(b, m, "decoder.conv1", &x, Conv2dParams::same(1))?;
        x = self.middle(b, "decoder", &x)?;
        let levels = DIM_MULT.len();
        for i in 0..levels {
            for j in 0..=RES_BLOCKS {
                x = blocks::residual(
                    b,
                    m,
                    &format!("decoder.upsamples.{}", decoder_index(i, j)),
                    &x,
                )?;
            }
            if i + 1 < levels {
                let prefix = format!("decoder.upsamples.{}", decoder_index(i, RES_BLOCKS + 1));
                x = blocks::upsample(b, m, &prefix, &x)?;
            }
        }
        x = blocks::head(b, m, "decoder", &x)?;
        Ok(b.cast(&x, DType::F32)?)
    }

    /// Encodes images x `[B, in_channels, H, W]` with values in [−1, 1] into the latent mean
    /// `[B, 16, H/8, W/8]`, f32, in VAE space.
    ///
    /// H and W that are not multiples of 8 are cropped to the largest multiples, centred (offset
    /// `(H mod 8) / 2`), as ComfyUI's `VAE.encode` does; an image smaller than 8×8 is an [`crate::Error::Invalid`].
    pub fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut x =
            crate::vae_io::image_in(b, x, cfg.has_encoder, cfg.in_channels, cfg.downscale())?;
        let m = &self.weights;
        x = blocks::conv(b, m, "encoder.conv1", &x, Conv2dParams::same(1))?;
        let levels = DIM_MULT.len();
        for i in 0..levels {
            for j in 0..RES_BLOCKS {
                x = blocks::residual(
                    b,
                    m,
                    &format!("encoder.downsamples.{}", encoder_index(i, j)),
                    &x,
                )?;
            }
            if i + 1 < levels {
                let prefix = format!("encoder.downsamples.{}", encoder_index(i, RES_BLOCKS));
                x = blocks::downsample(b, m, &prefix, &x)?;
            }
        }
        x = self.middle(b, "encoder", &x)?;
        x = blocks::head(b, m, "encoder", &x)?;
        x = blocks::conv(b, m, "conv1", &x, Conv2dParams::same(0))?;
        let mean = b.slice(&x, 1, 0, cfg.z_channels)?;
        Ok(b.cast(&mean, DType::F32)?)
    }

    /// The middle of `side`: residual block, attention, residual block.
    fn middle<B: Backend>(&self, b: &B, side: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let x = blocks::residual(b, m, &format!("{side}.middle.0"), x)?;
        let x = blocks::attention(b, m, &format!("{side}.middle.1"), &x)?;
        blocks::residual(b, m, &format!("{side}.middle.2"), &x)
    }
}
