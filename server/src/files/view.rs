//! `GET /view`: a file from a root, as ComfyUI serves it: `filename` may carry a `[input]`/`[output]`/`[temp]`
//! annotation overriding `type`; only its base name is used; `preview=<format>;<quality>` re-encodes, and
//! `channel=rgb|a` keeps the colour or the alpha channel. A file served as it is honours one byte `Range`, as
//! aiohttp's `FileResponse` does (media elements seek with it); only the bytes asked for are read.

use std::io::{Cursor, Read, Seek, SeekFrom};

use kiln_engine::nodes::FileKind;
use kiln_engine::roots::{Roots, within};

use crate::store::WorkspaceFiles;

/// What was asked for.
#[derive(Debug, Clone, Default)]
pub(crate) struct ViewRequest {
    pub(crate) filename: Option<String>,
    pub(crate) kind: Option<FileKind>,
    pub(crate) subfolder: Option<String>,
    pub(crate) preview: Option<String>,
    pub(crate) channel: Option<String>,
    /// The `Range` header.
    pub(crate) range: Option<String>,
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
    /// 416: the range is malformed or starts past the end of the file of this size.
    RangeNotSatisfiable { size: u64 },
}

/// A file to send.
#[derive(Debug, Clone)]
pub(crate) struct ViewFile {
    pub(crate) bytes: Vec<u8>,
    pub(crate) content_type: String,
    /// `filename="..."`, with `attachment; ` for types that could run script in the browser.
    pub(crate) content_disposition: String,
    /// How the bytes relate to the file: all of it as stored, a range of it, or a re-encoding.
    pub(crate) extent: Extent,
}

/// What part of the file a [`ViewFile`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extent {
    /// The whole file as stored (ranges could have been asked for).
    Whole,
    /// Bytes `first..=last` of a file of `size` bytes.
    Range { first: u64, last: u64, size: u64 },
    /// A preview or channel extract made from the file.
    Derived,
}

