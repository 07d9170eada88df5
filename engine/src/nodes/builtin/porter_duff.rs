//! `PorterDuffImageComposite` and `SplitImageWithAlpha` (`comfy_extras.nodes_compositing`, V3; its
//! `JoinImageWithAlpha` is in `mask.rs`). ComfyUI's masks are transparency: alpha is `1 − mask` going in and
//! the mask `1 − alpha` coming out.
//!
//! Invariant: each operation is torch's f32 arithmetic in the order ComfyUI writes it, on premultiplied colours.

use super::image::dims;
use super::mask::{mask, tensor};
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

const MODULE: &str = "comfy_extras.nodes_compositing";

/// The modes, in ComfyUI's order.
const MODES: [&str; 18] = [
    "ADD", "CLEAR", "DARKEN", "DST", "DST_ATOP", "DST_IN", "DST_OUT", "DST_OVER", "LIGHTEN",
    "MULTIPLY", "OVERLAY", "SCREEN", "SRC", "SRC_ATOP", "SRC_IN", "SRC_OUT", "SRC_OVER", "XOR",
];

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let spec = |name: &str, display: &str| {
        NodeSpec::new(name, display, "image/compositing").python_module(MODULE).v3()
    };
    let typed = |name: &str, ty: &str| InputDef::typed(name, ty).with_options();
    vec![
        Pure::new(
            spec("PorterDuffImageComposite", "Porter-Duff Image Composite")
                .input(typed("source", "IMAGE"))
                .input(typed("source_alpha", "MASK"))
                .input(typed("destination", "IMAGE"))
                .input(typed("destination_alpha", "MASK"))
                .input(
                    InputDef::bare("mode", "COMBO")
                        .option("default", "DST")
                        .option("multiselect", false)
                        .option(
                            "options",
                            MODES.iter().map(|m| (*m).to_owned()).collect::<Vec<_>>(),
                        ),
                )
                .output(OutputDef::new("IMAGE"))
                .output(OutputDef::new("MASK"))
                .aliases(&["alpha composite", "blend modes", "layer blend", "transparency blend"]),
            porter_duff,
        ),
        Pure::new(
            spec("SplitImageWithAlpha", "Split Image with Alpha")
                .input(typed("image", "IMAGE"))
                .output(OutputDef::new("IMAGE"))
                .output(OutputDef::new("MASK"))
                .aliases(&["extract alpha", "separate transparency", "remove alpha"]),
            split_alpha,
        ),
    ]
}

fn invalid(message: String) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// One `[H, W, C]` image of a batch, or one `[H, W]` mask as a one-channel image.
fn sample(t: &Tensor, i: usize, shape: [usize; 3]) -> Result<Tensor, NodeError> {
    let [h, w, c] = shape;
    tensor(vec![1, h, w, c], t.data()[i * h * w * c..(i + 1) * h * w * c].to_vec())
}

/// `t` (one `[1, H, W, C]` sample) resized bicubically to `w × h` with ComfyUI's centre crop, when it is not that
/// size already.
fn fitted(t: Tensor, w: usize, h: usize) -> Result<Tensor, NodeError> {
    let (_, th, tw, _) = dims(&t)?;
    if (th, tw) == (h, w) { Ok(t) } else { resize(&t, w, h, "bicubic", true) }
}

