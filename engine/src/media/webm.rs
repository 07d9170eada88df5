//! WebM files as ComfyUI's `SaveWEBM` writes them through FFmpeg: one VP9 or AV1 video track, the alpha of a
//! VP9 video as a second VP9 stream beside each frame (`BlockAdditional` 1, the track's `AlphaMode`), and the
//! prompt and workflow as global tags named in capitals (FFmpeg's convention, which the frontend reads back
//! when a WebM is dropped on it). Kiln writes the file itself, as it writes MP4s.
//!
//! Layout: the EBML header, then one segment holding a seek head, the segment info, the track, the tags, the
//! clusters (a new one at each key frame, or every 5 s) and the cues (one per cluster, for seeking).

use super::colour::{rgb_to_yuv420, rgb_to_yuv420_10bit, to_u8};
use super::ebml::{element, float, master, string, uint, uint8};
use super::{MediaError, av1, vp9};

/// `SaveWEBM`'s file: `[n, h, w, c]` frames with values in 0..1 (RGB, or RGBA, whose alpha only VP9 keeps)
/// coded with `codec` at FFmpeg's `crf` (0–63) and `fps`, with `tags` as the file's global tags.
pub fn encode_webm(
    images: &[f32],
    (n, h, w, c): (usize, usize, usize, usize),
    codec: WebmCodec,
    (fps, crf): (f64, f64),
    tags: &[(String, String)],
) -> Result<Vec<u8>, MediaError> {
    if n == 0 {
        return Err(MediaError::NoFrames);
    }
    if !(3..=4).contains(&c) || images.len() != n * h * w * c || h == 0 || w == 0 {
        return Err(MediaError::Invalid(format!(
            "WebM frames must be RGB or RGBA images, got {n} frames of {h}x{w} with {c} channels"
        )));
    }
    let frames = images.chunks_exact(h * w * c);
    let rgb = frames.clone().map(|f| {
        if c == 3 {
            f.to_vec()
        } else {
            f.chunks_exact(4).flat_map(|p| [p[0], p[1], p[2]]).collect()
        }
    });
    let qindex = qindex(crf);
    let (frames, codec_private) = match codec {
        WebmCodec::Vp9 => {
            let yuv: Vec<_> = rgb.map(|f| rgb_to_yuv420(&f, w, h)).collect();
            let alpha: Option<Vec<Vec<u8>>> = (c == 4).then(|| {
                frames.map(|f| f.chunks_exact(4).map(|p| to_u8(p[3])).collect()).collect()
            });
            (vp9::encode(&yuv, alpha.as_deref(), qindex)?, None)
        }
        WebmCodec::Av1 => {
            let planes: Vec<_> = rgb.map(|f| rgb_to_yuv420_10bit(&f, w, h)).collect();
            let (frames, private) = av1::encode(&planes, (w, h), fps, qindex)?;
            (frames, Some(private))
        }
    };
    let video = WebmVideo { codec, codec_private, width: w, height: h, fps, frames, tags };
    Ok(webm_file(&video))
}

/// The quantizer index (0–255) of a `crf` (0–63), by libvpx's and libaom's `quantizer_to_qindex` table: four
/// steps a unit, with the top two units at 249 and 255.
fn qindex(crf: f64) -> u32 {
    match crf.round().clamp(0.0, 63.0) as u32 {
        62 => 249,
        63 => 255,
        q => 4 * q,
    }
}

/// The codec of a WebM video track.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WebmCodec {
    /// VP9 (8-bit 4:2:0, alpha supported).
    Vp9,
    /// AV1 (10-bit 4:2:0).
    Av1,
}

impl WebmCodec {
    /// The name `SaveWEBM`'s `codec` input gives it.
    pub fn from_name(name: &str) -> Option<WebmCodec> {
        match name {
            "vp9" => Some(WebmCodec::Vp9),
            "av1" => Some(WebmCodec::Av1),
            _ => None,
        }
    }

    fn codec_id(self) -> &'static str {
        match self {
            WebmCodec::Vp9 => "V_VP9",
            WebmCodec::Av1 => "V_AV1",
        }
    }
}

/// One coded frame, in presentation order.
#[derive(Debug, Clone)]
pub(crate) struct CodedFrame {
    /// The frame's bitstream.
    pub(crate) data: Vec<u8>,
    /// Its alpha plane's bitstream (a VP9 video with alpha), written as the block's additional data 1.
    pub(crate) alpha: Option<Vec<u8>>,
    /// Whether it decodes on its own.
    pub(crate) keyframe: bool,
}

/// A coded video track and what the file says of it.
pub(crate) struct WebmVideo<'a> {
    pub(crate) codec: WebmCodec,
    /// The decoder configuration record (AV1's `av1C` and its sequence header); none for VP9.
    pub(crate) codec_private: Option<Vec<u8>>,
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) fps: f64,
    pub(crate) frames: Vec<CodedFrame>,
    /// Global tags, in order: names as given (written in capitals), values as they are.
    pub(crate) tags: &'a [(String, String)],
}

