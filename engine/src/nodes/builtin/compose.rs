//! Compositing, cropping and batching nodes (V3 classes): `ImageCompositeMasked` and `GrowMask`
//! (`comfy_extras.nodes_mask`), `ImageCrop` and `ImageCropV2` (`comfy_extras.nodes_images`) and `RebatchImages`
//! (`comfy_extras.nodes_rebatch`).
//!
//! An IMAGE is `[B, H, W, C]` and a MASK `[B, H, W]`, both f32. `RebatchImages` is the one node here that takes
//! whole lists and returns a list (`is_input_list`, `output_is_list`); the others are mapped over lists.

use std::sync::Arc;

use super::image::dims;
use super::mask::{mask, tensor};
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, Output, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's `MAX_RESOLUTION`, the bound of its size and offset inputs.
const MAX_RESOLUTION: i64 = 16384;

/// A V3 node of `module` in `category`.
fn spec(name: &str, display: &str, category: &str, module: &str) -> NodeSpec {
    NodeSpec::new(name, display, category).python_module(module).v3()
}

/// An `INT` input of ComfyUI's pixel range `min..=MAX_RESOLUTION`, step 1.
fn pixels(name: &str, default: i64, min: i64) -> InputDef {
    InputDef::int(name, default, min, MAX_RESOLUTION).option("step", 1)
}

/// A size or offset input as a `usize`, refused when negative (the declared minimums keep it from being so).
fn non_negative(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    usize::try_from(v).map_err(|_| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("`{name}` must not be negative, got {v}"),
        )
    })
}

/// The nodes mapped over their inputs, in ComfyUI's registration order within their modules.
pub(super) fn nodes() -> Vec<Pure> {
    const MASKS: &str = "comfy_extras.nodes_mask";
    vec![
        Pure::new(
            spec(
                "ImageCrop",
                "Crop Image (DEPRECATED)",
                "image/transform",
                "comfy_extras.nodes_images",
            )
            .deprecated()
            .input(InputDef::typed("image", "IMAGE"))
            .input(pixels("width", 512, 1))
            .input(pixels("height", 512, 1))
            .input(pixels("x", 0, 0))
            .input(pixels("y", 0, 0))
            .output(OutputDef::new("IMAGE"))
            .aliases(&["trim"])
            .essentials("Image Tools"),
            image_crop,
        ),
        Pure::new(
            spec("GrowMask", "Grow Mask", "image/mask", MASKS)
                .input(InputDef::typed("mask", "MASK"))
                .input(pixels("expand", 0, -MAX_RESOLUTION))
                .input(
                    InputDef::bare("tapered_corners", "BOOLEAN")
                        .option("advanced", true)
                        .option("default", true),
                )
                .output(OutputDef::new("MASK"))
                .aliases(&["expand mask", "shrink mask"]),
            grow_mask,
        ),
        Pure::new(
            spec("ImageCompositeMasked", "Image Composite Masked", "image/compositing", MASKS)
                .input(InputDef::typed("destination", "IMAGE"))
                .input(InputDef::typed("source", "IMAGE"))
                .input(pixels("x", 0, 0))
                .input(pixels("y", 0, 0))
                .input(InputDef::boolean("resize_source", false))
                .optional(InputDef::typed("mask", "MASK"))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["overlay", "layer", "paste image", "images composition"]),
            composite_masked,
        ),
    ]
}

/// `ImageCrop`: the `width × height` window at `(x, y)` of every image ([`crop`]).
fn image_crop(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let [x, y, width, height] = ["x", "y", "width", "height"].map(|k| non_negative(inputs, k));
    Ok(vec![Value::Image(crop(inputs.image("image")?, x?, y?, width?, height?)?)])
}

/// `ImageCropV2` (`Crop Image`): the window its `crop_region` widget draws (a `BOUNDING_BOX`,
/// `{x, y, width, height}`, missing keys 0, 0, 512, 512), cut as `ImageCrop` cuts it, and shown as a preview.
pub(super) struct ImageCropV2(Arc<NodeSpec>);

