//! VAE nodes: `VAEDecode` (latent → IMAGE) and `VAEEncode` (IMAGE → latent), and their tiled forms
//! `VAEDecodeTiled` and `VAEEncodeTiled` ([`super::tiled`]). An image goes through alone, so a batch costs no
//! more device memory than one image (a tiled pass: than one tile).
//!
//! A video VAE (Wan's) works on clips as ComfyUI's does: a latent with frames `[B, C, T, h, w]` (T > 1) decodes
//! sample by sample, each into its 4T − 3 frames, which join the IMAGE batch in order; a batch of N > 1 images
//! is one clip (the batch is time) and encodes to `[1, C, ⌊(N − 1)/4⌋ + 1, h, w]`. A clip runs on the device a
//! chunk at a time ([`kiln_models::wan_vae::DECODE_CHUNK`], [`kiln_models::wan_vae::ENCODE_CHUNK`]), each
//! chunk's frames coming back to the host as it finishes and the interrupt checked between chunks. One image,
//! and a latent of one frame, keep the image path. An image VAE refuses a latent with frames (ComfyUI would
//! decode its first frame only).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_compute::{Backend, DType};
use kiln_models::wan_vae::{DECODE_CHUNK, ENCODE_CHUNK, decoded_frames, latent_frames};

use super::latent::transpose;
use super::model_specs;
use super::tiled::{Axis, Scale, tiled_pass};
use crate::compute::Compute;
use crate::models::Vae;
use crate::models::device::{OnDevice, on_device};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Interrupted, Node, NodeError, NodeResult, NodeSpec,
    OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// Which way through the VAE.
#[derive(Clone, Copy)]
enum Direction {
    Decode,
    Encode,
}

/// A tiled pass's settings: the spatial tile and overlap in input positions, and for a clip the temporal ones
/// in input frames (latent frames when decoding).
#[derive(Clone, Copy)]
struct Tiling {
    tile: usize,
    overlap: usize,
    temporal: (usize, usize),
}

/// One image (or latent) `[1, C, H, W]` through the VAE.
struct Pass<'a> {
    vae: &'a Vae,
    direction: Direction,
    shape: [usize; 4],
    values: &'a [f32],
}

impl OnDevice for Pass<'_> {
    type Output = kiln_models::Result<(Vec<usize>, Vec<f32>)>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        // As ComfyUI loads the VAE before it decodes or encodes: top residency priority.
        self.vae.net.weights().activate()?;
        let x = b.from_f32(&self.shape, self.values, b.compute_dtype())?;
        let y = match self.direction {
            Direction::Decode => self.vae.net.decode(b, &x)?,
            Direction::Encode => self.vae.net.encode(b, &x)?,
        };
        let y = b.cast(&y, DType::F32)?;
        Ok((y.shape().to_vec(), b.to_f32(&y)?))
    }
}

/// One clip `[1, C, T, H, W]` through a video VAE, chunk by chunk: `chunk` gets each chunk's output frames
/// `[n, C', H', W']` on the host as it finishes (an error from it stops the pass).
struct ClipPass<'a> {
    vae: &'a Vae,
    direction: Direction,
    shape: [usize; 5],
    values: &'a [f32],
    chunk: ChunkSink<'a>,
}

/// Where a [`ClipPass`] hands each chunk's frames: their shape and values on the host.
type ChunkSink<'a> = &'a mut dyn FnMut(&[usize], Vec<f32>) -> kiln_models::Result<()>;

impl OnDevice for ClipPass<'_> {
    type Output = kiln_models::Result<()>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        self.vae.net.weights().activate()?;
        let x = b.from_f32(&self.shape, self.values, b.compute_dtype())?;
        let chunk = self.chunk;
        let mut out = |t: kiln_compute::Tensor<B>| -> kiln_models::Result<()> {
            let t = b.cast(&t, DType::F32)?;
            chunk(t.shape(), b.to_f32(&t)?)
        };
        match self.direction {
            Direction::Decode => self.vae.net.decode_video(b, &x, DECODE_CHUNK, &mut out),
            Direction::Encode => self.vae.net.encode_video(b, &x, ENCODE_CHUNK, &mut out),
        }
    }
}

/// `VAEDecode`: latents (VAE space) to images in `[0, 1]`, channels last.
pub(super) struct VaeDecode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl VaeDecode {
    pub(super) fn new(compute: Arc<Compute>) -> VaeDecode {
        VaeDecode { spec: Arc::new(model_specs::vae_decode()), compute }
    }
}

