//! Image nodes: ImageScale, ImageScaleBy, ImageInvert, ImageBlend, ImageBatch, EmptyImage, GetImageSize.

use std::sync::Arc;

use super::resize::{METHODS, resize};
use crate::nodes::{
    Context, ErrorKind, Hidden, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// An IMAGE's `(batch, height, width, channels)`, or an error naming the shape it has instead.
pub(super) fn dims(image: &Tensor) -> Result<(usize, usize, usize, usize), NodeError> {
    match image.shape() {
        [b, h, w, c] => Ok((*b, *h, *w, *c)),
        other => Err(NodeError::new(format!("expected an IMAGE [B, H, W, C], got {other:?}"))),
    }
}

fn size(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    usize::try_from(inputs.int(name)?).map_err(|_| {
        NodeError::of_kind(ErrorKind::InvalidValue, format!("{name} must not be negative"))
    })
}

/// `ImageScale`: resizes to a width and height (0 keeps the aspect ratio from the other side).
pub(super) struct ImageScale(Arc<NodeSpec>);

impl ImageScale {
    pub(super) fn new() -> ImageScale {
        ImageScale(Arc::new(
            NodeSpec::new("ImageScale", "Upscale Image", "image/upscaling")
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::choices("upscale_method", &METHODS))
                .input(InputDef::int("width", 512, 0, 16384).option("step", 1))
                .input(InputDef::int("height", 512, 0, 16384).option("step", 1))
                .input(InputDef::choices("crop", &["disabled", "center"]))
                .output(OutputDef::new("IMAGE"))
                .aliases(&[
                    "resize",
                    "resize image",
                    "scale image",
                    "image resize",
                    "zoom",
                    "zoom in",
                    "change size",
                ])
                .essentials("Image Tools"),
        ))
    }
}

impl Node for ImageScale {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let image = inputs.image("image")?;
        let (_, h, w, _) = dims(image)?;
        let (mut width, mut height) = (size(inputs, "width")?, size(inputs, "height")?);
        if width == 0 && height == 0 {
            return Ok(NodeResult::values([Value::Image(image.clone())]));
        }
        if width == 0 {
            width = ((w as f64 * height as f64 / h as f64).round() as usize).max(1);
        } else if height == 0 {
            height = ((h as f64 * width as f64 / w as f64).round() as usize).max(1);
        }
        let crop = inputs.string("crop")? == "center";
        let out = resize(image, width, height, inputs.string("upscale_method")?, crop)?;
        Ok(NodeResult::values([Value::Image(out)]))
    }
}

/// `ImageScaleBy`: resizes by a factor.
pub(super) struct ImageScaleBy(Arc<NodeSpec>);

impl ImageScaleBy {
    pub(super) fn new() -> ImageScaleBy {
        ImageScaleBy(Arc::new(
            NodeSpec::new("ImageScaleBy", "Upscale Image By", "image/upscaling")
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::choices("upscale_method", &METHODS))
                .input(InputDef::float("scale_by", 1.0, 0.01, 8.0).option("step", 0.01))
                .output(OutputDef::new("IMAGE"))
                .essentials("Image Tools"),
        ))
    }
}

impl Node for ImageScaleBy {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let image = inputs.image("image")?;
        let (_, h, w, _) = dims(image)?;
        let scale = inputs.float("scale_by")?;
        let width = ((w as f64 * scale).round() as usize).max(1);
        let height = ((h as f64 * scale).round() as usize).max(1);
        let out = resize(image, width, height, inputs.string("upscale_method")?, false)?;
        Ok(NodeResult::values([Value::Image(out)]))
    }
}

/// `ImageInvert`: `1 - x`.
pub(super) struct ImageInvert(Arc<NodeSpec>);

impl ImageInvert {
    pub(super) fn new() -> ImageInvert {
        ImageInvert(Arc::new(
            NodeSpec::new("ImageInvert", "Invert Image Colors", "image/color")
                .input(InputDef::typed("image", "IMAGE"))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["reverse colors"])
                .essentials("Image Tools"),
        ))
    }
}

impl Node for ImageInvert {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        Ok(NodeResult::values([Value::Image(inputs.image("image")?.map(|v| 1.0 - v))]))
    }
}

/// `ImageBlend`: blends two images with a mode and a factor.
pub(super) struct ImageBlend(Arc<NodeSpec>);

const BLEND_MODES: [&str; 6] =
    ["normal", "multiply", "screen", "overlay", "soft_light", "difference"];

impl ImageBlend {
    pub(super) fn new() -> ImageBlend {
        ImageBlend(Arc::new(
            NodeSpec::new("ImageBlend", "Blend Images", "image/filters")
                .python_module("comfy_extras.nodes_post_processing")
                .v3()
                .input(InputDef::typed("image1", "IMAGE"))
                .input(InputDef::typed("image2", "IMAGE"))
                .input(InputDef::float("blend_factor", 0.5, 0.0, 1.0).option("step", 0.01))
                .input(InputDef::v3_combo("blend_mode", &BLEND_MODES))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["mix images"])
                .essentials("Image Tools"),
        ))
    }
}

