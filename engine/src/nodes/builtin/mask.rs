//! Mask and image-batch nodes (V3 classes): `ImageToMask`, `MaskToImage`, `InvertMask`, `SolidMask`
//! (`comfy_extras.nodes_mask`), `JoinImageWithAlpha` (`comfy_extras.nodes_compositing`), `ImageFromBatch`,
//! `RepeatImageBatch` (`comfy_extras.nodes_images`) and `ImageScaleToTotalPixels`
//! (`comfy_extras.nodes_post_processing`).
//!
//! An IMAGE is `[B, H, W, C]` and a MASK `[B, H, W]`, both f32 in 0..=1.

use super::image::dims;
use super::pure::Pure;
use super::resize::{METHODS, resize};
use crate::nodes::{ErrorKind, InputDef, Inputs, MATCHTYPE, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// A V3 node of `module` in `category`.
fn spec(name: &str, display: &str, category: &str, module: &str) -> NodeSpec {
    NodeSpec::new(name, display, category).python_module(module).v3()
}

/// `ResizeImageMaskNode`'s declaration: the input matched to the output's type, the resize type with the
/// inputs each brings, the scale method.
fn resize_image_mask_spec() -> NodeSpec {
    let size = |name: &str, tooltip: &str, default: i64, min: i64| {
        InputDef::bare(name, "INT")
            .tooltip(tooltip)
            .option("default", default)
            .option("min", min)
            .option("max", 16384)
            .option("step", 1)
    };
    let crop = || {
        InputDef::bare("crop", "COMBO")
            .tooltip(
                "How to handle aspect ratio mismatch: 'disabled' stretches to fit, 'center' crops to \
                 maintain aspect ratio.",
            )
            .option("default", "center")
            .option("multiselect", false)
            .option("options", vec!["disabled", "center"])
    };
    let float = |name: &str, tooltip: &str, min: f64, max: f64| {
        InputDef::bare(name, "FLOAT")
            .tooltip(tooltip)
            .option("default", 1.0)
            .option("min", min)
            .option("max", max)
            .option("step", 0.01)
    };
    let options = [
        (
            RESIZE_TYPES[0],
            vec![
                size(
                    "width",
                    "Target width in pixels. Set to 0 to auto-calculate from height while preserving aspect ratio.",
                    512,
                    0,
                ),
                size(
                    "height",
                    "Target height in pixels. Set to 0 to auto-calculate from width while preserving aspect ratio.",
                    512,
                    0,
                ),
                crop(),
            ],
        ),
        (
            RESIZE_TYPES[1],
            vec![float(
                "multiplier",
                "Scale factor (e.g., 2.0 doubles size, 0.5 halves size).",
                0.01,
                8.0,
            )],
        ),
        (
            RESIZE_TYPES[2],
            vec![size(
                "longer_size",
                "The longer edge will be resized to this value. Aspect ratio is preserved.",
                512,
                0,
            )],
        ),
        (
            RESIZE_TYPES[3],
            vec![size(
                "shorter_size",
                "The shorter edge will be resized to this value. Aspect ratio is preserved.",
                512,
                0,
            )],
        ),
        (
            RESIZE_TYPES[4],
            vec![size(
                "width",
                "Target width in pixels. Height auto-adjusts to preserve aspect ratio.",
                512,
                0,
            )],
        ),
        (
            RESIZE_TYPES[5],
            vec![size(
                "height",
                "Target height in pixels. Width auto-adjusts to preserve aspect ratio.",
                512,
                0,
            )],
        ),
        (
            RESIZE_TYPES[6],
            vec![float(
                "megapixels",
                "Target total megapixels (e.g., 1.0 ≈ 1024×1024). Aspect ratio is preserved.",
                0.01,
                16.0,
            )],
        ),
        (
            RESIZE_TYPES[7],
            vec![
                InputDef::bare("match", "IMAGE,MASK").tooltip(
                    "Resize input to match the dimensions of this reference image or mask.",
                ),
                crop(),
            ],
        ),
        (
            RESIZE_TYPES[8],
            vec![size(
                "multiple",
                "Resize so width and height are divisible by this number. Useful for latent alignment (e.g., 8 or 64).",
                8,
                1,
            )],
        ),
    ];
    spec(
        "ResizeImageMaskNode",
        "Resize Image/Mask",
        "image/transform",
        "comfy_extras.nodes_post_processing",
    )
    .description("Resize an image or mask using various scaling methods.")
    .input(InputDef::bare("input", MATCHTYPE).template("input_type", "IMAGE,MASK"))
    .dynamic_combo(
        "resize_type",
        "Select how to resize: by exact dimensions, scale factor, matching another image, etc.",
        &options,
    )
    .input(
        InputDef::bare("scale_method", "COMBO")
            .tooltip(
                "Interpolation algorithm. 'area' is best for downscaling, 'lanczos' for upscaling, \
                     'nearest-exact' for pixel art.",
            )
            .option("default", "area")
            .option("multiselect", false)
            .option("options", METHODS.to_vec()),
    )
    .output(OutputDef::matchtype("resized", "input_type"))
    .aliases(&[
        "resize",
        "resize image",
        "resize mask",
        "scale",
        "scale image",
        "scale mask",
        "image resize",
        "change size",
        "dimensions",
        "shrink",
        "enlarge",
    ])
}

/// A `MASK` input's tensor, `[B, H, W]` (a single `[H, W]` mask counts as a batch of one).
pub(super) fn mask(inputs: &Inputs, name: &str) -> Result<(Tensor, [usize; 3]), NodeError> {
    let tensor = match inputs.get(name) {
        Some(Value::Mask(t)) => t.clone(),
        Some(other) => {
            return Err(NodeError::of_kind(
                ErrorKind::WrongType,
                format!("input `{name}` is {}, not MASK", other.type_name()),
            ));
        }
        None => {
            return Err(NodeError::of_kind(
                ErrorKind::WrongType,
                format!("input `{name}` is missing"),
            ));
        }
    };
    let dims = match *tensor.shape() {
        [b, h, w] => [b, h, w],
        [h, w] => [1, h, w],
        ref other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("a MASK is [B, H, W], got {other:?}"),
            ));
        }
    };
    Ok((tensor, dims))
}

