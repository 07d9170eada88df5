//! The video nodes of `comfy_extras.nodes_video` (`CreateVideo`, `SaveVideo`, `GetVideoComponents`,
//! `LoadVideo`, `Video Slice`, `SaveWEBM`), the animation savers of `comfy_extras.nodes_images` (`SaveAnimatedWEBP`,
//! `SaveAnimatedPNG`), and the output-file rule every media save node shares (ComfyUI's
//! `get_save_image_path`).
//!
//! Invariant: no file is read or written outside its root; a prefix with `..` or a leading `/`, and a
//! subfolder that leads out of the root through a symlink, are refused before anything is created.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::files::{SaveTarget, input_files, save_target};
use crate::roots::within;
use std::sync::Arc;

use crate::media::{self, Audio, MediaError, Rational, SaveOptions, Video, VideoComponents};
use crate::nodes::{
    Context, DYNAMIC_COMBO, DynamicOption, ErrorKind, FileKind, FileRef, Fingerprint, Hidden,
    InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, Output, OutputDef, UiOutput,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// Extensions whose MIME type is `video/*` (what `LoadVideo` lists; Python's `mimetypes` table).
pub(super) const VIDEO_EXTENSIONS: [&str; 15] = [
    "mp4", "m4v", "mov", "qt", "webm", "mkv", "avi", "mpeg", "mpg", "mpe", "m1v", "movie", "flv",
    "wmv", "ogv",
];

/// A node whose work is a function of its inputs and the run's context (files, metadata).
pub(super) struct MediaNode {
    spec: Arc<NodeSpec>,
    run: fn(&Inputs, &Context) -> Result<NodeResult, NodeError>,
}

impl MediaNode {
    pub(super) fn new(
        spec: NodeSpec,
        run: fn(&Inputs, &Context) -> Result<NodeResult, NodeError>,
    ) -> MediaNode {
        MediaNode { spec: Arc::new(spec), run }
    }
}

impl Node for MediaNode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        (self.run)(inputs, ctx)
    }
}

/// A media failure as a node failure: a missing file keeps its kind, bad input is an invalid value.
pub(super) fn media_error(e: MediaError) -> NodeError {
    let kind = match &e {
        MediaError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            ErrorKind::FileNotFound
        }
        MediaError::Io { .. } => ErrorKind::Io,
        MediaError::Invalid(_) | MediaError::OddDimensions { .. } => ErrorKind::InvalidValue,
        MediaError::UnsupportedContainer { .. }
        | MediaError::UnsupportedCodec { .. }
        | MediaError::Malformed(_)
        | MediaError::NoVideoStream
        | MediaError::NoFrames
        | MediaError::Encode(_)
        | MediaError::Decode { .. } => ErrorKind::Failed,
    };
    NodeError::of_kind(kind, e.to_string())
}

/// A `VIDEO` input.
pub(super) fn video_input<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Arc<Video>, NodeError> {
    match inputs.get(name) {
        Some(Value::Video(v)) => Ok(v),
        Some(other) => Err(NodeError::of_kind(
            ErrorKind::WrongType,
            format!("input `{name}` should be VIDEO, got {}", other.type_name()),
        )),
        None => Err(NodeError::of_kind(ErrorKind::WrongType, format!("input `{name}` is missing"))),
    }
}

/// An optional `AUDIO` input.
pub(super) fn audio_input<'a>(
    inputs: &'a Inputs,
    name: &str,
) -> Result<Option<&'a Arc<Audio>>, NodeError> {
    match inputs.get(name) {
        Some(Value::Audio(a)) => Ok(Some(a)),
        Some(Value::Json(j)) if j.is_null() => Ok(None),
        Some(other) => Err(NodeError::of_kind(
            ErrorKind::WrongType,
            format!("input `{name}` should be AUDIO, got {}", other.type_name()),
        )),
        None => Ok(None),
    }
}

/// The tags a save node writes into its file.
pub(super) fn tags(ctx: &Context) -> Vec<(String, String)> {
    media::save_tags(&ctx.prompt, &ctx.extra_pnginfo)
}

