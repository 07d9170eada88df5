//! Latent transforms: `LatentRotate`, `LatentFlip`, `LatentCrop` (`nodes.py`) and `LatentCompositeMasked`
//! (`comfy_extras.nodes_mask`).
//!
//! Invariant: a latent is `[B, C, ..., H, W]`; the transforms act on its last two dimensions, each `H × W`
//! plane alike (ComfyUI indexes dimensions 2 and 3, the same on its image latents; on a video latent Kiln keeps
//! to height and width). What rides along (the noise mask, the batch index) is kept as it is, as ComfyUI copies
//! the dict.

use super::latent::repeat_to_batch;
use super::mask::{mask, tensor};
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// The widgets' largest size and offset (ComfyUI's `MAX_RESOLUTION`).
const MAX_RESOLUTION: i64 = 16384;

/// A size or offset in pixels that ComfyUI divides by 8 into latent cells: `min..=MAX_RESOLUTION`, step 8.
pub(super) fn pixels(name: &str, default: i64, min: i64) -> InputDef {
    InputDef::int(name, default, min, MAX_RESOLUTION).option("step", 8)
}

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let transform = |name: &str, display: &str| {
        NodeSpec::new(name, display, "model/latent/transform")
            .input(InputDef::typed("samples", "LATENT"))
    };
    vec![
        Pure::new(
            transform("LatentRotate", "Rotate Latent")
                .input(InputDef::choices(
                    "rotation",
                    &["none", "90 degrees", "180 degrees", "270 degrees"],
                ))
                .output(OutputDef::new("LATENT"))
                .aliases(&[]),
            rotate,
        ),
        Pure::new(
            transform("LatentFlip", "Flip Latent")
                .input(InputDef::choices(
                    "flip_method",
                    &["x-axis: vertically", "y-axis: horizontally"],
                ))
                .output(OutputDef::new("LATENT"))
                .aliases(&["mirror latent"]),
            flip,
        ),
        Pure::new(
            transform("LatentCrop", "Crop Latent")
                .input(pixels("width", 512, 64))
                .input(pixels("height", 512, 64))
                .input(pixels("x", 0, 0))
                .input(pixels("y", 0, 0))
                .output(OutputDef::new("LATENT"))
                .aliases(&["trim latent", "cut latent"]),
            crop,
        ),
        Pure::new(
            NodeSpec::new("LatentCompositeMasked", "Latent Composite Masked", "model/latent")
                .python_module("comfy_extras.nodes_mask")
                .v3()
                .input(InputDef::typed("destination", "LATENT").with_options())
                .input(InputDef::typed("source", "LATENT").with_options())
                .input(pixels("x", 0, 0))
                .input(pixels("y", 0, 0))
                .input(InputDef::boolean("resize_source", false))
                .optional(InputDef::typed("mask", "MASK").with_options())
                .output(OutputDef::new("LATENT"))
                .aliases(&["overlay latent", "layer latent", "paste latent", "inpaint latent"]),
            composite_masked,
        ),
    ]
}

/// A latent's planes: how many `H × W` planes, and their height and width.
fn planes(t: &Tensor, node: &str) -> Result<(usize, usize, usize), NodeError> {
    match t.shape() {
        [_, _, .., h, w] if t.shape().len() >= 4 && h * w > 0 => {
            Ok((t.data().len() / (h * w), *h, *w))
        }
        other => Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "{node} works on non-empty latents [B, C, H, W] (or with frames), got {other:?}"
            ),
        )),
    }
}

/// `samples`' latent with its samples replaced by `values` of `shape`.
fn with_samples(
    inputs: &Inputs,
    shape: Vec<usize>,
    values: Vec<f32>,
) -> Result<Vec<Value>, NodeError> {
    let latent = inputs.latent("samples")?;
    Ok(vec![Value::Latent(latent.with_samples(tensor(shape, values)?))])
}