impl Node for VaeDecode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let image = decode(&self.compute, inputs, ctx, None)?;
        Ok(NodeResult::values([Value::Image(image)]))
    }
}

/// One `[1, C, H, W]` sample through the VAE (a latent decoded to pixels in [-1, 1], or the reverse).
fn pass(
    compute: &Compute,
    vae: &Vae,
    direction: Direction,
    x: &Tensor,
) -> Result<Tensor, NodeError> {
    let &[1, c, h, w] = x.shape() else {
        return Err(NodeError::new(format!("a VAE pass takes [1, C, H, W], got {:?}", x.shape())));
    };
    let pass = Pass { vae, direction, shape: [1, c, h, w], values: x.data() };
    let (shape, values) = on_device(compute.device(), pass).map_err(node_error)?;
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

/// One clip `[1, C, T, H, W]` through a video VAE (latent frames decoded to frames in [-1, 1], or the reverse)
/// → `[1, C', T', H', W']`, checking the interrupt between chunks.
fn clip_pass(
    compute: &Compute,
    vae: &Vae,
    direction: Direction,
    x: &Tensor,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    let &[1, c, t, h, w] = x.shape() else {
        return Err(NodeError::new(format!(
            "a clip pass takes [1, C, T, H, W], got {:?}",
            x.shape()
        )));
    };
    ctx.check_interrupt()?;
    let interrupted = AtomicBool::new(false);
    let mut frames: Vec<f32> = Vec::new();
    let mut frame: Option<[usize; 3]> = None;
    let mut count = 0;
    let mut chunk = |shape: &[usize], values: Vec<f32>| -> kiln_models::Result<()> {
        let &[n, oc, oh, ow] = shape else {
            return Err(kiln_models::Error::Invalid(format!("a chunk came out {shape:?}")));
        };
        if *frame.get_or_insert([oc, oh, ow]) != [oc, oh, ow] {
            return Err(kiln_models::Error::Invalid(format!("a chunk came out {shape:?}")));
        }
        frames.extend(values);
        count += n;
        if ctx.check_interrupt().is_err() {
            interrupted.store(true, Ordering::Relaxed);
            return Err(kiln_models::Error::Invalid("interrupted".to_owned()));
        }
        Ok(())
    };
    let pass =
        ClipPass { vae, direction, shape: [1, c, t, h, w], values: x.data(), chunk: &mut chunk };
    match on_device(compute.device(), pass) {
        Ok(()) => {}
        Err(_) if interrupted.load(Ordering::Relaxed) => return Err(Interrupted.into()),
        Err(e) => return Err(node_error(e)),
    }
    let [oc, oh, ow] = frame.ok_or_else(|| NodeError::new("a clip pass gave no frames"))?;
    // Frames [F, C, H, W] → the clip [1, C, F, H, W].
    let plane = oh * ow;
    let mut clip = vec![0f32; frames.len()];
    for f in 0..count {
        for ch in 0..oc {
            let from = (f * oc + ch) * plane;
            let to = (ch * count + f) * plane;
            clip[to..to + plane].copy_from_slice(&frames[from..from + plane]);
        }
    }
    Tensor::new(vec![1, oc, count, oh, ow], clip).map_err(|e| NodeError::new(e.to_string()))
}

/// Clip frames `[1, C, F, H, W]` in [-1, 1] → images `[F, H, W, C]` in [0, 1].
fn clip_images(clip: &Tensor) -> Result<Tensor, NodeError> {
    let &[1, c, f, h, w] = clip.shape() else {
        return Err(NodeError::new(format!("frames {:?} are not [1, C, F, H, W]", clip.shape())));
    };
    let mut out = vec![0f32; clip.data().len()];
    for ch in 0..c {
        for fi in 0..f {
            let plane = &clip.data()[(ch * f + fi) * h * w..][..h * w];
            for (p, &v) in plane.iter().enumerate() {
                out[(fi * h * w + p) * c + ch] = ((v + 1.0) / 2.0).clamp(0.0, 1.0);
            }
        }
    }
    Tensor::new(vec![f, h, w, c], out).map_err(|e| NodeError::new(e.to_string()))
}

/// Clip frames per latent frame of `vae`, or an error naming `what` for an image VAE.
fn video_vae(vae: &Vae, what: &str) -> Result<usize, NodeError> {
    vae.net.temporal_downscale().ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "{} works on images, not {what} (a video needs a video VAE, such as the Wan VAEs)",
                vae.net.family().name()
            ),
        )
    })
}

