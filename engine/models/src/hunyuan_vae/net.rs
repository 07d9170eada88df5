//! The HunyuanVideo 1.5 VAE's network: [`HunyuanVae`], its encoder and decoder on images and clips.
//!
//! ComfyUI runs the levels of each side a chunk at a time with carried convolutions, but the middle (and the
//! encoder's head) on the whole clip at once: the middle's attention spans every frame. So a clip encodes in
//! chunks down to its latent frames, which then go through the middle and the head together; and a latent clip
//! goes through the decoder's input and middle together, then through the levels a chunk at a time.

use kiln_compute::backend::BinaryOp;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::blocks::{conv, downsample, middle, norm_silu, residual, upsample};
use super::causal::{Stream, Time, concat_frames, frames};
use super::clip::{chunks, clip_frames};
use super::config::{
    Config, IMAGE_CHANNELS, LEVELS, RES_BLOCKS, RESAMPLES, decoder_block, encoder_block,
};
use super::reshape::{group_mean, ratio, repeat_channels};
use crate::error::{Error, Result};
use crate::wan_vae::{ClipVae, TEMPORAL_DOWNSCALE, decoded_frames, latent_frames};

/// A loaded HunyuanVideo 1.5 VAE: its shape and its weights (under ComfyUI names, from
/// [`super::load_plan`]). Its images and clips go through [`ClipVae`]: 32 latent channels, 16× down in space,
/// 4× in time.
pub struct HunyuanVae {
    /// The shape.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

impl HunyuanVae {
    /// The autoencoder of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> HunyuanVae {
        HunyuanVae { config, weights }
    }

    /// The encoder's input convolution and levels on frames `x` `[n, 3, H, W]` (compute dtype) in `time`:
    /// latent frames of the widest level's width.
    fn down<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = conv(b, m, "encoder.conv_in", x, time)?;
        for i in 0..LEVELS {
            for j in 0..RES_BLOCKS {
                x = residual(b, m, &encoder_block(i, j), &x, time)?;
            }
            if i < RESAMPLES {
                let prefix = format!("encoder.down.{i}.downsample");
                x = downsample(b, m, &prefix, &x, Config::temporal_down(i), time)?;
            }
        }
        Ok(x)
    }

    /// The encoder's middle and head on all the latent frames `x` of images or of one clip: `conv_out` of the
    /// normed input plus its channel-group means, whose first `C_z` channels (the mean) are the latent (f32).
    fn encoder_tail<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>> {
        let m = &self.weights;
        let z = self.config.z_channels;
        let x = middle(b, m, "encoder", x, time)?;
        let skip = group_mean(b, &x, 2 * z)?;
        let h = norm_silu(b, m, "encoder.norm_out", &x)?;
        drop(x);
        let h = conv(b, m, "encoder.conv_out", &h, time)?;
        let moments = b.binary(&h, &skip, BinaryOp::Add)?;
        Ok(b.cast(&b.slice(&moments, 1, 0, z)?, DType::F32)?)
    }

    /// The decoder's input and middle on all the latent frames `z` of images or of one clip: `conv_in(z)` plus
    /// z's channels repeated to its width, then the middle.
    fn decoder_head<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>> {
        let m = &self.weights;
        let h = conv(b, m, "decoder.conv_in", z, time)?;
        let repeats = ratio(h.dim(1)?, z.dim(1)?, "the decoder's input shortcut")?;
        let x = b.binary(&h, &repeat_channels(b, z, repeats)?, BinaryOp::Add)?;
        middle(b, m, "decoder", &x, time)
    }

    /// The decoder's levels and output on frames `x` in `time`: images `[n, 3, H, W]` (f32).
    fn up<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = x.clone();
        for i in 0..LEVELS {
            for j in 0..=RES_BLOCKS {
                x = residual(b, m, &decoder_block(i, j), &x, time)?;
            }
            if i < RESAMPLES {
                let prefix = format!("decoder.up.{i}.upsample");
                x = upsample(b, m, &prefix, &x, Config::temporal_up(i), time)?;
            }
        }
        let h = norm_silu(b, m, "decoder.norm_out", &x)?;
        drop(x);
        let y = conv(b, m, "decoder.conv_out", &h, time)?;
        Ok(b.cast(&y, DType::F32)?)
    }

    /// An error unless the file holds the decoder.
    fn require_decoder(&self) -> Result<()> {
        if self.config.has_decoder {
            Ok(())
        } else {
            Err(Error::Invalid("this VAE file has no decoder".into()))
        }
    }

    /// An error unless the file holds the encoder.
    fn require_encoder(&self) -> Result<()> {
        if self.config.has_encoder {
            Ok(())
        } else {
            Err(Error::Invalid("this VAE file has no encoder".into()))
        }
    }
}

