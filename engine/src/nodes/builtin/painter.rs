//! `Painter` (`comfy_extras.nodes_painter`): the frontend's painting widget. What the user painted arrives as an
//! RGBA PNG (the `mask` input names it, as `LoadImage` names a file, with an optional `[input]`, `[output]` or
//! `[temp]` annotation); the node lays it over the base image (the first of `image`, or a `width` × `height`
//! canvas of `bg_color`), resized with PIL's Lanczos when its size differs, and gives the composite and the
//! painting's alpha as the mask, with the composite as its preview.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::files::{decode_image, file_fingerprint, preview};
use super::pil_lanczos;
use crate::nodes::{
    Context, ErrorKind, Fingerprint, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec,
    Output, OutputDef,
};
use crate::roots;
use crate::tensor::Tensor;
use crate::value::Value;

/// `Painter`.
pub(super) struct Painter {
    spec: Arc<NodeSpec>,
    input_dir: PathBuf,
}

impl Painter {
    pub(super) fn new(input_dir: PathBuf) -> Painter {
        let side = |name: &str| {
            InputDef::bare(name, "INT")
                .option("hidden", true)
                .option("default", 512)
                .option("socketless", true)
                .option("min", 64)
                .option("max", 4096)
                .option("step", 64)
        };
        let spec = NodeSpec::new("Painter", "Painter", "image")
            .python_module("comfy_extras.nodes_painter")
            .v3()
            .intermediate_output()
            .input(
                InputDef::bare("mask", "STRING")
                    .option("widgetType", "PAINTER")
                    .option("image_upload", true)
                    .option("default", "")
                    .option("socketless", true)
                    .option("multiline", false),
            )
            .input(side("width"))
            .input(side("height"))
            .input(
                InputDef::bare("bg_color", "COLOR")
                    .option("default", "#000000")
                    .option("socketless", true),
            )
            .optional(
                InputDef::typed("image", "IMAGE").tooltip("Optional base image to paint over"),
            )
            .output(OutputDef::new("IMAGE"))
            .output(OutputDef::new("MASK"));
        Painter { spec: Arc::new(spec), input_dir }
    }
}

impl Node for Painter {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    /// The painting's bytes, as ComfyUI's `fingerprint_inputs` hashes them: a new painting under the same name
    /// runs the node again. A painting outside the input directory is read at every run.
    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        let name = inputs.string("mask").unwrap_or_default();
        if name.trim().is_empty() {
            return Fingerprint::Value(String::new());
        }
        file_fingerprint(annotated(name, &self.input_dir, None, None).ok().as_deref())
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let base = match inputs.get("image") {
            Some(_) => first(inputs.image("image")?)?,
            None => {
                let side = |name: &str| -> Result<usize, NodeError> {
                    usize::try_from(inputs.int(name)?)
                        .map_err(|_| NodeError::new(format!("`{name}` must be positive")))
                };
                canvas(side("width")?, side("height")?, &colour(inputs)?)?
            }
        };
        let name = inputs.string("mask")?;
        let painting = match name.trim() {
            "" => None,
            _ => Some(annotated(name, &ctx.input_dir, Some(&ctx.output_dir), Some(&ctx.temp_dir))?),
        };
        let (image, mask) = paint(base, painting.as_deref().map(|path| (path, name)))?;
        let ui = preview(&image, ctx)?;
        Ok(NodeResult {
            outputs: vec![Output::One(Value::Image(image)), Output::One(Value::Mask(mask))],
            ui: Some(ui),
        })
    }
}

/// `base` (`[1, h, w, c]`) with the painting at `painting` (its path and name) laid over it, and the mask;
/// without a painting, `base` as it is and a zero mask.
fn paint(base: Tensor, painting: Option<(&Path, &str)>) -> Result<(Tensor, Tensor), NodeError> {
    let &[1, h, w, _] = base.shape() else {
        return Err(NodeError::new(format!("a base image [1, H, W, C], got {:?}", base.shape())));
    };
    match painting {
        None => Ok((base, Tensor::full(vec![1, h, w], 0.0))),
        Some((path, name)) => composite(&base, &read_rgba(path, name, (w, h))?),
    }
}