/// The clip `latent` `[1, C, T, h, w]` (VAE space) decoded by a video VAE (the Wan VAEs) into its 4T − 3
/// frames, an IMAGE `[F, H, W, 3]` in `[0, 1]`, one latent frame at a time on the device (the interrupt
/// checked between them). For the Wan conditioning nodes.
pub(crate) fn decode_video(
    compute: &Compute,
    vae: &Vae,
    latent: &Tensor,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    video_vae(vae, "video latents")?;
    clip_images(&clip_pass(compute, vae, Direction::Decode, latent, ctx)?)
}

/// The `samples` input decoded with the `vae` input to images in `[0, 1]`, channels last; with `tiling`
/// (latent positions and frames), tile by tile as ComfyUI's `VAE.decode_tiled`.
fn decode(
    compute: &Compute,
    inputs: &Inputs,
    ctx: &Context,
    tiling: Option<Tiling>,
) -> Result<Tensor, NodeError> {
    let vae = inputs.vae("vae")?;
    let samples = &inputs.latent("samples")?.samples;
    // A latent with one frame (`[B, C, 1, H, W]`, as Qwen-Image-Layered's are after LatentCutToBatch) is an
    // image latent; more frames are clips, for a video VAE.
    let (batch, channels, h, w) = match *samples.shape() {
        [batch, channels, h, w] | [batch, channels, 1, h, w] => (batch, channels, h, w),
        [_, _, frames, _, _] => {
            video_vae(vae, &format!("a latent of {frames} frames"))?;
            return decode_clips(compute, vae, samples, ctx, tiling);
        }
        ref other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!(
                    "expected a LATENT [B, C, H, W] or with frames [B, C, T, H, W], got {other:?}"
                ),
            ));
        }
    };
    let per = channels * h * w;
    let mut images = Vec::with_capacity(batch);
    for i in 0..batch {
        ctx.check_interrupt()?;
        let latent =
            Tensor::new(vec![1, channels, h, w], samples.data()[i * per..(i + 1) * per].to_vec())
                .map_err(|e| NodeError::new(e.to_string()))?;
        let mut run = |t: &Tensor| {
            ctx.check_interrupt()?;
            pass(compute, vae, Direction::Decode, t)
        };
        let rgb = match tiling {
            None => run(&latent)?,
            Some(t) => {
                let scale = Scale::Up(vae.net.downscale());
                tiled_pass(vae.net.family(), &latent, (t.tile, t.overlap), scale, None, &mut run)?
            }
        };
        // [1, C, H, W] in [-1, 1] → [1, H, W, C] in [0, 1].
        images.push(transpose(&rgb.map(|v| ((v + 1.0) / 2.0).clamp(0.0, 1.0)), true)?);
    }
    join_images(images)
}

/// `images` joined along the batch (an empty batch is `[0, 0, 0, 3]`).
fn join_images(images: Vec<Tensor>) -> Result<Tensor, NodeError> {
    if images.is_empty() {
        Tensor::new(vec![0, 0, 0, 3], Vec::new())
    } else {
        Tensor::concat_batch(&images.iter().collect::<Vec<_>>())
    }
    .map_err(|e| NodeError::new(e.to_string()))
}

/// Latents with frames `[B, C, T, h, w]` decoded sample by sample as clips by a video VAE, their frames joined
/// in order: `[B·(4T − 3), H, W, 3]` in `[0, 1]`. With `tiling`, each clip tile by tile in time and space as
/// ComfyUI's `decode_tiled_3d` (each temporal tile a clip of its own).
fn decode_clips(
    compute: &Compute,
    vae: &Vae,
    samples: &Tensor,
    ctx: &Context,
    tiling: Option<Tiling>,
) -> Result<Tensor, NodeError> {
    let frames_per = video_vae(vae, "video latents")?;
    let &[batch, c, t, h, w] = samples.shape() else {
        return Err(NodeError::new(format!(
            "latents {:?} are not [B, C, T, H, W]",
            samples.shape()
        )));
    };
    let per = c * t * h * w;
    let mut images = Vec::with_capacity(batch);
    for i in 0..batch {
        ctx.check_interrupt()?;
        let sample =
            Tensor::new(vec![1, c, t, h, w], samples.data()[i * per..(i + 1) * per].to_vec())
                .map_err(|e| NodeError::new(e.to_string()))?;
        let frames = match tiling {
            None => decode_video(compute, vae, &sample, ctx)?,
            Some(tl) => {
                let (tile, overlap) = tl.temporal;
                let time = Axis { tile, overlap, scale: Scale::FramesUp(frames_per) };
                let scale = Scale::Up(vae.net.downscale());
                let family = vae.net.family();
                let mut run = |s: &Tensor| clip_pass(compute, vae, Direction::Decode, s, ctx);
                let rgb = tiled_pass(
                    family,
                    &sample,
                    (tl.tile, tl.overlap),
                    scale,
                    Some(time),
                    &mut run,
                )?;
                clip_images(&rgb)?
            }
        };
        images.push(frames);
    }
    join_images(images)
}