impl ClipVae for HunyuanVae {
    fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        let z = crate::vae_io::latent_in(b, z, self.config.has_decoder, self.config.z_channels)?;
        let x = self.decoder_head(b, &z, &mut Time::Alone)?;
        self.up(b, &x, &mut Time::Alone)
    }

    fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let (has, r) = (self.config.has_encoder, self.config.downscale());
        let x = crate::vae_io::image_in(b, x, has, IMAGE_CHANNELS, r)?;
        let latent = self.down(b, &x, &mut Time::Alone)?;
        drop(x);
        self.encoder_tail(b, &latent, &mut Time::Alone)
    }

    /// Decodes the clip z `[1, C_z, T, h, w]`: its input and middle on all T latent frames together (the
    /// middle's attention spans them), then the levels `per_chunk` latent frames at a time after the first,
    /// each chunk's frames handed to `out` as they are finished.
    fn decode_video_with<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        self.require_decoder()?;
        if per_chunk == 0 {
            return Err(Error::Invalid(
                "a decode takes at least one latent frame per chunk".into(),
            ));
        }
        let z = clip_frames(b, z, self.config.z_channels, "latent")?;
        let x = self.decoder_head(b, &z, &mut Time::Stream(&mut Stream::new()))?;
        drop(z);
        let mut stream = Stream::new();
        for (start, len) in chunks(x.dim(0)?, per_chunk) {
            let chunk = frames(b, &x, start, len)?;
            out(self.up(b, &chunk, &mut Time::Stream(&mut stream))?)?;
        }
        Ok(())
    }

    /// Encodes the clip x `[1, 3, L, H, W]`: its levels `per_chunk` frames (a multiple of 4) at a time after
    /// the first, then the middle and head on all the latent frames together (the middle's attention spans
    /// them), so the whole latent `[⌊(L − 1)/4⌋ + 1, C_z, H/16, W/16]` is handed to `out` at once. Frames past
    /// the last 4k + 1 are dropped and sizes centre-cropped to multiples of 16, as ComfyUI does.
    fn encode_video_with<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        self.require_encoder()?;
        if per_chunk == 0 || !per_chunk.is_multiple_of(TEMPORAL_DOWNSCALE) {
            return Err(Error::Invalid(format!(
                "an encode takes a multiple of {TEMPORAL_DOWNSCALE} frames per chunk, not {per_chunk}"
            )));
        }
        let x = clip_frames(b, x, IMAGE_CHANNELS, "clip")?;
        let (l, h, w) = (x.dim(0)?, x.dim(2)?, x.dim(3)?);
        let r = self.config.downscale();
        if h < r || w < r {
            return Err(Error::Invalid(format!(
                "a clip of {w}×{h} frames: at least {r}×{r} is needed"
            )));
        }
        let x = crate::vae_io::crop_center(b, &x, h / r * r, w / r * r)?;
        let mut stream = Stream::new();
        let mut latents = Vec::new();
        for (start, len) in chunks(decoded_frames(latent_frames(l)), per_chunk) {
            let chunk = frames(b, &x, start, len)?;
            latents.push(self.down(b, &chunk, &mut Time::Stream(&mut stream))?);
        }
        drop((stream, x));
        let latent = concat_frames(b, &latents)?;
        drop(latents);
        out(self.encoder_tail(b, &latent, &mut Time::Stream(&mut Stream::new()))?)
    }
}