fn io_error(path: &Path, e: std::io::Error) -> NodeError {
    NodeError::of_kind(ErrorKind::Io, format!("cannot write {}: {e}", path.display()))
}

/// `CreateVideo`: frames, optional audio and a rate as a video (nothing is encoded yet).
pub(super) fn create_video() -> MediaNode {
    let spec = NodeSpec::new("CreateVideo", "Create Video", "video")
        .python_module("comfy_extras.nodes_video")
        .v3()
        .description("Create a video from images.")
        .input(InputDef::typed("images", "IMAGE").tooltip("The images to create a video from."))
        .input(
            InputDef::bare("fps", "FLOAT")
                .option("default", 30.0)
                .option("min", 1.0)
                .option("max", 120.0)
                .option("step", 1.0),
        )
        .optional(InputDef::typed("audio", "AUDIO").tooltip("The audio to add to the video."))
        .optional(
            InputDef::bare("bit_depth", "INT")
                .tooltip(
                    "Bit depth of the created video. 10-bit keeps smoother gradients with less banding, \
                     but some players and downstream nodes may not support it.",
                )
                .option("default", 8)
                .option("min", 8)
                .option("max", 10)
                .option("step", 2)
                .option("display", "number"),
        )
        .output(OutputDef::new("VIDEO"))
        .aliases(&["images to video"])
        .essentials("Video Tools");
    MediaNode::new(spec, |inputs, _| {
        let images = inputs.image("images")?;
        let fps = inputs.float("fps")?;
        let frame_rate = Rational::from_f64(fps).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::InvalidValue, format!("fps must be positive, got {fps}"))
        })?;
        let bit_depth = if inputs.has("bit_depth") { inputs.int("bit_depth")? } else { 8 };
        let bit_depth =
            u8::try_from(bit_depth).ok().filter(|d| matches!(d, 8 | 10)).ok_or_else(|| {
                NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("bit_depth must be 8 or 10, got {bit_depth}"),
                )
            })?;
        let audio = audio_input(inputs, "audio")?.cloned();
        let video = Video::Components {
            components: VideoComponents { images: images.clone(), audio, frame_rate },
            bit_depth,
        };
        Ok(NodeResult::values([Value::Video(Arc::new(video))]))
    })
}

