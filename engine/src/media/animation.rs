//! Animated images as ComfyUI's `SaveAnimatedWEBP` and `SaveAnimatedPNG` write them (through Pillow): an
//! animated WebP of lossless frames with the prompt and workflow in EXIF, and an APNG with them in `comf`
//! chunks after the image data.
//!
//! Invariant: frames arrive as 8-bit rows (RGB or RGBA) of one size; every frame is shown for `delay_ms`
//! (`int(1000 / fps)`), and both formats loop forever (Pillow's default).

use png::{BitDepth, ColorType, DeflateCompression, Encoder};

use super::tags::python_json;

/// The EXIF block (a little-endian TIFF) Pillow writes for ComfyUI's animated WebP: `prompt:<json>` as the
/// camera model (0x0110), each `extra_pnginfo` entry as `key:<json>` from the make (0x010F) downwards.
pub(crate) fn webp_exif(prompt: &serde_json::Value, extra_pnginfo: &serde_json::Value) -> Vec<u8> {
    let mut entries: Vec<(u16, String)> = Vec::new();
    if !prompt.is_null() {
        entries.push((0x0110, format!("prompt:{}", python_json(prompt))));
    }
    if let Some(extra) = extra_pnginfo.as_object() {
        for ((key, value), tag) in extra.iter().zip((0..=0x010Fu16).rev()) {
            entries.push((tag, format!("{key}:{}", python_json(value))));
        }
    }
    if entries.is_empty() {
        return Vec::new();
    }
    entries.sort_by_key(|(tag, _)| *tag);
    entries.dedup_by_key(|(tag, _)| *tag);
    let mut tiff = b"II*\0".to_vec();
    tiff.extend_from_slice(&8u32.to_le_bytes());
    tiff.extend_from_slice(&(entries.len() as u16).to_le_bytes());
    let mut data_at = 8 + 2 + entries.len() * 12 + 4;
    let mut data = Vec::new();
    for (tag, text) in &entries {
        let mut value = text.as_bytes().to_vec();
        value.push(0);
        tiff.extend_from_slice(&tag.to_le_bytes());
        tiff.extend_from_slice(&2u16.to_le_bytes()); // ASCII
        tiff.extend_from_slice(&(value.len() as u32).to_le_bytes());
        if value.len() <= 4 {
            value.resize(4, 0);
            tiff.extend_from_slice(&value);
        } else {
            tiff.extend_from_slice(&(data_at as u32).to_le_bytes());
            data_at += value.len();
            data.extend_from_slice(&value);
        }
    }
    tiff.extend_from_slice(&0u32.to_le_bytes());
    tiff.extend_from_slice(&data);
    tiff
}

/// An animated WebP of lossless frames, `delay_ms` each, with `exif` (empty: none).
pub(crate) fn animated_webp(
    frames: &[&[u8]],
    (width, height, channels): (usize, usize, usize),
    delay_ms: u32,
    exif: &[u8],
) -> Result<Vec<u8>, String> {
    let color = match channels {
        3 => image_webp::ColorType::Rgb8,
        4 => image_webp::ColorType::Rgba8,
        1 => image_webp::ColorType::L8,
        other => return Err(format!("cannot encode an image with {other} channels")),
    };
    if width == 0 || height == 0 || width > 1 << 14 || height > 1 << 14 {
        return Err(format!("a WebP frame cannot be {width}x{height}"));
    }
    let mut body = b"WEBP".to_vec();
    // VP8X: animation, EXIF when present, alpha for RGBA.
    let mut flags = 0x02u8;
    if !exif.is_empty() {
        flags |= 0x08;
    }
    if channels == 4 {
        flags |= 0x10;
    }
    let mut vp8x = vec![flags, 0, 0, 0];
    vp8x.extend_from_slice(&u24(width - 1));
    vp8x.extend_from_slice(&u24(height - 1));
    chunk(&mut body, b"VP8X", &vp8x);
    // ANIM: transparent background, loop forever.
    chunk(&mut body, b"ANIM", &[0, 0, 0, 0, 0, 0]);
    for frame in frames {
        let mut single = Vec::new();
        image_webp::WebPEncoder::new(&mut single)
            .encode(frame, width as u32, height as u32, color)
            .map_err(|e| e.to_string())?;
        // The simple container: `RIFF` size `WEBP`, then the VP8L chunk whole.
        let vp8l = single.get(12..).ok_or("the WebP encoder wrote no frame")?;
        let mut anmf = vec![0u8; 6];
        anmf.extend_from_slice(&u24(width - 1));
        anmf.extend_from_slice(&u24(height - 1));
        anmf.extend_from_slice(&u24(delay_ms.min(0xff_ffff) as usize));
        anmf.push(0x02); // no blending, no disposal
        anmf.extend_from_slice(vp8l);
        chunk(&mut body, b"ANMF", &anmf);
    }
    if !exif.is_empty() {
        chunk(&mut body, b"EXIF", exif);
    }
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(out)
}

