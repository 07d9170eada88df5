//! Clips through a Wan VAE, shared by both: the clip's edges (`[1, C, T, H, W]` in, its frames `[T, C, H, W]`
//! through the network), the frame counts (L frames encode to ⌊(L − 1)/4⌋ + 1 latent frames, the frames past
//! the last 4k + 1 dropped; T latent frames decode to 4T − 3), and the chunk loop: the first frame alone, then
//! a few at a time through one [`Stream`], each chunk's output handed on before the next starts, so memory
//! grows with a chunk and the stream's history, never with the clip.

use kiln_compute::{Backend, DType, Tensor};

use super::causal::{Stream, Time, frames};
use crate::error::{Error, Result};

/// Latent frames a decode takes per chunk after the first (ComfyUI's 2.2 and diffusers decode one at a time).
pub const DECODE_CHUNK: usize = 1;
/// Clip frames an encode takes per chunk after the first (4: one latent frame; ComfyUI's 2.2 and diffusers
/// encode 1, 4, 4, …).
pub const ENCODE_CHUNK: usize = 4;
/// Clip frames per latent frame.
pub const TEMPORAL_DOWNSCALE: usize = 4;

/// Latent frames of a clip of `frames` frames (⌊(L − 1)/4⌋ + 1; 0 for none).
pub fn latent_frames(frames: usize) -> usize {
    if frames == 0 { 0 } else { (frames - 1) / TEMPORAL_DOWNSCALE + 1 }
}

/// Clip frames `latent` latent frames decode to (4T − 3; 0 for none).
pub fn decoded_frames(latent: usize) -> usize {
    (latent * TEMPORAL_DOWNSCALE).saturating_sub(TEMPORAL_DOWNSCALE - 1)
}

/// What both Wan VAEs do with images and clips, in VAE space. `C_z` is the latent width and `r` the spatial
/// scale of each version ([`super::WanVae`]: 16 and 8; [`super::Wan22Vae`]: 48 and 16); `C` the image
/// channels.
pub trait ClipVae {
    /// Decodes latents z `[B, C_z, h, w]` into images `[B, C, r·h, r·w]`, f32, about [−1, 1] but not clamped;
    /// each latent is a one-frame clip.
    fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>>;

    /// Encodes images x `[B, C, H, W]` in [−1, 1] into the latent mean `[B, C_z, H/r, W/r]`, f32; each image is
    /// a one-frame clip. Sizes are centre-cropped to multiples of r (offset `(H mod r) / 2`), as ComfyUI's
    /// `VAE.encode` does; an image smaller than r×r is an [`Error::Invalid`].
    fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>>;

    /// Decodes the clip z `[1, C_z, T, h, w]` into `[1, C, 4T − 3, r·h, r·w]`, f32, one latent frame at a time.
    fn decode_video<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        collect(b, |out| self.decode_video_with(b, z, DECODE_CHUNK, out))
    }

    /// [`ClipVae::decode_video`], `per_chunk` latent frames at a time after the first (any count gives the
    /// same frames; more costs more memory), each chunk's frames `[n, C, r·h, r·w]` (f32) handed to `out` as
    /// they are finished; an error from `out` stops the decode.
    fn decode_video_with<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()>;

    /// Encodes the clip x `[1, C, L, H, W]` in [−1, 1] into the latent mean
    /// `[1, C_z, ⌊(L − 1)/4⌋ + 1, H/r, W/r]`, f32, 1 then 4, 4, … frames at a time. Frames past the last 4k + 1
    /// are dropped and sizes centre-cropped to multiples of r, as ComfyUI does.
    fn encode_video<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        collect(b, |out| self.encode_video_with(b, x, ENCODE_CHUNK, out))
    }

    /// [`ClipVae::encode_video`], `per_chunk` frames (a multiple of 4) at a time after the first, each chunk's
    /// latent frames `[n, C_z, H/r, W/r]` (f32) handed to `out`; an error from `out` stops the encode.
    fn encode_video_with<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()>;
}

impl<N: Chunked> ClipVae for N {
    fn decode<B: Backend>(&self, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
        decode_images(self, b, z)
    }

    fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        encode_images(self, b, x)
    }

    fn decode_video_with<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        per_chunk: usize,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()> {
        decode_clip(self, b, z, per_chunk, out)
    }

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

