//! Mask arithmetic of `comfy_extras.nodes_mask`: `MaskComposite` ("Combine Masks": one mask onto another at
//! an offset, by an operation), `FeatherMask` (edges faded linearly), `ThresholdMask` (0 or 1 by a value),
//! `ImageColorToMask` (1 where a pixel is one colour) and `CropMask` (a rectangle of each mask).

use super::mask::{mask, tensor};
use super::pure::Pure;
use super::wan::size;
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

const MODULE: &str = "comfy_extras.nodes_mask";
const MAX_RESOLUTION: i64 = 16384;
/// `MaskComposite`'s operations, in ComfyUI's order.
const OPERATIONS: [&str; 6] = ["multiply", "add", "subtract", "and", "or", "xor"];

fn spec(name: &str, display: &str) -> NodeSpec {
    NodeSpec::new(name, display, "image/mask").python_module(MODULE).v3()
}

/// An offset or edge width in pixels (0 to `MAX_RESOLUTION`).
fn pixels(name: &str) -> InputDef {
    InputDef::int(name, 0, 0, MAX_RESOLUTION).option("step", 1)
}

/// The nodes, in ComfyUI's registration order.
pub(super) fn nodes() -> Vec<Pure> {
    vec![
        Pure::new(
            spec("MaskComposite", "Combine Masks")
                .input(InputDef::typed("destination", "MASK"))
                .input(InputDef::typed("source", "MASK"))
                .input(pixels("x"))
                .input(pixels("y"))
                .input(InputDef::v3_combo("operation", &OPERATIONS))
                .output(OutputDef::new("MASK"))
                .aliases(&["combine masks", "blend masks", "layer masks", "masks composition"]),
            |inputs| {
                let (destination, [b, h, w]) = mask(inputs, "destination")?;
                let (source, source_dims) = mask(inputs, "source")?;
                let at = (size(inputs, "x")?, size(inputs, "y")?);
                let combined = composite(
                    (destination.data(), [b, h, w]),
                    (source.data(), source_dims),
                    at,
                    inputs.string("operation")?,
                )?;
                Ok(vec![Value::Mask(tensor(vec![b, h, w], combined)?)])
            },
        ),
        Pure::new(
            spec("FeatherMask", "Feather Mask")
                .input(InputDef::typed("mask", "MASK"))
                .input(pixels("left"))
                .input(pixels("top"))
                .input(pixels("right"))
                .input(pixels("bottom"))
                .output(OutputDef::new("MASK"))
                .aliases(&["soft edge mask", "blur mask edges", "gradient mask edge"]),
            |inputs| {
                let (m, dims) = mask(inputs, "mask")?;
                let edges = ["left", "top", "right", "bottom"].map(|name| size(inputs, name));
                let [left, top, right, bottom] = edges;
                let feathered = feather(m.data(), dims, [left?, top?, right?, bottom?]);
                Ok(vec![Value::Mask(tensor(dims.to_vec(), feathered)?)])
            },
        ),
        Pure::new(
            spec("ImageColorToMask", "Convert Image Color to Mask")
                .input(InputDef::typed("image", "IMAGE"))
                .input(
                    InputDef::int("color", 0, 0, 0xFF_FFFF)
                        .option("step", 1)
                        .option("display", "number"),
                )
                .output(OutputDef::new("MASK"))
                .aliases(&["color keying", "chroma key"]),
            |inputs| {
                let image = inputs.image("image")?;
                let color = inputs.int("color")?;
                let (b, h, w, c) = super::image::dims(image)?;
                if c < 3 {
                    return Err(NodeError::new(format!(
                        "ImageColorToMask reads red, green and blue; the image has {c} channels"
                    )));
                }
                // Each channel as ComfyUI's round(clamp(v, 0, 1) · 255), packed as 0xRRGGBB.
                let level = |v: f32| (v.clamp(0.0, 1.0) * 255.0).round_ties_even() as i64;
                let values = image
                    .data()
                    .chunks(c)
                    .map(|p| {
                        let packed = (level(p[0]) << 16) + (level(p[1]) << 8) + level(p[2]);
                        if packed == color { 1.0 } else { 0.0 }
                    })
                    .collect();
                Ok(vec![Value::Mask(tensor(vec![b, h, w], values)?)])
            },
        ),
        Pure::new(
            spec("CropMask", "Crop Mask")
                .input(InputDef::typed("mask", "MASK"))
                .input(pixels("x"))
                .input(pixels("y"))
                .input(InputDef::int("width", 512, 1, MAX_RESOLUTION).option("step", 1))
                .input(InputDef::int("height", 512, 1, MAX_RESOLUTION).option("step", 1))
                .output(OutputDef::new("MASK"))
                .aliases(&["cut mask", "extract mask region", "mask slice"]),
            |inputs| {
                let (m, [b, h, w]) = mask(inputs, "mask")?;
                // Python's slices [y : y + height, x : x + width], clamped to the mask.
                let (x, y) = (size(inputs, "x")?.min(w), size(inputs, "y")?.min(h));
                let (x_end, y_end) =
                    ((x + size(inputs, "width")?).min(w), (y + size(inputs, "height")?).min(h));
                let mut values = Vec::with_capacity(b * (y_end - y) * (x_end - x));
                for i in 0..b {
                    for row in y..y_end {
                        values.extend_from_slice(&m.data()[(i * h + row) * w..][x..x_end]);
                    }
                }
                Ok(vec![Value::Mask(tensor(vec![b, y_end - y, x_end - x], values)?)])
            },
        ),
        Pure::new(
            spec("ThresholdMask", "Threshold Mask")
                .input(InputDef::typed("mask", "MASK"))
                .input(InputDef::float("value", 0.5, 0.0, 1.0).option("step", 0.01))
                .output(OutputDef::new("MASK"))
                .aliases(&["binary mask"]),
            |inputs| {
                let (m, _) = mask(inputs, "mask")?;
                let value = inputs.float("value")? as f32;
                let values = m.data().iter().map(|&v| if v > value { 1.0 } else { 0.0 }).collect();
                Ok(vec![Value::Mask(tensor(m.shape().to_vec(), values)?)])
            },
        ),
    ]
}

