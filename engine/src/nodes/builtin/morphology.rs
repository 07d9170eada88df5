//! `comfy_extras.nodes_morphology` (V3 classes): `Morphology` (kornia's grey-scale morphology with a flat square
//! kernel) and `ImageRGBToYUV` / `ImageYUVToRGB` (kornia's YCbCr conversion).
//!
//! The reference is kornia 0.9.0 (the newest release ComfyUI's `kornia>=0.7.1` takes), as `filters.rs`'s Canny:
//! its `geodesic` border leaves the pixels outside the image out of a window, its dilation takes the maximum of
//! `f(x − b)` (the kernel reflected, as `scipy.ndimage`) and its erosion the minimum of `f(x + b)`, with the
//! kernel's origin at its middle cell (`k / 2`).

use super::image::dims;
use super::mask::tensor;
use super::pure::Pure;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

const MODULE: &str = "comfy_extras.nodes_morphology";

/// The operations, in ComfyUI's order.
const OPERATIONS: [&str; 7] =
    ["erode", "dilate", "open", "close", "gradient", "bottom_hat", "top_hat"];

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let spec = |name: &str, display: &str, category: &str| {
        NodeSpec::new(name, display, category).python_module(MODULE).v3()
    };
    let image = |name: &str| InputDef::typed(name, "IMAGE").with_options();
    vec![
        Pure::new(
            spec("Morphology", "Apply Morphology", "image/filters")
                .input(image("image"))
                .input(InputDef::v3_combo("operation", &OPERATIONS))
                .input(InputDef::int("kernel_size", 3, 3, 999).option("step", 1))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["erode", "dilate"]),
            morphology,
        ),
        Pure::new(
            spec("ImageRGBToYUV", "Image RGB to YUV", "image/color")
                .input(image("image"))
                .output(OutputDef::new("IMAGE").named("Y"))
                .output(OutputDef::new("IMAGE").named("U"))
                .output(OutputDef::new("IMAGE").named("V"))
                .aliases(&["color space conversion"]),
            rgb_to_yuv,
        ),
        Pure::new(
            spec("ImageYUVToRGB", "Image YUV to RGB", "image/color")
                .input(image("Y"))
                .input(image("U"))
                .input(image("V"))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["color space conversion"]),
            yuv_to_rgb,
        ),
    ]
}

/// The extreme a pass takes over its window.
#[derive(Clone, Copy)]
enum Extreme {
    Max,
    Min,
}

/// `Morphology`: each channel eroded, dilated, opened (erosion, then dilation), closed (dilation, then erosion),
/// its gradient (dilation − erosion), black top hat (closing − image) or white top hat (image − opening), with a
/// `kernel_size` square of ones.
fn morphology(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let (b, h, w, c) = dims(image)?;
    let size =
        usize::try_from(inputs.int("kernel_size")?).ok().filter(|&k| k >= 1).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::InvalidValue, "kernel_size must be at least 1")
        })?;
    let planes = Planes { b, h, w, c };
    let values = image.data();
    let dilate = |v: &[f32]| planes.pass(v, size, Extreme::Max);
    let erode = |v: &[f32]| planes.pass(v, size, Extreme::Min);
    let minus = |a: Vec<f32>, b: &[f32]| a.iter().zip(b).map(|(a, b)| a - b).collect::<Vec<f32>>();
    let out = match inputs.string("operation")? {
        "erode" => erode(values),
        "dilate" => dilate(values),
        "open" => dilate(&erode(values)),
        "close" => erode(&dilate(values)),
        "gradient" => minus(dilate(values), &erode(values)),
        "top_hat" => minus(values.to_vec(), &dilate(&erode(values))),
        "bottom_hat" => minus(erode(&dilate(values)), values),
        other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("Morphology: `{other}` is not one of {}", OPERATIONS.join(", ")),
            ));
        }
    };
    Ok(vec![Value::Image(tensor(image.shape().to_vec(), out)?)])
}

/// The layout of an image `[B, H, W, C]`.
#[derive(Clone, Copy)]
struct Planes {
    b: usize,
    h: usize,
    w: usize,
    c: usize,
}

impl Planes {
    /// The maximum (dilation) or minimum (erosion) of each value's window of `size × size` pixels inside the
    /// image: rows then columns (a flat square window's extreme is the extreme of its rows' extremes).
    fn pass(self, values: &[f32], size: usize, extreme: Extreme) -> Vec<f32> {
        let origin = size / 2;
        // The window of x: dilation reads x − b for the kernel offsets b = cell − origin, erosion x + b.
        let (before, after) = match extreme {
            Extreme::Max => (size - 1 - origin, origin),
            Extreme::Min => (origin, size - 1 - origin),
        };
        let pick = |a: f32, b: f32| match extreme {
            Extreme::Max => a.max(b),
            Extreme::Min => a.min(b),
        };
        let Planes { b, h, w, c } = self;
        // Along a line of `len` values `stride` apart: each value's extreme over its window on the line.
        let along = |values: &[f32], len: usize, stride: usize| {
            let mut out = vec![0f32; values.len()];
            for start in (0..values.len()).filter(|&i| (i / stride).is_multiple_of(len)) {
                for p in 0..len {
                    let window = p.saturating_sub(before)..(p + after + 1).min(len);
                    let mut r = window.map(|q| values[start + q * stride]);
                    let first = r.next().unwrap_or(0.0);
                    out[start + p * stride] = r.fold(first, pick);
                }
            }
            out
        };
        debug_assert_eq!(values.len(), b * h * w * c);
        along(&along(values, w, c), h, w * c)
    }
}

