//! VP9 through `rusty_vp9`, a pure-Rust encoder and decoder (no C library, nothing beyond the Rust toolchain
//! to build). Encoding is what `SaveWEBM` asks FFmpeg's `libvpx-vp9` for: 8-bit 4:2:0 at a constant quality,
//! and the alpha of RGBA frames as a second VP9 stream whose luma is the alpha and whose chroma is flat grey
//! (FFmpeg's `yuva420p`). Decoding gives `LoadVideo` the frames of a VP9 WebM.

use super::MediaError;
use super::bits::Bits;
use super::colour::{Yuv420, YuvMatrix, yuv420_to_rgb};
use super::h264::DecodedFrame;
use super::webm::CodedFrame;

/// The encoder's speed preset (0 best … 6 fastest): 3 is the slowest rung that keeps a 720p clip of 81 frames
/// within tens of seconds on a few cores; libvpx's own default (`cpu-used` 1) is slower still.
const SPEED: u32 = 3;

/// Codes `frames` (and, when given, one alpha plane per frame, full-size 8-bit) at `qindex`.
pub(crate) fn encode(
    frames: &[Yuv420],
    alpha: Option<&[Vec<u8>]>,
    qindex: u32,
) -> Result<Vec<CodedFrame>, MediaError> {
    // VP9's quantizer index 0 is lossless coding, which this encoder does not implement: 1 is the finest.
    let qindex = qindex.max(1);
    let colour = stream(
        frames.iter().map(|f| (f.y.as_slice(), f.u.as_slice(), f.v.as_slice())),
        frames,
        qindex,
    )?;
    let alpha = match alpha {
        Some(planes) => {
            let grey: Vec<u8> = frames.first().map_or(Vec::new(), |f| vec![128; f.u.len()]);
            let planes = planes.iter().map(|a| (a.as_slice(), grey.as_slice(), grey.as_slice()));
            Some(stream(planes, frames, qindex)?)
        }
        None => None,
    };
    if colour.len() != frames.len() || alpha.as_ref().is_some_and(|a| a.len() != frames.len()) {
        return Err(MediaError::Encode(format!(
            "the VP9 encoder gave {} packets for {} frames",
            colour.len(),
            frames.len()
        )));
    }
    let mut alpha = alpha.map(Vec::into_iter);
    Ok(colour
        .into_iter()
        .map(|(data, keyframe)| {
            // A frame decodes alone only when its alpha does too.
            let alpha = alpha.as_mut().and_then(Iterator::next);
            let keyframe = keyframe && alpha.as_ref().is_none_or(|(_, key)| *key);
            CodedFrame { data, alpha: alpha.map(|(a, _)| a), keyframe }
        })
        .collect())
}

/// One VP9 stream: each frame's packet and whether it is a key frame.
fn stream<'a>(
    planes: impl Iterator<Item = (&'a [u8], &'a [u8], &'a [u8])>,
    frames: &[Yuv420],
    qindex: u32,
) -> Result<Vec<(Vec<u8>, bool)>, MediaError> {
    let failed = |e: rusty_vp9::Error| MediaError::Encode(format!("VP9: {e}"));
    let mut encoder = rusty_vp9::Vp9Encoder::default();
    let config = rusty_vp9::Vp9EncoderConfig {
        qindex: Some(qindex),
        speed: Some(SPEED),
        ..Default::default()
    };
    encoder.configure(&config).map_err(failed)?;
    let mut packets = Vec::with_capacity(frames.len());
    let mut drain = |encoder: &mut rusty_vp9::Vp9Encoder| loop {
        match encoder.next_packet() {
            Ok(packet) => packets.push((packet.data, packet.keyframe)),
            Err(rusty_vp9::Error::Again | rusty_vp9::Error::Eof) => return Ok(()),
            Err(e) => return Err(failed(e)),
        }
    };
    for ((y, u, v), frame) in planes.zip(frames) {
        let (w, cw) = (frame.width, frame.chroma_width());
        encoder
            .push_frame([y, u, v], [w, cw, cw], w as u32, frame.height as u32)
            .map_err(failed)?;
        drain(&mut encoder)?;
    }
    encoder.flush();
    drain(&mut encoder)?;
    Ok(packets)
}

