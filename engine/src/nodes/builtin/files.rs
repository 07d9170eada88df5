//! File nodes: `LoadImage` (input directory → IMAGE + MASK), `SaveImage` (PNG with the prompt and workflow in
//! tEXt chunks, `prefix_00001_.png` counters, subfolders) and `PreviewImage` (the same into the temp directory).
//!
//! Invariant: no file is read or written outside its root; names with `..`, absolute paths, and symlinks
//! leading out of the root are refused.

use std::collections::hash_map::RandomState;
use std::fs;
use std::hash::{BuildHasher, DefaultHasher, Hash, Hasher};
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::nodes::{
    Context, ErrorKind, FileKind, FileRef, Fingerprint, Hidden, InputDef, InputType, Inputs, Node,
    NodeError, NodeResult, NodeSpec, Output, OutputDef, UiOutput,
};
use crate::roots::{self, Roots, SharedFiles, within};
use crate::tensor::Tensor;
use crate::value::Value;

const IMAGE_EXTENSIONS: [&str; 8] = ["png", "jpg", "jpeg", "webp", "bmp", "gif", "tif", "tiff"];

/// `LoadImage`: reads an image from the input directory, or, named `name [output]` or `name [temp]` as the
/// frontend names what it takes from a result, from those (ComfyUI's `get_annotated_filepath`).
pub(super) struct LoadImage {
    roots: Roots,
}

impl LoadImage {
    pub(super) fn new(roots: Roots) -> LoadImage {
        LoadImage { roots }
    }

    fn files(&self) -> Vec<String> {
        input_files(&self.roots.input, &IMAGE_EXTENSIONS)
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        let Roots { input, output, temp } = &self.roots;
        roots::annotated(name, input, Some(output), Some(temp))
    }
}

impl Node for LoadImage {
    fn spec(&self) -> Arc<NodeSpec> {
        let mut image = InputDef::typed("image", "COMBO").option("image_upload", true);
        image.ty = InputType::Choices(self.files());
        Arc::new(
            NodeSpec::new("LoadImage", "Load Image", "image")
                .input(image)
                .output(OutputDef::new("IMAGE"))
                .output(OutputDef::new("MASK"))
                .validates(&["image"])
                .aliases(&[
                    "load image",
                    "open image",
                    "import image",
                    "image input",
                    "upload image",
                    "read image",
                    "image loader",
                ])
                .essentials("Basics"),
        )
    }

    fn validate(&self, inputs: &Inputs) -> Result<(), String> {
        let name = inputs.string("image").map_err(|e| e.message)?;
        self.path(name).map(|_| ()).ok_or_else(|| format!("Invalid image file: {name}"))
    }

    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        file_fingerprint(inputs.string("image").ok().and_then(|n| self.path(n)).as_deref())
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let (image, mask) = self.load(inputs.string("image")?)?;
        Ok(NodeResult::values([Value::Image(image), Value::Mask(mask)]))
    }
}

impl LoadImage {
    /// The input file `name` as `LoadImage` gives it: the RGB images `[N, H, W, 3]` and the masks, 1 − alpha
    /// `[N, H, W]` (zeros `[N, 64, 64]` for images without alpha). An animated WebP or PNG gives every frame of
    /// the first frame's size, as ComfyUI's `ImageSequence` loop does; other files one image.
    fn load(&self, name: &str) -> Result<(Tensor, Tensor), NodeError> {
        let path = self.path(name).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::FileNotFound, format!("Invalid image file: {name}"))
        })?;
        let (frames, has_alpha) = decode_frames(&path, name)?;
        let (w, h) = frames.first().map_or((0, 0), |f| (f.width() as usize, f.height() as usize));
        let mut rgb = Vec::with_capacity(frames.len() * w * h * 3);
        let mut mask = Vec::with_capacity(frames.len() * w * h);
        let mut n = 0;
        for frame in frames.iter().filter(|f| (f.width() as usize, f.height() as usize) == (w, h)) {
            for pixel in frame.to_rgba32f().pixels() {
                rgb.extend_from_slice(&pixel.0[..3]);
                mask.push(1.0 - pixel.0[3]);
            }
            n += 1;
        }
        let image =
            Tensor::new(vec![n, h, w, 3], rgb).map_err(|e| NodeError::new(e.to_string()))?;
        let mask = if has_alpha {
            Tensor::new(vec![n, h, w], mask).map_err(|e| NodeError::new(e.to_string()))?
        } else {
            Tensor::full(vec![n, 64, 64], 0.0)
        };
        Ok((image, mask))
    }
}

/// `LoadImageMask`: one channel of an input image as a mask: `alpha` is `LoadImage`'s mask (1 − alpha),
/// `red`, `green` or `blue` that channel's values.
pub(super) struct LoadImageMask(LoadImage);

impl LoadImageMask {
    pub(super) fn new(roots: Roots) -> LoadImageMask {
        LoadImageMask(LoadImage::new(roots))
    }
}

/// `LoadImageOutput` (`Load Image (from Outputs)`): `LoadImage` whose widget lists the output folder (the
/// frontend fetches the list from `/internal/files/output` and names its choice `name [output]`).
pub(super) struct LoadImageOutput(LoadImage);

impl LoadImageOutput {
    pub(super) fn new(roots: Roots) -> LoadImageOutput {
        LoadImageOutput(LoadImage::new(roots))
    }
}

impl Node for LoadImageOutput {
    fn spec(&self) -> Arc<NodeSpec> {
        let remote = serde_json::json!({
            "route": "/internal/files/output",
            "refresh_button": true,
            "control_after_refresh": "first",
        });
        let image = InputDef::bare("image", "COMBO")
            .option("image_upload", true)
            .option("image_folder", "output")
            .option("remote", remote);
        Arc::new(
            NodeSpec::new("LoadImageOutput", "Load Image (from Outputs)", "image")
                .description(
                    "Load an image from the output folder. When the refresh button is clicked, the node will \
                     update the image list and automatically select the first image, allowing for easy \
                     iteration.",
                )
                .experimental()
                .input(image)
                .output(OutputDef::new("IMAGE"))
                .output(OutputDef::new("MASK"))
                .validates(&["image"])
                .aliases(&["output image", "previous generation"])
                .essentials("Basics"),
        )
    }