/// A tensor from a shape and values built by the node (always consistent).
pub(super) fn tensor(shape: Vec<usize>, values: Vec<f32>) -> Result<Tensor, NodeError> {
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

/// A count input (`amount`, `length`, sizes), at least 1 by its declared range.
fn positive(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| {
        NodeError::of_kind(ErrorKind::InvalidValue, format!("`{name}` must be positive, got {v}"))
    })
}

/// The nodes, in ComfyUI's registration order within their modules.
pub(super) fn nodes() -> Vec<Pure> {
    const MASKS: &str = "comfy_extras.nodes_mask";
    const IMAGES: &str = "comfy_extras.nodes_images";
    vec![
        Pure::new(
            spec("SolidMask", "Create Solid Mask", "image/mask", MASKS)
                .input(InputDef::float("value", 1.0, 0.0, 1.0).option("step", 0.01))
                .input(InputDef::int("width", 512, 1, 16384).option("step", 1))
                .input(InputDef::int("height", 512, 1, 16384).option("step", 1))
                .output(OutputDef::new("MASK")),
            |inputs| {
                let (w, h) = (positive(inputs, "width")?, positive(inputs, "height")?);
                let value = inputs.float("value")? as f32;
                Ok(vec![Value::Mask(tensor(vec![1, h, w], vec![value; h * w])?)])
            },
        ),
        Pure::new(
            spec("InvertMask", "Invert Mask", "image/mask", MASKS)
                .input(InputDef::typed("mask", "MASK"))
                .output(OutputDef::new("MASK"))
                .aliases(&["reverse mask", "flip mask"]),
            |inputs| {
                let (m, _) = mask(inputs, "mask")?;
                let inverted = m.data().iter().map(|v| 1.0 - v).collect();
                Ok(vec![Value::Mask(tensor(m.shape().to_vec(), inverted)?)])
            },
        ),
        Pure::new(
            spec("MaskToImage", "Convert Mask to Image", "image/mask", MASKS)
                .input(InputDef::typed("mask", "MASK"))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["convert mask"]),
            |inputs| {
                let (m, [b, h, w]) = mask(inputs, "mask")?;
                let rgb = m.data().iter().flat_map(|&v| [v, v, v]).collect();
                Ok(vec![Value::Image(tensor(vec![b, h, w, 3], rgb)?)])
            },
        ),
        Pure::new(
            spec("ImageToMask", "Convert Image to Mask", "image/mask", MASKS)
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::v3_combo("channel", &["red", "green", "blue", "alpha"]))
                .output(OutputDef::new("MASK"))
                .aliases(&["extract channel", "channel to mask"]),
            |inputs| {
                let image = inputs.image("image")?;
                let (b, h, w, c) = dims(image)?;
                let name = inputs.string("channel")?;
                let channel = ["red", "green", "blue", "alpha"]
                    .iter()
                    .position(|&n| n == name)
                    .filter(|&i| i < c)
                    .ok_or_else(|| {
                        NodeError::of_kind(
                            ErrorKind::InvalidValue,
                            format!("the image has {c} channels, no `{name}` channel"),
                        )
                    })?;
                let values = image.data().iter().skip(channel).step_by(c).copied().collect();
                Ok(vec![Value::Mask(tensor(vec![b, h, w], values)?)])
            },
        ),
        Pure::new(
            spec(
                "JoinImageWithAlpha",
                "Join Image with Alpha",
                "image/compositing",
                "comfy_extras.nodes_compositing",
            )
            .input(InputDef::typed("image", "IMAGE"))
            .input(InputDef::typed("alpha", "MASK"))
            .output(OutputDef::new("IMAGE"))
            .aliases(&["add transparency", "apply alpha", "composite alpha", "RGBA"]),
            join_alpha,
        ),
        Pure::new(
            spec("RepeatImageBatch", "Repeat Image Batch", "image/batch", IMAGES)
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::int("amount", 1, 1, 4096))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["duplicate image", "clone image"]),
            |inputs| {
                let image = inputs.image("image")?;
                let amount = positive(inputs, "amount")?;
                let mut shape = image.shape().to_vec();
                shape[0] *= amount;
                Ok(vec![Value::Image(tensor(shape, image.data().repeat(amount))?)])
            },
        ),
        Pure::new(
            spec(
                "BatchImagesNode",
                "Batch Images",
                "image/batch",
                "comfy_extras.nodes_post_processing",
            )
            .autogrow_prefix("images", InputDef::typed("image", "IMAGE"), "image", (1, 50))
            .output(OutputDef::new("IMAGE"))
            .aliases(&[
                "batch",
                "image batch",
                "batch images",
                "combine images",
                "merge images",
                "stack images",
            ])
            .essentials("Image Tools"),
            batch_images,
        ),
        Pure::new(
            spec(
                "BatchMasksNode",
                "Batch Masks",
                "image/mask",
                "comfy_extras.nodes_post_processing",
            )
            .autogrow_prefix("masks", InputDef::typed("mask", "MASK"), "mask", (1, 50))
            .output(OutputDef::new("MASK"))
            .aliases(&["combine masks", "stack masks", "merge masks"]),
            batch_masks,
        ),
        Pure::new(resize_image_mask_spec(), resize_image_mask),
        Pure::new(
            spec("ImageFromBatch", "Get Image from Batch", "image/batch", IMAGES)
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::int("batch_index", 0, -16384, 16384))
                .input(InputDef::int("length", 1, 1, 4096))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["select image", "pick from batch", "extract image"]),
            |inputs| {
                let image = inputs.image("image")?;
                let (b, h, w, c) = dims(image)?;
                let (start, len) =
                    batch_range(b, inputs.int("batch_index")?, positive(inputs, "length")?);
                let per = h * w * c;
                let values = image.data()[start * per..(start + len) * per].to_vec();
                Ok(vec![Value::Image(tensor(vec![len, h, w, c], values)?)])
            },
        ),
        Pure::new(
            spec(
                "ImageScaleToTotalPixels",
                "Scale Image to Total Pixels",
                "image/upscaling",
                "comfy_extras.nodes_post_processing",
            )
            .input(InputDef::typed("image", "IMAGE"))
            .input(InputDef::v3_combo("upscale_method", &METHODS))
            .input(InputDef::float("megapixels", 1.0, 0.01, 16.0).option("step", 0.01))
            .input(
                InputDef::bare("resolution_steps", "INT")
                    .option("advanced", true)
                    .option("default", 1)
                    .option("min", 1)
                    .option("max", 256),
            )
            .output(OutputDef::new("IMAGE")),
            |inputs| {
                let image = inputs.image("image")?;
                let (_, h, w, _) = dims(image)?;
                let (width, height) = total_pixels_size(
                    w,
                    h,
                    inputs.float("megapixels")?,
                    positive(inputs, "resolution_steps")?,
                );
                let out = resize(image, width, height, inputs.string("upscale_method")?, false)?;
                Ok(vec![Value::Image(out)])
            },
        ),
    ]
}

