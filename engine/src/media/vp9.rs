//! VP9 through `rusty_vp9`, a pure-Rust encoder (no C library, nothing beyond the Rust toolchain to build),
//! as `SaveWEBM` asks FFmpeg's `libvpx-vp9` for it: 8-bit 4:2:0 at a constant quality, and the alpha of RGBA
//! frames as a second VP9 stream whose luma is the alpha and whose chroma is flat grey (FFmpeg's `yuva420p`).

use super::MediaError;
use super::colour::Yuv420;
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
        .map(|(data, keyframe)| CodedFrame {
            data,
            alpha: alpha.as_mut().and_then(Iterator::next).map(|(a, _)| a),
            keyframe,
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
