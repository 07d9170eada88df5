//! VAE nodes: `VAEDecode` (latent → IMAGE) and `VAEEncode` (IMAGE → latent), and their tiled forms
//! `VAEDecodeTiled` and `VAEEncodeTiled` ([`super::tiled`]). One image of the batch at a time, so a batch
//! costs no more device memory than one image (a tiled pass: than one tile).

use std::sync::Arc;

use kiln_compute::{Backend, DType};

use super::latent::transpose;
use super::model_specs;
use super::tiled::{Scale, tiled_pass};
use crate::compute::Compute;
use crate::models::Vae;
use crate::models::device::{OnDevice, on_device};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// Which way through the VAE.
#[derive(Clone, Copy)]
enum Direction {
    Decode,
    Encode,
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

/// The `samples` input decoded with the `vae` input to images in `[0, 1]`, channels last; with `tiling`
/// (tile, overlap in latent positions), tile by tile as ComfyUI's `VAE.decode_tiled`.
fn decode(
    compute: &Compute,
    inputs: &Inputs,
    ctx: &Context,
    tiling: Option<(usize, usize)>,
) -> Result<Tensor, NodeError> {
    let vae = inputs.vae("vae")?;
    let samples = &inputs.latent("samples")?.samples;
    // A latent with one frame (`[B, C, 1, H, W]`, as Qwen-Image-Layered's are after LatentCutToBatch) is an
    // image latent; more frames are a video, which Kiln's VAEs do not decode yet.
    let (batch, channels, h, w) = match *samples.shape() {
        [batch, channels, h, w] | [batch, channels, 1, h, w] => (batch, channels, h, w),
        ref other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!(
                    "expected a LATENT [B, C, H, W] or one frame [B, C, 1, H, W], got {other:?} (video \
                     latents are not decoded yet)"
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
            Some((tile, overlap)) => {
                let scale = Scale::Up(vae.net.downscale());
                tiled_pass(vae.net.family(), &latent, tile, overlap, scale, &mut run)?
            }
        };
        // [1, C, H, W] in [-1, 1] → [1, H, W, C] in [0, 1].
        images.push(transpose(&rgb.map(|v| ((v + 1.0) / 2.0).clamp(0.0, 1.0)), true)?);
    }
    if images.is_empty() {
        Tensor::new(vec![0, 0, 0, 3], Vec::new())
    } else {
        Tensor::concat_batch(&images.iter().collect::<Vec<_>>())
    }
    .map_err(|e| NodeError::new(e.to_string()))
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

/// `VAEDecodeTiled` and `VAEEncodeTiled` (ComfyUI's `nodes.py`): the plain passes tile by tile. Only image
/// latents exist in Kiln yet, so the temporal inputs are accepted and have nothing to tile.
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
        let tile = usize::try_from(inputs.int("tile_size")?).unwrap_or(0);
        let overlap = usize::try_from(inputs.int("overlap")?).unwrap_or(0);
        Ok(NodeResult::values([match self.direction {
            Direction::Decode => {
                // As ComfyUI: the overlap at most a quarter of the tile, both in latent positions (pixels over
                // the VAE's downscale, 16 for FLUX.2's).
                let overlap = if tile < overlap * 4 { tile / 4 } else { overlap };
                let ratio = inputs.vae("vae")?.net.downscale();
                let tiling = Some((tile / ratio, overlap / ratio));
                Value::Image(decode(&self.compute, inputs, ctx, tiling)?)
            }
            Direction::Encode => {
                let (vae, pixels) = (inputs.vae("vae")?, inputs.image("pixels")?);
                let latent = encode_tiled(&self.compute, vae, pixels, ctx, Some((tile, overlap)))?;
                Value::Latent(Latent::new(latent))
            }
        }]))
    }
}

/// Images `[B, H, W, C]` in `[0, 1]` to latents (VAE space), one image at a time, as ComfyUI's `VAE.encode`:
/// sizes that are not multiples of the VAE's downscale (8; 16 for FLUX.2's) are cropped to them, centred;
/// channels past the VAE's are dropped, and missing ones padded as ComfyUI pads them.
pub(super) fn encode(
    compute: &Compute,
    vae: &Vae,
    pixels: &Tensor,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    encode_tiled(compute, vae, pixels, ctx, None)
}

/// [`encode`], with `tiling` (tile, overlap in pixels) tile by tile as ComfyUI's `VAE.encode_tiled`.
fn encode_tiled(
    compute: &Compute,
    vae: &Vae,
    pixels: &Tensor,
    ctx: &Context,
    tiling: Option<(usize, usize)>,
) -> Result<Tensor, NodeError> {
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
                "cannot encode {batch} image(s) of {w}×{h}: at least one of {ratio}×{ratio} is needed"
            ),
        ));
    }
    let (top, left) = ((h - eh) / 2, (w - ew) / 2);
    // The VAE's channels: extra ones dropped, missing ones padded as ComfyUI pads them (an RGB image into an
    // RGBA VAE gets an opaque alpha).
    let (channels, pad) = vae.net.image_channels();
    if c < channels && pad.is_none() {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("this VAE encodes images of {channels} channels, got {c}"),
        ));
    }
    let mut latents = Vec::new();
    let mut latent_shape = Vec::new();
    for i in 0..batch {
        ctx.check_interrupt()?;
        // [H, W, C] in [0, 1] → [1, channels, H, W] in [-1, 1].
        let mut chw = vec![0f32; channels * eh * ew];
        for (ch, plane) in chw.chunks_exact_mut(eh * ew).enumerate() {
            for y in 0..eh {
                for x in 0..ew {
                    let v = match ch < c {
                        true => pixels.data()[((i * h + y + top) * w + x + left) * c + ch],
                        false => pad.unwrap_or(0.0),
                    };
                    plane[y * ew + x] = v * 2.0 - 1.0;
                }
            }
        }
        let image = Tensor::new(vec![1, channels, eh, ew], chw)
            .map_err(|e| NodeError::new(e.to_string()))?;
        let mut run = |t: &Tensor| {
            ctx.check_interrupt()?;
            pass(compute, vae, Direction::Encode, t)
        };
        let latent = match tiling {
            None => run(&image)?,
            Some((tile, overlap)) => {
                let scale = Scale::Down(vae.net.downscale());
                tiled_pass(vae.net.family(), &image, tile, overlap, scale, &mut run)?
            }
        };
        latent_shape = latent.shape().to_vec();
        latents.extend_from_slice(latent.data());
    }
    latent_shape[0] = batch;
    Tensor::new(latent_shape, latents).map_err(|e| NodeError::new(e.to_string()))
}
