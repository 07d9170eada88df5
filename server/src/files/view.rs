//! `GET /view`: a file from a root, as ComfyUI serves it: `filename` may carry a `[input]`/`[output]`/`[temp]`
//! annotation overriding `type`; only its base name is used; `preview=<format>;<quality>` re-encodes, and
//! `channel=rgb|a` keeps the colour or the alpha channel.

use std::io::Cursor;

use kiln_engine::nodes::FileKind;
use kiln_engine::roots::{Roots, within};

/// What was asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct ViewRequest {
    pub(crate) filename: Option<String>,
    pub(crate) kind: Option<FileKind>,
    pub(crate) subfolder: Option<String>,
    pub(crate) preview: Option<String>,
    pub(crate) channel: Option<String>,
}

/// Why there is no file; ComfyUI answers each with an empty body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ViewError {
    /// 400: an empty, absolute or `..` file name.
    BadName,
    /// 403: the subfolder leaves the root.
    OutsideRoot,
    /// 404: no file name, or no such file.
    NotFound,
    /// 500: the file exists but could not be read or re-encoded.
    Unreadable(String),
}

/// A file to send.
#[derive(Debug, Clone)]
pub(crate) struct ViewFile {
    pub(crate) bytes: Vec<u8>,
    pub(crate) content_type: String,
    /// `filename="..."`, with `attachment; ` for types that could run script in the browser.
    pub(crate) content_disposition: String,
}

/// Types a browser could execute: served as a download, never rendered.
const DANGEROUS: [&str; 6] = [
    "text/html",
    "application/xhtml+xml",
    "text/javascript",
    "text/css",
    "image/svg+xml",
    "text/xml",
];

pub(crate) fn content_type(name: &str) -> &'static str {
    let ext = name.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase()).unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "webp" => "image/webp",
        "gif" => "image/gif",
        "bmp" => "image/bmp",
        "tif" | "tiff" => "image/tiff",
        "svg" => "image/svg+xml",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mp3" => "audio/mpeg",
        "wav" => "audio/x-wav",
        "flac" => "audio/flac",
        "json" => "application/json",
        "txt" => "text/plain",
        "html" | "htm" => "text/html",
        "js" | "mjs" => "text/javascript",
        "css" => "text/css",
        "xml" => "text/xml",
        "glb" => "model/gltf-binary",
        _ => "application/octet-stream",
    }
}

fn quote(name: &str) -> String {
    name.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Finds and reads the file a `/view` request names.
pub(crate) fn view(roots: &Roots, request: &ViewRequest) -> Result<ViewFile, ViewError> {
    let raw = request.filename.as_deref().ok_or(ViewError::NotFound)?;
    let (name, annotated) = match raw.rsplit_once(" [") {
        Some((name, "input]")) => (name, Some(FileKind::Input)),
        Some((name, "output]")) => (name, Some(FileKind::Output)),
        Some((name, "temp]")) => (name, Some(FileKind::Temp)),
        _ => (raw, None),
    };
    if name.is_empty() || name.starts_with('/') || name.contains("..") {
        return Err(ViewError::BadName);
    }
    let kind = annotated.or(request.kind).unwrap_or(FileKind::Output);
    let root = roots.get(kind);
    let folder = match request.subfolder.as_deref().filter(|s| !s.is_empty()) {
        Some(subfolder) => within(root, subfolder).ok_or(ViewError::OutsideRoot)?,
        None => root.to_path_buf(),
    };
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let relative = match request.subfolder.as_deref().filter(|s| !s.is_empty()) {
        Some(subfolder) => format!("{subfolder}/{base}"),
        None => base.to_owned(),
    };
    let path = folder.join(base);
    if !path.is_file() {
        return Err(ViewError::NotFound);
    }
    within(root, &relative).ok_or(ViewError::OutsideRoot)?;
    let bytes = std::fs::read(&path).map_err(|e| ViewError::Unreadable(e.to_string()))?;

    let channel = request.channel.as_deref().unwrap_or("rgba");
    if let Some(preview) = &request.preview {
        let (format, quality) = preview.split_once(';').unwrap_or((preview, "90"));
        let quality = quality.parse::<u8>().unwrap_or(90).clamp(1, 100);
        // As upstream: an `a` anywhere in the `channel` parameter as sent forces WebP.
        let jpeg = format == "jpeg" && !request.channel.as_deref().unwrap_or("").contains('a');
        let image = decode(&bytes)?;
        let (encoded, ty) = if jpeg {
            (
                encode(
                    &image::DynamicImage::ImageRgb8(image.to_rgb8()),
                    image::ImageFormat::Jpeg,
                    quality,
                )?,
                "image/jpeg",
            )
        } else {
            (encode(&image, image::ImageFormat::WebP, quality)?, "image/webp")
        };
        return Ok(ViewFile {
            bytes: encoded,
            content_type: ty.to_owned(),
            content_disposition: format!("filename=\"{}\"", quote(base)),
        });
    }
    let bytes = match channel {
        "rgb" => encode(
            &image::DynamicImage::ImageRgb8(decode(&bytes)?.to_rgb8()),
            image::ImageFormat::Png,
            90,
        )?,
        "a" => {
            let rgba = decode(&bytes)?.to_rgba8();
            let alpha = image::RgbaImage::from_fn(rgba.width(), rgba.height(), |x, y| {
                image::Rgba([0, 0, 0, rgba.get_pixel(x, y)[3]])
            });
            encode(&image::DynamicImage::ImageRgba8(alpha), image::ImageFormat::Png, 90)?
        }
        _ => bytes,
    };
    let mut ty = if channel == "rgb" || channel == "a" { "image/png" } else { content_type(base) };
    let mut disposition = format!("filename=\"{}\"", quote(base));
    if DANGEROUS.contains(&ty) {
        ty = "application/octet-stream";
        disposition = format!("attachment; {disposition}");
    }
    Ok(ViewFile { bytes, content_type: ty.to_owned(), content_disposition: disposition })
}

fn decode(bytes: &[u8]) -> Result<image::DynamicImage, ViewError> {
    image::load_from_memory(bytes).map_err(|e| ViewError::Unreadable(format!("not an image: {e}")))
}

fn encode(
    image: &image::DynamicImage,
    format: image::ImageFormat,
    quality: u8,
) -> Result<Vec<u8>, ViewError> {
    let mut out = Cursor::new(Vec::new());
    let result = match format {
        image::ImageFormat::Jpeg => image.write_with_encoder(
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality),
        ),
        // The image crate's WebP encoder is lossless; `quality` does not apply.
        other => image.write_to(&mut out, other),
    };
    result.map_err(|e| ViewError::Unreadable(format!("cannot encode: {e}")))?;
    Ok(out.into_inner())
}