    fn validate(&self, inputs: &Inputs) -> Result<(), String> {
        self.0.validate(inputs)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        self.0.fingerprint(inputs)
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        self.0.execute(inputs, ctx)
    }
}

impl Node for LoadImageMask {
    fn spec(&self) -> Arc<NodeSpec> {
        let mut image = InputDef::typed("image", "COMBO").option("image_upload", true);
        image.ty = InputType::Choices(self.0.files());
        Arc::new(
            NodeSpec::new("LoadImageMask", "Load Image (as Mask)", "image")
                .input(image)
                .input(InputDef::choices("channel", &["alpha", "red", "green", "blue"]))
                .output(OutputDef::new("MASK"))
                .validates(&["image"])
                .aliases(&["import mask", "alpha mask", "channel mask"])
                .essentials("Image Tools"),
        )
    }

    fn validate(&self, inputs: &Inputs) -> Result<(), String> {
        self.0.validate(inputs)
    }

    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        self.0.fingerprint(inputs)
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let (image, mask) = self.0.load(inputs.string("image")?)?;
        // ComfyUI reads the channel's first letter.
        let channel = match inputs.string("channel")?.chars().next().map(|c| c.to_ascii_uppercase())
        {
            Some('A') => return Ok(NodeResult::values([Value::Mask(mask)])),
            Some('G') => 1,
            Some('B') => 2,
            _ => 0,
        };
        // Every frame's channel, as `image[..., channel]`.
        let shape = image.shape()[..3].to_vec();
        let values = image.data().iter().skip(channel).step_by(3).copied().collect();
        let mask = Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))?;
        Ok(NodeResult::values([Value::Mask(mask)]))
    }
}

/// The image file at `path` (`name` in messages) decoded whatever its extension says, as PIL opens it, and turned
/// upright by its EXIF orientation as ComfyUI's loaders do (`ImageOps.exif_transpose`; an unreadable orientation
/// is none): an I/O error or an undecodable file is the node's error, as ComfyUI's message words it.
pub(super) fn decode_image(path: &Path, name: &str) -> Result<image::DynamicImage, NodeError> {
    use image::ImageDecoder as _;
    let undecodable = undecodable(name);
    let mut decoder = image::ImageReader::open(path)
        .and_then(|r| r.with_guessed_format())
        .map_err(cannot_open(name))?
        .into_decoder()
        .map_err(undecodable)?;
    let orientation = decoder.orientation().unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut image = image::DynamicImage::from_decoder(decoder).map_err(undecodable)?;
    image.apply_orientation(orientation);
    Ok(image)
}

/// The node's error for an image file `name` that does not decode, worded as ComfyUI's.
fn undecodable(name: &str) -> impl Fn(image::ImageError) -> NodeError + Copy + '_ {
    move |e| {
        NodeError::of_kind(
            ErrorKind::ImageDecode,
            format!("cannot identify image file '{name}': {e}"),
        )
    }
}

/// The node's error for an image file `name` that cannot be opened.
fn cannot_open(name: &str) -> impl Fn(std::io::Error) -> NodeError + Copy + '_ {
    move |e| NodeError::of_kind(ErrorKind::Io, format!("cannot open {name}: {e}"))
}

/// The frames of the image file at `path` (`name` in messages), each upright by the file's EXIF orientation, and
/// whether the file has alpha: every frame of an animated WebP or PNG (composited, as PIL's `ImageSequence`
/// gives them), else the one image [`decode_image`] gives.
fn decode_frames(path: &Path, name: &str) -> Result<(Vec<image::DynamicImage>, bool), NodeError> {
    use image::{AnimationDecoder as _, ImageDecoder as _};
    let undecodable = undecodable(name);
    let open = || fs::File::open(path).map(std::io::BufReader::new).map_err(cannot_open(name));
    let frames = |frames: image::Frames<'_>, orientation| {
        frames
            .map(|f| {
                let mut image = image::DynamicImage::ImageRgba8(f?.into_buffer());
                image.apply_orientation(orientation);
                Ok(image)
            })
            .collect::<Result<Vec<_>, image::ImageError>>()
            .map_err(undecodable)
    };
    let no_turn = image::metadata::Orientation::NoTransforms;
    match image::ImageReader::open(path).and_then(|r| r.with_guessed_format()).map(|r| r.format()) {
        Ok(Some(image::ImageFormat::WebP)) => {
            let mut decoder =
                image::codecs::webp::WebPDecoder::new(open()?).map_err(undecodable)?;
            if decoder.has_animation() {
                let (alpha, turn) = (decoder.color_type().has_alpha(), decoder.orientation());
                return Ok((frames(decoder.into_frames(), turn.unwrap_or(no_turn))?, alpha));
            }
        }
        Ok(Some(image::ImageFormat::Png)) => {
            let mut decoder = image::codecs::png::PngDecoder::new(open()?).map_err(undecodable)?;
            if decoder.is_apng().map_err(undecodable)? {
                let (alpha, turn) = (decoder.color_type().has_alpha(), decoder.orientation());
                let apng = decoder.apng().map_err(undecodable)?;
                return Ok((frames(apng.into_frames(), turn.unwrap_or(no_turn))?, alpha));
            }
        }
        _ => {}
    }
    let image = decode_image(path, name)?;
    let alpha = image.color().has_alpha();
    Ok((vec![image], alpha))
}

/// A file input's fingerprint: its bytes' hash and length, so a new file under the same name runs the node
/// again (ComfyUI hashes the file in `IS_CHANGED`); a file that cannot be read is read at every run.
pub(super) fn file_fingerprint(path: Option<&Path>) -> Fingerprint {
    let Some(bytes) = path.and_then(|p| fs::read(p).ok()) else {
        return Fingerprint::Always;
    };
    let mut hasher = DefaultHasher::new();
    bytes.hash(&mut hasher);
    Fingerprint::Value(format!("{:016x}{}", hasher.finish(), bytes.len()))
}

/// `SaveImage`: writes PNGs into the output directory.
pub(super) struct SaveImage(Arc<NodeSpec>);