/// A Wan VAE's network, one chunk of a clip (or a batch of images) at a time.
pub(crate) trait Chunked {
    /// Latent channels.
    fn z_channels(&self) -> usize;
    /// Image channels the encoder reads.
    fn image_channels(&self) -> usize;
    /// Pixels per latent position along each side.
    fn downscale(&self) -> usize;
    /// Whether the file holds the decoder, and the encoder.
    fn halves(&self) -> (bool, bool);
    /// Decodes latent frames `z` `[n, C, h, w]` (compute dtype) in `time`, handing `out` the frames it
    /// finishes (f32), in order.
    fn decode_chunk<B: Backend>(
        &self,
        b: &B,
        z: &Tensor<B>,
        time: &mut Time<'_, B>,
        out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
    ) -> Result<()>;
    /// Encodes frames `x` `[n, C, H, W]` (compute dtype, cropped) in `time` into latent frames (the mean, f32).
    fn encode_chunk<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        time: &mut Time<'_, B>,
    ) -> Result<Tensor<B>>;
}

/// Decodes images' latents `z` `[B, C, h, w]`, each a one-frame clip, into `[B, C', H, W]` f32.
fn decode_images<N: Chunked, B: Backend>(net: &N, b: &B, z: &Tensor<B>) -> Result<Tensor<B>> {
    let z = crate::vae_io::latent_in(b, z, net.halves().0, net.z_channels())?;
    let mut parts = Vec::new();
    net.decode_chunk(b, &z, &mut Time::Alone, &mut |x| {
        parts.push(x);
        Ok(())
    })?;
    super::causal::concat_frames(b, &parts)
}

/// Encodes images `x` `[B, C, H, W]` in [−1, 1], each a one-frame clip, centre-cropped to the downscale, into
/// latents `[B, C_z, H/r, W/r]` f32.
fn encode_images<N: Chunked, B: Backend>(net: &N, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let x = crate::vae_io::image_in(b, x, net.halves().1, net.image_channels(), net.downscale())?;
    net.encode_chunk(b, &x, &mut Time::Alone)
}

/// The frames `[T, C, H, W]` of a clip `[1, C, T, H, W]` of `channels` channels, cast to the compute dtype.
fn clip_frames<B: Backend>(b: &B, x: &Tensor<B>, channels: usize, what: &str) -> Result<Tensor<B>> {
    let &[1, c, t, h, w] = x.shape() else {
        return Err(Error::Invalid(format!(
            "a {what} must be one clip [1, C, T, H, W], got {:?}",
            x.shape()
        )));
    };
    if c != channels || t == 0 {
        return Err(Error::Invalid(format!(
            "a {what} {:?} for a VAE of {channels} channels (and at least one frame)",
            x.shape()
        )));
    }
    let x = b.permute(&b.cast(x, b.compute_dtype())?, &[0, 2, 1, 3, 4])?;
    Ok(x.reshape(&[t, c, h, w])?)
}

/// The clip `[1, C, T, H, W]` of frames `[T, C, H, W]`.
pub(crate) fn clip_of<B: Backend>(b: &B, frames: &Tensor<B>) -> Result<Tensor<B>> {
    let &[t, c, h, w] = frames.shape() else {
        return Err(Error::Invalid(format!("frames {:?} are not [T, C, H, W]", frames.shape())));
    };
    Ok(b.permute(&frames.reshape(&[1, t, c, h, w])?, &[0, 2, 1, 3, 4])?)
}

/// `(start, len)` of each chunk of `total` frames: the first alone, then `per` at a time.
pub(crate) fn chunks(total: usize, per: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(0, total.min(1))];
    let mut start = 1;
    while start < total {
        let len = per.min(total - start);
        out.push((start, len));
        start += len;
    }
    out
}

/// The latent frames `[T, C_z, h, w]` (compute dtype) of clip `z` `[1, C_z, T, h, w]` for a decode of `per`
/// latent frames a chunk, by a VAE of `z_channels` latent channels whose file holds the decoder if
/// `has_decoder`; an [`Error::Invalid`] for no decoder, no frames a chunk, or a clip of another shape.
pub(crate) fn latent_clip_in<B: Backend>(
    b: &B,
    z: &Tensor<B>,
    has_decoder: bool,
    z_channels: usize,
    per: usize,
) -> Result<Tensor<B>> {
    if !has_decoder {
        return Err(Error::Invalid("this VAE file has no decoder".into()));
    }
    if per == 0 {
        return Err(Error::Invalid("a decode takes at least one latent frame per chunk".into()));
    }
    clip_frames(b, z, z_channels, "latent")
}