impl ImageCropV2 {
    /// The node as ComfyUI declares it.
    pub(super) fn new() -> ImageCropV2 {
        let region = serde_json::json!({"x": 0, "y": 0, "width": 512, "height": 512});
        ImageCropV2(Arc::new(
            spec("ImageCropV2", "Crop Image", "image/transform", "comfy_extras.nodes_images")
                .description("Crop an image to the specified dimensions.")
                .intermediate_output()
                .input(InputDef::typed("image", "IMAGE").with_options())
                .input(
                    InputDef::bare("crop_region", "BOUNDING_BOX")
                        .option("default", region)
                        .option("socketless", true)
                        .option("component", "ImageCrop"),
                )
                .output(OutputDef::new("IMAGE"))
                .aliases(&["crop", "cut", "trim"])
                .essentials("Image Tools"),
        ))
    }
}

impl Node for ImageCropV2 {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let region = match inputs.get("crop_region") {
            Some(Value::Json(j)) if j.is_object() => j.clone(),
            other => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "crop_region must be a bounding box {{x, y, width, height}}, got {}",
                        other.map_or("nothing".to_owned(), Value::repr)
                    ),
                ));
            }
        };
        let side = |key: &str, default: i64| -> Result<usize, NodeError> {
            let v = region.get(key).map_or(Some(default), serde_json::Value::as_i64);
            v.and_then(|v| usize::try_from(v).ok()).ok_or_else(|| {
                NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "crop_region's `{key}` must be a whole number from 0, got {}",
                        region[key]
                    ),
                )
            })
        };
        let (x, y) = (side("x", 0)?, side("y", 0)?);
        let (width, height) = (side("width", 512)?, side("height", 512)?);
        let cropped = crop(inputs.image("image")?, x, y, width, height)?;
        let ui = super::files::preview(&cropped, ctx)?;
        Ok(NodeResult { ui: Some(ui), ..NodeResult::values([Value::Image(cropped)]) })
    }
}

/// The `width × height` window at `(x, y)` of every image of `image`, cut short at the image's edges; an
/// offset past the last column (row) is moved onto it, so at least one pixel remains.
fn crop(
    image: &Tensor,
    x: usize,
    y: usize,
    width: usize,
    height: usize,
) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(image)?;
    if h == 0 || w == 0 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("cannot crop an empty {w}x{h} image"),
        ));
    }
    let (x, y) = (x.min(w - 1), y.min(h - 1));
    let (width, height) = (width.min(w - x), height.min(h - y));
    let mut out = Vec::with_capacity(b * height * width * c);
    for i in 0..b {
        for row in y..y + height {
            let start = ((i * h + row) * w + x) * c;
            out.extend_from_slice(&image.data()[start..start + width * c]);
        }
    }
    tensor(vec![b, height, width, c], out)
}

/// `GrowMask`: each mask dilated (`expand > 0`) or eroded (`expand < 0`) `|expand|` times by a 3 × 3 cross
/// (`tapered_corners`) or square, as scipy's `grey_dilation` / `grey_erosion`: the max (min) over the
/// neighbourhood, whose mirrored border (`reflect`) adds no value the pixels inside do not already have.
fn grow_mask(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let (m, [b, h, w]) = mask(inputs, "mask")?;
    let expand = inputs.int("expand")?;
    let tapered = inputs.bool("tapered_corners")?;
    let grow = expand > 0;
    let mut out = Vec::with_capacity(b * h * w);
    for plane in m.data().chunks_exact(h * w) {
        let mut current = plane.to_vec();
        for _ in 0..expand.unsigned_abs() {
            let next = morph_step(&current, h, w, grow, tapered);
            // Once a step changes nothing, neither does any after it.
            if next == current {
                break;
            }
            current = next;
        }
        out.extend(current);
    }
    Ok(vec![Value::Mask(tensor(vec![b, h, w], out)?)])
}