/// `SaveVideo`: the video as an MP4 (H.264) in the output folder, with the prompt and workflow as tags.
pub(super) fn save_video() -> MediaNode {
    let crf = InputDef::bare("crf", "FLOAT")
        .tooltip("Lower values produce higher quality and larger files.")
        .option("default", 23.0)
        .option("min", 0.0)
        .option("max", 51.0)
        .option("step", 1.0);
    let nothing = |key| DynamicOption { key, required: Vec::new(), optional: Vec::new() };
    let encoding = InputDef::bare("encoding", DYNAMIC_COMBO)
        .option("display_name", "encoding mode")
        .tooltip("Automatic preserves compatible H.264 streams. Re-encode applies a custom CRF.")
        .option(
            "options",
            serde_json::json!([
                {"key": "auto", "inputs": {"required": {}}},
                {"key": "re-encode", "inputs": {"required": {"crf": crf.config_json()}}},
            ]),
        );
    let codec_options = [
        nothing("auto"),
        DynamicOption { key: "h264", required: Vec::new(), optional: vec![encoding] },
    ];
    let mut spec = NodeSpec::new("SaveVideo", "Save Video", "video")
        .python_module("comfy_extras.nodes_video")
        .v3()
        .description("Saves the input videos to your ComfyUI output directory.")
        .input(InputDef::typed("video", "VIDEO").tooltip("The video to save."))
        .input(
            InputDef::bare("filename_prefix", "STRING")
                .tooltip(
                    "The prefix for the file to save. This may include formatting information such as \
                     %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from nodes.",
                )
                .option("default", "video/ComfyUI")
                .option("multiline", false),
        )
        .input(
            InputDef::bare("format", "COMBO")
                .tooltip("The format to save the video as.")
                .option("default", "auto")
                .option("multiselect", false)
                .option("options", vec!["auto", "mp4"]),
        )
        .dynamic_combo_of(
            InputDef::bare("codec", DYNAMIC_COMBO).tooltip("The codec to use for the video."),
            &codec_options,
        )
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("VIDEO").named("video"))
        .output_node()
        .aliases(&["export video"])
        .essentials("Basics");
    // The nested dynamic combo: `codec.encoding` is a choice, `codec.encoding.crf` its re-encode input.
    if let Some((_, grown)) = spec.grown.iter_mut().find(|(name, _)| name == "codec") {
        *grown = vec![
            (InputDef::v3_combo("codec", &["auto", "h264"]), true),
            (InputDef::v3_combo("codec.encoding", &["auto", "re-encode"]), false),
            (InputDef { name: "codec.encoding.crf".to_owned(), ..crf }, false),
        ];
    }
    MediaNode::new(spec, |inputs, ctx| {
        let video = video_input(inputs, "video")?;
        match inputs.string("format")? {
            "auto" | "mp4" => {}
            other => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("Only MP4 format is supported for now, got {other}"),
                ));
            }
        }
        let codec = inputs.string("codec")?;
        let encoding = inputs.string("codec.encoding").unwrap_or("auto");
        let crf = match (codec, encoding) {
            ("auto", _) | ("h264", "auto") => None,
            ("h264", "re-encode") => Some(inputs.float("codec.encoding.crf").unwrap_or(23.0)),
            (codec, encoding) => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("unknown codec `{codec}` / encoding `{encoding}`: choose auto or h264"),
                ));
            }
        };
        let dimensions = video.dimensions().map_err(media_error)?;
        let target =
            save_target(inputs.string("filename_prefix")?, ctx, FileKind::Output, dimensions)?;
        ctx.check_interrupt()?;
        let claimed = target.claim(target.counter, |n| format!("{}_{n:05}_.mp4", target.name))?;
        let filename = claimed.fill(|path, _| {
            video.save_mp4(path, &SaveOptions { crf, tags: tags(ctx) }).map_err(media_error)
        })?;
        let ui = UiOutput {
            images: vec![FileRef { filename, subfolder: target.subfolder, kind: FileKind::Output }],
            animated: vec![true],
            ..UiOutput::default()
        };
        Ok(NodeResult { outputs: vec![Output::One(Value::Video(video.clone()))], ui: Some(ui) })
    })
}

/// `GetVideoComponents`: frames, audio, rate and bit depth.
pub(super) fn get_video_components() -> MediaNode {
    let spec = NodeSpec::new("GetVideoComponents", "Get Video Components", "video")
        .python_module("comfy_extras.nodes_video")
        .v3()
        .description(
            "Extracts all components from a video: frames, audio, framerate, and bit depth.",
        )
        .input(InputDef::typed("video", "VIDEO").tooltip("The video to extract components from."))
        .output(OutputDef::new("IMAGE").named("images"))
        .output(OutputDef::new("AUDIO").named("audio"))
        .output(OutputDef::new("FLOAT").named("fps"))
        .output(OutputDef::new("INT").named("bit_depth"))
        .aliases(&["extract frames", "split video", "video to images", "demux"]);
    MediaNode::new(spec, |inputs, _| {
        let video = video_input(inputs, "video")?;
        let components = video.components().map_err(media_error)?;
        let bit_depth = video.bit_depth().map_err(media_error)?;
        // A video without sound gives ComfyUI's `None`.
        let audio = components.audio.map_or_else(Value::none, Value::Audio);
        Ok(NodeResult::values([
            Value::Image(components.images),
            audio,
            Value::Float(components.frame_rate.to_f64()),
            Value::Int(i64::from(bit_depth)),
        ]))
    })
}

/// An input file's path from a combo value (`name` or `name [input]`), if it exists inside the folder.
pub(super) fn input_path(dir: &Path, name: &str) -> Option<PathBuf> {
    let name = name.strip_suffix(" [input]").unwrap_or(name);
    within(dir, name).filter(|p| p.is_file())
}