impl Extent {
    /// The `Content-Range` value of a range.
    pub(crate) fn content_range(self) -> Option<String> {
        match self {
            Extent::Range { first, last, size } => Some(format!("bytes {first}-{last}/{size}")),
            Extent::Whole | Extent::Derived => None,
        }
    }
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
        "mp4" | "m4v" => "video/mp4",
        "webm" => "video/webm",
        "mov" | "qt" => "video/quicktime",
        "mkv" => "video/x-matroska",
        "avi" => "video/x-msvideo",
        "mp3" => "audio/mpeg",
        "wav" => "audio/x-wav",
        "flac" => "audio/flac",
        "opus" | "ogg" | "oga" => "audio/ogg",
        "m4a" => "audio/mp4",
        "aac" => "audio/aac",
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

/// The file a `/view` request names: its kind, its base name and its path relative to the root, by
/// ComfyUI's rules (an annotation overrides `type`, only the name's last component counts).
pub(crate) fn located(request: &ViewRequest) -> Result<(FileKind, &str, String), ViewError> {
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
    let base = name.rsplit(['/', '\\']).next().unwrap_or(name);
    let relative = match request.subfolder.as_deref().filter(|s| !s.is_empty()) {
        Some(subfolder) => format!("{subfolder}/{base}"),
        None => base.to_owned(),
    };
    Ok((kind, base, relative))
}

/// [`view`] through the object store when there is one (`stored`): a file served as stored is read from the
/// store (a range read for a range request), nothing written locally; a preview or channel extract is made from
/// the file brought in. A file the store does not hold is looked for locally.
pub(crate) fn view_stored(
    roots: &Roots,
    stored: Option<&WorkspaceFiles>,
    request: &ViewRequest,
) -> Result<ViewFile, ViewError> {
    let Some(files) = stored else { return view(roots, request) };
    let (kind, base, relative) = located(request)?;
    if within(roots.get(kind), &relative).is_none() {
        return Err(ViewError::OutsideRoot);
    }
    let failed = |e: crate::store::StoreError| ViewError::Unreadable(e.to_string());
    if derived(request) {
        files.bring(kind, &relative).map_err(failed)?;
        return view(roots, request);
    }
    match files.size(kind, &relative).map_err(failed)? {
        Some(size) => as_stored(base, request.range.as_deref(), size, |first, count| {
            files.read(kind, &relative, first..first + count).map_err(failed)
        }),
        None => view(roots, request),
    }
}

/// Whether the request asks for a preview or a channel extract rather than the file as stored.
fn derived(request: &ViewRequest) -> bool {
    let channel = request.channel.as_deref().unwrap_or("rgba");
    request.preview.is_some() || channel == "rgb" || channel == "a"
}

/// Finds and reads the file a `/view` request names.
pub(crate) fn view(roots: &Roots, request: &ViewRequest) -> Result<ViewFile, ViewError> {
    let (kind, base, relative) = located(request)?;
    let root = roots.get(kind);
    let folder = match request.subfolder.as_deref().filter(|s| !s.is_empty()) {
        Some(subfolder) => within(root, subfolder).ok_or(ViewError::OutsideRoot)?,
        None => root.to_path_buf(),
    };
    let path = folder.join(base);
    if !path.is_file() {
        return Err(ViewError::NotFound);
    }
    within(root, &relative).ok_or(ViewError::OutsideRoot)?;

    let channel = request.channel.as_deref().unwrap_or("rgba");
    if !derived(request) {
        let unreadable = |e: std::io::Error| ViewError::Unreadable(e.to_string());
        let size = std::fs::metadata(&path).map_err(unreadable)?.len();
        return as_stored(base, request.range.as_deref(), size, |first, count| {
            let mut file = std::fs::File::open(&path).map_err(unreadable)?;
            let mut bytes = vec![0u8; count as usize];
            file.seek(SeekFrom::Start(first)).map_err(unreadable)?;
            file.read_exact(&mut bytes).map_err(unreadable)?;
            Ok(bytes)
        });
    }
    let bytes = std::fs::read(&path).map_err(|e| ViewError::Unreadable(e.to_string()))?;
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
            extent: Extent::Derived,
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
    Ok(ViewFile {
        bytes,
        content_type: "image/png".to_owned(),
        content_disposition: format!("filename=\"{}\"", quote(base)),
        extent: Extent::Derived,
    })
}

/// The file as stored, or the one range of it `range` asks for: `size` bytes, of which `read(first, count)`
/// reads some.
fn as_stored(
    base: &str,
    range: Option<&str>,
    size: u64,
    read: impl FnOnce(u64, u64) -> Result<Vec<u8>, ViewError>,
) -> Result<ViewFile, ViewError> {
    let mut ty = content_type(base);
    let mut disposition = format!("filename=\"{}\"", quote(base));
    if DANGEROUS.contains(&ty) {
        ty = "application/octet-stream";
        disposition = format!("attachment; {disposition}");
    }
    let (bytes, extent) = match range {
        None => (read(0, size)?, Extent::Whole),
        Some(range) => {
            let (first, count) = byte_range(range, size)?;
            (read(first, count)?, Extent::Range { first, last: first + count - 1, size })
        }
    };
    Ok(ViewFile { bytes, content_type: ty.to_owned(), content_disposition: disposition, extent })
}

/// The first byte and byte count of a `Range` header on a file of `size` bytes, by aiohttp's rules: one
/// `bytes=<first>-<last>` (either may be missing; `-<n>` is the last n bytes), the last byte clipped to the
/// file; anything else, a reversed range, or a first byte past the end is not satisfiable.
fn byte_range(header: &str, size: u64) -> Result<(u64, u64), ViewError> {
    let refused = ViewError::RangeNotSatisfiable { size };
    let spec = header.strip_prefix("bytes=").ok_or(refused.clone())?;
    let (first, last) = spec.split_once('-').ok_or(refused.clone())?;
    let number = |s: &str| -> Result<Option<u64>, ViewError> {
        if s.is_empty() {
            return Ok(None);
        }
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ViewError::RangeNotSatisfiable { size });
        }
        s.parse().map(Some).map_err(|_| ViewError::RangeNotSatisfiable { size })
    };
    let (first, count) = match (number(first)?, number(last)?) {
        (None, None) => return Err(refused),
        // The last n bytes (all of them when the file is shorter; aiohttp reads `-0` as from 0).
        (None, Some(suffix)) => {
            let first = if suffix == 0 { 0 } else { size.saturating_sub(suffix) };
            (first, size - first)
        }
        (Some(first), None) => (first, size.saturating_sub(first)),
        (Some(first), Some(last)) => {
            if first > last {
                return Err(refused);
            }
            (first, (last + 1).min(size).saturating_sub(first))
        }
    };
    if first >= size {
        return Err(refused);
    }
    Ok((first, count))
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

#[cfg(test)]
mod range_tests {
    use super::{ViewError, byte_range};

    #[test]
    fn ranges_follow_aiohttp() {
        let cases: [(&str, Option<(u64, u64)>); 11] = [
            ("bytes=0-", Some((0, 100))),
            ("bytes=0-9", Some((0, 10))),
            ("bytes=90-200", Some((90, 10))),
            ("bytes=-10", Some((90, 10))),
            ("bytes=-1000", Some((0, 100))),
            ("bytes=-0", Some((0, 100))),
            ("bytes=100-", None),
            ("bytes=9-3", None),
            ("bytes=0-1,5-6", None),
            ("items=0-1", None),
            ("bytes=-", None),
        ];
        for (header, want) in cases {
            let got = byte_range(header, 100)
                .inspect_err(|e| assert_eq!(*e, ViewError::RangeNotSatisfiable { size: 100 }))
                .ok();
            assert_eq!(got, want, "{header}");
        }
    }
}
