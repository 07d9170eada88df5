//! Upscale models (`comfy_extras.nodes_upscale_model`): `UpscaleModelLoader` loads one from `upscale_models/`
//! (ESRGAN's RRDBNet, [`kiln_models::esrgan`]), and `ImageUpscaleWithModel` runs each image through it in
//! ComfyUI's tiles (512 pixels overlapping by 32, blended as `comfy.utils.tiled_scale` does), each tile's
//! output clamped to [0, 1] (spandrel's call), the result clamped again.

use std::sync::Arc;

use kiln_compute::{Backend, DType};

use super::loaders::{find, progress};
use super::tiled::{Axis, Scale, tile_count, tiled_scale};
use crate::compute::Compute;
use crate::models::device::{OnDevice, on_device};
use crate::models::{ModelEnv, UpscaleModel, load};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's module of these nodes.
const MODULE: &str = "comfy_extras.nodes_upscale_model";
/// `ImageUpscaleWithModel`'s tile side and overlap, in input pixels.
const TILE: usize = 512;
const OVERLAP: usize = 32;

/// `UpscaleModelLoader`: an upscale model from `upscale_models/`.
pub(super) struct UpscaleModelLoader(pub(super) ModelEnv);

impl Node for UpscaleModelLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("upscale_models");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("UpscaleModelLoader", "Load Upscale Model", "model/loaders")
                .python_module(MODULE)
                .v3()
                .input(InputDef::v3_combo("model_name", &files))
                .output(OutputDef::new("UPSCALE_MODEL"))
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "upscale_models", inputs, "model_name")?;
        let net =
            load::load_upscale_model(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::UpscaleModel(Arc::new(net))]))
    }
}

/// `ImageUpscaleWithModel`.
pub(super) struct ImageUpscaleWithModel {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ImageUpscaleWithModel {
    pub(super) fn new(compute: Arc<Compute>) -> ImageUpscaleWithModel {
        let spec = NodeSpec::new(
            "ImageUpscaleWithModel",
            "Upscale Image (using Model)",
            "image/upscaling",
        )
        .python_module(MODULE)
        .v3()
        .aliases(&[
            "upscale",
            "upscaler",
            "upsc",
            "enlarge image",
            "super resolution",
            "hires",
            "superres",
            "increase resolution",
        ])
        .input(InputDef::typed("upscale_model", "UPSCALE_MODEL"))
        .input(InputDef::typed("image", "IMAGE"))
        .output(OutputDef::new("IMAGE"));
        ImageUpscaleWithModel { spec: Arc::new(spec), compute }
    }
}

impl Node for ImageUpscaleWithModel {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.upscale_model("upscale_model")?;
        let image = inputs.image("image")?;
        let out = upscale(&self.compute, model, image, &mut |done, total| {
            ctx.progress(done as f64, total as f64)
        })?;
        Ok(NodeResult::values([Value::Image(out)]))
    }
}

/// `image` `[B, H, W, C]` through `model`, tile by tile, as `ImageUpscaleWithModel` runs it: `[B, s·H, s·W, C]`
/// in [0, 1]. `progress` hears (tiles done, tiles) after each tile.
fn upscale(
    compute: &Compute,
    model: &UpscaleModel,
    image: &Tensor,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Tensor, NodeError> {
    let &[batch, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!("an IMAGE [B, H, W, C], got {:?}", image.shape())));
    };
    let config = model.net.config;
    if c != config.in_channels {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "the upscale model reads images of {} channels, got {c}: convert the image to RGB",
                config.in_channels
            ),
        ));
    }
    let scale = config.scale();
    let axis = Axis { tile: TILE, overlap: OVERLAP, scale: Scale::Up(scale) };
    let total = batch * tile_count(&[h, w], &[axis, axis]);
    let mut done = 0;
    let plane = h * w;
    let mut out = Vec::with_capacity(image.data().len() * scale * scale);
    for sample in image.data().chunks_exact(plane * c) {
        // NHWC → [1, C, H, W].
        let mut chw = vec![0f32; plane * c];
        for (p, pixel) in sample.chunks_exact(c).enumerate() {
            for (ch, v) in pixel.iter().enumerate() {
                chw[ch * plane + p] = *v;
            }
        }
        let chw = Tensor::new(vec![1, c, h, w], chw).map_err(|e| NodeError::new(e.to_string()))?;
        let mut pass = |tile: &Tensor| -> Result<Tensor, NodeError> {
            let up = on_device(compute.device(), Upscale { model, tile }).map_err(node_error)?;
            done += 1;
            progress(done, total);
            Ok(up)
        };
        let up = tiled_scale(&chw, &[axis, axis], &mut pass)?;
        let (oc, oh, ow) = (up.shape()[1], up.shape()[2], up.shape()[3]);
        let oplane = oh * ow;
        for p in 0..oplane {
            out.extend((0..oc).map(|ch| up.data()[ch * oplane + p].clamp(0.0, 1.0)));
        }
    }
    Tensor::new(vec![batch, h * scale, w * scale, config.out_channels], out)
        .map_err(|e| NodeError::new(e.to_string()))
}

/// One tile `[1, C, h, w]` through the model, its output clamped to [0, 1] (spandrel's call).
struct Upscale<'a> {
    model: &'a UpscaleModel,
    tile: &'a Tensor,
}

impl OnDevice for Upscale<'_> {
    type Output = Result<Tensor, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        // As ComfyUI loads the model before it upscales: top residency priority.
        self.model.net.weights.activate()?;
        let x = b.from_f32(self.tile.shape(), self.tile.data(), DType::F32)?;
        let y = self.model.net.forward(b, &x)?;
        let values = b.to_f32(&b.cast(&y, DType::F32)?)?.into_iter().map(|v| v.clamp(0.0, 1.0));
        Tensor::new(y.shape().to_vec(), values.collect())
            .map_err(|e| kiln_models::Error::Invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's `ImageUpscaleWithModel` on spandrel's RRDBNet (`scripts/reference/esrgan.py`): an image batch
    /// within one tile, and an image wider than a tile (two tiles blended).
    #[test]
    fn images_upscale_tile_by_tile_as_comfyui_does() {
        let dir = std::env::temp_dir().join(format!("kiln-upscale-{}", std::process::id()));
        let models = dir.join("upscale_models");
        std::fs::create_dir_all(&models).unwrap();
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/esrgan/weights.safetensors");
        std::fs::copy(&source, models.join("esrgan.safetensors")).unwrap();
        let env = ModelEnv::cpu(&dir);
        let model =
            load::load_upscale_model(&env, &models.join("esrgan.safetensors"), &mut |_, _| {})
                .unwrap();
        let io = crate::fixtures::tensors("esrgan/io.safetensors");
        for (input, want, tiles) in [("image", "out", 2), ("wide", "wide_out", 2)] {
            let mut seen = Vec::new();
            let out = upscale(&env.compute, &model, &io[input], &mut |done, total| {
                seen.push((done, total))
            })
            .unwrap();
            assert_eq!(out.shape(), io[want].shape(), "{input}");
            let worst = out
                .data()
                .iter()
                .zip(io[want].data())
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-4, "{input}: max |difference| {worst}");
            assert_eq!(seen.last(), Some(&(tiles, tiles)), "{input}: one tick per tile");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