/// `LoadVideo`: a video file of the input folder (decoded when its frames are asked for).
pub(super) struct LoadVideo {
    input_dir: PathBuf,
}

impl LoadVideo {
    pub(super) fn new(input_dir: PathBuf) -> LoadVideo {
        LoadVideo { input_dir }
    }
}

impl Node for LoadVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        let file = InputDef::bare("file", "COMBO")
            .option("multiselect", false)
            .option("options", input_files(&self.input_dir, &VIDEO_EXTENSIONS))
            .option("video_upload", true);
        Arc::new(
            NodeSpec::new("LoadVideo", "Load Video", "video")
                .python_module("comfy_extras.nodes_video")
                .v3()
                .input(file)
                .output(OutputDef::new("VIDEO"))
                .validates(&["file"])
                .aliases(&["import video", "open video", "video file"])
                .essentials("Basics"),
        )
    }

    fn validate(&self, inputs: &Inputs) -> Result<(), String> {
        let name = inputs.string("file").map_err(|e| e.message)?;
        input_path(&self.input_dir, name)
            .map(|_| ())
            .ok_or_else(|| format!("Invalid video file: {name}"))
    }

    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        // The modification time, as ComfyUI (large files are not hashed).
        let modified = inputs
            .string("file")
            .ok()
            .and_then(|n| input_path(&self.input_dir, n))
            .and_then(|p| fs::metadata(p).ok())
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
        match modified {
            Some(t) => Fingerprint::Value(format!("{}.{:09}", t.as_secs(), t.subsec_nanos())),
            None => Fingerprint::Always,
        }
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let name = inputs.string("file")?;
        let path = input_path(&self.input_dir, name).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::FileNotFound, format!("Invalid video file: {name}"))
        })?;
        Ok(NodeResult::values([Value::Video(Arc::new(Video::from_path(path)))]))
    }
}

/// `Video Slice` ("Trim Video"): the video from `start_time` for `duration` seconds.
pub(super) fn video_slice() -> MediaNode {
    let spec = NodeSpec::new("Video Slice", "Trim Video", "video")
        .python_module("comfy_extras.nodes_video")
        .v3()
        .input(InputDef::typed("video", "VIDEO"))
        .input(
            InputDef::bare("start_time", "FLOAT")
                .tooltip("Start time in seconds")
                .option("default", 0.0)
                .option("min", -100000.0)
                .option("max", 100000.0)
                .option("step", 0.001),
        )
        .input(
            InputDef::bare("duration", "FLOAT")
                .tooltip("Duration in seconds, or 0 for unlimited duration")
                .option("default", 0.0)
                .option("min", 0.0)
                .option("step", 0.001),
        )
        .input(
            InputDef::bare("strict_duration", "BOOLEAN")
                .tooltip("If True, when the specified duration is not possible, an error will be raised.")
                .option("default", false),
        )
        .output(OutputDef::new("VIDEO"))
        .aliases(&["trim video duration", "skip first frames", "frame load cap", "start time"])
        .essentials("Video Tools");
    MediaNode::new(spec, |inputs, _| {
        let video = video_input(inputs, "video")?;
        let (start, duration) = (inputs.float("start_time")?, inputs.float("duration")?);
        match video
            .trimmed(start, duration, inputs.bool("strict_duration")?)
            .map_err(media_error)?
        {
            Some(trimmed) => Ok(NodeResult::values([Value::Video(Arc::new(trimmed))])),
            None => Err(NodeError::new(format!(
                "Failed to slice video:\nSource duration: {}\nStart time: {start}\nTarget duration: {duration}",
                video.duration().map_err(media_error)?
            ))),
        }
    })
}

