//! H.264 through OpenH264: 4:2:0 pictures to length-prefixed access units with the parameter sets kept apart
//! (what an MP4 track stores), and a track's samples back to pictures.
//!
//! Invariant: every picture pushed yields exactly one access unit (frame skipping is off), so a video keeps
//! its frame count. OpenH264 writes Constrained Baseline (no B-frames: decode order is display order), which
//! every browser plays; it has no CRF, so a CRF is applied as a constant quantizer of that value.

use openh264::OpenH264API;
use openh264::decoder::{Decoder, DecoderConfig, Flush};
use openh264::encoder::{
    BitRate, Complexity, Encoder, EncoderConfig, FrameRate, FrameType, IntraFramePeriod, QpRange,
    RateControlMode,
};
use openh264::formats::YUVSource;

use super::MediaError;
use super::colour::Yuv420;

/// The quantizer used when no CRF is given (x264's default CRF).
const DEFAULT_QP: u8 = 23;

/// Frames between forced keyframes (x264's default `keyint`).
const KEYFRAME_INTERVAL: u32 = 250;

/// An encoded picture: NAL units each prefixed by its 4-byte big-endian length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AccessUnit {
    pub(crate) data: Vec<u8>,
    pub(crate) keyframe: bool,
}

/// An elementary stream as an MP4 track holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct H264Track {
    /// The `avcC` record: profile, level, length size 4, the SPS and PPS.
    pub(crate) config: Vec<u8>,
    pub(crate) units: Vec<AccessUnit>,
}

/// Encodes pictures of one size.
pub(crate) struct H264Encoder {
    encoder: Encoder,
    sps: Option<Vec<u8>>,
    pps: Option<Vec<u8>>,
    units: Vec<AccessUnit>,
}

impl H264Encoder {
    /// An encoder at `fps` with quantizer `crf` (rounded; 0..=51) or the default.
    pub(crate) fn new(fps: f64, crf: Option<f64>) -> Result<H264Encoder, MediaError> {
        let qp = crf.map_or(DEFAULT_QP, |c| c.round().clamp(0.0, 51.0) as u8);
        let config = EncoderConfig::new()
            .rate_control_mode(RateControlMode::Bufferbased)
            .qp(QpRange::new(qp, qp))
            .bitrate(BitRate::from_bps(100_000_000))
            .skip_frames(false)
            .max_frame_rate(FrameRate::from_hz(fps as f32))
            .intra_frame_period(IntraFramePeriod::from_num_frames(KEYFRAME_INTERVAL))
            .complexity(Complexity::High)
            .adaptive_quantization(false)
            .background_detection(false)
            .scene_change_detect(false)
            .num_threads(1);
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| MediaError::Encode(format!("OpenH264 refused its settings: {e}")))?;
        Ok(H264Encoder { encoder, sps: None, pps: None, units: Vec::new() })
    }

    /// Encodes the next picture.
    pub(crate) fn push(&mut self, picture: &Yuv420) -> Result<(), MediaError> {
        let source = Picture(picture);
        let stream = self
            .encoder
            .encode(&source)
            .map_err(|e| MediaError::Encode(format!("OpenH264 failed on a frame: {e}")))?;
        let keyframe = matches!(stream.frame_type(), FrameType::IDR | FrameType::I);
        let mut data = Vec::new();
        for l in 0..stream.num_layers() {
            let Some(layer) = stream.layer(l) else { continue };
            for n in 0..layer.nal_count() {
                let Some(nal) = layer.nal_unit(n) else { continue };
                let nal = strip_start_code(nal);
                match nal.first().map(|b| b & 0x1f) {
                    Some(7) => self.sps = Some(nal.to_vec()),
                    Some(8) => self.pps = Some(nal.to_vec()),
                    Some(_) => {
                        data.extend_from_slice(&(nal.len() as u32).to_be_bytes());
                        data.extend_from_slice(nal);
                    }
                    None => {}
                }
            }
        }
        if data.is_empty() {
            return Err(MediaError::Encode(format!(
                "OpenH264 produced no picture for frame {} ({:?})",
                self.units.len() + 1,
                stream.frame_type()
            )));
        }
        self.units.push(AccessUnit { data, keyframe });
        Ok(())
    }

    /// The stream so far.
    pub(crate) fn finish(self) -> Result<H264Track, MediaError> {
        let (Some(sps), Some(pps)) = (self.sps, self.pps) else {
            return Err(MediaError::NoFrames);
        };
        Ok(H264Track { config: avc_config(&sps, &pps)?, units: self.units })
    }
}