impl SaveImage {
    pub(super) fn new() -> SaveImage {
        SaveImage(Arc::new(
            NodeSpec::new("SaveImage", "Save Image", "image")
                .description("Saves the input images to your ComfyUI output directory.")
                .input(InputDef::typed("images", "IMAGE").tooltip("The images to save."))
                .input(InputDef::string("filename_prefix", "ComfyUI").tooltip(
                    "The prefix for the file to save. This may include formatting information such as %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from nodes.",
                ))
                .hidden("prompt", Hidden::Prompt)
                .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
                .output(OutputDef::new("IMAGE").named("images"))
                .output_node()
                .aliases(&["save", "save image", "export image", "output image", "write image", "download"])
                .essentials("Basics"),
        ))
    }
}

impl Node for SaveImage {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let images = inputs.image("images")?;
        let ui = save_pngs(images, inputs.string("filename_prefix")?, FileKind::Output, ctx)?;
        Ok(NodeResult { outputs: vec![Output::One(Value::Image(images.clone()))], ui: Some(ui) })
    }
}

/// `SaveImageAdvanced` (`comfy_extras.nodes_images`, V3): `SaveImage` with a choice of format. PNG in 8 or 16
/// bits; OpenEXR is refused, naming it, until Kiln writes it.
pub(super) struct SaveImageAdvanced(Arc<NodeSpec>);

impl SaveImageAdvanced {
    pub(super) fn new() -> SaveImageAdvanced {
        let combo = |name: &str, choices: &[&str], default: &str| {
            InputDef::bare(name, "COMBO")
                .option("advanced", true)
                .option("default", default)
                .option("multiselect", false)
                .option("options", choices.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
        };
        let exr_color_space = InputDef::bare("input_color_space", "COMBO")
            .tooltip(
                "Colorspace of the input tensor. The EXR is always written as scene-linear in the matching \
                 gamut.\nsRGB — input is sRGB-encoded Rec.709; the inverse sRGB EOTF is applied.\nHDR — input \
                 is HLG-encoded Rec.2020 (BT.2100); the inverse HLG OETF is applied to get scene-linear \
                 light.\nlinear — input is already scene-linear (Rec.709 primaries); written through \
                 unchanged. Use this for renderer/compositor output.",
            )
            .option("advanced", true)
            .option("default", "sRGB")
            .option("multiselect", false)
            .option("options", vec!["sRGB", "HDR", "linear"]);
        SaveImageAdvanced(Arc::new(
            NodeSpec::new("SaveImageAdvanced", "Save Image (Advanced)", "image")
                .python_module("comfy_extras.nodes_images")
                .v3()
                .description("Saves the input images to your ComfyUI output directory.")
                .input(InputDef::typed("images", "IMAGE").tooltip("The images to save."))
                .input(
                    InputDef::bare("filename_prefix", "STRING")
                        .tooltip(
                            "The prefix for the file to save. May include formatting tokens such as \
                             %date:yyyy-MM-dd% or %Empty Latent Image.width%.",
                        )
                        .option("default", "ComfyUI")
                        .option("multiline", false),
                )
                .dynamic_combo(
                    "format",
                    "The file format in which to save the image.",
                    &[
                        (
                            "png",
                            vec![
                                combo("bit_depth", &["8-bit", "16-bit"], "8-bit"),
                                combo("input_color_space", &["sRGB"], "sRGB"),
                            ],
                        ),
                        (
                            "exr",
                            vec![combo("bit_depth", &["32-bit float"], "32-bit float"), exr_color_space],
                        ),
                    ],
                )
                .hidden("prompt", Hidden::Prompt)
                .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
                .output(OutputDef::new("IMAGE").named("images"))
                .output_node()
                .aliases(&["save", "save image", "export image", "output image", "write image"])
                .essentials("Basics"),
        ))
    }
}

impl Node for SaveImageAdvanced {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let images = inputs.image("images")?;
        let format = inputs.string("format")?;
        let bit_depth = inputs.string("format.bit_depth")?;
        let sixteen_bit = match (format, bit_depth) {
            ("png", "8-bit") => false,
            ("png", "16-bit") => true,
            ("exr", _) => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    "saving OpenEXR files is not supported yet; choose the png format",
                ));
            }
            (format, depth) => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("No {format}/{depth} encoder"),
                ));
            }
        };
        let files = PngFiles { trailing_underscore: false, sixteen_bit, metadata: true };
        let prefix = inputs.string("filename_prefix")?;
        let ui = save_pngs_as(images, prefix, FileKind::Output, ctx, files)?;
        Ok(NodeResult { outputs: vec![Output::One(Value::Image(images.clone()))], ui: Some(ui) })
    }
}

/// `PreviewImage`: writes PNGs into the temp directory.
pub(super) struct PreviewImage(Arc<NodeSpec>);

impl PreviewImage {
    pub(super) fn new() -> PreviewImage {
        PreviewImage(Arc::new(
            NodeSpec::new("PreviewImage", "Preview Image", "image")
                .description(
                    "Preview the images without saving them to the ComfyUI output directory.",
                )
                .input(InputDef::typed("images", "IMAGE"))
                .hidden("prompt", Hidden::Prompt)
                .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
                .output(OutputDef::new("IMAGE").named("images"))
                .output_node()
                .aliases(&[
                    "preview",
                    "preview image",
                    "show image",
                    "view image",
                    "display image",
                    "image viewer",
                ])
                .essentials("Basics"),
        ))
    }
}

impl Node for PreviewImage {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let images = inputs.image("images")?;
        let ui = preview(images, ctx)?;
        Ok(NodeResult { outputs: vec![Output::One(Value::Image(images.clone()))], ui: Some(ui) })
    }
}

/// `images` previewed as `PreviewImage` writes them (a V3 node's `UI.PreviewImage`).
pub(super) fn preview(images: &Tensor, ctx: &Context) -> Result<UiOutput, NodeError> {
    preview_pngs(images, "ComfyUI", ctx, SAVE_IMAGE)
}