/// An IMAGE `[B, H, W, C]` or a MASK `[B, H, W]` (as a one-channel image), and which it was.
fn image_or_mask(value: Option<&Value>, name: &str) -> Result<(Tensor, bool), NodeError> {
    match value {
        Some(Value::Image(t)) => Ok((t.clone(), true)),
        Some(Value::Mask(m)) => {
            let dims = m.shape();
            let (h, w) = match dims {
                [.., h, w] if dims.len() >= 2 => (*h, *w),
                _ => return Err(NodeError::new(format!("a MASK of shape {dims:?}"))),
            };
            let n = m.data().len() / (h * w).max(1);
            Ok((tensor(vec![n, h, w, 1], m.data().to_vec())?, false))
        }
        Some(other) => Err(NodeError::of_kind(
            ErrorKind::WrongType,
            format!("input `{name}` is {}, not IMAGE or MASK", other.type_name()),
        )),
        None => Err(NodeError::of_kind(ErrorKind::WrongType, format!("input `{name}` is missing"))),
    }
}

/// The resize types of `ResizeImageMaskNode`, in ComfyUI's order.
const RESIZE_TYPES: [&str; 9] = [
    "scale dimensions",
    "scale by multiplier",
    "scale longer dimension",
    "scale shorter dimension",
    "scale width",
    "scale height",
    "scale total pixels",
    "match size",
    "scale to multiple",
];