/// The file a painting's name refers to ([`roots::annotated`]), or the error naming it.
fn annotated(
    name: &str,
    input: &Path,
    output: Option<&Path>,
    temp: Option<&Path>,
) -> Result<PathBuf, NodeError> {
    roots::annotated(name, input, output, temp).ok_or_else(|| {
        NodeError::of_kind(ErrorKind::FileNotFound, format!("Painter: no painting file {name}"))
    })
}

/// `bg_color` as RGB in 0..1, as ComfyUI's `hex_to_rgb` reads it: `#rrggbb` (the `#` optional), black for a
/// length other than 6, refused for six characters that are not hex digits (ComfyUI's `int(…, 16)` raises).
fn colour(inputs: &Inputs) -> Result<[f32; 3], NodeError> {
    let text = inputs.widget_text("bg_color");
    let hex = text.trim_start_matches('#');
    if hex.chars().count() != 6 {
        return Ok([0.0; 3]);
    }
    let channel = |i: usize| {
        hex.get(2 * i..2 * i + 2)
            .and_then(|c| u8::from_str_radix(c, 16).ok())
            .map(|v| f32::from(v) / 255.0)
            .ok_or_else(|| {
                NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("Painter: bg_color `{text}` is not a colour (#rrggbb in hex digits)"),
                )
            })
    };
    Ok([channel(0)?, channel(1)?, channel(2)?])
}

/// A `width` × `height` canvas of `rgb`, `[1, h, w, 3]`.
fn canvas(width: usize, height: usize, rgb: &[f32; 3]) -> Result<Tensor, NodeError> {
    let values = rgb.iter().copied().cycle().take(width * height * 3).collect();
    Tensor::new(vec![1, height, width, 3], values).map_err(|e| NodeError::new(e.to_string()))
}

/// The first image of a batch, `[1, H, W, C]` (ComfyUI's `image[:1]`).
fn first(image: &Tensor) -> Result<Tensor, NodeError> {
    let &[n, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!("an IMAGE [B, H, W, C], got {:?}", image.shape())));
    };
    if n == 0 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            "Painter: the image batch is empty",
        ));
    }
    Tensor::new(vec![1, h, w, c], image.data()[..h * w * c].to_vec())
        .map_err(|e| NodeError::new(e.to_string()))
}

/// The painting at `path` as RGBA in 0..1 (8 bits a channel, as ComfyUI reads it through PIL), resized to
/// `w` × `h` with PIL's Lanczos when its size differs.
fn read_rgba(path: &Path, name: &str, (w, h): (usize, usize)) -> Result<Vec<f32>, NodeError> {
    let decoded = decode_image(path, name)?.to_rgba8();
    let (pw, ph) = (decoded.width() as usize, decoded.height() as usize);
    let mut bytes = decoded.into_raw();
    if (pw, ph) != (w, h) {
        bytes = pil_lanczos::resize_bytes(bytes, (ph, pw, 4), w, h);
    }
    Ok(bytes.into_iter().map(|v| f32::from(v) / 255.0).collect())
}

