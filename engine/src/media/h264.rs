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
use super::bits::Bits;
use super::colour::{Yuv420, YuvMatrix};

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
    // The colour space and range the SPS declares, as FFmpeg converts by them.
    let matrix = colour_matrix(config);
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
            frames.push(rgb(&picture, &matrix));
        }
        annex_b.clear();
    }
    for picture in decoder.flush_remaining().map_err(failed)? {
        frames.push(rgb(&picture, &matrix));
    }
    Ok(frames)
}

/// A decoded picture as RGB in 0..1, by `matrix`.
fn rgb(picture: &impl YUVSource, matrix: &YuvMatrix) -> DecodedFrame {
    let (width, height) = picture.dimensions();
    let (y_stride, uv_stride, _) = picture.strides();
    let mut rgb = Vec::new();
    super::colour::yuv420_to_rgb(
        (picture.y(), picture.u(), picture.v()),
        (y_stride, uv_stride),
        (width, height),
        matrix,
        &mut rgb,
    );
    DecodedFrame { width, height, rgb }
}

/// The first SPS of an `avcC` record, emulation-prevention bytes (00 00 03) taken out: its RBSP, from
/// `profile_idc` on.
fn first_sps(config: &[u8]) -> Option<Vec<u8>> {
    let config = parse_avc_config(config).ok()?;
    let sps = config.parameter_sets.iter().find(|s| s.first().is_some_and(|b| b & 0x1f == 7))?;
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
    Some(rbsp)
}

/// Whether a profile's SPS carries the chroma format, bit depths and scaling matrices.
fn high_profile(profile: u8) -> bool {
    matches!(profile, 100 | 110 | 122 | 244 | 44 | 83 | 86 | 118 | 128 | 138 | 139 | 134 | 135)
}

/// The luma bit depth an `avcC` record's first SPS declares (8 for the profiles without the field).
pub(crate) fn bit_depth(config: &[u8]) -> u8 {
    let Some(rbsp) = first_sps(config) else { return 8 };
    let profile = rbsp.first().copied().unwrap_or(0);
    if !high_profile(profile) {
        return 8;
    }
    let mut bits = Bits::new(&rbsp, 24);
    let depth = (|| {
        bits.ue()?; // seq_parameter_set_id
        if bits.ue()? == 3 {
            bits.bit()?; // separate_colour_plane_flag
        }
        bits.ue()
    })();
    depth.map_or(8, |d| 8 + d.min(8) as u8)
}

/// The colour matrix an `avcC` record's first SPS declares in its VUI (`matrix_coefficients` and
/// `video_full_range_flag`), which FFmpeg converts by: BT.709, FCC, SMPTE 240M and BT.2020 by their weights,
/// the rest as BT.601; BT.601 limited range when the SPS declares nothing.
pub(crate) fn colour_matrix(config: &[u8]) -> YuvMatrix {
    first_sps(config).and_then(|rbsp| vui_colour(&rbsp)).unwrap_or(YuvMatrix::BT601_LIMITED)
}

/// The VUI's colour fields: read through the SPS (Rec. ITU-T H.264 7.3.2.1.1 and E.1.1) to them.
fn vui_colour(rbsp: &[u8]) -> Option<YuvMatrix> {
    let profile = *rbsp.first()?;
    let mut bits = Bits::new(rbsp, 24);
    bits.ue()?; // seq_parameter_set_id
    if high_profile(profile) {
        let chroma_format = bits.ue()?;
        if chroma_format == 3 {
            bits.bit()?; // separate_colour_plane_flag
        }
        bits.ue()?; // bit_depth_luma_minus8
        bits.ue()?; // bit_depth_chroma_minus8
        bits.bit()?; // qpprime_y_zero_transform_bypass_flag
        if bits.bit()? == 1 {
            // seq_scaling_matrix_present_flag: skip each list present.
            for list in 0..if chroma_format == 3 { 12 } else { 8 } {
                if bits.bit()? == 1 {
                    let size = if list < 6 { 16 } else { 64 };
                    let (mut last, mut next) = (8i32, 8i32);
                    for _ in 0..size {
                        if next != 0 {
                            next = (last + bits.se()? + 256) % 256;
                        }
                        if next != 0 {
                            last = next;
                        }
                    }
                }
            }
        }
    }
    bits.ue()?; // log2_max_frame_num_minus4
    match bits.ue()? {
        0 => {
            bits.ue()?; // log2_max_pic_order_cnt_lsb_minus4
        }
        1 => {
            bits.bit()?; // delta_pic_order_always_zero_flag
            bits.se()?; // offset_for_non_ref_pic
            bits.se()?; // offset_for_top_to_bottom_field
            for _ in 0..bits.ue()?.min(255) {
                bits.se()?; // offset_for_ref_frame
            }
        }
        _ => {}
    }
    bits.ue()?; // max_num_ref_frames
    bits.bit()?; // gaps_in_frame_num_value_allowed_flag
    bits.ue()?; // pic_width_in_mbs_minus1
    bits.ue()?; // pic_height_in_map_units_minus1
    if bits.bit()? == 0 {
        bits.bit()?; // mb_adaptive_frame_field_flag
    }
    bits.bit()?; // direct_8x8_inference_flag
    if bits.bit()? == 1 {
        for _ in 0..4 {
            bits.ue()?; // frame_crop offsets
        }
    }
    if bits.bit()? == 0 {
        return None; // no VUI
    }
    if bits.bit()? == 1 && bits.read(8)? == 255 {
        bits.read(32)?; // sar_width, sar_height
    }
    if bits.bit()? == 1 {
        bits.bit()?; // overscan_appropriate_flag
    }
    if bits.bit()? == 0 {
        return None; // no video signal type
    }
    bits.read(3)?; // video_format
    let full_range = bits.bit()? == 1;
    let matrix = if bits.bit()? == 1 {
        bits.read(16)?; // colour_primaries, transfer_characteristics
        bits.read(8)?
    } else {
        2 // unspecified
    };
    let (kr, kb) = match matrix {
        1 => (0.2126, 0.0722),
        4 => (0.30, 0.11),
        7 => (0.212, 0.087),
        9 | 10 => (0.2627, 0.0593),
        _ if !full_range => return Some(YuvMatrix::BT601_LIMITED),
        _ => (0.299, 0.114),
    };
    Some(YuvMatrix::new(kr, kb, full_range))
}
