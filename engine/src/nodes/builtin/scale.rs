//! Image-scaling nodes that choose the size themselves: `ImageScaleToMaxDimension`
//! (`comfy_extras.nodes_images`) and `FluxKontextImageScale` (`comfy_extras.nodes_flux`).

use super::image::dims;
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
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
