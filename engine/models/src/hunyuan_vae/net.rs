//! The HunyuanVideo 1.5 VAE's network: [`HunyuanVae`], its encoder and decoder on images and clips.
//!
//! ComfyUI runs the levels of each side a chunk at a time with carried convolutions, but the middle (and the
//! encoder's head) on the whole clip at once: the middle's attention spans every frame. So a clip encodes in
//! chunks down to its latent frames, which then go through the middle and the head together; and a latent clip
//! goes through the decoder's input and middle together, then through the levels a chunk at a time.

use kiln_compute::backend::BinaryOp;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::blocks::{RmsNorm, conv, downsample, middle, norm_silu, residual, upsample};
use super::causal::{Stream, Time, concat_frames, frames};
use super::config::{
    Config, IMAGE_CHANNELS, LEVELS, RES_BLOCKS, RESAMPLES, decoder_block, encoder_block,
};
use super::reshape::{group_mean, ratio, repeat_channels};
use crate::error::Result;
use crate::wan_vae::{ClipVae, chunks, clip_in, decoded_frames, latent_clip_in, latent_frames};

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
}

/// A HunyuanVideo VAE's network (this VAE's, or the 1.0 VAE's in [`crate::kl_video_vae`]): each side's levels
/// run a chunk of a clip at a time with carried convolutions, the encoder's middle and head and the decoder's
/// input and middle on the whole clip at once. [`decode_images`], [`encode_images`], [`decode_clip`] and
/// [`encode_clip`] run either through [`ClipVae`].
pub(crate) trait WholeClipMiddle {
    /// Latent channels.
    fn z_channels(&self) -> usize;
    /// Pixels per latent position along each side.
    fn downscale(&self) -> usize;
    /// Whether the file holds the decoder, and the encoder.
    fn halves(&self) -> (bool, bool);
    /// `(start, len)` of each chunk the encoder's levels take of a clip's `total` frames when a caller asks for
    /// `per` frames a chunk.
    fn encode_chunks(&self, total: usize, per: usize) -> Vec<(usize, usize)>;
    /// `(start, len)` of each chunk the decoder's levels take of a clip's `total` latent frames when a caller
    /// asks for `per` latent frames a chunk.
    fn decode_chunks(&self, total: usize, per: usize) -> Vec<(usize, usize)>;
    /// The encoder's input and levels on frames `x` `[n, 3, H, W]` (compute dtype) in `time`: latent frames
    /// of the widest level's width.
    fn down<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>>;
    /// The encoder's middle and head on all the latent frames `x` of images or of one clip: the latent (the
    /// mean, f32).
    fn encoder_tail<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>>;
    /// The decoder's input and middle on all the latent frames `z` (compute dtype) of images or of one clip.
    fn decoder_head<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>>;
    /// The decoder's levels and output on frames `x` in `time`: images `[n, 3, H, W]` (f32).
    fn up<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>>;
}

/// Decodes images' latents `z` `[B, C_z, h, w]`, each a one-frame clip, into `[B, 3, H, W]` f32.
pub(crate) fn decode_images<N: WholeClipMiddle, B: Backend>(
    net: &N,
    b: &B,
    z: &Tensor<B>,
) -> Result<Tensor<B>> {
    let z = crate::vae_io::latent_in(b, z, net.halves().0, net.z_channels())?;
    let x = net.decoder_head(b, &z, &mut Time::Alone)?;
    drop(z);
    net.up(b, &x, &mut Time::Alone)
}

/// Encodes images `x` `[B, 3, H, W]` in [−1, 1], each a one-frame clip, centre-cropped to the downscale, into
/// latents `[B, C_z, H/r, W/r]` f32.
pub(crate) fn encode_images<N: WholeClipMiddle, B: Backend>(
    net: &N,
    b: &B,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let x = crate::vae_io::image_in(b, x, net.halves().1, IMAGE_CHANNELS, net.downscale())?;
    let latent = net.down(b, &x, &mut Time::Alone)?;
    drop(x);
    net.encoder_tail(b, &latent, &mut Time::Alone)
}