/// One dilation (`grow`) or erosion of an `h × w` mask by the 3 × 3 cross (`tapered`) or square, over the
/// neighbours inside the mask.
fn morph_step(src: &[f32], h: usize, w: usize, grow: bool, tapered: bool) -> Vec<f32> {
    let mut out = Vec::with_capacity(h * w);
    for y in 0..h {
        for x in 0..w {
            let mut v = src[y * w + x];
            for ny in y.saturating_sub(1)..(y + 2).min(h) {
                for nx in x.saturating_sub(1)..(x + 2).min(w) {
                    if tapered && ny != y && nx != x {
                        continue;
                    }
                    let n = src[ny * w + nx];
                    v = if grow { v.max(n) } else { v.min(n) };
                }
            }
            out.push(v);
        }
    }
    out
}

/// `ImageCompositeMasked`: `source` pasted into `destination` with its top-left corner at `(x, y)`, blended by
/// `mask` (`mask · source + (1 − mask) · destination`), cut at the destination's edges.
///
/// As ComfyUI's `composite`: a source with more channels than the destination loses the extra ones, one with
/// fewer gains an alpha channel of 1; `resize_source` first resizes it (bilinear) to the destination; the
/// source, then the mask, repeat (or are cut) to the destination's batch; the mask is resized (bilinear) to the
/// source; no mask means a mask of 1.
fn composite_masked(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let destination = inputs.image("destination")?;
    let (batch, h, w, c) = dims(destination)?;
    let source = alpha_fix(inputs.image("source")?, c)?;
    let source = if inputs.bool("resize_source")? {
        resize(&source, w, h, "bilinear", false)?
    } else {
        source
    };
    let (sb, sh, sw, _) = dims(&source)?;
    let mask = match inputs.get("mask") {
        Some(_) => {
            let (m, [mb, mh, mw]) = mask(inputs, "mask")?;
            let as_image = tensor(vec![mb, mh, mw, 1], m.data().to_vec())?;
            Some((resize(&as_image, sw, sh, "bilinear", false)?, mb))
        }
        None => None,
    };
    let left = non_negative(inputs, "x")?.min(w);
    let top = non_negative(inputs, "y")?.min(h);
    let (visible_w, visible_h) = (sw.min(w - left), sh.min(h - top));
    let mut out = destination.data().to_vec();
    for i in 0..batch {
        let src = &source.data()[(i % sb) * sh * sw * c..][..sh * sw * c];
        let alpha = mask.as_ref().map(|(m, mb)| &m.data()[(i % mb) * sh * sw..][..sh * sw]);
        for y in 0..visible_h {
            for x in 0..visible_w {
                let m = alpha.map_or(1.0, |a| a[y * sw + x]);
                let d = ((i * h + top + y) * w + left + x) * c;
                let s = (y * sw + x) * c;
                for k in 0..c {
                    out[d + k] = m * src[s + k] + (1.0 - m) * out[d + k];
                }
            }
        }
    }
    Ok(vec![Value::Image(tensor(vec![batch, h, w, c], out)?)])
}

/// ComfyUI's `image_alpha_fix` for a source pasted into an image of `channels` channels: extra channels dropped,
/// or one channel of 1 appended; the channel counts must then agree.
fn alpha_fix(source: &Tensor, channels: usize) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(source)?;
    let fixed = if c > channels {
        let values = source.data().chunks_exact(c).flat_map(|p| &p[..channels]).copied().collect();
        tensor(vec![b, h, w, channels], values)?
    } else if c < channels {
        let values =
            source.data().chunks_exact(c).flat_map(|p| p.iter().copied().chain([1.0])).collect();
        tensor(vec![b, h, w, c + 1], values)?
    } else {
        source.clone()
    };
    let got = dims(&fixed)?.3;
    if got != channels {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("cannot paste an image of {c} channels into one of {channels}"),
        ));
    }
    Ok(fixed)
}