fn blend(mode: &str, a: f32, b: f32) -> f32 {
    match mode {
        "multiply" => a * b,
        "screen" => 1.0 - (1.0 - a) * (1.0 - b),
        "overlay" => {
            if a <= 0.5 {
                2.0 * a * b
            } else {
                1.0 - 2.0 * (1.0 - a) * (1.0 - b)
            }
        }
        "soft_light" => {
            if b <= 0.5 {
                a - (1.0 - 2.0 * b) * a * (1.0 - a)
            } else {
                let d = if a <= 0.25 { ((16.0 * a - 12.0) * a + 4.0) * a } else { a.sqrt() };
                a + (2.0 * b - 1.0) * (d - a)
            }
        }
        "difference" => a - b,
        _ => b,
    }
}

impl Node for ImageBlend {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let a = inputs.image("image1")?;
        let mut b = inputs.image("image2")?.clone();
        let (batch, h, w, c) = dims(a)?;
        if b.shape()[1..3] != a.shape()[1..3] {
            b = resize(&b, w, h, "bicubic", true)?;
        }
        if dims(&b)?.3 != c {
            return Err(NodeError::new("the images have different channel counts"));
        }
        let factor = inputs.float("blend_factor")? as f32;
        let mode = inputs.string("blend_mode")?;
        let per_image = h * w * c;
        let b_batch = dims(&b)?.0.max(1);
        let data: Vec<f32> = (0..batch * per_image)
            .map(|i| {
                let x = a.data()[i];
                let y = b.data()[((i / per_image) % b_batch) * per_image + i % per_image];
                (x * (1.0 - factor) + blend(mode, x, y) * factor).clamp(0.0, 1.0)
            })
            .collect();
        let out =
            Tensor::new(a.shape().to_vec(), data).map_err(|e| NodeError::new(e.to_string()))?;
        Ok(NodeResult::values([Value::Image(out)]))
    }
}

/// `ImageBatch`: concatenates two batches (the second is resized to the first's size when they differ).
pub(super) struct ImageBatch(Arc<NodeSpec>);

impl ImageBatch {
    pub(super) fn new() -> ImageBatch {
        ImageBatch(Arc::new(
            NodeSpec::new("ImageBatch", "Batch Images (DEPRECATED)", "image/batch")
                .deprecated()
                .input(InputDef::typed("image1", "IMAGE"))
                .input(InputDef::typed("image2", "IMAGE"))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["combine images", "merge images", "stack images"]),
        ))
    }
}

impl Node for ImageBatch {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let a = inputs.image("image1")?;
        let mut b = inputs.image("image2")?.clone();
        let (_, h, w, _) = dims(a)?;
        if b.shape()[1..3] != a.shape()[1..3] {
            b = resize(&b, w, h, "bilinear", true)?;
        }
        let out = Tensor::concat_batch(&[a, &b]).map_err(|e| NodeError::new(e.to_string()))?;
        Ok(NodeResult::values([Value::Image(out)]))
    }
}

/// `EmptyImage`: a batch of one color.
pub(super) struct EmptyImage(Arc<NodeSpec>);

impl EmptyImage {
    pub(super) fn new() -> EmptyImage {
        EmptyImage(Arc::new(
            NodeSpec::new("EmptyImage", "Empty Image", "image")
                .input(InputDef::int("width", 512, 1, 16384).option("step", 1))
                .input(InputDef::int("height", 512, 1, 16384).option("step", 1))
                .input(InputDef::int("batch_size", 1, 1, 4096))
                .input(
                    InputDef::int("color", 0, 0, 0xFF_FFFF)
                        .option("step", 1)
                        .option("display", "color"),
                )
                .output(OutputDef::new("IMAGE")),
        ))
    }
}

impl Node for EmptyImage {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let (w, h, b) =
            (size(inputs, "width")?, size(inputs, "height")?, size(inputs, "batch_size")?);
        let color = inputs.int("color")?;
        let rgb = [
            ((color >> 16) & 0xFF) as f32 / 255.0,
            ((color >> 8) & 0xFF) as f32 / 255.0,
            (color & 0xFF) as f32 / 255.0,
        ];
        let data: Vec<f32> = (0..b * h * w).flat_map(|_| rgb).collect();
        let out = Tensor::new(vec![b, h, w, 3], data).map_err(|e| NodeError::new(e.to_string()))?;
        Ok(NodeResult::values([Value::Image(out)]))
    }
}

/// `GetImageSize`: width, height and batch size.
pub(super) struct GetImageSize(Arc<NodeSpec>);

impl GetImageSize {
    pub(super) fn new() -> GetImageSize {
        GetImageSize(Arc::new(
            NodeSpec::new("GetImageSize", "Get Image Size", "image")
                .description(
                    "Returns width and height of the image, and passes it through unchanged.",
                )
                .python_module("comfy_extras.nodes_images")
                .v3()
                .input(InputDef::typed("image", "IMAGE"))
                .hidden("unique_id", Hidden::UniqueId)
                .output(OutputDef::new("INT").named("width"))
                .output(OutputDef::new("INT").named("height"))
                .output(OutputDef::new("INT").named("batch_size"))
                .aliases(&["dimensions", "resolution", "image info"]),
        ))
    }
}

impl Node for GetImageSize {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let (b, h, w, _) = dims(inputs.image("image")?)?;
        Ok(NodeResult::values([Value::Int(w as i64), Value::Int(h as i64), Value::Int(b as i64)]))
    }
}