/// `LatentRotate`: each plane turned clockwise by the quarter turns named (torch's `rot90` over dims (3, 2)).
fn rotate(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let samples = &inputs.latent("samples")?.samples;
    let (n, h, w) = planes(samples, "LatentRotate")?;
    let turns = match inputs.string("rotation")? {
        r if r.starts_with("90") => 1,
        r if r.starts_with("180") => 2,
        r if r.starts_with("270") => 3,
        _ => 0,
    };
    let (oh, ow) = if turns % 2 == 1 { (w, h) } else { (h, w) };
    let mut out = Vec::with_capacity(samples.data().len());
    for plane in samples.data().chunks_exact(h * w).take(n) {
        for y in 0..oh {
            for x in 0..ow {
                // The source cell of output (y, x).
                let (sy, sx) = match turns {
                    1 => (h - 1 - x, y),
                    2 => (h - 1 - y, w - 1 - x),
                    3 => (x, w - 1 - y),
                    _ => (y, x),
                };
                out.push(plane[sy * w + sx]);
            }
        }
    }
    let mut shape = samples.shape().to_vec();
    let d = shape.len();
    (shape[d - 2], shape[d - 1]) = (oh, ow);
    with_samples(inputs, shape, out)
}

/// `LatentFlip`: each plane mirrored top to bottom ("x-axis") or left to right ("y-axis").
fn flip(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let samples = &inputs.latent("samples")?.samples;
    let (_, h, w) = planes(samples, "LatentFlip")?;
    let vertical = inputs.string("flip_method")?.starts_with('x');
    let mut out = Vec::with_capacity(samples.data().len());
    for plane in samples.data().chunks_exact(h * w) {
        for y in 0..h {
            let row = if vertical { h - 1 - y } else { y };
            let row = &plane[row * w..(row + 1) * w];
            if vertical {
                out.extend_from_slice(row);
            } else {
                out.extend(row.iter().rev());
            }
        }
    }
    with_samples(inputs, samples.shape().to_vec(), out)
}

/// A widget in pixels as latent cells (÷ 8, as ComfyUI divides whatever the model's VAE).
fn cells(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    usize::try_from(v / 8).map_err(|_| {
        NodeError::of_kind(ErrorKind::InvalidValue, format!("`{name}` must be 0 or more, got {v}"))
    })
}

/// `LatentCrop`: the block `width × height` (pixels ÷ 8) at (x, y), its corner kept at least 8 cells from the
/// far edges and the block cut at them, as ComfyUI slices.
fn crop(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let samples = &inputs.latent("samples")?.samples;
    let (n, h, w) = planes(samples, "LatentCrop")?;
    // ComfyUI pulls the corner back to 8 cells before the far edge, then slices as Python does (a negative
    // bound counts from the end; both are clamped to the dimension; an end before the start is empty).
    let range = |offset: usize, len: usize, size: usize| {
        let size = size as i64;
        let start = (offset as i64).min(size - 8);
        let bound = |v: i64| if v < 0 { (v + size).max(0) } else { v.min(size) } as usize;
        let (a, b) = (bound(start), bound(start + len as i64));
        (a, b.max(a))
    };
    let (x, x1) = range(cells(inputs, "x")?, cells(inputs, "width")?, w);
    let (y, y1) = range(cells(inputs, "y")?, cells(inputs, "height")?, h);
    let (oh, ow) = (y1 - y, x1 - x);
    let mut out = Vec::with_capacity(n * oh * ow);
    for plane in samples.data().chunks_exact(h * w) {
        for row in y..y1 {
            out.extend_from_slice(&plane[row * w + x..row * w + x1]);
        }
    }
    let mut shape = samples.shape().to_vec();
    let d = shape.len();
    (shape[d - 2], shape[d - 1]) = (oh, ow);
    with_samples(inputs, shape, out)
}