/// A picture as OpenH264 reads it.
struct Picture<'a>(&'a Yuv420);

impl YUVSource for Picture<'_> {
    fn dimensions(&self) -> (usize, usize) {
        (self.0.width, self.0.height)
    }
    fn strides(&self) -> (usize, usize, usize) {
        (self.0.width, self.0.chroma_width(), self.0.chroma_width())
    }
    fn y(&self) -> &[u8] {
        &self.0.y
    }
    fn u(&self) -> &[u8] {
        &self.0.u
    }
    fn v(&self) -> &[u8] {
        &self.0.v
    }
}

/// The `AVCDecoderConfigurationRecord` of one SPS and one PPS, with 4-byte NAL lengths.
fn avc_config(sps: &[u8], pps: &[u8]) -> Result<Vec<u8>, MediaError> {
    if sps.len() < 4 {
        return Err(MediaError::Encode("OpenH264 wrote a truncated SPS".to_owned()));
    }
    let mut record = vec![1, sps[1], sps[2], sps[3], 0xff, 0xe1];
    record.extend_from_slice(&(sps.len() as u16).to_be_bytes());
    record.extend_from_slice(sps);
    record.push(1);
    record.extend_from_slice(&(pps.len() as u16).to_be_bytes());
    record.extend_from_slice(pps);
    Ok(record)
}

fn strip_start_code(nal: &[u8]) -> &[u8] {
    nal.strip_prefix(&[0, 0, 0, 1]).or_else(|| nal.strip_prefix(&[0, 0, 1])).unwrap_or(nal)
}

/// The parameter sets and NAL length size of an `avcC` record.
struct AvcConfig {
    length_size: usize,
    parameter_sets: Vec<Vec<u8>>,
}

fn parse_avc_config(record: &[u8]) -> Result<AvcConfig, MediaError> {
    let bad = || MediaError::Malformed("the avcC record is truncated".to_owned());
    let mut at = 5;
    let length_size = usize::from(record.get(4).ok_or_else(bad)? & 3) + 1;
    let mut parameter_sets = Vec::new();
    for mask in [0x1f, 0xff] {
        let count = record.get(at).ok_or_else(bad)? & mask;
        at += 1;
        for _ in 0..count {
            let len = usize::from(u16::from_be_bytes([
                *record.get(at).ok_or_else(bad)?,
                *record.get(at + 1).ok_or_else(bad)?,
            ]));
            at += 2;
            parameter_sets.push(record.get(at..at + len).ok_or_else(bad)?.to_vec());
            at += len;
        }
    }
    Ok(AvcConfig { length_size, parameter_sets })
}

/// A decoded picture's RGB (`[H, W, 3]` in 0..1) and size.
pub(crate) struct DecodedFrame {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) rgb: Vec<f32>,
}

