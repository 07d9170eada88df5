//! Image-scaling nodes that choose the size themselves: `ImageScaleToMaxDimension` and `ResizeAndPadImage`
//! (`comfy_extras.nodes_images`) and `FluxKontextImageScale` (`comfy_extras.nodes_flux`).

use super::image::dims;
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// The sizes Flux Kontext was trained at, (width, height), in ComfyUI's order (ties go to the first).
const KONTEXT_RESOLUTIONS: [(usize, usize); 17] = [
    (672, 1568),
    (688, 1504),
    (720, 1456),
    (752, 1392),
    (800, 1328),
    (832, 1248),
    (880, 1184),
    (944, 1104),
    (1024, 1024),
    (1104, 944),
    (1184, 880),
    (1248, 832),
    (1328, 800),
    (1392, 752),
    (1456, 720),
    (1504, 688),
    (1568, 672),
];

/// The Kontext size whose aspect ratio is nearest the image's (Python's `min` over
/// `(|ratio − w/h|, w, h)` tuples: ties by the smaller width).
fn kontext_size(width: usize, height: usize) -> (usize, usize) {
    let ratio = width as f64 / height as f64;
    let key = |&(w, h): &(usize, usize)| ((ratio - w as f64 / h as f64).abs(), w, h);
    KONTEXT_RESOLUTIONS
        .iter()
        .copied()
        .min_by(|a, b| key(a).partial_cmp(&key(b)).unwrap_or(std::cmp::Ordering::Equal))
        .unwrap_or((1024, 1024))
}

/// The size with the longer side `largest` and the ratio kept (Python's `round`, halves to even).
fn max_dimension_size(width: usize, height: usize, largest: usize) -> (usize, usize) {
    let scaled = |side: usize, other: usize| {
        ((side as f64 / other as f64) * largest as f64).round_ties_even() as usize
    };
    match height.cmp(&width) {
        std::cmp::Ordering::Greater => (scaled(width, height), largest),
        std::cmp::Ordering::Less => (largest, scaled(height, width)),
        std::cmp::Ordering::Equal => (largest, largest),
    }
}

/// The nodes.
/// An advanced V3 combo (`advanced` written first).
fn advanced_combo(name: &str, options: &[&str]) -> InputDef {
    InputDef::bare(name, "COMBO")
        .option("advanced", true)
        .option("multiselect", false)
        .option("options", options.iter().map(|o| (*o).to_owned()).collect::<Vec<_>>())
}

/// `ResizeAndPadImage`: the image scaled by the smaller of the two ratios to the target (sides truncated as
/// Python's `int` truncates them, no crop) and centred on a white or black canvas of the target's size.
fn resize_and_pad(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let (b, h, w, c) = dims(image)?;
    let side = |name: &str| {
        usize::try_from(inputs.int(name)?)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| NodeError::new(format!("`{name}` must be 1 or more")))
    };
    let (tw, th) = (side("target_width")?, side("target_height")?);
    if w == 0 || h == 0 {
        return Err(NodeError::new(format!("ResizeAndPadImage: an image of {w} × {h} pixels")));
    }
    let scale = (tw as f64 / w as f64).min(th as f64 / h as f64);
    let (nw, nh) = ((w as f64 * scale) as usize, (h as f64 * scale) as usize);
    if nw == 0 || nh == 0 {
        return Err(NodeError::new(format!(
            "ResizeAndPadImage: {w} × {h} scaled into {tw} × {th} leaves no pixels"
        )));
    }
    let resized = resize(image, nw, nh, inputs.string("interpolation")?, false)?;
    let pad = if inputs.string("padding_color")? == "black" { 0.0 } else { 1.0 };
    let mut out = vec![pad; b * th * tw * c];
    let (top, left) = ((th - nh) / 2, (tw - nw) / 2);
    for i in 0..b {
        for y in 0..nh {
            let src = &resized.data()[((i * nh + y) * nw) * c..][..nw * c];
            out[((i * th + top + y) * tw + left) * c..][..nw * c].copy_from_slice(src);
        }
    }
    Ok(vec![Value::Image(
        crate::tensor::Tensor::new(vec![b, th, tw, c], out)
            .map_err(|e| NodeError::new(e.to_string()))?,
    )])
}