/// `VAEEncode`: images to latents (VAE space). Sizes that are not multiples of the VAE's downscale (8; 16 for
/// FLUX.2's) are cropped to them, centred, as ComfyUI does.
pub(super) struct VaeEncode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl VaeEncode {
    pub(super) fn new(compute: Arc<Compute>) -> VaeEncode {
        VaeEncode { spec: Arc::new(model_specs::vae_encode()), compute }
    }
}

impl Node for VaeEncode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let latent = encode(&self.compute, inputs.vae("vae")?, inputs.image("pixels")?, ctx)?;
        Ok(NodeResult::values([Value::Latent(Latent::new(latent))]))
    }
}

/// `VAEDecodeTiled` and `VAEEncodeTiled` (ComfyUI's `nodes.py`): the plain passes tile by tile; a clip through
/// a video VAE in time too (`temporal_size` and `temporal_overlap` frames), as ComfyUI's 3-D tiling does. An
/// image VAE, or an image, has nothing to tile in time.
pub(super) struct VaeTiled {
    spec: Arc<NodeSpec>,
    direction: Direction,
    compute: Arc<Compute>,
}

impl VaeTiled {
    /// `VAEDecodeTiled` ("VAE Decode (Tiled)").
    pub(super) fn decode(compute: Arc<Compute>) -> VaeTiled {
        let spec =
            tiled_spec("VAEDecodeTiled", "VAE Decode (Tiled)", ("samples", "LATENT"), 32, "decode")
                .output(OutputDef::new("IMAGE"));
        VaeTiled { spec: Arc::new(spec), direction: Direction::Decode, compute }
    }

    /// `VAEEncodeTiled` ("VAE Encode (Tiled)").
    pub(super) fn encode(compute: Arc<Compute>) -> VaeTiled {
        let spec =
            tiled_spec("VAEEncodeTiled", "VAE Encode (Tiled)", ("pixels", "IMAGE"), 64, "encode")
                .output(OutputDef::new("LATENT"));
        VaeTiled { spec: Arc::new(spec), direction: Direction::Encode, compute }
    }
}

/// A tiled VAE node's inputs: the data, the VAE, the tile size (in pixels, a multiple of `tile_step`), the
/// overlap and the two temporal settings.
fn tiled_spec(
    name: &str,
    display: &str,
    (data, ty): (&str, &str),
    tile_step: i64,
    verb: &str,
) -> NodeSpec {
    // Options in ComfyUI's order: default, min, max, step, tooltip, advanced.
    let int = |name: &str, default: i64, min: i64, step: i64, tooltip: Option<&str>| {
        let input = InputDef::int(name, default, min, 4096).option("step", step);
        let input = match tooltip {
            Some(text) => input.tooltip(text),
            None => input,
        };
        input.option("advanced", true)
    };
    let frames = format!("Only used for video VAEs: Amount of frames to {verb} at a time.");
    let overlap = "Only used for video VAEs: Amount of frames to overlap.";
    NodeSpec::new(name, display, "model/latent")
        .input(InputDef::typed(data, ty))
        .input(InputDef::typed("vae", "VAE"))
        .input(int("tile_size", 512, 64, tile_step, None))
        .input(int("overlap", 64, 0, 32, None))
        .input(int("temporal_size", 64, 8, 4, Some(&frames)))
        .input(int("temporal_overlap", 8, 4, 4, Some(overlap)))
        .aliases(&[])
}