/// Decodes the clip z `[1, C_z, T, h, w]`: its input and middle on all T latent frames together, then the
/// levels a chunk of [`WholeClipMiddle::decode_chunks`] at a time, each chunk's frames handed to `out` as they
/// are finished.
pub(crate) fn decode_clip<N: WholeClipMiddle, B: Backend>(
    net: &N,
    b: &B,
    z: &Tensor<B>,
    per_chunk: usize,
    out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
) -> Result<()> {
    let z = latent_clip_in(b, z, net.halves().0, net.z_channels(), per_chunk)?;
    let x = net.decoder_head(b, &z, &mut Time::Stream(&mut Stream::new()))?;
    drop(z);
    let mut stream = Stream::new();
    for (start, len) in net.decode_chunks(x.dim(0)?, per_chunk) {
        let chunk = frames(b, &x, start, len)?;
        out(net.up(b, &chunk, &mut Time::Stream(&mut stream))?)?;
    }
    Ok(())
}

/// Encodes the clip x `[1, 3, L, H, W]`: its levels a chunk of [`WholeClipMiddle::encode_chunks`] at a time,
/// then the middle and head on all the latent frames together, so the whole latent
/// `[⌊(L − 1)/4⌋ + 1, C_z, H/r, W/r]` is handed to `out` at once. Frames past the last 4k + 1 are dropped and
/// sizes centre-cropped to multiples of r, as ComfyUI does.
pub(crate) fn encode_clip<N: WholeClipMiddle, B: Backend>(
    net: &N,
    b: &B,
    x: &Tensor<B>,
    per_chunk: usize,
    out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
) -> Result<()> {
    let x = clip_in(b, x, net.halves().1, IMAGE_CHANNELS, net.downscale(), per_chunk)?;
    let mut stream = Stream::new();
    let mut latents = Vec::new();
    for (start, len) in net.encode_chunks(decoded_frames(latent_frames(x.dim(0)?)), per_chunk) {
        let chunk = frames(b, &x, start, len)?;
        latents.push(net.down(b, &chunk, &mut Time::Stream(&mut stream))?);
    }
    drop((stream, x));
    let latent = concat_frames(b, &latents)?;
    drop(latents);
    out(net.encoder_tail(b, &latent, &mut Time::Stream(&mut Stream::new()))?)
}

impl WholeClipMiddle for HunyuanVae {
    fn z_channels(&self) -> usize {
        self.config.z_channels
    }

    fn downscale(&self) -> usize {
        self.config.downscale()
    }

    fn halves(&self) -> (bool, bool) {
        (self.config.has_decoder, self.config.has_encoder)
    }

    /// The first frame alone, then `per` frames at a time.
    fn encode_chunks(&self, total: usize, per: usize) -> Vec<(usize, usize)> {
        chunks(total, per)
    }

    /// The first latent frame alone, then `per` latent frames at a time.
    fn decode_chunks(&self, total: usize, per: usize) -> Vec<(usize, usize)> {
        chunks(total, per)
    }

    /// The encoder's input convolution and levels on frames `x` `[n, 3, H, W]` (compute dtype) in `time`:
    /// latent frames of the widest level's width.
    fn down<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = conv(b, m, "encoder.conv_in", x, time)?;
        for i in 0..LEVELS {
            for j in 0..RES_BLOCKS {
                x = residual(b, m, &RmsNorm, &encoder_block(i, j), &x, time)?;
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
        let x = middle(b, m, &RmsNorm, "encoder", x, time)?;
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
        middle(b, m, &RmsNorm, "decoder", &x, time)
    }

    /// The decoder's levels and output on frames `x` in `time`: images `[n, 3, H, W]` (f32).
    fn up<B: Backend>(&self, b: &B, x: &Tensor<B>, time: &mut Time<'_, B>) -> Result<Tensor<B>> {
        let m = &self.weights;
        let mut x = x.clone();
        for i in 0..LEVELS {
            for j in 0..=RES_BLOCKS {
                x = residual(b, m, &RmsNorm, &decoder_block(i, j), &x, time)?;
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
}

impl ClipVae for HunyuanVae {
    fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        decode_images(self, b, z)
    }

    fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        encode_images(self, b, x)
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
        decode_clip(self, b, z, per_chunk, out)
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
        encode_clip(self, b, x, per_chunk, out)
    }
}