const EBML: u32 = 0x1A45_DFA3;
const SEGMENT: u32 = 0x1853_8067;
const SEEK_HEAD: u32 = 0x114D_9B74;
const SEEK: u32 = 0x4DBB;
const SEEK_ID: u32 = 0x53AB;
const SEEK_POSITION: u32 = 0x53AC;
const INFO: u32 = 0x1549_A966;
const TRACKS: u32 = 0x1654_AE6B;
const TAGS: u32 = 0x1254_C367;
const CLUSTER: u32 = 0x1F43_B675;
const CUES: u32 = 0x1C53_BB6B;

/// Milliseconds: the timestamp unit (`TimestampScale`, in nanoseconds).
const TIMESTAMP_SCALE: u64 = 1_000_000;
/// The longest a cluster runs before the next one starts (as FFmpeg's muxer does).
const CLUSTER_MS: u64 = 5_000;
/// The most frame bytes a cluster holds before the next one starts.
const CLUSTER_BYTES: usize = 5 << 20;

/// The whole file.
pub(crate) fn webm_file(video: &WebmVideo) -> Vec<u8> {
    let header = master(
        EBML,
        &[
            uint(0x4286, 1),        // EBMLVersion
            uint(0x42F7, 1),        // EBMLReadVersion
            uint(0x42F2, 4),        // EBMLMaxIDLength
            uint(0x42F3, 8),        // EBMLMaxSizeLength
            string(0x4282, "webm"), // DocType
            uint(0x4287, 4),        // DocTypeVersion
            uint(0x4285, 2),        // DocTypeReadVersion
        ],
    );
    let times: Vec<u64> = (0..video.frames.len()).map(|i| timestamp_ms(i, video.fps)).collect();
    let duration_ms = video.frames.len() as f64 * 1000.0 / video.fps;
    let info = master(
        INFO,
        &[
            uint(0x2AD7B1, TIMESTAMP_SCALE),
            string(0x4D80, "Kiln"), // MuxingApp
            string(0x5741, "Kiln"), // WritingApp
            float(0x4489, duration_ms),
        ],
    );
    let tracks = master(TRACKS, &[track_entry(video)]);
    // No tags element without tags (a tag must hold at least one).
    let tags = if video.tags.is_empty() { Vec::new() } else { tags(video.tags) };
    let (clusters, starts) = clusters(&video.frames, &times);

    // Positions count from the segment's body; the seek head's are 8 bytes wide, so its size is known first.
    let seek_len = seek_head(&[0; 4], !tags.is_empty()).len() as u64;
    let info_at = seek_len;
    let tracks_at = info_at + info.len() as u64;
    let tags_at = tracks_at + tracks.len() as u64;
    let clusters_at = tags_at + tags.len() as u64;
    let cues_at = clusters_at + clusters.len() as u64;
    let cues = master(
        CUES,
        &starts
            .iter()
            .map(|&(time, offset)| {
                master(
                    0xBB, // CuePoint
                    &[
                        uint(0xB3, time), // CueTime
                        master(0xB7, &[uint(0xF7, 1), uint(0xF1, clusters_at + offset)]),
                    ],
                )
            })
            .collect::<Vec<_>>(),
    );
    let seek = seek_head(&[info_at, tracks_at, tags_at, cues_at], !tags.is_empty());
    let body = [seek, info, tracks, tags, clusters, cues].concat();

    let mut out = header;
    out.extend(SEGMENT.to_be_bytes());
    // An 8-byte size, as FFmpeg writes the segment's.
    out.push(0x01);
    out.extend(&(body.len() as u64).to_be_bytes()[1..]);
    out.extend(body);
    out
}

/// Frame `i`'s presentation time in milliseconds (FFmpeg's rescale of `i / fps`, rounded to nearest).
fn timestamp_ms(i: usize, fps: f64) -> u64 {
    (i as f64 * 1000.0 / fps).round() as u64
}

/// The seek head pointing at the info, tracks, tags (when written) and cues (positions from the segment's
/// body).
fn seek_head(positions: &[u64; 4], with_tags: bool) -> Vec<u8> {
    let seeks: Vec<Vec<u8>> = [INFO, TRACKS, TAGS, CUES]
        .iter()
        .zip(positions)
        .filter(|(id, _)| with_tags || **id != TAGS)
        .map(|(&id, &at)| {
            master(SEEK, &[element(SEEK_ID, &id.to_be_bytes()), uint8(SEEK_POSITION, at)])
        })
        .collect();
    master(SEEK_HEAD, &seeks)
}

fn track_entry(video: &WebmVideo) -> Vec<u8> {
    let alpha = video.frames.iter().any(|f| f.alpha.is_some());
    let mut picture = vec![uint(0xB0, video.width as u64), uint(0xBA, video.height as u64)];
    if alpha {
        picture.push(uint(0x53C0, 1)); // AlphaMode
    }
    let mut entry = vec![
        uint(0xD7, 1),   // TrackNumber
        uint(0x73C5, 1), // TrackUID
        uint(0x9C, 0),   // FlagLacing
        string(0x22B59C, "und"),
        string(0x86, video.codec.codec_id()),
    ];
    if let Some(private) = &video.codec_private {
        entry.push(element(0x63A2, private));
    }
    entry.push(uint(0x83, 1)); // TrackType: video
    entry.push(uint(0x23E383, (1e9 / video.fps).round() as u64)); // DefaultDuration (ns)
    entry.push(master(0xE0, &picture));
    master(0xAE, &entry)
}