/// `ResizeImageMaskNode`: an image or mask resized as `resize_type` says (ComfyUI's `scale_*` functions).
fn resize_image_mask(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let (image, is_image) = image_or_mask(inputs.get("input"), "input")?;
    let method = inputs.string("scale_method")?;
    let kind = inputs.string("resize_type")?;
    let child = |name: &str| format!("resize_type.{name}");
    let int = |name: &str| -> Result<usize, NodeError> {
        let v = inputs.int(&child(name))?;
        usize::try_from(v).map_err(|_| {
            NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("`{name}` must not be negative, got {v}"),
            )
        })
    };
    let crop = || -> Result<bool, NodeError> { Ok(inputs.string(&child("crop"))? == "center") };
    let (_, h, w, _) = dims(&image)?;
    // Python's round: ties to even.
    let round = |v: f64| v.round_ties_even() as usize;
    let out = match kind {
        "scale dimensions" | "scale width" | "scale height" => {
            let (width, height) = match kind {
                "scale width" => (int("width")?, 0),
                "scale height" => (0, int("height")?),
                _ => (int("width")?, int("height")?),
            };
            if width == 0 && height == 0 {
                image.clone()
            } else {
                let width = if width == 0 {
                    round(w as f64 * height as f64 / h as f64).max(1)
                } else {
                    width
                };
                let height = if height == 0 {
                    round(h as f64 * width as f64 / w as f64).max(1)
                } else {
                    height
                };
                let crop = kind == "scale dimensions" && crop()?;
                resize(&image, width, height, method, crop)?
            }
        }
        "scale by multiplier" => {
            let m = inputs.float(&child("multiplier"))?;
            resize(&image, round(w as f64 * m), round(h as f64 * m), method, false)?
        }
        "scale longer dimension" | "scale shorter dimension" => {
            let longer = kind == "scale longer dimension";
            let size = int(if longer { "longer_size" } else { "shorter_size" })?;
            let (mut width, mut height) = (size, size);
            if (h > w) == longer && h != w {
                width = round(w as f64 / h as f64 * size as f64);
            } else if h != w {
                height = round(h as f64 / w as f64 * size as f64);
            }
            resize(&image, width, height, method, false)?
        }
        "scale total pixels" => {
            let total = (inputs.float(&child("megapixels"))? * 1024.0 * 1024.0) as usize;
            let scale = (total as f64 / (w * h) as f64).sqrt();
            resize(&image, round(w as f64 * scale), round(h as f64 * scale), method, false)?
        }
        "match size" => {
            let (reference, _) = image_or_mask(inputs.get(&child("match")), "match")?;
            let (_, mh, mw, _) = dims(&reference)?;
            resize(&image, mw, mh, method, crop()?)?
        }
        "scale to multiple" => scale_to_multiple(&image, int("multiple")?, method)?,
        other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("Unsupported resize type: {other}"),
            ));
        }
    };
    Ok(vec![if is_image {
        Value::Image(out)
    } else {
        let (b, oh, ow, _) = dims(&out)?;
        Value::Mask(tensor(vec![b, oh, ow], out.data().to_vec())?)
    }])
}