impl Node for VaeTiled {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let int = |name: &str| -> Result<usize, NodeError> {
            Ok(usize::try_from(inputs.int(name)?).unwrap_or(0))
        };
        let (tile, overlap) = (int("tile_size")?, int("overlap")?);
        let (size, frames) = (int("temporal_size")?, int("temporal_overlap")?);
        let vae = inputs.vae("vae")?;
        Ok(NodeResult::values([match self.direction {
            Direction::Decode => {
                // As ComfyUI: the overlap at most a quarter of the tile, both in latent positions (pixels over
                // the VAE's downscale, 16 for FLUX.2's); the temporal overlap at most half the temporal size,
                // both in latent frames (frames over 4), at least 2 and 1.
                let overlap = if tile < overlap * 4 { tile / 4 } else { overlap };
                let ratio = vae.net.downscale();
                let frames = if size < frames * 2 { frames / 2 } else { frames };
                let per = vae.net.temporal_downscale().unwrap_or(1);
                let size = (size / per).max(2);
                let frames = (frames / per).min(size / 2).max(1);
                let tiling = Tiling {
                    tile: tile / ratio,
                    overlap: overlap / ratio,
                    temporal: (size, frames),
                };
                Value::Image(decode(&self.compute, inputs, ctx, Some(tiling))?)
            }
            Direction::Encode => {
                // As ComfyUI's `encode_tiled`: temporal tiles of whole latent frames (at least 2), overlapping
                // by at most half of them (at least one), in frames.
                let latent = latent_frames(size).max(2);
                let overlap_t = latent_frames(frames).min(latent / 2).max(1);
                let temporal = (decoded_frames(latent), decoded_frames(overlap_t));
                let tiling = Tiling { tile, overlap, temporal };
                let pixels = inputs.image("pixels")?;
                Value::Latent(Latent::new(encode_tiled(
                    &self.compute,
                    vae,
                    pixels,
                    ctx,
                    Some(tiling),
                )?))
            }
        }]))
    }
}

/// Images `[B, H, W, C]` in `[0, 1]` to latents (VAE space), as ComfyUI's `VAE.encode`: sizes that are not
/// multiples of the VAE's downscale (8; 16 for FLUX.2's and Wan 2.2's) are cropped to them, centred; channels
/// past the VAE's are dropped, and missing ones padded as ComfyUI pads them. An image VAE takes one image at a
/// time (`[B, C, h, w]`); a video VAE takes one image to `[1, C, h, w]` and more as one clip (see
/// [`encode_video`]).
pub(super) fn encode(
    compute: &Compute,
    vae: &Vae,
    pixels: &Tensor,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    encode_tiled(compute, vae, pixels, ctx, None)
}

/// The frames `frames` (an IMAGE `[N, H, W, C]` in `[0, 1]`) encoded by a video VAE (the Wan VAEs) as one clip
/// into `[1, C, ⌊(N − 1)/4⌋ + 1, h, w]` (VAE space), as ComfyUI's `VAE.encode` (the batch is time; frames
/// past the last 4k + 1 dropped; sizes centre-cropped), 1 then 4, 4, … frames at a time on the device. For the
/// Wan conditioning nodes.
pub(crate) fn encode_video(
    compute: &Compute,
    vae: &Vae,
    frames: &Tensor,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    video_vae(vae, "videos")?;
    encode_clip(compute, vae, &Pixels::of(vae, frames)?, ctx, None)
}

/// An IMAGE batch checked and cropped for a VAE: which pixels it reads, and how its channels are completed.
struct Pixels<'a> {
    pixels: &'a Tensor,
    batch: usize,
    /// Input height, width and channels.
    size: [usize; 3],
    /// The crop: top, left, height and width (multiples of the VAE's downscale).
    crop: [usize; 4],
    /// The VAE's channels, and what fills the ones the image lacks.
    channels: (usize, Option<f32>),
}