/// The painting (RGBA, `[h·w·4]`) over `base` (`[1, h, w, c]`, c = 3, or 1 broadcast as numpy does): rgb·α +
/// base·(1 − α) `[1, h, w, 3]`, and α as the mask. Other channel counts do not broadcast (ComfyUI raises).
fn composite(base: &Tensor, painting: &[f32]) -> Result<(Tensor, Tensor), NodeError> {
    let &[1, h, w, c] = base.shape() else {
        return Err(NodeError::new(format!("a base image [1, H, W, C], got {:?}", base.shape())));
    };
    if c != 3 && c != 1 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("Painter paints over RGB (or one-channel) images; this one has {c} channels"),
        ));
    }
    let mut image = Vec::with_capacity(h * w * 3);
    let mut mask = Vec::with_capacity(h * w);
    for (pixel, under) in painting.chunks_exact(4).zip(base.data().chunks_exact(c)) {
        let alpha = pixel[3];
        for (ch, p) in pixel[..3].iter().enumerate() {
            image.push(p * alpha + under[ch.min(c - 1)] * (1.0 - alpha));
        }
        mask.push(alpha);
    }
    let image = Tensor::new(vec![1, h, w, 3], image).map_err(|e| NodeError::new(e.to_string()))?;
    let mask = Tensor::new(vec![1, h, w], mask).map_err(|e| NodeError::new(e.to_string()))?;
    Ok((image, mask))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's own Painter (`scripts/reference/painter.py`): a painting resized with PIL's Lanczos over a
    /// coloured canvas and over an image, one at the canvas's size, and no painting.
    #[test]
    fn paintings_lay_over_the_canvas_or_image_as_comfyui_does() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/painter");
        let io = crate::fixtures::tensors("painter/io.safetensors");
        let blue = [0x33, 0x66, 0xcc].map(|v| f32::from(v as u8) / 255.0);
        let cases = [
            ("canvas", canvas(64, 48, &blue).unwrap(), true),
            ("over", first(&io["base"]).unwrap(), true),
            ("exact", canvas(40, 30, &[0.0; 3]).unwrap(), true),
            ("empty", canvas(64, 48, &blue).unwrap(), false),
        ];
        for (case, base, painted) in cases {
            let path = dir.join("painting.png");
            let painting = painted.then_some((path.as_path(), "painting.png"));
            let (image, mask) = paint(base, painting).unwrap();
            for (got, want) in
                [(&image, &io[&format!("image.{case}")]), (&mask, &io[&format!("mask.{case}")])]
            {
                assert_eq!(got.shape(), want.shape(), "{case}");
                let worst = got
                    .data()
                    .iter()
                    .zip(want.data())
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst < 1e-6, "{case}: max |difference| {worst}");
            }
        }
    }

    #[test]
    fn painting_names_stay_in_their_folders_and_colours_parse_as_comfyui_parses_them() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        assert!(annotated("painter/painting.png", &dir, None, None).is_ok());
        assert!(annotated("painter/painting.png [input]", &dir, None, None).is_ok());
        let outside = annotated("../Cargo.toml", &dir.join("painter"), None, None).unwrap_err();
        assert!(outside.message.contains("no painting file"), "{}", outside.message);
        assert!(annotated("painter/painting.png [temp]", &dir, None, None).is_err());
        let colour = |text: &str| {
            let inputs =
                Inputs::from_values([("bg_color".to_owned(), Value::String(text.to_owned()))]);
            super::colour(&inputs)
        };
        assert_eq!(colour("#ff0080").unwrap(), [1.0, 0.0, 128.0 / 255.0]);
        assert_eq!(colour("#fff").unwrap(), [0.0; 3]);
        assert_eq!(colour("red").unwrap(), [0.0; 3]);
        let err = colour("#gggggg").unwrap_err().message;
        assert!(err.contains("#gggggg") && err.contains("not a colour"), "{err}");

        // Without a painting the image passes as it is, alpha channel and all; a one-channel image is
        // broadcast under a painting, a four-channel one refused there.
        let rgba = Tensor::full(vec![2, 30, 40, 4], 0.5);
        let (image, mask) = paint(first(&rgba).unwrap(), None).unwrap();
        assert_eq!((image.shape(), mask.shape()), (&[1, 30, 40, 4][..], &[1, 30, 40][..]));
        let painting = dir.join("painter/painting.png");
        let grey = Tensor::full(vec![1, 30, 40, 1], 0.25);
        let (image, _) = paint(grey, Some((&painting, "painting.png"))).unwrap();
        assert_eq!(image.shape(), [1, 30, 40, 3]);
        assert_eq!(image.data()[..3], [0.25; 3], "the transparent left third shows the base");
        let err = paint(first(&rgba).unwrap(), Some((&painting, "painting.png"))).unwrap_err();
        assert!(err.message.contains("4 channels"), "{}", err.message);
        let empty = Tensor::new(vec![0, 30, 40, 3], vec![]).unwrap();
        assert!(first(&empty).unwrap_err().message.contains("empty"));
    }
}