/// The `images`, `filename_prefix` and `fps` inputs both animation savers open with.
fn animation_spec(name: &str, display: &str) -> NodeSpec {
    NodeSpec::new(name, display, "image")
        .python_module("comfy_extras.nodes_images")
        .v3()
        .input(InputDef::typed("images", "IMAGE").with_options())
        .input(
            InputDef::bare("filename_prefix", "STRING")
                .option("default", "ComfyUI")
                .option("multiline", false),
        )
        .input(
            InputDef::bare("fps", "FLOAT")
                .option("default", 6.0)
                .option("min", 0.01)
                .option("max", 1000.0)
                .option("step", 0.01),
        )
}

/// The frames of an `IMAGE` batch as 8-bit RGB or RGBA rows (ComfyUI's `clip(255 · x)` truncated).
fn frames_u8(images: &Tensor) -> Result<(usize, usize, usize, usize, Vec<u8>), NodeError> {
    let (n, h, w, c) = super::image::dims(images)?;
    if n == 0 {
        return Err(NodeError::of_kind(ErrorKind::InvalidValue, "there are no images to save"));
    }
    let bytes = images.data().iter().map(|&x| (x * 255.0).clamp(0.0, 255.0) as u8).collect();
    Ok((n, h, w, c, bytes))
}

/// Writes an animation's `file` as `<prefix>_<counter:05>_.<extension>` in the output folder.
fn write_animation(target: SaveTarget, extension: &str, file: &[u8]) -> Result<FileRef, NodeError> {
    let claimed =
        target.claim(target.counter, |n| format!("{}_{n:05}_.{extension}", target.name))?;
    let filename =
        claimed.fill(|path, mut out| out.write_all(file).map_err(|e| io_error(path, e)))?;
    Ok(FileRef { filename, subfolder: target.subfolder, kind: FileKind::Output })
}

/// The images passed on, with the saved file in the UI.
fn images_with_ui(images: &Tensor, ui: UiOutput) -> NodeResult {
    NodeResult { outputs: vec![Output::One(Value::Image(images.clone()))], ui: Some(ui) }
}

/// The UI of an animation: the file, animated when it has more than one frame.
fn animation_ui(file: FileRef, frames: usize) -> UiOutput {
    UiOutput {
        images: vec![file],
        animated: if frames > 1 { vec![true] } else { Vec::new() },
        ..UiOutput::default()
    }
}

/// `SaveAnimatedWEBP`: every image as a frame of one animated WebP, the prompt and workflow in its EXIF.
pub(super) fn save_animated_webp() -> MediaNode {
    let spec = animation_spec("SaveAnimatedWEBP", "Save Animated WEBP")
        .input(InputDef::bare("lossless", "BOOLEAN").option("default", true))
        .input(
            InputDef::bare("quality", "INT")
                .option("default", 80)
                .option("min", 0)
                .option("max", 100),
        )
        .input(InputDef::v3_combo("method", &["default", "fastest", "slowest"]))
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("IMAGE").named("images"))
        .output_node();
    MediaNode::new(spec, |inputs, ctx| {
        let images = inputs.image("images")?;
        let fps = inputs.float("fps")?;
        let (n, h, w, c, bytes) = frames_u8(images)?;
        let target = save_target(inputs.string("filename_prefix")?, ctx, FileKind::Output, (w, h))?;
        let delay = (1000.0 / fps) as u32;
        let frame_len = h * w * c;
        let frames: Vec<&[u8]> = bytes.chunks_exact(frame_len).collect();
        let exif = media::webp_exif(&ctx.prompt, &ctx.extra_pnginfo);
        let file = media::animated_webp(&frames, (w, h, c), delay, &exif)
            .map_err(|e| NodeError::new(format!("cannot encode {}: {e}", target.name)))?;
        let saved = write_animation(target, "webp", &file)?;
        Ok(images_with_ui(images, animation_ui(saved, n)))
    })
}