/// ComfyUI's `scale_to_multiple_cover`: scaled to cover the largest multiple-of-`multiple` size within the
/// image, then centre-cropped to it.
fn scale_to_multiple(image: &Tensor, multiple: usize, method: &str) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(image)?;
    if multiple <= 1 {
        return Ok(image.clone());
    }
    let (tw, th) = (w / multiple * multiple, h / multiple * multiple);
    if tw == 0 || th == 0 || (tw, th) == (w, h) {
        return Ok(image.clone());
    }
    let (sw, sh) = (tw as f64 / w as f64, th as f64 / h as f64);
    let (scaled_w, scaled_h) = if sw >= sh {
        (tw, ((h as f64 * sw).ceil() as usize).max(th))
    } else {
        (((w as f64 * sh).ceil() as usize).max(tw), th)
    };
    let scaled = resize(image, scaled_w, scaled_h, method, false)?;
    let (x0, y0) = ((scaled_w - tw) / 2, (scaled_h - th) / 2);
    let mut out = Vec::with_capacity(b * th * tw * c);
    for i in 0..b {
        for y in y0..y0 + th {
            let row = ((i * scaled_h + y) * scaled_w + x0) * c;
            out.extend_from_slice(&scaled.data()[row..row + tw * c]);
        }
    }
    tensor(vec![b, th, tw, c], out)
}

/// `BatchImagesNode`: the given images (`images.image0`, ...) in one batch; a missing fourth channel is
/// padded with 1 and every image is resized (bilinear, centre crop) to the first one's size, as ComfyUI's
/// `batch_images` does.
fn batch_images(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let images: Vec<&Tensor> = (0..50)
        .filter_map(|i| match inputs.get(&format!("images.image{i}")) {
            Some(Value::Image(t)) => Some(t),
            _ => None,
        })
        .collect();
    let Some(first) = images.first() else {
        return Err(NodeError::of_kind(ErrorKind::InvalidValue, "no image to batch"));
    };
    let max_channels =
        images.iter().map(|t| dims(t).map(|d| d.3)).collect::<Result<Vec<_>, _>>()?;
    let max_channels = max_channels.into_iter().max().unwrap_or(3);
    let (_, h, w, _) = dims(first)?;
    let mut out = Vec::new();
    let mut batch = 0;
    for image in &images {
        let (b, ih, iw, c) = dims(image)?;
        let mut image = (*image).clone();
        if c < max_channels {
            // One channel of 1.0 (torch's `pad(image, (0, 1), value=1.0)`).
            let padded =
                image.data().chunks_exact(c).flat_map(|p| p.iter().copied().chain([1.0])).collect();
            image = tensor(vec![b, ih, iw, c + 1], padded)?;
        }
        if (ih, iw) != (h, w) {
            image = resize(&image, w, h, "bilinear", true)?;
        }
        batch += image.shape()[0];
        out.extend_from_slice(image.data());
    }
    let channels = out.len() / (batch * h * w).max(1);
    Ok(vec![Value::Image(tensor(vec![batch, h, w, channels], out)?)])
}

/// `BatchMasksNode`: the given masks (`masks.mask0`, ...) in one batch, each resized (bilinear, centre crop) to
/// the first one's size, as ComfyUI's `batch_masks` does.
fn batch_masks(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let masks: Vec<&Tensor> = (0..50)
        .filter_map(|i| match inputs.get(&format!("masks.mask{i}")) {
            Some(Value::Mask(t)) => Some(t),
            _ => None,
        })
        .collect();
    let as_batch = |t: &Tensor| -> Result<(usize, usize, usize), NodeError> {
        match *t.shape() {
            [b, h, w] => Ok((b, h, w)),
            [h, w] => Ok((1, h, w)),
            ref other => Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("a MASK is [B, H, W], got {other:?}"),
            )),
        }
    };
    let Some(first) = masks.first() else {
        return Err(NodeError::of_kind(ErrorKind::InvalidValue, "no mask to batch"));
    };
    let (_, h, w) = as_batch(first)?;
    let (mut out, mut batch) = (Vec::new(), 0);
    for mask in &masks {
        let (b, mh, mw) = as_batch(mask)?;
        if (mh, mw) == (h, w) {
            out.extend_from_slice(mask.data());
        } else {
            let image = tensor(vec![b, mh, mw, 1], mask.data().to_vec())?;
            out.extend_from_slice(resize(&image, w, h, "bilinear", true)?.data());
        }
        batch += b;
    }
    Ok(vec![Value::Mask(tensor(vec![batch, h, w], out)?)])
}