/// `PorterDuffImageComposite`: per sample (as many as the shortest input), the destination's alpha, then the
/// source and its alpha, resized (bicubic, centre crop) to the destination where they differ; the colours
/// premultiplied, composited by `mode`, and divided by the resulting alpha where it exceeds 1e-5 (0 elsewhere),
/// clamped to 0..=1.
fn porter_duff(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let (source, destination) = (inputs.image("source")?, inputs.image("destination")?);
    let (src_alpha, [sab, sah, saw]) = mask(inputs, "source_alpha")?;
    let (dst_alpha, [dab, dah, daw]) = mask(inputs, "destination_alpha")?;
    let mode = inputs.string("mode")?;
    let mode = MODES.iter().position(|m| *m == mode).ok_or_else(|| {
        invalid(format!("PorterDuffImageComposite: `{mode}` is not one of {}", MODES.join(", ")))
    })?;
    let (sb, sh, sw, sc) = dims(source)?;
    let (db, h, w, c) = dims(destination)?;
    if sc != c {
        return Err(invalid(format!(
            "PorterDuffImageComposite: the source has {sc} channels, the destination {c}: they must agree"
        )));
    }
    let batch = sb.min(db).min(sab).min(dab);
    let (mut images, mut masks) = (Vec::new(), Vec::new());
    for i in 0..batch {
        let dst = sample(destination, i, [h, w, c])?;
        let dst_a = fitted(sample(&dst_alpha, i, [dah, daw, 1])?, w, h)?;
        let src = fitted(sample(source, i, [sh, sw, c])?, w, h)?;
        let src_a = fitted(sample(&src_alpha, i, [sah, saw, 1])?, w, h)?;
        let (image, alpha) = composite(src.data(), src_a.data(), dst.data(), dst_a.data(), c, mode);
        images.extend(image);
        masks.extend(alpha);
    }
    Ok(vec![
        Value::Image(tensor(vec![batch, h, w, c], images)?),
        Value::Mask(tensor(vec![batch, h, w], masks)?),
    ])
}

/// ComfyUI's `porter_duff_composite` on one sample's pixels (`c` channels each) and masks: the image and the
/// mask out.
fn composite(
    src: &[f32],
    src_mask: &[f32],
    dst: &[f32],
    dst_mask: &[f32],
    c: usize,
    mode: usize,
) -> (Vec<f32>, Vec<f32>) {
    let mut image = Vec::with_capacity(dst.len());
    let mut out_mask = Vec::with_capacity(dst_mask.len());
    for (p, (sm, dm)) in src_mask.iter().zip(dst_mask).enumerate() {
        let (sa, da) = (1.0 - sm, 1.0 - dm);
        let out_alpha = match MODES[mode] {
            "ADD" => (sa + da).clamp(0.0, 1.0),
            "CLEAR" => 0.0,
            "DST" => da,
            "DST_ATOP" | "SRC" => sa,
            "DST_IN" | "MULTIPLY" | "SRC_IN" => sa * da,
            "DST_OUT" => (1.0 - sa) * da,
            "DST_OVER" => da + (1.0 - da) * sa,
            "SRC_ATOP" => da,
            "SRC_OUT" => (1.0 - da) * sa,
            "SRC_OVER" => sa + (1.0 - sa) * da,
            "XOR" => (1.0 - da) * sa + (1.0 - sa) * da,
            // DARKEN, LIGHTEN, OVERLAY, SCREEN.
            _ => sa + da - sa * da,
        };
        for k in 0..c {
            let (s, d) = (src[p * c + k] * sa, dst[p * c + k] * da);
            let value = match MODES[mode] {
                "ADD" => (s + d).clamp(0.0, 1.0),
                "CLEAR" => 0.0,
                "DARKEN" => (1.0 - da) * s + (1.0 - sa) * d + s.min(d),
                "DST" => d,
                "DST_ATOP" => sa * d + (1.0 - da) * s,
                "DST_IN" => d * sa,
                "DST_OUT" => (1.0 - sa) * d,
                "DST_OVER" => d + (1.0 - da) * s,
                "LIGHTEN" => (1.0 - da) * s + (1.0 - sa) * d + s.max(d),
                "MULTIPLY" => s * d,
                "OVERLAY" if 2.0 * d < da => 2.0 * s * d,
                "OVERLAY" => sa * da - 2.0 * (da - s) * (sa - d),
                "SCREEN" => s + d - s * d,
                "SRC" => s,
                "SRC_ATOP" => da * s + (1.0 - sa) * d,
                "SRC_IN" => s * da,
                "SRC_OUT" => (1.0 - da) * s,
                "SRC_OVER" => s + (1.0 - sa) * d,
                // XOR.
                _ => (1.0 - da) * s + (1.0 - sa) * d,
            };
            let value = if out_alpha > 1e-5 { value / out_alpha } else { 0.0 };
            image.push(value.clamp(0.0, 1.0));
        }
        out_mask.push(1.0 - out_alpha);
    }
    (image, out_mask)
}

