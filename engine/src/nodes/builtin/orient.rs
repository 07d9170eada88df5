//! `ImageFlip` and `ImageRotate` (`comfy_extras.nodes_images`): an image batch mirrored along an axis or
//! turned by quarter turns, as `torch.flip` and `torch.rot90(dims=[2, 1])` move its pixels.

use super::image::dims;
use super::mask::tensor;
use super::pure::Pure;
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

const MODULE: &str = "comfy_extras.nodes_images";

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    let spec = |name: &str, display: &str| {
        NodeSpec::new(name, display, "image/transform").python_module(MODULE).v3()
    };
    vec![
        Pure::new(
            spec("ImageRotate", "Rotate Image")
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::v3_combo(
                    "rotation",
                    &["none", "90 degrees", "180 degrees", "270 degrees"],
                ))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["turn", "flip orientation"])
                .essentials("Image Tools"),
            |inputs| {
                // ComfyUI reads the choice's leading digits.
                let rotation = inputs.string("rotation")?;
                let quarter_turns = ["90", "180", "270"]
                    .iter()
                    .position(|p| rotation.starts_with(p))
                    .map_or(0, |i| i + 1);
                Ok(vec![Value::Image(rotate(inputs.image("image")?, quarter_turns)?)])
            },
        ),
        Pure::new(
            spec("ImageFlip", "Flip Image")
                .input(InputDef::typed("image", "IMAGE"))
                .input(InputDef::v3_combo(
                    "flip_method",
                    &["x-axis: vertically", "y-axis: horizontally"],
                ))
                .output(OutputDef::new("IMAGE"))
                .aliases(&["mirror", "reflect"]),
            |inputs| {
                let image = inputs.image("image")?;
                let method = inputs.string("flip_method")?;
                let flipped = if method.starts_with('x') {
                    flip(image, true)?
                } else if method.starts_with('y') {
                    flip(image, false)?
                } else {
                    image.clone()
                };
                Ok(vec![Value::Image(flipped)])
            },
        ),
    ]
}

/// `image` `[B, H, W, C]` upside down (`vertically`: rows reversed) or mirrored left to right.
fn flip(image: &Tensor, vertically: bool) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(image)?;
    let mut out = Vec::with_capacity(image.data().len());
    for i in 0..b {
        for y in 0..h {
            let row = if vertically { h - 1 - y } else { y };
            for x in 0..w {
                let col = if vertically { x } else { w - 1 - x };
                out.extend_from_slice(&image.data()[((i * h + row) * w + col) * c..][..c]);
            }
        }
    }
    tensor(vec![b, h, w, c], out)
}

/// `image` `[B, H, W, C]` turned clockwise by `quarter_turns` quarter turns (`torch.rot90(k, dims=[2, 1])`):
/// odd turns swap its height and width.
fn rotate(image: &Tensor, quarter_turns: usize) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(image)?;
    let (oh, ow) = if quarter_turns % 2 == 1 { (w, h) } else { (h, w) };
    let mut out = Vec::with_capacity(image.data().len());
    for i in 0..b {
        for y in 0..oh {
            for x in 0..ow {
                // The input pixel that lands at output (y, x).
                let (sy, sx) = match quarter_turns % 4 {
                    1 => (h - 1 - x, y),
                    2 => (h - 1 - y, w - 1 - x),
                    3 => (x, w - 1 - y),
                    _ => (y, x),
                };
                out.extend_from_slice(&image.data()[((i * h + sy) * w + sx) * c..][..c]);
            }
        }
    }
    tensor(vec![b, oh, ow, c], out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::Node;

    /// `scripts/reference/image_ops.py`'s record of ComfyUI's ImageRotate and ImageFlip.
    #[test]
    fn rotations_and_flips_move_pixels_as_comfyuis() {
        let io = crate::fixtures::tensors("image_ops/io.safetensors");
        let run = |name: &str, choice: (&str, &str)| {
            let node = nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
            let inputs = vec![
                ("image", Value::Image(io["image"].clone())),
                (choice.0, Value::String(choice.1.into())),
            ];
            match crate::fixtures::node_outputs(&node, inputs).expect("runs").remove(0) {
                Value::Image(image) => image,
                other => panic!("an image, not {other:?}"),
            }
        };
        for choice in ["none", "90 degrees", "180 degrees", "270 degrees"] {
            assert_eq!(
                run("ImageRotate", ("rotation", choice)),
                io[&format!("rotate.{choice}")],
                "{choice}"
            );
        }
        for choice in ["x-axis: vertically", "y-axis: horizontally"] {
            let want = &io[&format!("flip.{}", &choice[..1])];
            assert_eq!(&run("ImageFlip", ("flip_method", choice)), want, "{choice}");
        }
    }
}