/// `ImageFromBatch`'s slice of a batch of `batch`: a negative index counts from the end, then both are
/// clamped into the batch, as ComfyUI does.
fn batch_range(batch: usize, index: i64, length: usize) -> (usize, usize) {
    let batch_i = batch as i64;
    let index = if index < 0 { index + batch_i } else { index };
    let start = index.clamp(0, (batch_i - 1).max(0)) as usize;
    (start, length.min(batch - start))
}

/// `ImageScaleToTotalPixels`' size: the image scaled to `megapixels` (of 1024² pixels), each side rounded
/// (Python's `round`, ties to even) to a multiple of `steps`.
fn total_pixels_size(w: usize, h: usize, megapixels: f64, steps: usize) -> (usize, usize) {
    let scale = (megapixels * 1024.0 * 1024.0 / (w * h) as f64).sqrt();
    let side = |len: usize| {
        ((len as f64 * scale / steps as f64).round_ties_even() as usize * steps).max(1)
    };
    (side(w), side(h))
}

/// `JoinImageWithAlpha`: RGB of `image` with `1 − alpha` (resized to the image with bilinear filtering when it
/// differs) as the fourth channel; the shorter batch repeats to the longer one.
fn join_alpha(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let (b, h, w, c) = dims(image)?;
    let (alpha, [ab, ah, aw]) = mask(inputs, "alpha")?;
    let alpha = if (ah, aw) == (h, w) {
        alpha
    } else {
        // As an image of one channel through ComfyUI's bilinear resize (`resize_mask`).
        let as_image = tensor(vec![ab, ah, aw, 1], alpha.data().to_vec())?;
        let resized = resize(&as_image, w, h, "bilinear", false)?;
        tensor(vec![ab, h, w], resized.data().to_vec())?
    };
    let batch = b.max(ab);
    let rgb = c.min(3);
    let mut out = Vec::with_capacity(batch * h * w * 4);
    for i in 0..batch {
        let img = &image.data()[(i % b) * h * w * c..][..h * w * c];
        let a = &alpha.data()[(i % ab) * h * w..][..h * w];
        for (pixel, alpha) in img.chunks_exact(c).zip(a) {
            out.extend_from_slice(&pixel[..rgb]);
            out.extend(std::iter::repeat_n(0.0, 3 - rgb));
            out.push(1.0 - alpha);
        }
    }
    Ok(vec![Value::Image(tensor(vec![batch, h, w, 4], out)?)])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scripts/reference/batch_nodes.py`'s record of ComfyUI's BatchMasksNode: a mask of another size resized
    /// (bilinear, centre crop) to the first.
    #[test]
    fn batch_masks_node_is_comfyuis() {
        use crate::nodes::Node;
        let io = crate::fixtures::tensors("batch_nodes/io.safetensors");
        let node =
            nodes().into_iter().find(|n| n.spec().name == "BatchMasksNode").expect("the node");
        let inputs = ["mask0", "mask1", "mask2"]
            .map(|k| (["masks.", k].concat(), Value::Mask(io[k].clone())));
        let inputs = inputs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let out = crate::fixtures::node_outputs(&node, inputs).expect("runs");
        let Some(Value::Mask(got)) = out.first() else { panic!("a mask") };
        assert_eq!(got.shape(), io["masks.out"].shape());
        crate::fixtures::assert_within("masks", got.data(), io["masks.out"].data(), 1e-5);
    }

    #[test]
    fn batch_ranges_clamp_as_comfyui() {
        assert_eq!(batch_range(4, 1, 2), (1, 2));
        assert_eq!(batch_range(4, -1, 3), (3, 1));
        assert_eq!(batch_range(4, 9, 1), (3, 1));
        assert_eq!(batch_range(4, -9, 9), (0, 4));
    }

    #[test]
    fn total_pixels_round_to_the_steps() {
        assert_eq!(total_pixels_size(512, 512, 1.0, 1), (1024, 1024));
        assert_eq!(total_pixels_size(640, 480, 0.25, 64), (576, 448));
    }
}
