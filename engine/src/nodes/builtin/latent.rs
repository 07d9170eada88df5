//! Latent nodes: EmptyLatentImage and LatentUpscale. A latent is `[B, 4, H/8, W/8]`.

use std::sync::Arc;

use super::resize::resize;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// `EmptyLatentImage`: zeros of the size of a `width` × `height` image.
pub(super) struct EmptyLatentImage(Arc<NodeSpec>);

impl EmptyLatentImage {
    pub(super) fn new() -> EmptyLatentImage {
        EmptyLatentImage(Arc::new(
            NodeSpec::new("EmptyLatentImage", "Empty Latent Image", "model/latent")
                .description(
                    "Create a new batch of empty latent images to be denoised via sampling.",
                )
                .input(
                    InputDef::int("width", 512, 16, 16384)
                        .option("step", 8)
                        .tooltip("The width of the latent images in pixels."),
                )
                .input(
                    InputDef::int("height", 512, 16, 16384)
                        .option("step", 8)
                        .tooltip("The height of the latent images in pixels."),
                )
                .input(
                    InputDef::int("batch_size", 1, 1, 4096)
                        .tooltip("The number of latent images in the batch."),
                )
                .output(OutputDef::new("LATENT").tooltip("The empty latent image batch."))
                .aliases(&[
                    "empty",
                    "empty latent",
                    "new latent",
                    "create latent",
                    "blank latent",
                    "blank",
                ]),
        ))
    }
}

impl Node for EmptyLatentImage {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        empty_latent(inputs, 4)
    }
}

/// Zeros of `channels` latent channels the size of a `width` × `height` image, `batch_size` of them (an
/// eighth of the pixels on each side).
pub(super) fn empty_latent(inputs: &Inputs, channels: i64) -> Result<NodeResult, NodeError> {
    let (w, h, b) = (inputs.int("width")?, inputs.int("height")?, inputs.int("batch_size")?);
    let shape = [b, channels, h / 8, w / 8].map(|d| usize::try_from(d).unwrap_or(0));
    Ok(NodeResult::values([Value::Latent(Tensor::full(shape.to_vec(), 0.0))]))
}

/// `LatentUpscale`: resizes a latent to the size of a `width` × `height` image.
pub(super) struct LatentUpscale(Arc<NodeSpec>);

impl LatentUpscale {
    pub(super) fn new() -> LatentUpscale {
        LatentUpscale(Arc::new(
            NodeSpec::new("LatentUpscale", "Upscale Latent", "model/latent")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::choices(
                    "upscale_method",
                    &["nearest-exact", "bilinear", "area", "bicubic", "bislerp"],
                ))
                .input(InputDef::int("width", 512, 0, 16384).option("step", 8))
                .input(InputDef::int("height", 512, 0, 16384).option("step", 8))
                .input(InputDef::choices("crop", &["disabled", "center"]))
                .output(OutputDef::new("LATENT"))
                .aliases(&["enlarge latent", "resize latent"]),
        ))
    }
}

/// `[B, C, H, W]` ↔ `[B, H, W, C]`.
pub(super) fn transpose(t: &Tensor, to_channels_last: bool) -> Result<Tensor, NodeError> {
    let s = t.shape();
    let [b, d1, d2, d3] = [s[0], s[1], s[2], s[3]];
    let (c, h, w) = if to_channels_last { (d1, d2, d3) } else { (d3, d1, d2) };
    let mut out = vec![0.0; t.data().len()];
    for bi in 0..b {
        for ci in 0..c {
            for y in 0..h {
                for x in 0..w {
                    let chw = ((bi * c + ci) * h + y) * w + x;
                    let hwc = ((bi * h + y) * w + x) * c + ci;
                    if to_channels_last {
                        out[hwc] = t.data()[chw]
                    } else {
                        out[chw] = t.data()[hwc]
                    }
                }
            }
        }
    }
    let shape = if to_channels_last { vec![b, h, w, c] } else { vec![b, c, h, w] };
    Tensor::new(shape, out).map_err(|e| NodeError::new(e.to_string()))
}

impl Node for LatentUpscale {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let samples = inputs.latent("samples")?;
        if samples.shape().len() != 4 {
            return Err(NodeError::new(format!(
                "expected a LATENT [B, C, H, W], got {:?}",
                samples.shape()
            )));
        }
        let (h, w) = (samples.dim(2), samples.dim(3));
        let (mut width, mut height) =
            (inputs.int("width")?.max(0) as usize / 8, inputs.int("height")?.max(0) as usize / 8);
        if width == 0 && height == 0 {
            return Ok(NodeResult::values([Value::Latent(samples.clone())]));
        }
        if width == 0 {
            width = ((w * height) as f64 / h as f64).round().max(1.0) as usize;
        } else if height == 0 {
            height = ((h * width) as f64 / w as f64).round().max(1.0) as usize;
        }
        let channels_last = transpose(samples, true)?;
        let crop = inputs.string("crop")? == "center";
        let resized =
            resize(&channels_last, width, height, inputs.string("upscale_method")?, crop)?;
        Ok(NodeResult::values([Value::Latent(transpose(&resized, false)?)]))
    }
}
