//! `ImageStitch` (`comfy_extras.nodes_images`, V3): one image put beside another, as ComfyUI does it — the
//! batches evened by repeating the last image, the second image resized (lanczos) to the first's height or
//! width or, without resizing, both padded to the larger one, channels evened with ones, and an optional even
//! strip of colour between them.

use super::image::dims;
use super::pure::Pure;
use super::resize::resize;
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// An image as `[B, H, W, C]` values, for the arithmetic here.
#[derive(Clone)]
struct Image {
    b: usize,
    h: usize,
    w: usize,
    c: usize,
    data: Vec<f32>,
}

impl Image {
    fn of(t: &Tensor) -> Result<Image, NodeError> {
        let (b, h, w, c) = dims(t)?;
        Ok(Image { b, h, w, c, data: t.data().to_vec() })
    }

    fn at(&self, b: usize, y: usize, x: usize) -> &[f32] {
        let start = ((b * self.h + y) * self.w + x) * self.c;
        &self.data[start..start + self.c]
    }

    fn tensor(self) -> Result<Tensor, NodeError> {
        Tensor::new(vec![self.b, self.h, self.w, self.c], self.data)
            .map_err(|e| NodeError::new(e.to_string()))
    }

    /// A batch of `batch`, the last image repeated.
    fn repeated_to(mut self, batch: usize) -> Image {
        let per = self.h * self.w * self.c;
        while self.b < batch {
            let last = self.data[(self.b - 1) * per..self.b * per].to_vec();
            self.data.extend(last);
            self.b += 1;
        }
        self
    }

    /// Padded with `value` to `h × w`, the padding split as `pad // 2` before and the rest after.
    fn pad_to(self, h: usize, w: usize, value: f32) -> Image {
        if (h, w) == (self.h, self.w) {
            return self;
        }
        let (top, left) = ((h - self.h) / 2, (w - self.w) / 2);
        let mut data = vec![value; self.b * h * w * self.c];
        for b in 0..self.b {
            for y in 0..self.h {
                for x in 0..self.w {
                    let dst = ((b * h + y + top) * w + x + left) * self.c;
                    data[dst..dst + self.c].copy_from_slice(self.at(b, y, x));
                }
            }
        }
        Image { h, w, data, ..self }
    }

    /// Widened to `c` channels with ones.
    fn channels(self, c: usize) -> Image {
        if c == self.c {
            return self;
        }
        let data = self
            .data
            .chunks_exact(self.c)
            .flat_map(|p| p.iter().copied().chain(std::iter::repeat_n(1.0, c - self.c)))
            .collect();
        Image { c, data, ..self }
    }
}

/// `images` joined along the width (`horizontal`) or the height; they share the other dimensions.
fn concat(images: &[Image], horizontal: bool) -> Image {
    let first = &images[0];
    let (b, c) = (first.b, first.c);
    let (h, w) = if horizontal {
        (first.h, images.iter().map(|i| i.w).sum())
    } else {
        (images.iter().map(|i| i.h).sum(), first.w)
    };
    let mut data = Vec::with_capacity(b * h * w * c);
    for bi in 0..b {
        if horizontal {
            for y in 0..h {
                for image in images {
                    let row = ((bi * image.h + y) * image.w) * c;
                    data.extend_from_slice(&image.data[row..row + image.w * c]);
                }
            }
        } else {
            for image in images {
                let per = image.h * image.w * c;
                data.extend_from_slice(&image.data[bi * per..(bi + 1) * per]);
            }
        }
    }
    Image { b, h, w, c, data }
}

/// The spacing colours: one value for every colour channel, or an RGB triple.
fn color(name: &str) -> Result<[f32; 3], NodeError> {
    Ok(match name {
        "white" => [1.0; 3],
        "black" => [0.0; 3],
        "red" => [1.0, 0.0, 0.0],
        "green" => [0.0, 1.0, 0.0],
        "blue" => [0.0, 0.0, 1.0],
        other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("unknown spacing color `{other}`"),
            ));
        }
    })
}