/// An RGB image's three channels, or an error naming the node.
fn rgb(image: &Tensor, node: &str) -> Result<(usize, usize, usize), NodeError> {
    match dims(image)? {
        (b, h, w, 3) => Ok((b, h, w)),
        (.., c) => Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("{node} converts RGB images (3 channels), got {c} channels"),
        )),
    }
}

/// `ImageRGBToYUV`: kornia's `rgb_to_ycbcr` (Y = 0.299 R + 0.587 G + 0.114 B, Cb = (B − Y)·0.564 + ½, Cr =
/// (R − Y)·0.713 + ½), each plane as an image of three equal channels.
fn rgb_to_yuv(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    rgb(image, "ImageRGBToYUV")?;
    let mut planes = [Vec::new(), Vec::new(), Vec::new()];
    for p in image.data().chunks_exact(3) {
        let (r, g, b) = (p[0], p[1], p[2]);
        let y = 0.299 * r + 0.587 * g + 0.114 * b;
        let values = [y, (b - y) * 0.564 + 0.5, (r - y) * 0.713 + 0.5];
        for (plane, v) in planes.iter_mut().zip(values) {
            plane.extend([v; 3]);
        }
    }
    planes
        .into_iter()
        .map(|plane| Ok(Value::Image(tensor(image.shape().to_vec(), plane)?)))
        .collect()
}

/// `ImageYUVToRGB`: each of Y, U and V averaged over its channels, then kornia's `ycbcr_to_rgb` (R = Y +
/// 1.4025245442 Cr', G = Y − 0.7144034731 Cr' − 0.3443401356 Cb', B = Y + 1.7730496454 Cb', with Cb' = Cb − ½ and
/// Cr' = Cr − ½), clamped to 0..=1.
fn yuv_to_rgb(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let [y, u, v] = ["Y", "U", "V"].map(|k| inputs.image(k));
    let (y, u, v) = (y?, u?, v?);
    let (b, h, w, _) = dims(y)?;
    for (name, t) in [("U", u), ("V", v)] {
        let (tb, th, tw, _) = dims(t)?;
        if (tb, th, tw) != (b, h, w) {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!(
                    "ImageYUVToRGB: {name} is {tw}x{th} ×{tb}, Y {w}x{h} ×{b}: the planes must agree"
                ),
            ));
        }
    }
    let mean = |t: &Tensor| -> Vec<f32> {
        let c = t.shape()[3];
        t.data().chunks_exact(c).map(|p| p.iter().sum::<f32>() / c as f32).collect()
    };
    let (ys, us, vs) = (mean(y), mean(u), mean(v));
    // kornia's constants, as torch meets them: Python floats rounded to f32.
    let [kr, kg_r, kg_b, kb] =
        [1.402_524_544_2_f64, 0.714_403_473_1, 0.344_340_135_6, 1.773_049_645_4].map(|k| k as f32);
    let mut out = Vec::with_capacity(b * h * w * 3);
    for ((y, cb), cr) in ys.iter().zip(&us).zip(&vs) {
        let (cb, cr) = (cb - 0.5, cr - 0.5);
        let r = y + kr * cr;
        let g = y - kg_r * cr - kg_b * cb;
        let b = y + kb * cb;
        out.extend([r, g, b].map(|v| v.clamp(0.0, 1.0)));
    }
    Ok(vec![Value::Image(tensor(vec![b, h, w, 3], out)?)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::Node;

    fn run(name: &str, inputs: Vec<(&str, Value)>) -> Vec<Tensor> {
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        crate::fixtures::node_tensors(&node, inputs)
    }

    /// `scripts/reference/morphology.py`'s record of ComfyUI's nodes on kornia 0.9.0.
    #[test]
    fn morphology_and_yuv_are_comfyuis() {
        let io = crate::fixtures::tensors("morphology/io.safetensors");
        let image = || Value::Image(io["image"].clone());
        for operation in OPERATIONS {
            for size in [3, 4, 7] {
                let got = run(
                    "Morphology",
                    vec![
                        ("image", image()),
                        ("operation", Value::String(operation.to_owned())),
                        ("kernel_size", Value::Int(size)),
                    ],
                );
                let key = format!("{operation}.{size}");
                crate::fixtures::assert_within(&key, got[0].data(), io[&key].data(), 1e-6);
            }
        }
        let yuv = run("ImageRGBToYUV", vec![("image", image())]);
        for (plane, name) in yuv.iter().zip(["y", "u", "v"]) {
            crate::fixtures::assert_within(name, plane.data(), io[name].data(), 1e-6);
        }
        let planes = ["Y", "U", "V"].iter().zip(&yuv).map(|(k, t)| (*k, Value::Image(t.clone())));
        let back = run("ImageYUVToRGB", planes.collect());
        crate::fixtures::assert_within("rgb", back[0].data(), io["rgb"].data(), 1e-6);
    }
}
