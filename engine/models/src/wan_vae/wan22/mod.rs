//! The Wan 2.2 VAE (`wan2.2_vae.safetensors`, Wan 2.2 TI2V 5B's): the Wan 2.1 VAE's causal blocks around a 2×2
//! patchify, 48 latent channels, 16× down in space and 4× in time; the encoder's levels are residual down
//! blocks with `AvgDown3D` shortcuts, the decoder's residual up blocks with `DupUp3D` shortcuts, and its
//! upsamples keep their width.
//!
//! - [`detect`] recognises the file in ComfyUI's layout or diffusers' (`AutoencoderKLWan`, `is_residual`) and
//!   derives its [`Config`] from the shapes; [`load_plan`] names every weight by its ComfyUI name.
//! - [`Wan22Vae`] decodes and encodes images (one-frame clips) and clips, in VAE space, through
//!   [`super::ClipVae`] as [`super::WanVae`] does.

mod config;
mod reshape;

pub use config::{Config, IMAGE_CHANNELS, PATCH, Z_CHANNELS, detect, load_plan};

pub(crate) use config::{expected, is_wan22};

use kiln_compute::backend::{BinaryOp, Conv2dParams};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::blocks::{conv, downsample, head, middle, residual, upsample};
use super::causal::{FRAMES_TOGETHER_BYTES, Time, frames, one_frame_at_a_time};
use super::config::{DIM_MULT, RES_BLOCKS};
use super::video::Chunked;
use crate::error::Result;
use config::{decoder_entry, encoder_entry};
use reshape::{avg_down, dup_up, patchify, unpatchify};

/// A loaded Wan 2.2 VAE: its shape and its weights (under ComfyUI names, from [`load_plan`]). Its images and
/// clips go through [`super::ClipVae`]: 48 latent channels, 16× down in space, 3 image channels.
pub struct Wan22Vae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
    /// Up to how many bytes a decoded chunk's frames stay together after a temporal upsample
    /// ([`FRAMES_TOGETHER_BYTES`] unless set; any value gives the same frames, bit for bit on the CPU).
    pub frames_together_bytes: usize,
}

impl Wan22Vae {
    /// The autoencoder of `config` with `weights` loaded from [`load_plan`].
    pub fn new(config: Config, weights: Model) -> Wan22Vae {
        Wan22Vae { config, weights, frames_together_bytes: FRAMES_TOGETHER_BYTES }
    }

    /// The decoder from up block `level` on, then the head and the unpatchify. After a temporal up block, a
    /// large clip's frames go on one at a time ([`one_frame_at_a_time`]).
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
            let resample = decoder_entry(i, RES_BLOCKS + 1);
            let temporal = Config::temporal_up(i);
            // ComfyUI's `first_chunk`: the clip's first frame has not reached this block's time convolution.
            let first = match time {
                Time::Stream(stream) => stream.fresh(&format!("{resample}.time_conv")),
                Time::Alone => true,
            };
            let input = x.clone();
            for j in 0..=RES_BLOCKS {
                x = residual(b, m, &decoder_entry(i, j), &x, time)?;
            }
            if i + 1 < levels {
                x = upsample(b, m, &resample, &x, temporal, time)?;
                let out_width = self.config.decoder_widths(i).1;
                let ft = if temporal { 2 } else { 1 };
                let shortcut = dup_up(b, &input, out_width, (ft, 2), first, time)?;
                x = b.binary(&x, &shortcut, BinaryOp::Add)?;
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
        out(b.cast(&unpatchify(b, &x)?, DType::F32)?)
    }
}

impl Chunked for Wan22Vae {
    fn z_channels(&self) -> usize {
        self.config.z_channels
    }

    fn image_channels(&self) -> usize {
        IMAGE_CHANNELS
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
        let x = patchify(b, x)?;
        let mut x = conv(b, m, "encoder.conv1", &x, Conv2dParams::same(1), time)?;
        let levels = DIM_MULT.len();
        for i in 0..levels {
            let input = x.clone();
            for j in 0..RES_BLOCKS {
                x = residual(b, m, &encoder_entry(i, j), &x, time)?;
            }
            let down = i + 1 < levels;
            let temporal = Config::temporal_down(i);
            if down {
                x = downsample(b, m, &encoder_entry(i, RES_BLOCKS), &x, temporal, time)?;
            }
            let factors = (if temporal { 2 } else { 1 }, if down { 2 } else { 1 });
            let shortcut = avg_down(b, &input, self.config.encoder_widths(i).1, factors, time)?;
            x = b.binary(&x, &shortcut, BinaryOp::Add)?;
        }
        x = middle(b, m, "encoder", &x, time)?;
        x = head(b, m, "encoder", &x, time)?;
        x = conv(b, m, "conv1", &x, Conv2dParams::same(0), time)?;
        let mean = b.slice(&x, 1, 0, self.config.z_channels)?;
        Ok(b.cast(&mean, DType::F32)?)
    }
}
