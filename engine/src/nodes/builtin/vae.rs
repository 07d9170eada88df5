//! VAE nodes: `VAEDecode` (latent → IMAGE) and `VAEEncode` (IMAGE → latent). One image of the batch at a
//! time, so a batch costs no more device memory than one image.

use std::sync::Arc;

use kiln_compute::{Backend, DType};

use super::latent::transpose;
use super::model_specs;
use crate::compute::Compute;
use crate::models::Vae;
use crate::models::device::{OnDevice, on_device};
use crate::nodes::error::node_error;
use crate::nodes::{Context, ErrorKind, Inputs, Node, NodeError, NodeResult, NodeSpec};
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
        let vae = inputs.vae("vae")?;
        let samples = &inputs.latent("samples")?.samples;
        let &[batch, channels, h, w] = samples.shape() else {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("expected a LATENT [B, C, H, W], got {:?}", samples.shape()),
            ));
        };
        let per = channels * h * w;
        let mut images = Vec::with_capacity(batch);
        for i in 0..batch {
            ctx.check_interrupt()?;
            let pass = Pass {
                vae,
                direction: Direction::Decode,
                shape: [1, channels, h, w],
                values: &samples.data()[i * per..(i + 1) * per],
            };
            let (shape, rgb) = on_device(self.compute.device(), pass).map_err(node_error)?;
            // [1, 3, H, W] in [-1, 1] → [1, H, W, 3] in [0, 1].
            let rgb = Tensor::new(shape, rgb).map_err(|e| NodeError::new(e.to_string()))?;
            images.push(transpose(&rgb.map(|v| ((v + 1.0) / 2.0).clamp(0.0, 1.0)), true)?);
        }
        let image = if images.is_empty() {
            Tensor::new(vec![0, 0, 0, 3], Vec::new())
        } else {
            Tensor::concat_batch(&images.iter().collect::<Vec<_>>())
        }
        .map_err(|e| NodeError::new(e.to_string()))?;
        Ok(NodeResult::values([Value::Image(image)]))
    }
}

/// `VAEEncode`: images to latents (VAE space). Sizes that are not multiples of 8 are cropped to them,
/// centred, as ComfyUI does.
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

/// Images `[B, H, W, C]` in `[0, 1]` to latents (VAE space), one image at a time, as ComfyUI's `VAE.encode`:
/// sizes that are not multiples of 8 are cropped to them, centred; channels past RGB are dropped.
pub(super) fn encode(
    compute: &Compute,
    vae: &Vae,
    pixels: &Tensor,
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    let &[batch, h, w, c] = pixels.shape() else {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("expected an IMAGE [B, H, W, C], got {:?}", pixels.shape()),
        ));
    };
    let (eh, ew) = (h / 8 * 8, w / 8 * 8);
    if batch == 0 || eh == 0 || ew == 0 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("cannot encode {batch} image(s) of {w}×{h}: at least one of 8×8 is needed"),
        ));
    }
    let (top, left) = ((h - eh) / 2, (w - ew) / 2);
    let mut latents = Vec::new();
    let mut latent_shape = Vec::new();
    for i in 0..batch {
        ctx.check_interrupt()?;
        // [H, W, C] in [0, 1] → [1, 3, H, W] in [-1, 1].
        let mut chw = vec![0f32; 3 * eh * ew];
        for ch in 0..3.min(c) {
            for y in 0..eh {
                for x in 0..ew {
                    let v = pixels.data()[((i * h + y + top) * w + x + left) * c + ch];
                    chw[(ch * eh + y) * ew + x] = v * 2.0 - 1.0;
                }
            }
        }
        let pass = Pass { vae, direction: Direction::Encode, shape: [1, 3, eh, ew], values: &chw };
        let (shape, latent) = on_device(compute.device(), pass).map_err(node_error)?;
        latent_shape = shape;
        latents.extend(latent);
    }
    latent_shape[0] = batch;
    Tensor::new(latent_shape, latents).map_err(|e| NodeError::new(e.to_string()))
}