/// Writes a batch into the temp directory as `<prefix>_<counter:05>_.png`, without the prompt in the files (a
/// V3 node's `ImageSaveHelper.save_images(images, prefix, FolderType.temp, cls=None)`).
pub(super) fn save_temp_pngs(
    images: &Tensor,
    prefix: &str,
    ctx: &Context,
) -> Result<Vec<FileRef>, NodeError> {
    const PLAIN: PngFiles = PngFiles { metadata: false, ..SAVE_IMAGE };
    Ok(save_pngs_as(images, prefix, FileKind::Temp, ctx, PLAIN)?.images)
}

/// Writes a preview into the temp directory as `<prefix>_temp_<5 random letters>_<counter>_.png`.
fn preview_pngs(
    images: &Tensor,
    prefix: &str,
    ctx: &Context,
    files: PngFiles,
) -> Result<UiOutput, NodeError> {
    let mut bits = RandomState::new().hash_one(&ctx.node);
    let suffix: String = (0..5)
        .map(|_| {
            let c = (b'a' + (bits % 26) as u8) as char;
            bits /= 26;
            c
        })
        .collect();
    let prefix = format!("{prefix}_temp_{suffix}");
    save_pngs_as(images, &prefix, FileKind::Temp, ctx, files)
}

/// `MaskPreview` (`comfy_extras.nodes_mask`): the masks previewed as grey images; passes the mask on.
pub(super) struct MaskPreview(Arc<NodeSpec>);

impl MaskPreview {
    pub(super) fn new() -> MaskPreview {
        MaskPreview(Arc::new(
            NodeSpec::new("MaskPreview", "Preview Mask", "image/mask")
                .python_module("comfy_extras.nodes_mask")
                .v3()
                .description(
                    "Preview the masks without saving them to the ComfyUI output directory.",
                )
                .input(InputDef::typed("mask", "MASK"))
                .hidden("prompt", Hidden::Prompt)
                .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
                .output(OutputDef::new("MASK").named("mask"))
                .output_node()
                .aliases(&["show mask", "view mask", "inspect mask", "debug mask"]),
        ))
    }
}

impl Node for MaskPreview {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let (mask, [b, h, w]) = super::mask::mask(inputs, "mask")?;
        let grey = mask.data().iter().flat_map(|&v| [v, v, v]).collect();
        let images = super::mask::tensor(vec![b, h, w, 3], grey)?;
        let ui = preview_pngs(&images, "ComfyUI", ctx, SAVE_IMAGE)?;
        Ok(NodeResult { outputs: vec![Output::One(Value::Mask(mask))], ui: Some(ui) })
    }
}

/// `ImageCompare` (`comfy_extras.nodes_image_compare`): previews of either or both images, which the
/// frontend shows under a slider (`a_images`, `b_images`; PNGs without the prompt in them).
pub(super) struct ImageCompare(Arc<NodeSpec>);

impl ImageCompare {
    pub(super) fn new() -> ImageCompare {
        ImageCompare(Arc::new(
            NodeSpec::new("ImageCompare", "Compare Images", "image")
                .python_module("comfy_extras.nodes_image_compare")
                .v3()
                .experimental()
                .description("Compares two images side by side with a slider.")
                .input(InputDef::bare("compare_view", "IMAGECOMPARE").option("socketless", true))
                .optional(InputDef::typed("image_a", "IMAGE"))
                .optional(InputDef::typed("image_b", "IMAGE"))
                .hidden("prompt", Hidden::Prompt)
                .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
                .output_node()
                .essentials("Image Tools"),
        ))
    }
}

impl Node for ImageCompare {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        const NO_METADATA: PngFiles = PngFiles { metadata: false, ..SAVE_IMAGE };
        let mut ui = UiOutput::default();
        for (input, key, prefix) in
            [("image_a", "a_images", "comfy.compare.a"), ("image_b", "b_images", "comfy.compare.b")]
        {
            let files = match inputs.get(input) {
                Some(Value::Image(images)) if images.shape().first().is_some_and(|&b| b > 0) => {
                    preview_pngs(images, prefix, ctx, NO_METADATA)?.images
                }
                _ => Vec::new(),
            };
            ui.named.push((key.to_owned(), files));
        }
        Ok(NodeResult { outputs: Vec::new(), ui: Some(ui) })
    }
}

/// How a save node names and encodes its PNGs.
#[derive(Clone, Copy)]
struct PngFiles {
    /// `SaveImage`'s `<prefix>_<counter>_.png`, or `SaveImageAdvanced`'s `<prefix>_<counter>.png`.
    trailing_underscore: bool,
    /// 16 bits per sample (else 8).
    sixteen_bit: bool,
    /// The prompt and `extra_pnginfo` as text chunks.
    metadata: bool,
}

/// `SaveImage`'s and `PreviewImage`'s files.
const SAVE_IMAGE: PngFiles =
    PngFiles { trailing_underscore: true, sixteen_bit: false, metadata: true };

/// Writes each image of a batch as `<prefix>_<counter:05>_.png` in the directory of `kind`, continuing after
/// the highest counter already there, with the prompt and `extra_pnginfo` as PNG text chunks.
fn save_pngs(
    images: &Tensor,
    prefix: &str,
    kind: FileKind,
    ctx: &Context,
) -> Result<UiOutput, NodeError> {
    save_pngs_as(images, prefix, kind, ctx, SAVE_IMAGE)
}

/// [`save_pngs`] with the naming and depth of `files`.
fn save_pngs_as(
    images: &Tensor,
    prefix: &str,
    kind: FileKind,
    ctx: &Context,
    files: PngFiles,
) -> Result<UiOutput, NodeError> {
    let (batch, h, w, c) = super::image::dims(images)?;
    let target = save_target(prefix, ctx, kind, (w, h))?;
    let (name, subfolder, first) = (&target.name, &target.subfolder, target.counter);
    let mut text_chunks: Vec<(String, String)> = Vec::new();
    if files.metadata {
        text_chunks.push(("prompt".to_owned(), ctx.prompt.to_string()));
        if let Some(extra) = ctx.extra_pnginfo.as_object() {
            text_chunks.extend(extra.iter().map(|(k, v)| (k.clone(), v.to_string())));
        }
    }
    let mut ui = UiOutput::default();
    let mut next = first;
    for b in 0..batch {
        ctx.check_interrupt()?;
        let pixels = &images.data()[b * h * w * c..(b + 1) * h * w * c];
        let claimed = target.claim(next, |counter| {
            if files.trailing_underscore {
                format!("{name}_{counter:05}_.png")
            } else {
                format!("{name}_{counter:05}.png")
            }
        })?;
        next = claimed.counter + 1;
        let filename = claimed.fill(|path, file| {
            write_png(path, file, pixels, (w, h, c), &text_chunks, files.sixteen_bit)
        })?;
        ui.images.push(FileRef { filename, subfolder: subfolder.clone(), kind });
    }
    Ok(ui)
}

