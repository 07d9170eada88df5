//! The Wan 2.1 VAE's network: [`WanVae`], its encoder and decoder on images and clips.

use kiln_compute::backend::Conv2dParams;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::blocks::{conv, downsample, head, middle, residual, upsample};
use super::causal::{FRAMES_TOGETHER_BYTES, Time, frames, one_frame_at_a_time};
use super::config::{
    Config, DIM_MULT, RES_BLOCKS, TEMPORAL_DOWNSAMPLE, decoder_index, encoder_index,
};
use super::video::Chunked;
use crate::error::Result;

/// A loaded Wan 2.1 VAE: its shape and its weights (under ComfyUI names, from [`super::load_plan`]). Its images
/// and clips go through [`super::ClipVae`]: 16 latent channels, 8× down in space.
pub struct WanVae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
    /// Up to how many bytes a decoded chunk's frames stay together after a temporal upsample
    /// ([`FRAMES_TOGETHER_BYTES`] unless set; any value gives the same frames, bit for bit on the CPU).
    pub frames_together_bytes: usize,
}

impl WanVae {
    /// The autoencoder of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> WanVae {
        WanVae { config, weights, frames_together_bytes: FRAMES_TOGETHER_BYTES }
    }

    /// The decoder from level `level` on: its residual blocks and resamples, then the head. After a temporal
    /// upsample, a large clip's frames go on one at a time ([`one_frame_at_a_time`]).
    fn up_from<B: Backend>(
        &self,
        b: &B,
        level: usize,
        mut x: Tensor<B>,
        time: &mut Time<'_, B>,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        let m = &self.weights;
        let levels = DIM_MULT.len();
        for i in level..levels {
            for j in 0..=RES_BLOCKS {
                let prefix = format!("decoder.upsamples.{}", decoder_index(i, j));
                x = residual(b, m, &prefix, &x, time)?;
            }
            if i + 1 < levels {
                let temporal = TEMPORAL_DOWNSAMPLE[levels - 2 - i];
                let prefix = format!("decoder.upsamples.{}", decoder_index(i, RES_BLOCKS + 1));
                x = upsample(b, m, &prefix, &x, temporal, time)?;
                if temporal
                    && one_frame_at_a_time(&x, time, levels - 2 - i, self.frames_together_bytes)
                {
                    for f in 0..x.dim(0)? {
                        self.up_from(b, i + 1, frames(b, &x, f, 1)?, time, out)?;
                    }
                    return Ok(());
                }
            }
        }
        let x = head(b, m, "decoder", &x, time)?;
        out(b.cast(&x, DType::F32)?)
    }
}

impl Chunked for WanVae {
    fn z_channels(&self) -> usize {
        self.config.z_channels
    }

    fn image_channels(&self) -> usize {
        self.config.in_channels
    }

    fn downscale(&self) -> usize {
        self.config.downscale()
    }

    fn halves(&self) -> (bool, bool) {
        (self.config.has_decoder, self.config.has_encoder)
    }

    fn decode_chunk<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        time: &mut Time<'_, B>,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        let m = &self.weights;
        let x = conv(b, m, "conv2", z, Conv2dParams::same(0), time)?;
        let x = conv(b, m, "decoder.conv1", &x, Conv2dParams::same(1), time)?;
        let x = middle(b, m, "decoder", &x, time)?;
        self.up_from(b, 0, x, time, out)
    }

    fn encode_chunk<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = conv(b, m, "encoder.conv1", x, Conv2dParams::same(1), time)?;
        let levels = DIM_MULT.len();
        for i in 0..levels {
            for j in 0..RES_BLOCKS {
                let prefix = format!("encoder.downsamples.{}", encoder_index(i, j));
                x = residual(b, m, &prefix, &x, time)?;
            }
            // Every level but the last ends with a downsample, temporal where the architecture says.
            if let Some(&temporal) = TEMPORAL_DOWNSAMPLE.get(i) {
                let prefix = format!("encoder.downsamples.{}", encoder_index(i, RES_BLOCKS));
                x = downsample(b, m, &prefix, &x, temporal, time)?;
            }
        }
        x = middle(b, m, "encoder", &x, time)?;
        x = head(b, m, "encoder", &x, time)?;
        x = conv(b, m, "conv1", &x, Conv2dParams::same(0), time)?;
        let mean = b.slice(&x, 1, 0, self.config.z_channels)?;
        Ok(b.cast(&mean, DType::F32)?)
    }
}