pub(super) fn nodes() -> Vec<Pure> {
    vec![
        Pure::new(
            NodeSpec::new(
                "ImageScaleToMaxDimension",
                "Scale Image to Max Dimension",
                "image/upscaling",
            )
            .python_module("comfy_extras.nodes_images")
            .v3()
            .input(InputDef::typed("image", "IMAGE"))
            .input(InputDef::v3_combo(
                "upscale_method",
                // ComfyUI's list, `bilinear` twice included.
                &["area", "lanczos", "bilinear", "nearest-exact", "bilinear", "bicubic"],
            ))
            .input(InputDef::int("largest_size", 512, 0, 16384).option("step", 1))
            .output(OutputDef::new("IMAGE")),
            |inputs| {
                let image = inputs.image("image")?;
                let (_, h, w, _) = dims(image)?;
                let largest = usize::try_from(inputs.int("largest_size")?)
                    .map_err(|_| NodeError::new("`largest_size` must be 0 or more"))?;
                let (width, height) = max_dimension_size(w, h, largest);
                let method = inputs.string("upscale_method")?;
                Ok(vec![Value::Image(resize(image, width, height, method, false)?)])
            },
        ),
        Pure::new(
            NodeSpec::new("ResizeAndPadImage", "Resize And Pad Image", "image/transform")
                .python_module("comfy_extras.nodes_images")
                .v3()
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::int("target_width", 512, 1, 16384).option("step", 1))
                .input(InputDef::int("target_height", 512, 1, 16384).option("step", 1))
                .input(advanced_combo("padding_color", &["white", "black"]))
                .input(advanced_combo(
                    "interpolation",
                    &["area", "bicubic", "nearest-exact", "bilinear", "lanczos"],
                ))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["fit to size"]),
            resize_and_pad,
        ),
        Pure::new(
            NodeSpec::new("FluxKontextImageScale", "", "model/conditioning/flux")
                .python_module("comfy_extras.nodes_flux")
                .v3()
                .description(
                    "This node resizes the image to one that is more optimal for flux kontext.",
                )
                .input(InputDef::typed("image", "IMAGE"))
                .output(OutputDef::new("IMAGE")),
            |inputs| {
                let image = inputs.image("image")?;
                let (_, h, w, _) = dims(image)?;
                let (width, height) = kontext_size(w, h);
                Ok(vec![Value::Image(resize(image, width, height, "lanczos", true)?)])
            },
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's ResizeAndPadImage (`scripts/reference/image_ops.py`): a 14 × 9 picture fitted into 20 × 11
    /// (white) and 7 × 12 (black) by every method.
    #[test]
    fn resize_and_pad_fits_and_centres_as_comfyui() {
        use crate::nodes::Node as _;
        let io = crate::fixtures::tensors("image_ops/io.safetensors");
        let node =
            nodes().into_iter().find(|n| n.spec().name == "ResizeAndPadImage").expect("node");
        for ((tw, th), colour) in [((20, 11), "white"), ((7, 12), "black")] {
            for method in ["area", "bicubic", "nearest-exact", "bilinear", "lanczos"] {
                let inputs = vec![
                    ("image", Value::Image(io["pad_image"].clone())),
                    ("target_width", Value::Int(tw)),
                    ("target_height", Value::Int(th)),
                    ("padding_color", Value::String(colour.into())),
                    ("interpolation", Value::String(method.into())),
                ];
                let out = crate::fixtures::node_outputs(&node, inputs).expect("runs");
                let Value::Image(got) = &out[0] else { panic!("an image") };
                let key = format!("pad.{tw}x{th}.{colour}.{method}");
                let want = &io[&key];
                assert_eq!(got.shape(), want.shape(), "{key}");
                crate::fixtures::assert_within(&key, got.data(), want.data(), 1e-5);
            }
        }
    }

    #[test]
    fn kontext_picks_the_nearest_trained_ratio() {
        assert_eq!(kontext_size(512, 512), (1024, 1024));
        assert_eq!(kontext_size(1920, 1080), (1392, 752));
        assert_eq!(kontext_size(100, 1000), (672, 1568));
    }

    #[test]
    fn max_dimension_keeps_the_ratio_with_python_rounding() {
        assert_eq!(max_dimension_size(640, 480, 512), (512, 384));
        assert_eq!(max_dimension_size(480, 640, 512), (384, 512));
        assert_eq!(max_dimension_size(300, 300, 64), (64, 64));
        // 1/4·2 = 0.5 rounds to 0 (half to even, as Python's `round`).
        assert_eq!(max_dimension_size(4, 1, 2), (2, 0));
    }
}