/// Files directly in `dir` whose extension is one of `extensions`, sorted.
pub(super) fn input_files(dir: &Path, extensions: &[&str]) -> Vec<String> {
    let mut files: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            Path::new(name)
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| extensions.contains(&x.to_ascii_lowercase().as_str()))
        })
        .collect();
    files.sort();
    files
}

/// Where a save node writes (ComfyUI's `get_save_image_path`).
pub(super) struct SaveTarget {
    /// The folder the files go in.
    pub(super) folder: PathBuf,
    /// The file name's stem before the counter.
    pub(super) name: String,
    /// The folder relative to the root (`video`), as the UI names it.
    pub(super) subfolder: String,
    /// The first free counter.
    pub(super) counter: u64,
    /// Where the names are shared beyond this machine, and as which kind of file.
    shared: Option<(Arc<dyn SharedFiles>, FileKind)>,
}

/// A file a save node claimed: created empty, under a name no other writer holds.
pub(super) struct ClaimedFile {
    /// Its name.
    pub(super) filename: String,
    /// Its counter.
    pub(super) counter: u64,
    /// Its path.
    pub(super) path: PathBuf,
    /// The file, open for writing.
    pub(super) file: fs::File,
    /// The shared files that hold its name too, its subfolder and kind there.
    shared: Option<(Arc<dyn SharedFiles>, String, FileKind)>,
}

impl ClaimedFile {
    /// Writes the file with `write` (given its path and the open file) and returns its name; on failure the
    /// claimed file goes, so no empty or partial file is left under the name.
    pub(super) fn fill(
        self,
        write: impl FnOnce(&Path, fs::File) -> Result<(), NodeError>,
    ) -> Result<String, NodeError> {
        let written = write(&self.path, self.file).and_then(|()| match &self.shared {
            Some((shared, subfolder, kind)) => {
                shared.publish(*kind, subfolder, &self.filename, &self.path).map_err(|e| {
                    NodeError::of_kind(
                        ErrorKind::Io,
                        format!("cannot store {}: {e}", self.filename),
                    )
                })
            }
            None => Ok(()),
        });
        match written {
            Ok(()) => Ok(self.filename),
            Err(error) => {
                let _ = fs::remove_file(&self.path);
                if let Some((shared, subfolder, kind)) = &self.shared {
                    shared.release(*kind, subfolder, &self.filename);
                }
                Err(error)
            }
        }
    }
}

impl SaveTarget {
    /// Creates the file `name_of(counter)` for the first counter from `from` whose file does not exist yet
    /// (created exclusively, and claimed in the shared files too): ComfyUI's counter, except that writers saving
    /// under the same prefix at once (the workers of a cluster on one output folder or one object store) each
    /// get their own file instead of overwriting one.
    pub(super) fn claim(
        &self,
        from: u64,
        name_of: impl Fn(u64) -> String,
    ) -> Result<ClaimedFile, NodeError> {
        let mut counter = from;
        loop {
            let filename = name_of(counter);
            let path = self.folder.join(&filename);
            let file = match fs::OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    counter += 1;
                    continue;
                }
                Err(e) => {
                    return Err(NodeError::of_kind(
                        ErrorKind::Io,
                        format!("cannot write {}: {e}", path.display()),
                    ));
                }
            };
            let Some((shared, kind)) = &self.shared else {
                return Ok(ClaimedFile { filename, counter, path, file, shared: None });
            };
            match shared.claim(*kind, &self.subfolder, &filename) {
                Ok(true) => {
                    let shared = Some((shared.clone(), self.subfolder.clone(), *kind));
                    return Ok(ClaimedFile { filename, counter, path, file, shared });
                }
                claimed => {
                    drop(file);
                    let _ = fs::remove_file(&path);
                    if let Err(e) = claimed {
                        return Err(NodeError::of_kind(
                            ErrorKind::Io,
                            format!("cannot claim {filename} in the object store: {e}"),
                        ));
                    }
                    counter += 1;
                }
            }
        }
    }
}

/// ComfyUI's variables in a filename prefix (`compute_vars` of `get_save_image_path`): `%width%` and
/// `%height%` of what is saved, and the local time as `%year%`, `%month%`, `%day%`, `%hour%`, `%minute%`,
/// `%second%` (two digits but the year). (`%date:…%` and `%Node.widget%` are the frontend's: it replaces
/// them before it queues the prompt.)
fn prefix_vars(
    prefix: &str,
    (width, height): (usize, usize),
    now: &chrono::DateTime<chrono::Local>,
) -> String {
    use chrono::{Datelike as _, Timelike as _};
    if !prefix.contains('%') {
        return prefix.to_owned();
    }
    let two = |n: u32| format!("{n:02}");
    prefix
        .replace("%width%", &width.to_string())
        .replace("%height%", &height.to_string())
        .replace("%year%", &now.year().to_string())
        .replace("%month%", &two(now.month()))
        .replace("%day%", &two(now.day()))
        .replace("%hour%", &two(now.hour()))
        .replace("%minute%", &two(now.minute()))
        .replace("%second%", &two(now.second()))
}

/// The folder, name and first counter for `prefix` in the directory of `kind`: as [`local_target`], the
/// counter also past those of the shared files, whose names the target claims too.
pub(super) fn save_target(
    prefix: &str,
    ctx: &Context,
    kind: FileKind,
    dimensions: (usize, usize),
) -> Result<SaveTarget, NodeError> {
    let mut target = local_target(prefix, ctx.dir(kind), dimensions)?;
    if let Some(shared) = &ctx.shared {
        let names = shared.names(kind, &target.subfolder, &target.name).map_err(|e| {
            NodeError::of_kind(ErrorKind::Io, format!("cannot list the object store: {e}"))
        })?;
        let highest = names.iter().filter_map(|file| counter_of(file, &target.name)).max();
        target.counter = target.counter.max(highest.map_or(1, |n| n + 1));
        target.shared = Some((shared.clone(), kind));
    }
    Ok(target)
}