fn stitch(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let first = inputs.image("image1")?;
    let second = match inputs.get("image2") {
        Some(Value::Image(t)) => t,
        _ => return Ok(vec![Value::Image(first.clone())]),
    };
    let direction = inputs.string("direction")?;
    let horizontal = matches!(direction, "left" | "right");
    let spacing_color = inputs.string("spacing_color")?;
    let rgb = color(spacing_color)?;
    let (mut a, mut b) = (Image::of(first)?, Image::of(second)?);
    let batch = a.b.max(b.b);
    (a, b) = (a.repeated_to(batch), b.repeated_to(batch));
    if inputs.bool("match_image_size")? {
        let aspect = b.w as f64 / b.h as f64;
        let (tw, th) = if horizontal {
            ((a.h as f64 * aspect) as usize, a.h)
        } else {
            (a.w, (a.w as f64 / aspect) as usize)
        };
        b = Image::of(&resize(&b.tensor()?, tw, th, "lanczos", false)?)?;
    } else {
        // A single value pads (white, black); the coloured ones pad with 0.
        let pad = match spacing_color {
            "white" => 1.0,
            _ => 0.0,
        };
        let (aw, bw, ah, bh) = (a.w, b.w, a.h, b.h);
        if horizontal {
            let h = ah.max(bh);
            (a, b) = (a.pad_to(h, aw, pad), b.pad_to(h, bw, pad));
        } else {
            let w = aw.max(bw);
            (a, b) = (a.pad_to(ah, w, pad), b.pad_to(bh, w, pad));
        }
    }
    let c = a.c.max(b.c);
    (a, b) = (a.channels(c), b.channels(c));
    let mut parts = if matches!(direction, "left" | "up") { vec![b, a] } else { vec![a, b] };
    let spacing = usize::try_from(inputs.int("spacing_width")?).unwrap_or(0);
    if spacing > 0 {
        let spacing = spacing + spacing % 2;
        let (h, w) = if horizontal {
            (parts[0].h.max(parts[1].h), spacing)
        } else {
            (spacing, parts[0].w.max(parts[1].w))
        };
        let pixel: Vec<f32> = (0..c).map(|i| if i < 3 { rgb[i] } else { 1.0 }).collect();
        let data = pixel.repeat(batch * h * w);
        parts.insert(1, Image { b: batch, h, w, c, data });
    }
    Ok(vec![Value::Image(concat(&parts, horizontal).tensor()?)])
}

/// The node.
pub(super) fn node() -> Pure {
    Pure::new(
        NodeSpec::new("ImageStitch", "Stitch Images", "image/transform")
            .python_module("comfy_extras.nodes_images")
            .v3()
            .description(
                "Stitches image2 to image1 in the specified direction.\nIf image2 is not provided, returns \
                 image1 unchanged.\nOptional spacing can be added between images.",
            )
            .input(InputDef::typed("image1", "IMAGE"))
            .input(
                InputDef::bare("direction", "COMBO")
                    .option("default", "right")
                    .option("multiselect", false)
                    .option("options", vec!["right", "down", "left", "up"]),
            )
            .input(InputDef::boolean("match_image_size", true))
            .input(
                InputDef::bare("spacing_width", "INT")
                    .option("advanced", true)
                    .option("default", 0)
                    .option("min", 0)
                    .option("max", 1024)
                    .option("step", 2),
            )
            .input(
                InputDef::bare("spacing_color", "COMBO")
                    .option("advanced", true)
                    .option("default", "white")
                    .option("multiselect", false)
                    .option("options", vec!["white", "black", "red", "green", "blue"]),
            )
            .optional(InputDef::typed("image2", "IMAGE"))
            .output(OutputDef::new("IMAGE"))
            .aliases(&["combine images", "join images", "concatenate images", "side by side"]),
        stitch,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(b: usize, h: usize, w: usize, c: usize, v: f32) -> Image {
        Image { b, h, w, c, data: vec![v; b * h * w * c] }
    }

    #[test]
    fn padding_and_concatenation_place_pixels_as_torch_does() {
        let padded = image(1, 1, 2, 1, 5.0).pad_to(4, 2, 0.0);
        assert_eq!(padded.data, [0.0, 0.0, 5.0, 5.0, 0.0, 0.0, 0.0, 0.0]);
        let joined = concat(&[image(1, 2, 1, 1, 1.0), image(1, 2, 2, 1, 2.0)], true);
        assert_eq!((joined.h, joined.w), (2, 3));
        assert_eq!(joined.data, [1.0, 2.0, 2.0, 1.0, 2.0, 2.0]);
        let stacked = concat(&[image(2, 1, 1, 1, 1.0), image(2, 2, 1, 1, 2.0)], false);
        assert_eq!(stacked.data, [1.0, 2.0, 2.0, 1.0, 2.0, 2.0]);
        assert_eq!(image(1, 1, 1, 3, 0.5).channels(4).data, [0.5, 0.5, 0.5, 1.0]);
    }
}