fn u24(v: usize) -> [u8; 3] {
    let b = (v as u32).to_le_bytes();
    [b[0], b[1], b[2]]
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(kind);
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(data);
    if data.len() % 2 == 1 {
        out.push(0);
    }
}

/// ComfyUI's `comf` chunk payloads: `prompt\0<json>`, then each `extra_pnginfo` entry, Latin-1.
pub(crate) fn comf_chunks(
    prompt: &serde_json::Value,
    extra_pnginfo: &serde_json::Value,
) -> Vec<Vec<u8>> {
    let latin1 = |key: &str, value: &serde_json::Value| -> Vec<u8> {
        // `python_json` escapes non-ASCII, so the payload is ASCII (a subset of Latin-1).
        [
            key.chars().map(|c| if (c as u32) < 0x100 { c as u8 } else { b'?' }).collect(),
            vec![0],
            python_json(value).into_bytes(),
        ]
        .concat()
    };
    let mut chunks = Vec::new();
    if !prompt.is_null() {
        chunks.push(latin1("prompt", prompt));
    }
    if let Some(extra) = extra_pnginfo.as_object() {
        chunks.extend(extra.iter().map(|(k, v)| latin1(k, v)));
    }
    chunks
}

/// An APNG of the frames, `delay_ms` each, deflate level `level` (0–9), with `comf` chunks before `IEND`.
pub(crate) fn apng(
    frames: &[&[u8]],
    (width, height, channels): (usize, usize, usize),
    delay_ms: u32,
    level: u8,
    comf: &[Vec<u8>],
) -> Result<Vec<u8>, String> {
    let color = match channels {
        1 => ColorType::Grayscale,
        3 => ColorType::Rgb,
        4 => ColorType::Rgba,
        other => return Err(format!("cannot encode an image with {other} channels")),
    };
    let mut out = Vec::new();
    {
        let mut encoder = Encoder::new(&mut out, width as u32, height as u32);
        encoder.set_color(color);
        encoder.set_depth(BitDepth::Eight);
        encoder.set_deflate_compression(if level == 0 {
            DeflateCompression::NoCompression
        } else {
            DeflateCompression::Level(level)
        });
        if frames.len() > 1 {
            encoder.set_animated(frames.len() as u32, 0).map_err(|e| e.to_string())?;
            encoder
                .set_frame_delay(delay_ms.min(u32::from(u16::MAX)) as u16, 1000)
                .map_err(|e| e.to_string())?;
        }
        let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
        for frame in frames {
            writer.write_image_data(frame).map_err(|e| e.to_string())?;
        }
        for payload in comf {
            writer
                .write_chunk(png::chunk::ChunkType(*b"comf"), payload)
                .map_err(|e| e.to_string())?;
        }
        writer.finish().map_err(|e| e.to_string())?;
    }
    Ok(out)
}