/// `SplitImageWithAlpha`: the first three channels (all of an image with fewer), and the mask `1 − alpha`
/// (alpha 1 for an image without a fourth channel).
fn split_alpha(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let (b, h, w, c) = dims(image)?;
    let kept = c.min(3);
    let pixels = image.data().chunks_exact(c.max(1));
    let rgb = pixels.clone().flat_map(|p| p[..kept].to_vec()).collect();
    let masks = pixels.map(|p| 1.0 - if c > 3 { p[3] } else { 1.0 }).collect();
    Ok(vec![
        Value::Image(tensor(vec![b, h, w, kept], rgb)?),
        Value::Mask(tensor(vec![b, h, w], masks)?),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::Node;

    fn run(name: &str, inputs: Vec<(&str, Value)>) -> Vec<Tensor> {
        let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        crate::fixtures::node_tensors(&node, inputs)
    }

    /// `scripts/reference/porter_duff.py`'s record of ComfyUI's nodes: every mode on a batch the shortest input
    /// bounds, masks with exact 0s and 1s, inputs of other sizes resized, and both alpha splits.
    #[test]
    fn composites_and_splits_are_comfyuis() {
        let io = crate::fixtures::tensors("porter_duff/io.safetensors");
        let image = |k: &str| Value::Image(io[k].clone());
        let mask = |k: &str| Value::Mask(io[k].clone());
        let composite = |source, source_alpha, destination, destination_alpha, mode: &str| {
            run(
                "PorterDuffImageComposite",
                vec![
                    ("source", source),
                    ("source_alpha", source_alpha),
                    ("destination", destination),
                    ("destination_alpha", destination_alpha),
                    ("mode", Value::String(mode.to_owned())),
                ],
            )
        };
        for mode in MODES {
            let got = composite(
                image("source"),
                mask("source_alpha"),
                image("destination"),
                mask("destination_alpha"),
                mode,
            );
            for (t, part) in got.iter().zip(["image", "mask"]) {
                let want = &io[&format!("{mode}.{part}")];
                assert_eq!(t.shape(), want.shape(), "{mode}.{part}");
                crate::fixtures::assert_within(
                    &format!("{mode}.{part}"),
                    t.data(),
                    want.data(),
                    1e-6,
                );
            }
        }
        let first =
            Tensor::new(vec![1, 6, 7, 3], io["destination"].data()[..6 * 7 * 3].to_vec()).unwrap();
        let got = composite(
            image("small"),
            mask("small_alpha"),
            Value::Image(first),
            mask("big_alpha"),
            "SRC_OVER",
        );
        crate::fixtures::assert_within(
            "resized.image",
            got[0].data(),
            io["resized.image"].data(),
            1e-5,
        );
        crate::fixtures::assert_within(
            "resized.mask",
            got[1].data(),
            io["resized.mask"].data(),
            1e-5,
        );
        let split = run("SplitImageWithAlpha", vec![("image", image("rgba"))]);
        assert_eq!(split[0], io["split.image"]);
        assert_eq!(split[1], io["split.mask"]);
        let split = run("SplitImageWithAlpha", vec![("image", image("rgb"))]);
        assert_eq!(split[1], io["split_rgb.mask"]);
        // A grey image keeps its one channel and is opaque.
        let grey = Tensor::full(vec![1, 2, 2, 1], 0.25);
        let split = run("SplitImageWithAlpha", vec![("image", Value::Image(grey.clone()))]);
        assert_eq!(split[0], grey);
        assert!(split[1].data().iter().all(|&m| m == 0.0));
    }
}