impl Pixels<'_> {
    /// `pixels` `[B, H, W, C]` for `vae`: the centre crop to its downscale, its channels (extra ones dropped,
    /// missing ones padded as ComfyUI pads them: an RGB image into an RGBA VAE gets an opaque alpha).
    fn of<'a>(vae: &Vae, pixels: &'a Tensor) -> Result<Pixels<'a>, NodeError> {
        let &[batch, h, w, c] = pixels.shape() else {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("expected an IMAGE [B, H, W, C], got {:?}", pixels.shape()),
            ));
        };
        let ratio = vae.net.downscale();
        let (eh, ew) = (h / ratio * ratio, w / ratio * ratio);
        if batch == 0 || eh == 0 || ew == 0 {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!(
                    "cannot encode {batch} image(s) of {w}×{h}: at least one of {ratio}×{ratio} is \
                     needed"
                ),
            ));
        }
        let (channels, pad) = vae.net.image_channels();
        if c < channels && pad.is_none() {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("this VAE encodes images of {channels} channels, got {c}"),
            ));
        }
        let crop = [(h - eh) / 2, (w - ew) / 2, eh, ew];
        Ok(Pixels { pixels, batch, size: [h, w, c], crop, channels: (channels, pad) })
    }

    /// Image `i`'s channel `ch` cropped, in [-1, 1], appended to `out`.
    fn plane(&self, i: usize, ch: usize, out: &mut Vec<f32>) {
        let [h, w, c] = self.size;
        let [top, left, eh, ew] = self.crop;
        for y in 0..eh {
            for x in 0..ew {
                let v = match ch < c {
                    true => self.pixels.data()[((i * h + y + top) * w + x + left) * c + ch],
                    false => self.channels.1.unwrap_or(0.0),
                };
                out.push(v * 2.0 - 1.0);
            }
        }
    }

    /// Image `i` as `[1, channels, h, w]` in [-1, 1].
    fn image(&self, i: usize) -> Result<Tensor, NodeError> {
        let [_, _, eh, ew] = self.crop;
        let channels = self.channels.0;
        let mut chw = Vec::with_capacity(channels * eh * ew);
        for ch in 0..channels {
            self.plane(i, ch, &mut chw);
        }
        Tensor::new(vec![1, channels, eh, ew], chw).map_err(|e| NodeError::new(e.to_string()))
    }

    /// The first `frames` images as one clip `[1, channels, frames, h, w]` in [-1, 1].
    fn clip(&self, frames: usize) -> Result<Tensor, NodeError> {
        let [_, _, eh, ew] = self.crop;
        let channels = self.channels.0;
        let mut values = Vec::with_capacity(channels * frames * eh * ew);
        for ch in 0..channels {
            for i in 0..frames {
                self.plane(i, ch, &mut values);
            }
        }
        Tensor::new(vec![1, channels, frames, eh, ew], values)
            .map_err(|e| NodeError::new(e.to_string()))
    }
}

/// [`encode`], with `tiling` (tile, overlap in pixels; temporal tile and overlap in frames) tile by tile as
/// ComfyUI's `VAE.encode_tiled`.
fn encode_tiled(
    compute: &Compute,
    vae: &Vae,
    pixels: &Tensor,
    ctx: &Context,
    tiling: Option<Tiling>,
) -> Result<Tensor, NodeError> {
    let pixels = Pixels::of(vae, pixels)?;
    if pixels.batch > 1 && vae.net.temporal_downscale().is_some() {
        return encode_clip(compute, vae, &pixels, ctx, tiling);
    }
    let mut latents = Vec::new();
    let mut latent_shape = Vec::new();
    for i in 0..pixels.batch {
        ctx.check_interrupt()?;
        let image = pixels.image(i)?;
        let mut run = |t: &Tensor| {
            ctx.check_interrupt()?;
            pass(compute, vae, Direction::Encode, t)
        };
        let latent = match tiling {
            None => run(&image)?,
            Some(t) => {
                let scale = Scale::Down(vae.net.downscale());
                tiled_pass(vae.net.family(), &image, (t.tile, t.overlap), scale, None, &mut run)?
            }
        };
        latent_shape = latent.shape().to_vec();
        latents.extend_from_slice(latent.data());
    }
    latent_shape[0] = pixels.batch;
    Tensor::new(latent_shape, latents).map_err(|e| NodeError::new(e.to_string()))
}

/// `pixels` as one clip through a video VAE → `[1, C, ⌊(N − 1)/4⌋ + 1, h, w]`; with `tiling`, tile by tile in
/// time and space as ComfyUI's `encode_tiled_3d` (the clip first cut to its last 4k + 1 frames).
fn encode_clip(
    compute: &Compute,
    vae: &Vae,
    pixels: &Pixels<'_>,
    ctx: &Context,
    tiling: Option<Tiling>,
) -> Result<Tensor, NodeError> {
    let frames_per = video_vae(vae, "videos")?;
    let mut run = |s: &Tensor| clip_pass(compute, vae, Direction::Encode, s, ctx);
    match tiling {
        None => run(&pixels.clip(pixels.batch)?),
        Some(tl) => {
            let clip = pixels.clip(decoded_frames(latent_frames(pixels.batch)))?;
            let (tile, overlap) = tl.temporal;
            let time = Axis { tile, overlap, scale: Scale::FramesDown(frames_per) };
            let scale = Scale::Down(vae.net.downscale());
            tiled_pass(vae.net.family(), &clip, (tl.tile, tl.overlap), scale, Some(time), &mut run)
        }
    }
}