/// `source` put onto `destination` with its top-left corner at `(x, y)` by `operation`, the part inside the
/// destination only, then every value clamped to [0, 1]. A source batch of one applies to every destination
/// mask; otherwise the batches must match. `and`, `or` and `xor` read each value rounded (half to even) as
/// set or not and give 0 or 1.
fn composite(
    (destination, [batch, h, w]): (&[f32], [usize; 3]),
    (source, [source_batch, sh, sw]): (&[f32], [usize; 3]),
    (x, y): (usize, usize),
    operation: &str,
) -> Result<Vec<f32>, NodeError> {
    if source_batch != 1 && source_batch != batch {
        return Err(NodeError::new(format!(
            "the source's {source_batch} masks cannot combine with the destination's {batch}: give one \
             source mask or one for each"
        )));
    }
    let op: fn(f32, f32) -> f32 = match operation {
        "multiply" => |d, s| d * s,
        "add" => |d, s| d + s,
        "subtract" => |d, s| d - s,
        "and" => |d, s| f32::from(u8::from(set(d) && set(s))),
        "or" => |d, s| f32::from(u8::from(set(d) || set(s))),
        "xor" => |d, s| f32::from(u8::from(set(d) != set(s))),
        other => {
            return Err(NodeError::new(format!(
                "unknown operation `{other}`: one of {}",
                OPERATIONS.join(", ")
            )));
        }
    };
    let mut out = destination.to_vec();
    let (visible_w, visible_h) =
        ((x + sw).min(w).saturating_sub(x), (y + sh).min(h).saturating_sub(y));
    for b in 0..batch {
        let s = if source_batch == 1 { 0 } else { b };
        for row in 0..visible_h {
            for col in 0..visible_w {
                let d = &mut out[(b * h + y + row) * w + x + col];
                *d = op(*d, source[(s * sh + row) * sw + col]);
            }
        }
    }
    out.iter_mut().for_each(|v| *v = v.clamp(0.0, 1.0));
    Ok(out)
}

/// Whether a mask value counts as set for the logical operations (`round().bool()`).
fn set(v: f32) -> bool {
    v.round_ties_even() != 0.0
}

