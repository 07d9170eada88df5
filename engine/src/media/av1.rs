//! AV1 through rav1e, Xiph's pure-Rust encoder (built without its NASM kernels, so nothing beyond the Rust
//! toolchain), as `SaveWEBM` asks FFmpeg's `libsvtav1` for it: 10-bit 4:2:0 at a constant quantizer. Blocks
//! hold each frame's OBUs without temporal delimiters (the AV1-in-Matroska mapping), and the track's codec
//! private data is the `av1C` record followed by the sequence header.

use rav1e::prelude::{
    ChromaSampling, Config, Context, EncoderConfig, EncoderStatus, FrameType, Rational,
};

use super::MediaError;
use super::webm::CodedFrame;

/// rav1e's speed preset (0 best … 10 fastest): its own default, the middle of its range, as SVT-AV1's
/// preset 6 is of SVT's.
const SPEED: u8 = 6;

const OBU_SEQUENCE_HEADER: u8 = 1;
const OBU_TEMPORAL_DELIMITER: u8 = 2;

/// Codes 10-bit planes (Y, U, V; chroma at half size, rounded up) of `width` × `height` frames at `qindex`;
/// returns the frames and the track's codec private data.
pub(crate) fn encode(
    frames: &[[Vec<u16>; 3]],
    (width, height): (usize, usize),
    fps: f64,
    qindex: u32,
) -> Result<(Vec<CodedFrame>, Vec<u8>), MediaError> {
    let failed =
        |what: &str, e: &dyn std::fmt::Display| MediaError::Encode(format!("AV1 {what}: {e}"));
    let mut config = EncoderConfig::with_speed_preset(SPEED);
    config.width = width;
    config.height = height;
    config.bit_depth = 10;
    config.chroma_sampling = ChromaSampling::Cs420;
    config.quantizer = qindex.clamp(1, 255) as usize;
    config.time_base = Rational::new(1000, (fps * 1000.0).round().max(1.0) as u64);
    let mut context: Context<u16> = Config::new()
        .with_encoder_config(config)
        .new_context()
        .map_err(|e| failed("configuration", &e))?;
    let private_head = context.container_sequence_header();
    let cw = width.div_ceil(2);
    let mut coded = Vec::with_capacity(frames.len());
    let receive = |context: &mut Context<u16>, coded: &mut Vec<CodedFrame>| loop {
        match context.receive_packet() {
            Ok(packet) => coded.push(CodedFrame {
                keyframe: packet.frame_type == FrameType::KEY,
                data: packet.data,
                alpha: None,
            }),
            Err(EncoderStatus::Encoded) => {}
            Err(EncoderStatus::NeedMoreData | EncoderStatus::LimitReached) => return Ok(()),
            Err(e) => return Err(failed("encoding", &e)),
        }
    };
    for planes in frames {
        let mut frame = context.new_frame();
        for ((plane, samples), stride) in frame.planes.iter_mut().zip(planes).zip([width, cw, cw]) {
            let bytes: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
            plane.copy_from_raw_u8(&bytes, 2 * stride, 2);
        }
        context.send_frame(frame).map_err(|e| failed("encoding", &e))?;
        receive(&mut context, &mut coded)?;
    }
    context.flush();
    receive(&mut context, &mut coded)?;
    if coded.len() != frames.len() {
        return Err(MediaError::Encode(format!(
            "the AV1 encoder gave {} packets for {} frames",
            coded.len(),
            frames.len()
        )));
    }
    let mut sequence_header = None;
    for frame in &mut coded {
        let obus = obus(&frame.data)?;
        if sequence_header.is_none() {
            sequence_header = (obus.iter().find(|o| o.0 == OBU_SEQUENCE_HEADER))
                .map(|o| frame.data[o.1.clone()].to_vec());
        }
        frame.data = (obus.iter().filter(|o| o.0 != OBU_TEMPORAL_DELIMITER))
            .flat_map(|o| frame.data[o.1.clone()].iter().copied())
            .collect();
    }
    let sequence_header = sequence_header
        .ok_or_else(|| MediaError::Encode("AV1: the first frame has no sequence header".into()))?;
    Ok((coded, [private_head, sequence_header].concat()))
}

/// Each OBU of a temporal unit: its type and its bytes (header included).
fn obus(data: &[u8]) -> Result<Vec<(u8, std::ops::Range<usize>)>, MediaError> {
    let bad = || MediaError::Encode("AV1: the encoder wrote a malformed OBU".into());
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let header = data[at];
        let kind = (header >> 3) & 0x0F;
        let mut body = at + 1 + usize::from(header & 0x04 != 0);
        let end = if header & 0x02 != 0 {
            let mut size = 0usize;
            for i in 0..8 {
                let byte = *data.get(body).ok_or_else(bad)?;
                body += 1;
                size |= usize::from(byte & 0x7F) << (7 * i);
                if byte & 0x80 == 0 {
                    break;
                }
            }
            body + size
        } else {
            data.len()
        };
        if end > data.len() {
            return Err(bad());
        }
        out.push((kind, at..end));
        at = end;
    }
    Ok(out)
}