/// `LatentCompositeMasked`: `source` pasted into `destination` at (x, y) (pixels ÷ 8), blended by `mask`
/// (`mask · source + (1 − mask) · destination`, the mask resized bilinearly to the source and shared by its
/// channels and frames), cut at the destination's edges; `resize_source` first resizes the source (bilinear)
/// to the destination; the source and the mask repeat (or are cut) to the batch (ComfyUI's `composite`).
fn composite_masked(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let destination = inputs.latent("destination")?;
    let dest = &destination.samples;
    let source = &inputs.latent("source")?.samples;
    let shape = dest.shape();
    let (_, h, w) = planes(dest, "LatentCompositeMasked")?;
    let (_, sh0, sw0) = planes(source, "LatentCompositeMasked")?;
    let mismatch = || {
        NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "LatentCompositeMasked cannot paste a latent of shape {:?} into one of {shape:?}: their channels \
                 (and frames) must agree",
                source.shape()
            ),
        )
    };
    if source.shape().len() != shape.len()
        || source.shape()[1..shape.len() - 2] != shape[1..shape.len() - 2]
    {
        return Err(mismatch());
    }
    let source = if inputs.bool("resize_source")? && (sh0, sw0) != (h, w) {
        resized_planes(source, h, w)?
    } else {
        source.clone()
    };
    let source = repeat_to_batch(&source, shape[0])?;
    let (_, sh, sw) = planes(&source, "LatentCompositeMasked")?;
    let mask = match inputs.get("mask") {
        Some(_) => {
            let (m, [mb, mh, mw]) = mask(inputs, "mask")?;
            let resized = resize(
                &tensor(vec![mb, mh, mw, 1], m.data().to_vec())?,
                sw,
                sh,
                "bilinear",
                false,
            )?;
            Some(repeat_to_batch(&tensor(vec![mb, sh, sw], resized.data().to_vec())?, shape[0])?)
        }
        None => None,
    };
    let (left, top) = (cells(inputs, "x")?.min(w), cells(inputs, "y")?.min(h));
    let (visible_w, visible_h) = (sw.min(w - left), sh.min(h - top));
    let per_sample: usize = shape[1..shape.len() - 2].iter().product();
    let mut out = dest.data().to_vec();
    for b in 0..shape[0] {
        let alpha = mask.as_ref().map(|m| &m.data()[b * sh * sw..][..sh * sw]);
        for p in 0..per_sample {
            let plane = b * per_sample + p;
            let src = &source.data()[plane * sh * sw..][..sh * sw];
            for y in 0..visible_h {
                for x in 0..visible_w {
                    let m = alpha.map_or(1.0, |a| a[y * sw + x]);
                    let d = &mut out[plane * h * w + (top + y) * w + left + x];
                    *d = m * src[y * sw + x] + (1.0 - m) * *d;
                }
            }
        }
    }
    let samples = tensor(shape.to_vec(), out)?;
    Ok(vec![Value::Latent(destination.with_samples(samples))])
}