/// The folder, name and first counter for `prefix` under `root`: ComfyUI's variables replaced
/// ([`prefix_vars`]), the subfolder created, the counter one past the highest `name_<digits>…` file there.
fn local_target(
    prefix: &str,
    root: &Path,
    dimensions: (usize, usize),
) -> Result<SaveTarget, NodeError> {
    let prefix = prefix_vars(prefix, dimensions, &chrono::Local::now());
    let outside = || NodeError::new("Saving image outside the output folder is not allowed.");
    let parts: Vec<&str> =
        prefix.split(['/', '\\']).filter(|p| !p.is_empty() && *p != ".").collect();
    if prefix.starts_with(['/', '\\']) || parts.contains(&"..") {
        return Err(outside());
    }
    let (name, folders) = parts
        .split_last()
        .ok_or_else(|| NodeError::of_kind(ErrorKind::InvalidValue, "filename_prefix is empty"))?;
    let subfolder = folders.join("/");
    let create = |dir: &Path| {
        fs::create_dir_all(dir).map_err(|e| {
            NodeError::of_kind(ErrorKind::Io, format!("cannot create {}: {e}", dir.display()))
        })
    };
    // The root first: `within` resolves symlinks against it, so it must exist.
    create(root)?;
    let folder = if subfolder.is_empty() {
        root.to_path_buf()
    } else {
        within(root, &subfolder).ok_or_else(outside)?
    };
    create(&folder)?;
    if !subfolder.is_empty() && within(root, &subfolder).is_none() {
        return Err(outside());
    }
    let counter = next_counter(&folder, name);
    Ok(SaveTarget { folder, name: (*name).to_owned(), subfolder, counter, shared: None })
}

/// One past the highest counter of `<name>_<digits>[_.]…` files in `folder` (1 when there is none).
fn next_counter(folder: &Path, name: &str) -> u64 {
    fs::read_dir(folder)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter_map(|file| counter_of(&file, name))
        .max()
        .map_or(1, |n| n + 1)
}

/// The counter of a `<name>_<digits>[_.]…` file name.
fn counter_of(file: &str, name: &str) -> Option<u64> {
    let rest = file.strip_prefix(name)?.strip_prefix('_')?;
    rest.split('.').next()?.split('_').next()?.parse::<u64>().ok()
}

fn write_png(
    path: &Path,
    file: fs::File,
    pixels: &[f32],
    (w, h, c): (usize, usize, usize),
    text: &[(String, String)],
    sixteen_bit: bool,
) -> Result<(), NodeError> {
    let out = BufWriter::new(file);
    let encoded = if sixteen_bit {
        encode_png16(out, pixels, (w, h, c), text)
    } else {
        encode_png(out, pixels, w, h, c, text)
    };
    encoded.map_err(|e| {
        NodeError::of_kind(ErrorKind::Io, format!("cannot encode {}: {e}", path.display()))
    })
}

/// Encodes one `[H, W, C]` image (values in 0..1) as an 8-bit PNG with text chunks (iTXt where a value is not
/// Latin-1), clipping to 0..255 and truncating as upstream. The error is a message.
pub(super) fn encode_png(
    out: impl std::io::Write,
    pixels: &[f32],
    w: usize,
    h: usize,
    c: usize,
    text: &[(String, String)],
) -> Result<(), String> {
    let color = color_type(c)?;
    let mut encoder = png::Encoder::new(out, w as u32, h as u32);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.set_compression(png::Compression::Fast);
    for (keyword, value) in text {
        if value.chars().all(|ch| (ch as u32) < 0x100) {
            encoder.add_text_chunk(keyword.clone(), value.clone()).map_err(|e| e.to_string())?;
        } else {
            encoder.add_itxt_chunk(keyword.clone(), value.clone()).map_err(|e| e.to_string())?;
        }
    }
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = pixels.iter().map(|v| (v * 255.0).clamp(0.0, 255.0) as u8).collect();
    writer.write_image_data(&bytes).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())
}

/// The PNG colour type of `c` channels.
fn color_type(c: usize) -> Result<png::ColorType, String> {
    match c {
        1 => Ok(png::ColorType::Grayscale),
        3 => Ok(png::ColorType::Rgb),
        4 => Ok(png::ColorType::Rgba),
        other => Err(format!(
            "cannot encode an image with {other} channels: supported channel counts are 1, 3 and 4"
        )),
    }
}