/// The global tags: names in capitals with spaces as underscores, as FFmpeg's Matroska muxer writes them.
fn tags(pairs: &[(String, String)]) -> Vec<u8> {
    let mut tag = vec![master(0x63C0, &[])]; // Targets: the whole file
    for (name, value) in pairs {
        let name: String =
            name.chars().map(|c| if c == ' ' { '_' } else { c.to_ascii_uppercase() }).collect();
        tag.push(master(0x67C8, &[string(0x45A3, &name), string(0x4487, value)]));
    }
    master(TAGS, &[master(0x7373, &tag)])
}

/// The clusters, and the start time and offset of each that begins with a key frame (a seek lands there).
fn clusters(frames: &[CodedFrame], times: &[u64]) -> (Vec<u8>, Vec<(u64, u64)>) {
    let mut out = Vec::new();
    let mut starts = Vec::new();
    // The open cluster: its start time, blocks, frame bytes and whether its first frame is a key frame.
    let mut current: Option<(u64, Vec<Vec<u8>>, usize, bool)> = None;
    let mut close = |cluster: Option<(u64, Vec<Vec<u8>>, usize, bool)>, out: &mut Vec<u8>| {
        if let Some((start, blocks, _, key)) = cluster {
            if key {
                starts.push((start, out.len() as u64));
            }
            let mut children = vec![uint(0xE7, start)]; // Timestamp
            children.extend(blocks);
            out.extend(master(CLUSTER, &children));
        }
    };
    for (i, (frame, &time)) in frames.iter().zip(times).enumerate() {
        let full = current.as_ref().is_some_and(|(start, _, bytes, _)| {
            time - start >= CLUSTER_MS || *bytes >= CLUSTER_BYTES
        });
        if current.is_none() || frame.keyframe || full {
            close(current.take(), &mut out);
            current = Some((time, Vec::new(), 0, frame.keyframe));
        }
        if let Some((start, blocks, bytes, _)) = current.as_mut() {
            let previous = i.checked_sub(1).map(|p| times[p] as i64 - time as i64);
            blocks.push(block(frame, (time - *start) as i16, previous));
            *bytes += frame.data.len();
        }
    }
    close(current.take(), &mut out);
    (out, starts)
}

/// A frame as a `SimpleBlock`, or as a `BlockGroup` when it carries alpha (only a group holds additions; a
/// group's frame that needs the previous one names it with a `ReferenceBlock`).
fn block(frame: &CodedFrame, relative: i16, previous: Option<i64>) -> Vec<u8> {
    let mut head = vec![0x81]; // track 1
    head.extend(relative.to_be_bytes());
    match &frame.alpha {
        None => {
            head.push(if frame.keyframe { 0x80 } else { 0x00 });
            head.extend(&frame.data);
            element(0xA3, &head)
        }
        Some(alpha) => {
            head.push(0x00);
            head.extend(&frame.data);
            let mut group = vec![element(0xA1, &head)];
            let more = master(0xA6, &[uint(0xEE, 1), element(0xA5, alpha)]); // BlockMore
            group.push(master(0x75A1, &[more])); // BlockAdditions
            if let (false, Some(back)) = (frame.keyframe, previous) {
                group.push(element(0xFB, &back.to_be_bytes())); // ReferenceBlock
            }
            master(0xA0, &group)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{CodedFrame, WebmCodec, WebmVideo, timestamp_ms, webm_file};

    fn frame(byte: u8, keyframe: bool) -> CodedFrame {
        CodedFrame { data: vec![byte; 3], alpha: None, keyframe }
    }

    #[test]
    fn timestamps_round_each_frames_time_to_the_millisecond() {
        assert_eq!((0..4).map(|i| timestamp_ms(i, 24.0)).collect::<Vec<_>>(), [0, 42, 83, 125]);
    }

    #[test]
    fn a_key_frame_or_five_seconds_start_a_cluster() {
        let frames: Vec<CodedFrame> = (0..15).map(|i| frame(i, i == 0 || i == 3)).collect();
        let tags = [("prompt".to_owned(), "{}".to_owned())];
        let video = WebmVideo {
            codec: WebmCodec::Vp9,
            codec_private: None,
            width: 2,
            height: 2,
            fps: 2.0,
            frames,
            tags: &tags,
        };
        let file = webm_file(&video);
        let clusters = file.windows(4).filter(|w| w == &[0x1F, 0x43, 0xB6, 0x75]).count();
        // Key frames at 0 and 1.5 s, then 6.5 s passes the 5 s bound.
        assert_eq!(clusters, 3);
        assert!(file.windows(6).any(|w| w == b"PROMPT"));
    }
}