/// Each `H × W` plane of `t` resized bilinearly to `h × w`.
fn resized_planes(t: &Tensor, h: usize, w: usize) -> Result<Tensor, NodeError> {
    let (n, th, tw) = planes(t, "LatentCompositeMasked")?;
    let resized = resize(&tensor(vec![n, th, tw, 1], t.data().to_vec())?, w, h, "bilinear", false)?;
    let mut shape = t.shape().to_vec();
    let d = shape.len();
    (shape[d - 2], shape[d - 1]) = (h, w);
    tensor(shape, resized.data().to_vec())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::value::Latent;

    fn run(name: &str, inputs: Vec<(&str, Value)>) -> Result<Tensor, NodeError> {
        use crate::nodes::Node;
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        match crate::fixtures::node_outputs(&node, inputs)?.into_iter().next() {
            Some(Value::Latent(l)) => Ok(l.samples.clone()),
            other => panic!("{name}: not a latent: {other:?}"),
        }
    }

    fn latent(t: &Tensor) -> Value {
        Value::Latent(Latent::new(t.clone()))
    }

    fn same(what: &str, got: &Tensor, want: &Tensor) {
        assert_eq!(got.shape(), want.shape(), "{what}");
        crate::fixtures::assert_within(what, got.data(), want.data(), 1e-6);
    }

    fn io() -> BTreeMap<String, Tensor> {
        crate::fixtures::tensors("latent_transform/io.safetensors")
    }

    /// `scripts/reference/latent_transform.py`'s record of ComfyUI's nodes.
    #[test]
    fn rotations_flips_and_crops_are_comfyuis() {
        let io = io();
        let choice = |s: &str| Value::String(s.to_owned());
        for (k, name) in [(1, "90 degrees"), (2, "180 degrees"), (3, "270 degrees")] {
            let got = run(
                "LatentRotate",
                vec![("samples", latent(&io["latent"])), ("rotation", choice(name))],
            );
            same(name, &got.unwrap(), &io[&format!("rotate.{k}")]);
        }
        let none = run(
            "LatentRotate",
            vec![("samples", latent(&io["latent"])), ("rotation", choice("none"))],
        );
        same("none", &none.unwrap(), &io["latent"]);
        for (axis, method) in [("x", "x-axis: vertically"), ("y", "y-axis: horizontally")] {
            let got = run(
                "LatentFlip",
                vec![("samples", latent(&io["latent"])), ("flip_method", choice(method))],
            );
            same(method, &got.unwrap(), &io[&format!("flip.{axis}")]);
        }
        for (case, source, [w, h, x, y]) in [
            ("inner", "latent", [48, 64, 16, 24]),
            ("corner", "latent", [512, 512, 200, 200]),
            ("small", "small", [64, 64, 8, 8]),
        ] {
            let mut inputs = vec![("samples", latent(&io[source]))];
            inputs.extend(
                [("width", w), ("height", h), ("x", x), ("y", y)].map(|(k, v)| (k, Value::Int(v))),
            );
            same(case, &run("LatentCrop", inputs).unwrap(), &io[&format!("crop.{case}")]);
        }
    }

    #[test]
    fn masked_composites_are_comfyuis() {
        let io = io();
        let cases = [
            ("plain", "latent", "source", [16, 40], false, false),
            ("masked", "latent", "source", [16, 40], false, true),
            ("edge", "latent", "source", [48, 72], false, true),
            ("resized", "latent", "source", [0, 0], true, true),
            ("video", "video", "video_source", [16, 40], false, true),
        ];
        for (case, dest, source, [x, y], resize, masked) in cases {
            let mut inputs = vec![
                ("destination", latent(&io[dest])),
                ("source", latent(&io[source])),
                ("x", Value::Int(x)),
                ("y", Value::Int(y)),
                ("resize_source", Value::Bool(resize)),
            ];
            if masked {
                let mask = if case == "video" {
                    let m = &io["mask"];
                    let plane = m.shape()[1] * m.shape()[2];
                    Tensor::new(vec![1, m.shape()[1], m.shape()[2]], m.data()[..plane].to_vec())
                        .unwrap()
                } else {
                    io["mask"].clone()
                };
                inputs.push(("mask", Value::Mask(mask)));
            }
            let got = run("LatentCompositeMasked", inputs).unwrap();
            let want = &io[&format!("composite.{case}")];
            assert_eq!(got.shape(), want.shape(), "{case}");
            crate::fixtures::assert_within(case, got.data(), want.data(), 1e-5);
        }
        // Latents of other channels are refused, naming the node.
        let other = Tensor::full(vec![1, 4, 5, 4], 0.0);
        let inputs = vec![
            ("destination", latent(&io["latent"])),
            ("source", latent(&other)),
            ("x", Value::Int(0)),
            ("y", Value::Int(0)),
            ("resize_source", Value::Bool(false)),
        ];
        let err = run("LatentCompositeMasked", inputs).expect_err("4 channels into 3");
        assert!(err.message.contains("LatentCompositeMasked"), "{}", err.message);
    }
}