/// Encodes one `[H, W, C]` image as a 16-bit PNG (values × 65535, clipped and truncated, as
/// `SaveImageAdvanced` quantizes them) with text chunks.
fn encode_png16(
    out: impl std::io::Write,
    pixels: &[f32],
    (w, h, c): (usize, usize, usize),
    text: &[(String, String)],
) -> Result<(), String> {
    let mut encoder = png::Encoder::new(out, w as u32, h as u32);
    encoder.set_color(color_type(c)?);
    encoder.set_depth(png::BitDepth::Sixteen);
    encoder.set_compression(png::Compression::Fast);
    for (keyword, value) in text {
        // `SaveImageAdvanced` writes Latin-1 tEXt, other characters replaced.
        let latin1: String =
            value.chars().map(|ch| if (ch as u32) < 0x100 { ch } else { '?' }).collect();
        encoder.add_text_chunk(keyword.clone(), latin1).map_err(|e| e.to_string())?;
    }
    let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
    let bytes: Vec<u8> = pixels
        .iter()
        .flat_map(|v| ((v * 65535.0).clamp(0.0, 65535.0) as u16).to_be_bytes())
        .collect();
    writer.write_image_data(&bytes).map_err(|e| e.to_string())?;
    writer.finish().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::{LoadImageMask, LoadImageOutput, local_target, next_counter, prefix_vars};
    use crate::nodes::{Inputs, Node as _, Output};
    use crate::roots::Roots;
    use crate::value::Value;

    #[test]
    fn load_image_mask_reads_the_channel_asked_for() {
        let dir = std::env::temp_dir().join(format!("kiln-image-mask-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // A 2 × 1 RGBA picture: red-ish and half transparent, then blue and opaque.
        let pixels = [255u8, 51, 0, 128, 0, 102, 204, 255];
        image::save_buffer(dir.join("m.png"), &pixels, 2, 1, image::ExtendedColorType::Rgba8)
            .expect("a PNG");
        let roots =
            Roots { input: dir.clone(), output: dir.join("output"), temp: dir.join("temp") };
        let node = LoadImageMask::new(roots);
        let ctx = crate::fixtures::quiet_context(&dir);
        let mask = |channel: &str| {
            let inputs = Inputs::from_values([
                ("image".to_owned(), Value::String("m.png".into())),
                ("channel".to_owned(), Value::String(channel.into())),
            ]);
            match node.execute(&inputs, &ctx).expect("runs").outputs.remove(0) {
                Output::One(Value::Mask(m)) => (m.shape().to_vec(), m.data().to_vec()),
                other => panic!("a mask, not {other:?}"),
            }
        };
        // alpha is LoadImage's mask, 1 − alpha; a colour channel is that channel's values.
        assert_eq!(mask("alpha"), (vec![1, 1, 2], vec![1.0 - 128.0 / 255.0, 0.0]));
        assert_eq!(mask("red"), (vec![1, 1, 2], vec![1.0, 0.0]));
        assert_eq!(mask("green"), (vec![1, 1, 2], vec![51.0 / 255.0, 102.0 / 255.0]));
        assert_eq!(mask("blue"), (vec![1, 1, 2], vec![0.0, 204.0 / 255.0]));
        let missing = Inputs::from_values([
            ("image".to_owned(), Value::String("gone.png".into())),
            ("channel".to_owned(), Value::String("red".into())),
        ]);
        assert_eq!(node.validate(&missing), Err("Invalid image file: gone.png".to_owned()));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A photo whose EXIF orientation says "rotate 90° clockwise" loads upright, as PIL's `exif_transpose`
    /// turns it in ComfyUI's `LoadImage`.
    #[test]
    fn load_image_turns_a_photo_upright_by_its_exif_orientation() {
        use image::ImageEncoder as _;
        let dir = std::env::temp_dir().join(format!("kiln-image-exif-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // 16 × 8 as stored: the left half red, the right half blue.
        let (w, h) = (16u32, 8u32);
        let pixels: Vec<u8> = (0..w * h)
            .flat_map(|i| if i % w < w / 2 { [255, 0, 0] } else { [0, 0, 255] })
            .collect();
        // A TIFF-structured EXIF block with one entry: Orientation (0x0112), SHORT, 6 = rotate 90° clockwise.
        let exif = [
            b"II*\0".as_slice(),
            &8u32.to_le_bytes(),
            &1u16.to_le_bytes(),
            &0x0112u16.to_le_bytes(),
            &3u16.to_le_bytes(),
            &1u32.to_le_bytes(),
            &6u16.to_le_bytes(),
            &[0, 0],
            &0u32.to_le_bytes(),
        ]
        .concat();
        let mut jpeg = Vec::new();
        let mut encoder = image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 95);
        encoder.set_exif_metadata(exif).expect("EXIF");
        encoder.write_image(&pixels, w, h, image::ExtendedColorType::Rgb8).expect("a JPEG");
        std::fs::write(dir.join("photo.jpg"), &jpeg).expect("written");
        let roots =
            Roots { input: dir.clone(), output: dir.join("output"), temp: dir.join("temp") };
        let node = super::LoadImage::new(roots);
        let ctx = crate::fixtures::quiet_context(&dir);
        let inputs = Inputs::from_values([("image".to_owned(), Value::String("photo.jpg".into()))]);
        let image = match node.execute(&inputs, &ctx).expect("runs").outputs.remove(0) {
            Output::One(Value::Image(t)) => t,
            other => panic!("an image, not {other:?}"),
        };
        // Upright it is 8 wide and 16 high: turned clockwise, the left half (red) is on top.
        assert_eq!(image.shape(), &[1, 16, 8, 3]);
        let pixel = |y: usize, x: usize| &image.data()[(y * 8 + x) * 3..][..3];
        assert!(pixel(2, 4)[0] > 0.9 && pixel(2, 4)[2] < 0.1, "top: {:?}", pixel(2, 4));
        assert!(pixel(13, 4)[2] > 0.9 && pixel(13, 4)[0] < 0.1, "bottom: {:?}", pixel(13, 4));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// An animated PNG or WebP loads as a batch of its frames, as ComfyUI's `ImageSequence` loop gives them; a
    /// mask of its channel is every frame's.
    #[test]
    fn animated_files_load_every_frame() {
        let dir = std::env::temp_dir().join(format!("kiln-image-frames-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // Three 4 × 2 frames of one colour each (RGB), then two RGBA frames of different alphas.
        let rgb: Vec<Vec<u8>> = [[200u8, 0, 0], [0, 150, 0], [0, 0, 100]]
            .iter()
            .map(|c| c.iter().copied().cycle().take(4 * 2 * 3).collect())
            .collect();
        let rgb_frames: Vec<&[u8]> = rgb.iter().map(Vec::as_slice).collect();
        let apng = crate::media::apng(&rgb_frames, (4, 2, 3), 100, 6, &[]).expect("an APNG");
        std::fs::write(dir.join("a.png"), apng).expect("written");
        let rgba: Vec<Vec<u8>> = [51u8, 255]
            .iter()
            .map(|&a| [10, 20, 30, a].iter().copied().cycle().take(4 * 2 * 4).collect())
            .collect();
        let rgba_frames: Vec<&[u8]> = rgba.iter().map(Vec::as_slice).collect();
        let webp = crate::media::animated_webp(&rgba_frames, (4, 2, 4), 100, &[]).expect("a WebP");
        std::fs::write(dir.join("a.webp"), webp).expect("written");
        let roots =
            Roots { input: dir.clone(), output: dir.join("output"), temp: dir.join("temp") };
        let ctx = crate::fixtures::quiet_context(&dir);
        let load = super::LoadImage::new(roots.clone());
        let run = |name: &str| {
            let inputs = Inputs::from_values([("image".to_owned(), Value::String(name.into()))]);
            let mut outputs = load.execute(&inputs, &ctx).expect("runs").outputs.into_iter();
            match (outputs.next(), outputs.next()) {
                (Some(Output::One(Value::Image(i))), Some(Output::One(Value::Mask(m)))) => (i, m),
                other => panic!("an image and a mask, not {other:?}"),
            }
        };
        let (image, mask) = run("a.png");
        assert_eq!((image.shape(), mask.shape()), (&[3, 2, 4, 3][..], &[3, 64, 64][..]));
        let firsts: Vec<f32> = image.data().chunks(4 * 2 * 3).map(|f| f[0] + f[1] + f[2]).collect();
        assert_eq!(firsts, [200.0 / 255.0, 150.0 / 255.0, 100.0 / 255.0]);
        let (image, mask) = run("a.webp");
        assert_eq!((image.shape(), mask.shape()), (&[2, 2, 4, 3][..], &[2, 2, 4][..]));
        assert_eq!((mask.data()[0], mask.data()[8]), (1.0 - 51.0 / 255.0, 0.0));
        let masks = LoadImageMask::new(roots);
        let inputs = Inputs::from_values([
            ("image".to_owned(), Value::String("a.png".into())),
            ("channel".to_owned(), Value::String("green".into())),
        ]);
        match masks.execute(&inputs, &ctx).expect("runs").outputs.remove(0) {
            Output::One(Value::Mask(m)) => {
                assert_eq!(m.shape(), &[3, 2, 4]);
                assert_eq!((m.data()[0], m.data()[8]), (0.0, 150.0 / 255.0));
            }
            other => panic!("a mask, not {other:?}"),
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A name annotated `[output]` or `[temp]` is read from that folder (`Load Image (from Outputs)` names its
    /// choices so); a plain name from the input folder, and never outside the folders.
    #[test]
    fn annotated_names_load_from_the_output_and_temp_folders() {
        let dir = std::env::temp_dir().join(format!("kiln-image-output-{}", std::process::id()));
        let roots =
            Roots { input: dir.join("input"), output: dir.join("output"), temp: dir.join("temp") };
        for (folder, shade) in [(&roots.input, 10u8), (&roots.output, 20), (&roots.temp, 30)] {
            std::fs::create_dir_all(folder).expect("dir");
            image::save_buffer(
                folder.join("a.png"),
                &[shade; 3],
                1,
                1,
                image::ExtendedColorType::Rgb8,
            )
            .expect("a PNG");
        }
        let node = LoadImageOutput::new(roots);
        let ctx = crate::fixtures::quiet_context(&dir);
        let inputs =
            |name: &str| Inputs::from_values([("image".to_owned(), Value::String(name.into()))]);
        let shade =
            |name: &str| match node.execute(&inputs(name), &ctx).expect("runs").outputs.remove(0) {
                Output::One(Value::Image(t)) => (t.data()[0] * 255.0).round() as u8,
                other => panic!("an image, not {other:?}"),
            };
        assert_eq!([shade("a.png"), shade("a.png [output]"), shade("a.png [temp]")], [10, 20, 30]);
        assert_eq!(shade("a.png [input]"), 10);
        assert!(
            node.validate(&inputs("../input/a.png [output]")).is_err(),
            "stays inside its folder"
        );
        assert!(node.validate(&inputs("b.png [output]")).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn prefix_variables_are_comfyuis() {
        use chrono::TimeZone as _;
        let now =
            chrono::Local.with_ymd_and_hms(2026, 3, 4, 5, 6, 7).single().expect("a local time");
        assert_eq!(
            prefix_vars(
                "%year%-%month%-%day%/%hour%%minute%%second%_%width%x%height%",
                (640, 48),
                &now
            ),
            "2026-03-04/050607_640x48"
        );
        // Unknown names and the frontend's `%date:…%` stay as they are.
        assert_eq!(prefix_vars("a_%date:yyyy%_%foo%", (1, 1), &now), "a_%date:yyyy%_%foo%");
    }

    #[test]
    fn a_dated_prefix_saves_into_a_dated_subfolder() {
        let root = std::env::temp_dir().join(format!("kiln-dated-{}", std::process::id()));
        let target = local_target("%year%/img", &root, (8, 8)).expect("target");
        let year = chrono::Datelike::year(&chrono::Local::now());
        assert_eq!(target.subfolder, year.to_string());
        assert!(root.join(year.to_string()).is_dir());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn counters_continue_after_the_highest() {
        let dir = std::env::temp_dir().join(format!("kiln-counter-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        // Digits before an underscore or a dot, as ComfyUI's `map_filename` reads them (audio files have no
        // trailing underscore).
        for f in
            ["img_00001_.png", "img_00007_.png", "other_00009_.png", "img_x_.png", "img_00008.flac"]
        {
            std::fs::write(dir.join(f), b"").expect("file");
        }
        assert_eq!(next_counter(&dir, "img"), 9);
        assert_eq!(next_counter(&dir, "new"), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn writers_saving_under_one_prefix_at_once_each_get_their_own_file() {
        let root = std::env::temp_dir().join(format!("kiln-claim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        // Both see the same first counter, as two workers on one output folder would.
        let targets = [local_target("img", &root, (8, 8)), local_target("img", &root, (8, 8))];
        let names: Vec<String> = std::thread::scope(|scope| {
            let writers: Vec<_> = targets
                .iter()
                .map(|target| {
                    let target = target.as_ref().expect("target");
                    scope.spawn(move || {
                        (0..50)
                            .map(|_| {
                                let file = target
                                    .claim(target.counter, |n| {
                                        format!("{}_{n:05}_.png", target.name)
                                    })
                                    .expect("claimed");
                                file.filename
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            writers.into_iter().flat_map(|w| w.join().expect("joins")).collect()
        });
        let mut distinct = names.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 100, "no file was claimed twice: {names:?}");
        assert_eq!(distinct.first().map(String::as_str), Some("img_00001_.png"));
        assert_eq!(distinct.last().map(String::as_str), Some("img_00100_.png"));
        let _ = std::fs::remove_dir_all(&root);
    }
}