/// `RebatchImages`: every image of every batch of the `images` list, in order, regrouped into batches of
/// `batch_size` (the last may be smaller), as a list.
pub(super) struct RebatchImages(Arc<NodeSpec>);

impl RebatchImages {
    /// The node as ComfyUI declares it: whole lists in, a list out.
    pub(super) fn new() -> RebatchImages {
        RebatchImages(Arc::new(
            spec("RebatchImages", "Rebatch Images", "image/batch", "comfy_extras.nodes_rebatch")
                .input_list()
                .input(InputDef::typed("images", "IMAGE"))
                .input(InputDef::int("batch_size", 1, 1, 4096))
                .output(OutputDef::new("IMAGE").list()),
        ))
    }
}

/// A rebatching node's `batch_size`: the first of the list, as ComfyUI reads it, refused below 1.
pub(super) fn batch_size(inputs: &Inputs) -> Result<usize, NodeError> {
    let batch_size = inputs.int("batch_size")?;
    usize::try_from(batch_size).ok().filter(|&n| n > 0).ok_or_else(|| {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("`batch_size` must be positive, got {batch_size}"),
        )
    })
}

impl Node for RebatchImages {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let batch_size = batch_size(inputs)?;
        let mut singles: Vec<(&[usize], &[f32])> = Vec::new();
        for value in inputs.list("images") {
            let Value::Image(image) = value else {
                return Err(NodeError::of_kind(
                    ErrorKind::WrongType,
                    format!("input `images` holds {}, not IMAGE", value.type_name()),
                ));
            };
            let (b, h, w, c) = dims(image)?;
            let per = h * w * c;
            singles.extend((0..b).map(|j| (&image.shape()[1..], &image.data()[j * per..][..per])));
        }
        let batches = singles
            .chunks(batch_size)
            .map(|group| {
                let shape = group[0].0;
                if let Some((other, _)) = group.iter().find(|(s, _)| *s != shape) {
                    return Err(NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!(
                            "images of one batch must have one size: {:?} and {:?} (height, width, channels)",
                            shape, other
                        ),
                    ));
                }
                let values = group.iter().flat_map(|(_, d)| d.iter().copied()).collect();
                let mut full = vec![group.len()];
                full.extend_from_slice(shape);
                Ok(Value::Image(tensor(full, values)?))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NodeResult { outputs: vec![Output::List(batches)], ui: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs from names and values.
    fn inputs(values: Vec<(&str, Value)>) -> Inputs {
        Inputs::from_values(values.into_iter().map(|(k, v)| (k.to_owned(), v)))
    }

    /// The single tensor output of a pure node.
    fn one(out: Result<Vec<Value>, NodeError>) -> Tensor {
        match out.expect("runs").as_slice() {
            [Value::Image(t) | Value::Mask(t)] => t.clone(),
            other => panic!("not one tensor: {other:?}"),
        }
    }

    /// A `[1, h, w]` mask of `values`.
    fn mask_of(h: usize, w: usize, values: &[f32]) -> Value {
        Value::Mask(Tensor::new(vec![1, h, w], values.to_vec()).expect("shape"))
    }

    #[test]
    fn grow_mask_dilates_and_erodes_as_scipy() {
        // One lit pixel in the middle of 5 × 5.
        let mut dot = vec![0.0; 25];
        dot[12] = 1.0;
        let grown = |expand: i64, tapered: bool, values: &[f32]| {
            one(grow_mask(&inputs(vec![
                ("mask", mask_of(5, 5, values)),
                ("expand", Value::Int(expand)),
                ("tapered_corners", Value::Bool(tapered)),
            ])))
            .data()
            .iter()
            .map(|&v| if v > 0.5 { '#' } else { '.' })
            .collect::<String>()
        };
        assert_eq!(grown(1, true, &dot), ".......#...###...#.......");
        assert_eq!(grown(1, false, &dot), "......###..###..###......");
        assert_eq!(grown(2, true, &dot), "..#...###.#####.###...#..");
        // The cross twice is a diamond; many more steps fill the mask and stop.
        assert_eq!(grown(16384, true, &dot), "#".repeat(25));
        // Eroding a full mask leaves it full: the border adds no smaller value.
        assert_eq!(grown(-3, false, &[1.0; 25]), "#".repeat(25));
        let square = grown(1, false, &dot);
        let square: Vec<f32> = square.chars().map(|c| if c == '#' { 1.0 } else { 0.0 }).collect();
        assert_eq!(grown(-1, false, &square), grown(0, true, &dot));
    }

    #[test]
    fn image_crop_clamps_the_window_into_the_image() {
        let values: Vec<f32> = (0..2 * 3 * 4).map(|v| v as f32).collect();
        let image = Value::Image(Tensor::new(vec![2, 3, 4, 1], values).expect("shape"));
        let crop = |width: i64, height: i64, x: i64, y: i64| {
            one(image_crop(&inputs(vec![
                ("image", image.clone()),
                ("width", Value::Int(width)),
                ("height", Value::Int(height)),
                ("x", Value::Int(x)),
                ("y", Value::Int(y)),
            ])))
        };
        let window = crop(2, 2, 1, 1);
        assert_eq!(window.shape(), &[2, 2, 2, 1]);
        assert_eq!(window.data(), &[5.0, 6.0, 9.0, 10.0, 17.0, 18.0, 21.0, 22.0]);
        // Past the edges: moved onto the last pixel, one pixel left.
        let corner = crop(512, 512, 100, 100);
        assert_eq!((corner.shape(), corner.data()), (&[2, 1, 1, 1][..], &[11.0, 23.0][..]));
    }

    #[test]
    fn composite_pastes_blends_and_cuts_at_the_edges() {
        let destination = Value::Image(Tensor::full(vec![2, 3, 4, 3], 0.0));
        let source = Value::Image(Tensor::full(vec![1, 2, 2, 4], 1.0));
        let composite = |x: i64, y: i64, resize: bool, mask: Option<Value>| {
            let mut values = vec![
                ("destination", destination.clone()),
                ("source", source.clone()),
                ("x", Value::Int(x)),
                ("y", Value::Int(y)),
                ("resize_source", Value::Bool(resize)),
            ];
            values.extend(mask.map(|m| ("mask", m)));
            one(composite_masked(&inputs(values)))
        };
        let red = |t: &Tensor| -> Vec<f32> { t.data().chunks_exact(3).map(|p| p[0]).collect() };
        // The source's fourth channel is dropped; the paste is cut at the right edge; both images get it.
        let out = composite(3, 2, false, None);
        assert_eq!(out.shape(), &[2, 3, 4, 3]);
        let lit = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0];
        assert_eq!(red(&out), [lit, lit].concat());
        // A half mask (resized to the source) blends; resizing the source covers the whole destination.
        let half = mask_of(1, 1, &[0.5]);
        assert_eq!(red(&composite(0, 0, true, Some(half))), vec![0.5; 24]);
        // An offset past the destination pastes nothing.
        assert_eq!(red(&composite(16384, 0, false, None)), vec![0.0; 24]);
    }

    #[test]
    fn a_smaller_source_gains_an_alpha_of_one() {
        let fixed = alpha_fix(&Tensor::full(vec![1, 1, 1, 3], 0.25), 4).expect("fixes");
        assert_eq!(fixed.data(), &[0.25, 0.25, 0.25, 1.0]);
        assert!(alpha_fix(&Tensor::full(vec![1, 1, 1, 1], 0.25), 3).is_err());
    }
}