/// The frames `[L, C, H', W']` (compute dtype) of clip `x` `[1, C, L, H, W]` for an encode of `per` frames a
/// chunk, by a VAE of `channels` image channels and downscale `r` whose file holds the encoder if
/// `has_encoder`: each frame centre-cropped to multiples of r, as ComfyUI does. An [`Error::Invalid`] for no
/// encoder, a chunk that is not a positive multiple of 4 frames, a clip of another shape, or frames smaller
/// than r×r.
pub(crate) fn clip_in<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    has_encoder: bool,
    channels: usize,
    r: usize,
    per: usize,
) -> Result<Tensor<B>> {
    if !has_encoder {
        return Err(Error::Invalid("this VAE file has no encoder".into()));
    }
    if per == 0 || !per.is_multiple_of(TEMPORAL_DOWNSCALE) {
        return Err(Error::Invalid(format!(
            "an encode takes a multiple of {TEMPORAL_DOWNSCALE} frames per chunk, not {per}"
        )));
    }
    let x = clip_frames(b, x, channels, "clip")?;
    let (h, w) = (x.dim(2)?, x.dim(3)?);
    if h < r || w < r {
        return Err(Error::Invalid(format!(
            "a clip of {w}×{h} frames: at least {r}×{r} is needed"
        )));
    }
    crate::vae_io::crop_center(b, &x, h / r * r, w / r * r)
}

/// Decodes clip `z` `[1, C, T, h, w]` (VAE space), `per` latent frames per chunk after the first, handing
/// `out` its 4T − 3 frames `[n, C', H, W]` (f32) chunk by chunk.
fn decode_clip<N: Chunked, B: Backend>(
    net: &N,
    b: &B,
    z: &Tensor<B>,
    per: usize,
    out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
) -> Result<()> {
    let z = latent_clip_in(b, z, net.halves().0, net.z_channels(), per)?;
    let mut stream = Stream::new();
    for (start, len) in chunks(z.dim(0)?, per) {
        let chunk = frames(b, &z, start, len)?;
        net.decode_chunk(b, &chunk, &mut Time::Stream(&mut stream), out)?;
    }
    Ok(())
}

/// Encodes clip `x` `[1, C, L, H, W]` in [−1, 1], `per` frames per chunk after the first (a multiple of 4),
/// handing `out` its ⌊(L − 1)/4⌋ + 1 latent frames `[n, C_z, H/r, W/r]` (the mean, f32, VAE space) chunk by
/// chunk. Frames past the last 4k + 1 are dropped and sizes centre-cropped to the downscale, as ComfyUI does.
fn encode_clip<N: Chunked, B: Backend>(
    net: &N,
    b: &B,
    x: &Tensor<B>,
    per: usize,
    out: &mut dyn FnMut(Tensor<B>) -> Result<()>,
) -> Result<()> {
    let x = clip_in(b, x, net.halves().1, net.image_channels(), net.downscale(), per)?;
    let used = decoded_frames(latent_frames(x.dim(0)?));
    let mut stream = Stream::new();
    for (start, len) in chunks(used, per) {
        let chunk = frames(b, &x, start, len)?;
        let latent = net.encode_chunk(b, &chunk, &mut Time::Stream(&mut stream))?;
        out(latent)?;
    }
    Ok(())
}

/// The whole clip of the chunks [`decode_clip`] or [`encode_clip`] hand out.
fn collect<B: Backend>(
    b: &B,
    run: impl FnOnce(&mut dyn FnMut(Tensor<B>) -> Result<()>) -> Result<()>,
) -> Result<Tensor<B>> {
    let mut parts = Vec::new();
    run(&mut |x| {
        parts.push(x);
        Ok(())
    })?;
    let frames = super::causal::concat_frames(b, &parts)?;
    clip_of(b, &b.cast(&frames, DType::F32)?)
}

#[cfg(test)]
mod tests {
    use super::{chunks, decoded_frames, latent_frames};

    #[test]
    fn frame_counts_follow_the_first_frame_rule() {
        assert_eq!([1, 2, 4, 5, 6, 9, 81].map(latent_frames), [1, 1, 1, 2, 2, 3, 21]);
        assert_eq!([1, 2, 3, 21].map(decoded_frames), [1, 5, 9, 81]);
        assert_eq!(latent_frames(0), 0);
    }

    #[test]
    fn chunks_start_with_one_frame() {
        assert_eq!(chunks(9, 4), [(0, 1), (1, 4), (5, 4)]);
        assert_eq!(chunks(9, 8), [(0, 1), (1, 8)]);
        assert_eq!(chunks(3, 1), [(0, 1), (1, 1), (2, 1)]);
        assert_eq!(chunks(13, 8), [(0, 1), (1, 8), (9, 4)]);
        assert_eq!(chunks(1, 4), [(0, 1)]);
    }
}
