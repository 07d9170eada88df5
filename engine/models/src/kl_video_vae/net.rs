//! The HunyuanVideo 1.0 VAE's network: [`KlVideoVae`], its encoder and decoder on images and clips.
//!
//! ComfyUI runs each side's levels a chunk at a time with carried convolutions, and the rest on the whole clip at
//! once: the encoder takes a clip's first frame alone, then 8 frames at a time (the last 4 when 4 remain), down to
//! latent frames that go through its middle and head together; the decoder takes the whole latent through its
//! input and middle, then 2 latent frames at a time through its levels and head. Its GroupNorms normalise over
//! whatever they are given, so those chunks are part of its numbers and are kept here whatever chunk size a caller
//! asks for; memory still grows with one chunk (and the latent), never with the clip.

use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::blocks::{GroupNorm, downsample, head, pointwise_conv, upsample};
use super::config::{Config, LEVELS, RES_BLOCKS, decoder_block, encoder_block};
use crate::error::Result;
use crate::hunyuan_vae::blocks::{conv, middle, residual};
use crate::hunyuan_vae::causal::Time;
use crate::hunyuan_vae::net::{
    WholeClipMiddle, decode_clip, decode_images, encode_clip, encode_images,
};
use crate::wan_vae::{ClipVae, TEMPORAL_DOWNSCALE, chunks};

/// Clip frames the encoder's levels take at a time after a clip's first (ComfyUI's `2 · time_compress`).
pub const ENCODE_FRAMES: usize = 2 * TEMPORAL_DOWNSCALE;
/// Latent frames the decoder's levels take at a time (ComfyUI's `torch.split(h, 2)`), the first chunk included.
pub const DECODE_LATENT_FRAMES: usize = 2;

/// A loaded HunyuanVideo 1.0 VAE: its shape and its weights (under ComfyUI names, from [`super::load_plan`]). Its
/// images and clips go through [`ClipVae`]: 16 latent channels, 8× down in space, 4× in time.
pub struct KlVideoVae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl KlVideoVae {
    /// The autoencoder of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> KlVideoVae {
        KlVideoVae { config, weights }
    }

    /// Pixels per latent position along each side (8).
    pub fn downscale(&self) -> usize {
        self.config.downscale()
    }
}

impl WholeClipMiddle for KlVideoVae {
    fn z_channels(&self) -> usize {
        self.config.z_channels
    }

    fn downscale(&self) -> usize {
        self.config.downscale()
    }

    /// The decoder is always there.
    fn halves(&self) -> (bool, bool) {
        (true, self.config.has_encoder)
    }

    /// ComfyUI's, whatever `per` is: the first frame alone, then [`ENCODE_FRAMES`] at a time.
    fn encode_chunks(&self, total: usize, _per: usize) -> Vec<(usize, usize)> {
        chunks(total, ENCODE_FRAMES)
    }

    /// ComfyUI's, whatever `per` is: [`DECODE_LATENT_FRAMES`] at a time, the first chunk included.
    fn decode_chunks(&self, total: usize, _per: usize) -> Vec<(usize, usize)> {
        (0..total)
            .step_by(DECODE_LATENT_FRAMES)
            .map(|start| (start, DECODE_LATENT_FRAMES.min(total - start)))
            .collect()
    }

    /// The encoder's input convolution and levels on frames `x` `[n, 3, H, W]` (compute dtype) in `time`:
    /// latent frames of the widest level's width.
    fn down<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = conv(b, m, "encoder.conv_in", x, time)?;
        for i in 0..LEVELS {
            for j in 0..RES_BLOCKS {
                x = residual(b, m, &GroupNorm, &encoder_block(i, j), &x, time)?;
            }
            if i + 1 < LEVELS {
                let prefix = format!("encoder.down.{i}.downsample");
                x = downsample(b, m, &prefix, &x, Config::temporal_down(i), time)?;
            }
        }
        Ok(x)
    }

    /// The encoder's middle and head on all the latent frames `x` of images or of one clip, then `quant_conv`:
    /// its first `C_z` channels (the mean) are the latent (f32).
    fn encoder_tail<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>> {
        let m = &self.weights;
        let x = middle(b, m, &GroupNorm, "encoder", x, time)?;
        let h = head(b, m, "encoder", &x, time)?;
        drop(x);
        let moments = pointwise_conv(b, m, "quant_conv", &h)?;
        Ok(b.cast(&b.slice(&moments, 1, 0, self.config.z_channels)?, DType::F32)?)
    }

    /// `post_quant_conv`, the decoder's input and middle on all the latent frames `z` of images or of one clip.
    fn decoder_head<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>> {
        let m = &self.weights;
        let z = pointwise_conv(b, m, "post_quant_conv", z)?;
        let x = conv(b, m, "decoder.conv_in", &z, time)?;
        drop(z);
        middle(b, m, &GroupNorm, "decoder", &x, time)
    }

    /// The decoder's levels and output on frames `x` in `time`: images `[n, 3, H, W]` (f32).
    fn up<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = x.clone();
        for i in (0..LEVELS).rev() {
            for j in 0..=RES_BLOCKS {
                x = residual(b, m, &GroupNorm, &decoder_block(i, j), &x, time)?;
            }
            if i > 0 {
                let prefix = format!("decoder.up.{i}.upsample");
                x = upsample(b, m, &prefix, &x, Config::temporal_up(i), time)?;
            }
        }
        let y = head(b, m, "decoder", &x, time)?;
        Ok(b.cast(&y, DType::F32)?)
    }
}

impl ClipVae for KlVideoVae {
    fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        decode_images(self, b, z)
    }

    fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        encode_images(self, b, x)
    }

    /// Decodes the clip z `[1, C_z, T, h, w]`: `post_quant_conv`, the input and the middle on all T latent frames
    /// together (the middle's GroupNorms and attention span them), then the levels and head 2 latent frames at a
    /// time, as ComfyUI does (its GroupNorms span each chunk), each chunk's frames (5 for the first two latent
    /// frames, 8 for each later two) handed to `out` as they are finished. `per_chunk` must be at least 1 but does
    /// not change the chunks: ComfyUI's are part of its numbers.
    fn decode_video_with<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        decode_clip(self, b, z, per_chunk, out)
    }

    /// Encodes the clip x `[1, 3, L, H, W]`: its levels on the first frame, then 8 frames at a time (the last 4
    /// when 4 remain), as ComfyUI does (its GroupNorms span each chunk), then the middle, head and `quant_conv` on
    /// all the latent frames together, so the whole latent `[⌊(L − 1)/4⌋ + 1, C_z, H/8, W/8]` is handed to `out`
    /// at once. Frames past the last 4k + 1 are dropped and sizes centre-cropped to multiples of 8, as ComfyUI
    /// does. `per_chunk` must be a positive multiple of 4 but does not change the chunks.
    fn encode_video_with<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        encode_clip(self, b, x, per_chunk, out)
    }
}
