//! WebM files as ComfyUI's `SaveWEBM` writes them through FFmpeg: one VP9 or AV1 video track, the alpha of a
//! VP9 video as a second VP9 stream beside each frame (`BlockAdditional` 1, the track's `AlphaMode`), and the
//! prompt and workflow as global tags named in capitals (FFmpeg's convention, which the frontend reads back
//! when a WebM is dropped on it). Kiln writes the file itself, as it writes MP4s.
//!
//! Layout: the EBML header, then one segment holding a seek head, the segment info, the track, the tags, the
//! clusters (a new one at each key frame, or every 5 s) and the cues (one per cluster that starts on a key
//! frame, for seeking).

use super::colour::{rgb_to_yuv420, rgb_to_yuv420_10bit, to_u8};
use super::ebml::id::{self, CLUSTER, CUES, INFO, SEEK_HEAD, TAGS, TRACKS};
use super::ebml::{element, float, id_bytes, master, string, uint, uint8};
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

/// Milliseconds: the timestamp unit (`TimestampScale`, in nanoseconds).
const TIMESTAMP_SCALE: u64 = 1_000_000;
/// The longest a cluster runs before the next one starts (as FFmpeg's muxer does).
const CLUSTER_MS: u64 = 5_000;
/// The most frame bytes a cluster holds before the next one starts.
const CLUSTER_BYTES: usize = 5 << 20;

/// The whole file.
pub(crate) fn webm_file(video: &WebmVideo) -> Vec<u8> {
    let header = master(
        id::EBML,
        &[
            uint(id::EBML_VERSION, 1),
            uint(id::EBML_READ_VERSION, 1),
            uint(id::EBML_MAX_ID_LENGTH, 4),
            uint(id::EBML_MAX_SIZE_LENGTH, 8),
            string(id::DOC_TYPE, "webm"),
            uint(id::DOC_TYPE_VERSION, 4),
            uint(id::DOC_TYPE_READ_VERSION, 2),
        ],
    );
    let times: Vec<u64> = (0..video.frames.len()).map(|i| timestamp_ms(i, video.fps)).collect();
    let duration_ms = video.frames.len() as f64 * 1000.0 / video.fps;
    let info = master(
        INFO,
        &[
            uint(id::TIMESTAMP_SCALE, TIMESTAMP_SCALE),
            string(id::MUXING_APP, "Kiln"),
            string(id::WRITING_APP, "Kiln"),
            float(id::DURATION, duration_ms),
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
                let position =
                    [uint(id::CUE_TRACK, 1), uint(id::CUE_CLUSTER_POSITION, clusters_at + offset)];
                master(
                    id::CUE_POINT,
                    &[uint(id::CUE_TIME, time), master(id::CUE_TRACK_POSITIONS, &position)],
                )
            })
            .collect::<Vec<_>>(),
    );
    let seek = seek_head(&[info_at, tracks_at, tags_at, cues_at], !tags.is_empty());
    let body = [seek, info, tracks, tags, clusters, cues].concat();

    let mut out = header;
    out.extend(id_bytes(id::SEGMENT));
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
            master(id::SEEK, &[element(id::SEEK_ID, &id_bytes(id)), uint8(id::SEEK_POSITION, at)])
        })
        .collect();
    master(SEEK_HEAD, &seeks)
}

fn track_entry(video: &WebmVideo) -> Vec<u8> {
    let alpha = video.frames.iter().any(|f| f.alpha.is_some());
    let mut picture = vec![
        uint(id::PIXEL_WIDTH, video.width as u64),
        uint(id::PIXEL_HEIGHT, video.height as u64),
    ];
    if alpha {
        picture.push(uint(id::ALPHA_MODE, 1));
    }
    let mut entry = vec![
        uint(id::TRACK_NUMBER, 1),
        uint(id::TRACK_UID, 1),
        uint(id::FLAG_LACING, 0),
        string(id::LANGUAGE, "und"),
        string(id::CODEC_ID, video.codec.codec_id()),
    ];
    if let Some(private) = &video.codec_private {
        entry.push(element(id::CODEC_PRIVATE, private));
    }
    entry.push(uint(id::TRACK_TYPE, 1)); // video
    entry.push(uint(id::DEFAULT_DURATION, (1e9 / video.fps).round() as u64)); // nanoseconds
    entry.push(master(id::VIDEO, &picture));
    master(id::TRACK_ENTRY, &entry)
}

/// The global tags: names in capitals with spaces as underscores, as FFmpeg's Matroska muxer writes them.
fn tags(pairs: &[(String, String)]) -> Vec<u8> {
    let mut tag = vec![master(id::TARGETS, &[])]; // the whole file
    for (name, value) in pairs {
        let name: String =
            name.chars().map(|c| if c == ' ' { '_' } else { c.to_ascii_uppercase() }).collect();
        tag.push(master(
            id::SIMPLE_TAG,
            &[string(id::TAG_NAME, &name), string(id::TAG_STRING, value)],
        ));
    }
    master(TAGS, &[master(id::TAG, &tag)])
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
            let mut children = vec![uint(id::TIMESTAMP, start)];
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
            element(id::SIMPLE_BLOCK, &head)
        }
        Some(alpha) => {
            head.push(0x00);
            head.extend(&frame.data);
            let mut group = vec![element(id::BLOCK, &head)];
            let more = master(
                id::BLOCK_MORE,
                &[uint(id::BLOCK_ADD_ID, 1), element(id::BLOCK_ADDITIONAL, alpha)],
            );
            group.push(master(id::BLOCK_ADDITIONS, &[more]));
            if let (false, Some(back)) = (frame.keyframe, previous) {
                group.push(element(id::REFERENCE_BLOCK, &back.to_be_bytes()));
            }
            master(id::BLOCK_GROUP, &group)
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