/// Decodes a track's samples (length-prefixed access units under an `avcC` record) in decode order; the
/// pictures come back in display order.
pub(crate) fn decode(
    config: &[u8],
    samples: impl IntoIterator<Item = Result<Vec<u8>, MediaError>>,
) -> Result<Vec<DecodedFrame>, MediaError> {
    let failed = |e: openh264::Error| MediaError::Decode { kind: "video", message: e.to_string() };
    let config = parse_avc_config(config)?;
    // No flush after each sample: a stream with B-frames holds pictures back until their turn to be shown.
    let settings = DecoderConfig::new().flush_after_decode(Flush::NoFlush);
    let mut decoder =
        Decoder::with_api_config(OpenH264API::from_source(), settings).map_err(failed)?;
    let mut frames = Vec::new();
    let mut annex_b = Vec::new();
    for set in &config.parameter_sets {
        annex_b.extend_from_slice(&[0, 0, 0, 1]);
        annex_b.extend_from_slice(set);
    }
    for sample in samples {
        let sample = sample?;
        let mut at = 0;
        while at + config.length_size <= sample.len() {
            let len = sample[at..at + config.length_size]
                .iter()
                .fold(0usize, |n, &b| (n << 8) | usize::from(b));
            at += config.length_size;
            let nal = sample.get(at..at + len).ok_or_else(|| {
                MediaError::Malformed("an H.264 sample's NAL unit runs past its end".to_owned())
            })?;
            annex_b.extend_from_slice(&[0, 0, 0, 1]);
            annex_b.extend_from_slice(nal);
            at += len;
        }
        if let Some(picture) = decoder.decode(&annex_b).map_err(failed)? {
            frames.push(rgb(&picture));
        }
        annex_b.clear();
    }
    for picture in decoder.flush_remaining().map_err(failed)? {
        frames.push(rgb(&picture));
    }
    Ok(frames)
}

fn rgb(picture: &impl YUVSource) -> DecodedFrame {
    let (width, height) = picture.dimensions();
    let (y_stride, uv_stride, _) = picture.strides();
    let mut rgb = Vec::new();
    super::colour::yuv420_to_rgb(
        (picture.y(), picture.u(), picture.v()),
        (y_stride, uv_stride),
        (width, height),
        // The SPS's colour description is not read: BT.601 limited, FFmpeg's default for untagged video.
        &super::colour::YuvMatrix::BT601_LIMITED,
        &mut rgb,
    );
    DecodedFrame { width, height, rgb }
}

/// The luma bit depth an `avcC` record's first SPS declares (8 for the profiles without the field).
pub(crate) fn bit_depth(config: &[u8]) -> u8 {
    let Ok(config) = parse_avc_config(config) else { return 8 };
    let Some(sps) = config.parameter_sets.iter().find(|s| s.first().is_some_and(|b| b & 0x1f == 7))
    else {
        return 8;
    };
    // Emulation-prevention bytes (00 00 03) out, then the fields up to bit_depth_luma_minus8.
    let mut rbsp = Vec::with_capacity(sps.len());
    let mut zeros = 0;
    for &b in &sps[1..] {
        if zeros >= 2 && b == 3 {
            zeros = 0;
            continue;
        }
        zeros = if b == 0 { zeros + 1 } else { 0 };
        rbsp.push(b);
    }
    let profile = rbsp.first().copied().unwrap_or(0);
    if !matches!(profile, 100 | 110 | 122 | 244 | 44 | 83 | 86 | 118 | 128 | 138 | 139 | 134 | 135)
    {
        return 8;
    }
    let mut bits = Bits { data: &rbsp, at: 24 };
    let depth = (|| {
        bits.ue()?; // seq_parameter_set_id
        if bits.ue()? == 3 {
            bits.bit()?; // separate_colour_plane_flag
        }
        bits.ue()
    })();
    depth.map_or(8, |d| 8 + d.min(8) as u8)
}

/// An exp-Golomb bit reader.
struct Bits<'a> {
    data: &'a [u8],
    at: usize,
}

impl Bits<'_> {
    fn bit(&mut self) -> Option<u32> {
        let byte = self.data.get(self.at / 8)?;
        let bit = (byte >> (7 - self.at % 8)) & 1;
        self.at += 1;
        Some(u32::from(bit))
    }
    fn ue(&mut self) -> Option<u32> {
        let mut zeros = 0;
        while self.bit()? == 0 {
            zeros += 1;
            if zeros > 31 {
                return None;
            }
        }
        let mut value = 1u32;
        for _ in 0..zeros {
            value = (value << 1) | self.bit()?;
        }
        Some(value - 1)
    }
}