/// `FeatherMask`: the `left` columns scaled by 1/left, 2/left, … from the edge in, then the `right`, `top`
/// and `bottom` edges likewise (each width at most the mask's side).
fn feather(
    values: &[f32],
    [batch, h, w]: [usize; 3],
    [left, top, right, bottom]: [usize; 4],
) -> Vec<f32> {
    let mut out = values.to_vec();
    let (left, right, top, bottom) = (left.min(w), right.min(w), top.min(h), bottom.min(h));
    let rate = |i: usize, width: usize| ((i as f64 + 1.0) / width as f64) as f32;
    let mut scale = |b: usize, row: usize, col: usize, r: f32| out[(b * h + row) * w + col] *= r;
    for b in 0..batch {
        for i in 0..left {
            (0..h).for_each(|row| scale(b, row, i, rate(i, left)));
        }
        for i in 0..right {
            (0..h).for_each(|row| scale(b, row, w - 1 - i, rate(i, right)));
        }
        for i in 0..top {
            (0..w).for_each(|col| scale(b, i, col, rate(i, top)));
        }
        for i in 0..bottom {
            (0..w).for_each(|col| scale(b, h - 1 - i, col, rate(i, bottom)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::Node;

    #[test]
    fn a_source_combines_inside_the_destination_only_and_the_result_is_clamped() {
        // A 3x4 destination of 0.5, a 2x2 source of 0.75 at (3, 1): one column fits.
        let destination = vec![0.5; 12];
        let source = vec![0.75; 4];
        let add =
            composite((&destination, [1, 3, 4]), (&source, [1, 2, 2]), (3, 1), "add").unwrap();
        assert_eq!(add, [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1.0, 0.5, 0.5, 0.5, 1.0]);
        let sub =
            composite((&destination, [1, 3, 4]), (&source, [1, 2, 2]), (0, 0), "subtract").unwrap();
        assert_eq!(&sub[..2], [0.0, 0.0]);
        let mul =
            composite((&destination, [1, 3, 4]), (&source, [1, 2, 2]), (0, 0), "multiply").unwrap();
        assert_eq!(mul[0], 0.375);
        // Logical operations round: 0.5 rounds to 0 (half to even), 0.75 to 1; outside the source, unchanged.
        let or = composite((&destination, [1, 3, 4]), (&source, [1, 2, 2]), (0, 0), "or").unwrap();
        assert_eq!((or[0], or[2]), (1.0, 0.5));
        let and =
            composite((&[1.0, 1.0], [1, 1, 2]), (&[0.6, 0.4], [1, 1, 2]), (0, 0), "and").unwrap();
        assert_eq!(and, [1.0, 0.0]);
        let xor =
            composite((&[1.0, 0.0], [1, 1, 2]), (&[1.0, 1.0], [1, 1, 2]), (0, 0), "xor").unwrap();
        assert_eq!(xor, [0.0, 1.0]);
        // Outside entirely: unchanged.
        let away =
            composite((&destination, [1, 3, 4]), (&source, [1, 2, 2]), (9, 9), "add").unwrap();
        assert_eq!(away, destination);
    }

    #[test]
    fn one_source_mask_applies_to_every_destination_mask_and_other_batches_are_refused() {
        let two = composite((&[0.25, 0.5], [2, 1, 1]), (&[0.5], [1, 1, 1]), (0, 0), "add").unwrap();
        assert_eq!(two, [0.75, 1.0]);
        let err = composite((&[0.0; 3], [3, 1, 1]), (&[0.0; 2], [2, 1, 1]), (0, 0), "add")
            .expect_err("refused")
            .to_string();
        assert!(err.contains("source's 2 masks") && err.contains("destination's 3"), "{err}");
        let err = composite((&[0.0], [1, 1, 1]), (&[0.0], [1, 1, 1]), (0, 0), "blend").unwrap_err();
        assert!(err.to_string().contains("unknown operation `blend`"), "{err}");
    }

    #[test]
    fn feathering_scales_each_edge_from_the_outside_in() {
        let out = feather(&[1.0; 4 * 3], [1, 3, 4], [2, 1, 0, 0]);
        // Left columns 1/2 and 2/2; the top row 1/1 (a width of 1 leaves it as it is).
        assert_eq!(&out[..4], [0.5, 1.0, 1.0, 1.0]);
        let out = feather(&[1.0; 4], [1, 1, 4], [0, 0, 4, 0]);
        assert_eq!(out, [1.0, 0.75, 0.5, 0.25]);
        // Widths beyond the side are cut to it.
        let out = feather(&[1.0; 2], [1, 2, 1], [0, 0, 0, 10]);
        assert_eq!(out, [1.0, 0.5]);
    }

    fn run(name: &str, inputs: Vec<(&str, Value)>) -> crate::tensor::Tensor {
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        match crate::fixtures::node_outputs(&node, inputs).expect("runs").remove(0) {
            Value::Mask(mask) => mask,
            other => panic!("a mask, not {other:?}"),
        }
    }

    /// `scripts/reference/image_ops.py`'s record of ComfyUI's ImageColorToMask and CropMask.
    #[test]
    fn colour_keys_and_crops_match_comfyui() {
        let io = crate::fixtures::tensors("image_ops/io.safetensors");
        let key = |color: i64| {
            run(
                "ImageColorToMask",
                vec![("image", Value::Image(io["colors"].clone())), ("color", Value::Int(color))],
            )
        };
        // A pixel one level off the colour is not it; levels past 1 clamp to 255.
        assert_eq!(key(0x33_6699), io["color_mask"]);
        assert_eq!(key(0xFF_FF00), io["white_mask"]);
        for (x, y, w, h) in [(1, 2, 3, 2), (5, 4, 4, 5), (0, 0, 7, 6), (8, 1, 2, 2)] {
            let crop = run(
                "CropMask",
                vec![
                    ("mask", Value::Mask(io["mask"].clone())),
                    ("x", Value::Int(x)),
                    ("y", Value::Int(y)),
                    ("width", Value::Int(w)),
                    ("height", Value::Int(h)),
                ],
            );
            assert_eq!(crop, io[&format!("crop.{x}.{y}.{w}.{h}")], "crop {x} {y} {w} {h}");
        }
    }
}