/// `SaveWEBM`: every image as a frame of one WebM video (VP9 with the alpha of RGBA images, or 10-bit AV1) at
/// a constant quality, the prompt and workflow as the file's tags.
pub(super) fn save_webm() -> MediaNode {
    let spec = NodeSpec::new("SaveWEBM", "Save WEBM", "video")
        .python_module("comfy_extras.nodes_video")
        .v3()
        .experimental()
        .aliases(&["export webm"])
        .input(InputDef::typed("images", "IMAGE").tooltip(
            "RGBA images are saved with their alpha channel as transparency (vp9 codec only).",
        ))
        .input(
            InputDef::bare("filename_prefix", "STRING")
                .option("default", "ComfyUI")
                .option("multiline", false),
        )
        .input(InputDef::v3_combo("codec", &["vp9", "av1"]))
        .input(
            InputDef::bare("fps", "FLOAT")
                .option("default", 24.0)
                .option("min", 0.01)
                .option("max", 1000.0)
                .option("step", 0.01),
        )
        .input(
            InputDef::bare("crf", "FLOAT")
                .tooltip("Higher crf means lower quality with a smaller file size, lower crf means higher quality higher filesize.")
                .option("default", 32.0)
                .option("min", 0)
                .option("max", 63.0)
                .option("step", 1),
        )
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("IMAGE").named("images"))
        .output_node();
    MediaNode::new(spec, |inputs, ctx| {
        let images = inputs.image("images")?;
        let codec_name = inputs.string("codec")?;
        let codec = media::WebmCodec::from_name(codec_name).ok_or_else(|| {
            NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("unknown WebM codec `{codec_name}` (vp9 or av1)"),
            )
        })?;
        let (fps, crf) = (inputs.float("fps")?, inputs.float("crf")?);
        let (n, h, w, c) = super::image::dims(images)?;
        let target = save_target(inputs.string("filename_prefix")?, ctx, FileKind::Output, (w, h))?;
        // ComfyUI's order: the prompt, then each `extra_pnginfo` entry.
        let mut tags = Vec::new();
        if !ctx.prompt.is_null() {
            tags.push(("prompt".to_owned(), media::python_json(&ctx.prompt)));
        }
        if let Some(extra) = ctx.extra_pnginfo.as_object() {
            tags.extend(extra.iter().map(|(k, v)| (k.clone(), media::python_json(v))));
        }
        let file = media::encode_webm(images.data(), (n, h, w, c), codec, (fps, crf), &tags)
            .map_err(|e| NodeError::new(format!("cannot encode {}: {e}", target.name)))?;
        let saved = write_animation(target, "webm", &file)?;
        // A video preview: animated whatever the frame count (ComfyUI's `PreviewVideo`).
        Ok(images_with_ui(
            images,
            UiOutput { images: vec![saved], animated: vec![true], ..UiOutput::default() },
        ))
    })
}

/// `SaveAnimatedPNG`: every image as a frame of one APNG, the prompt and workflow in `comf` chunks.
pub(super) fn save_animated_png() -> MediaNode {
    let spec = animation_spec("SaveAnimatedPNG", "Save Animated PNG")
        .input(
            InputDef::bare("compress_level", "INT")
                .option("advanced", true)
                .option("default", 4)
                .option("min", 0)
                .option("max", 9),
        )
        .hidden("prompt", Hidden::Prompt)
        .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
        .output(OutputDef::new("IMAGE").named("images"))
        .output_node();
    MediaNode::new(spec, |inputs, ctx| {
        let images = inputs.image("images")?;
        let fps = inputs.float("fps")?;
        let level = inputs.int("compress_level")?.clamp(0, 9) as u8;
        let (n, h, w, c, bytes) = frames_u8(images)?;
        let target = save_target(inputs.string("filename_prefix")?, ctx, FileKind::Output, (w, h))?;
        let frames: Vec<&[u8]> = bytes.chunks_exact(h * w * c).collect();
        let chunks = media::comf_chunks(&ctx.prompt, &ctx.extra_pnginfo);
        let file = media::apng(&frames, (w, h, c), (1000.0 / fps) as u32, level, &chunks)
            .map_err(|e| NodeError::new(format!("cannot encode {}: {e}", target.name)))?;
        let saved = write_animation(target, "png", &file)?;
        Ok(images_with_ui(images, animation_ui(saved, n)))
    })
}