/// Decodes a track's samples (one VP9 frame or superframe each) into RGB pictures in display order. Deeper
/// samples (10 or 12 bits) are taken to 8 bits first; only 4:2:0 is read.
pub(crate) fn decode(
    samples: impl IntoIterator<Item = Result<Vec<u8>, MediaError>>,
) -> Result<Vec<DecodedFrame>, MediaError> {
    let failed =
        |e: rusty_vp9::Error| MediaError::Decode { kind: "video", message: format!("VP9: {e}") };
    let mut decoder = rusty_vp9::Vp9Decoder::new();
    let mut frames = Vec::new();
    // The colour space and range the last key frame declared (BT.601 limited until one says otherwise).
    let mut matrix = YuvMatrix::BT601_LIMITED;
    let pull = |decoder: &mut rusty_vp9::Vp9Decoder,
                frames: &mut Vec<DecodedFrame>,
                matrix: &YuvMatrix| loop {
        match decoder.next_frame() {
            Ok(picture) => frames.push(to_rgb(&picture, matrix)?),
            Err(rusty_vp9::Error::Again | rusty_vp9::Error::Eof) => return Ok(()),
            Err(e) => return Err(failed(e)),
        }
    };
    for (i, sample) in samples.into_iter().enumerate() {
        let sample = sample?;
        if let Some(declared) = key_frame_matrix(&sample) {
            matrix = declared;
        }
        decoder.push(&sample, Some(i as i64)).map_err(failed)?;
        pull(&mut decoder, &mut frames, &matrix)?;
    }
    decoder.flush();
    pull(&mut decoder, &mut frames, &matrix)?;
    Ok(frames)
}

/// The colour matrix a VP9 key frame's header declares (its `color_space` and `color_range`), which FFmpeg
/// converts by: BT.709, SMPTE 240M and BT.2020 by their weights, the rest (unknown, BT.601, SMPTE 170M) as
/// BT.601; `None` for any other frame.
fn key_frame_matrix(frame: &[u8]) -> Option<YuvMatrix> {
    let mut bits = Bits::new(frame, 0);
    if bits.read(2)? != 2 {
        return None; // not a frame marker
    }
    let profile = bits.read(1)? | bits.read(1)? << 1;
    if profile == 3 {
        bits.read(1)?;
    }
    // show_existing_frame set, or an inter frame.
    if bits.read(1)? == 1 || bits.read(1)? != 0 {
        return None;
    }
    bits.read(2)?; // show_frame, error_resilient_mode
    if bits.read(24)? != 0x49_8342 {
        return None;
    }
    if profile >= 2 {
        bits.read(1)?; // ten_or_twelve_bit
    }
    let color_space = bits.read(3)?;
    // CS_RGB (7) holds no range bit; it is 4:4:4, which is refused anyway.
    let full_range = color_space == 7 || bits.read(1)? == 1;
    let (kr, kb) = match color_space {
        2 => (0.2126, 0.0722),
        4 => (0.212, 0.087),
        5 => (0.2627, 0.0593),
        _ if !full_range => return Some(YuvMatrix::BT601_LIMITED),
        _ => (0.299, 0.114),
    };
    Some(YuvMatrix::new(kr, kb, full_range))
}

/// A decoded VP9 picture as RGB in 0..1, by `matrix`.
fn to_rgb(
    picture: &rusty_vp9::DecodedFrame,
    matrix: &YuvMatrix,
) -> Result<DecodedFrame, MediaError> {
    if (picture.subsampling_x, picture.subsampling_y) != (1, 1) {
        return Err(MediaError::UnsupportedCodec {
            kind: "video",
            codec: "VP9 4:2:2 or 4:4:4".to_owned(),
            supported: "Kiln decodes VP9 in 4:2:0",
        });
    }
    let (width, height) = (picture.width as usize, picture.height as usize);
    let deep = picture.bit_depth > 8;
    // Each plane at 8 bits, one byte a sample.
    let planes: Vec<Vec<u8>> = (picture.planes.iter())
        .map(|plane| {
            if deep {
                let shift = picture.bit_depth - 8;
                plane
                    .chunks_exact(2)
                    .map(|s| (u16::from_le_bytes([s[0], s[1]]) >> shift) as u8)
                    .collect()
            } else {
                plane.clone()
            }
        })
        .collect();
    let strides: Vec<usize> =
        picture.strides.iter().map(|&s| if deep { s / 2 } else { s }).collect();
    let (Some(y), Some(u), Some(v)) = (planes.first(), planes.get(1), planes.get(2)) else {
        return Err(MediaError::Decode {
            kind: "video",
            message: "VP9: a picture without three planes".into(),
        });
    };
    let mut rgb = Vec::new();
    yuv420_to_rgb((y, u, v), (strides[0], strides[1]), (width, height), matrix, &mut rgb);
    Ok(DecodedFrame { width, height, rgb })
}
