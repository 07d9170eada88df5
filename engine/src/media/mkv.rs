//! Matroska and WebM files read as tracks of samples, the shape the MP4 reader gives them: each frame's bytes
//! stay in the file (a sample is its offset and size inside its block), so nothing is loaded until decoded.
//!
//! What is read: the segment's timestamp scale, each video and audio track (codec, size or channels and
//! rate, codec private data), the global tags (names lower-cased: FFmpeg writes ComfyUI's `prompt` as
//! `PROMPT`), and every `SimpleBlock` and `BlockGroup` of every cluster, known or unknown size (as live
//! recorders write them). Laced blocks (several audio frames in one, as mkvmerge writes Vorbis and AAC) are
//! split into their frames; laced video, which no muxer writes, is refused.

use super::ebml::id::{
    self, AUDIO, BLOCK, BLOCK_GROUP, CHANNELS, CLUSTER, CODEC_ID, CODEC_PRIVATE, CUES,
    DEFAULT_DURATION, DISCARD_PADDING, DOC_TYPE, EBML, INFO, PIXEL_HEIGHT, PIXEL_WIDTH,
    REFERENCE_BLOCK, SAMPLING_FREQUENCY, SEEK_HEAD, SEGMENT, SIMPLE_BLOCK, SIMPLE_TAG, TAG,
    TAG_NAME, TAG_STRING, TAGS, TARGETS, TIMESTAMP, TIMESTAMP_SCALE, TRACK_ENTRY, TRACK_NUMBER,
    TRACK_TYPE, TRACKS, VIDEO,
};
use super::mp4::{SampleInfo, TrackInfo, TrackKind};
use super::{MediaError, Rational};

/// Reads `len` bytes at an offset of the file.
pub(crate) type ReadAt<'a> = dyn FnMut(u64, u64) -> Result<Vec<u8>, MediaError> + 'a;

/// A file's global tags: (name, value) in file order.
pub(crate) type Tags = Vec<(String, String)>;

/// Elements that end an unknown-size cluster: the next cluster, or any other child of the segment.
const SEGMENT_CHILDREN: [u64; 8] =
    [CLUSTER, INFO, TRACKS, TAGS, SEEK_HEAD, CUES, id::CHAPTERS, id::ATTACHMENTS];

/// The largest header or metadata element read whole (the tracks, the tags).
const MAX_METADATA: u64 = 64 << 20;

/// One element's place in the file.
#[derive(Debug, Clone, Copy)]
struct Element {
    id: u64,
    /// Where its body starts.
    body: u64,
    /// Its body's end (the limit it sits in, for an unknown size).
    end: u64,
    unknown_size: bool,
}

/// A track as it is read, before its samples become timed.
struct Pending {
    number: u64,
    kind: TrackKind,
    codec: String,
    private: Option<Vec<u8>>,
    sample_rate: u32,
    /// Nanoseconds per frame, when the file says.
    default_duration: Option<u64>,
    /// Each frame: its timestamp in ticks, offset, size and whether it is a key frame.
    frames: Vec<(i64, u64, u32, bool)>,
    /// A laced video block was met: its frames would have no times of their own.
    laced: bool,
    /// Nanoseconds of padding the blocks ask to discard (an Opus stream's last frame).
    discard_ns: u64,
}

/// The tracks and global tags of a Matroska/WebM file of `len` bytes.
pub(crate) fn read(read_at: &mut ReadAt, len: u64) -> Result<(Vec<TrackInfo>, Tags), MediaError> {
    let header = element_at(read_at, 0, len, false)?;
    if header.id != EBML {
        return Err(malformed("the file does not start with an EBML header"));
    }
    let body = metadata(read_at, &header)?;
    let doc_type = children(&body)?
        .into_iter()
        .find(|(id, _)| *id == DOC_TYPE)
        .map(|(_, v)| String::from_utf8_lossy(v).into_owned());
    if !matches!(doc_type.as_deref(), Some("webm" | "matroska")) {
        return Err(MediaError::UnsupportedContainer {
            what: format!("an EBML file of type {doc_type:?}, not Matroska or WebM"),
        });
    }
    // A segment (or cluster) cut short by a truncated upload is read as far as it goes.
    let segment = element_at(read_at, header.end, len, true)?;
    if segment.id != SEGMENT {
        return Err(malformed("no segment follows the EBML header"));
    }
    let mut scale = 1_000_000u64;
    let mut tracks: Vec<Pending> = Vec::new();
    let mut tags = Vec::new();
    let mut at = segment.body;
    while at < segment.end {
        let child = match element_at(read_at, at, segment.end, true) {
            Ok(child) => child,
            Err(e @ MediaError::Io { .. }) => return Err(e),
            // A damaged element: what came before it is kept.
            Err(_) => break,
        };
        match child.id {
            INFO => {
                let body = metadata(read_at, &child)?;
                if let Some((_, v)) =
                    children(&body)?.into_iter().find(|(id, _)| *id == TIMESTAMP_SCALE)
                {
                    scale = uint(v).max(1);
                }
            }
            TRACKS => {
                let body = metadata(read_at, &child)?;
                for (id, entry) in children(&body)? {
                    if id == TRACK_ENTRY {
                        tracks.extend(track(entry)?);
                    }
                }
            }
            TAGS => tags.extend(global_tags(&metadata(read_at, &child)?)?),
            CLUSTER => {
                let end = cluster(read_at, &child, &mut tracks)?;
                at = end;
                continue;
            }
            _ => {}
        }
        if child.unknown_size {
            return Err(malformed("an element other than a cluster has an unknown size"));
        }
        at = child.end;
    }
    if let Some(video) =
        tracks.iter().find(|t| t.laced && matches!(t.kind, TrackKind::Video { .. }))
    {
        return Err(MediaError::UnsupportedContainer {
            what: format!(
                "a Matroska file whose {} video is laced (several frames a block)",
                video.codec
            ),
        });
    }
    let timescale = u32::try_from(1_000_000_000 / scale).unwrap_or(1).max(1);
    let infos = tracks.into_iter().map(|t| timed(t, scale, timescale)).collect();
    Ok((infos, tags))
}

fn malformed(what: &str) -> MediaError {
    MediaError::Malformed(format!("Matroska/WebM: {what}"))
}

/// The element whose header starts at `at`, inside a parent ending at `limit`; with `clamp`, one that runs
/// past the limit ends there.
fn element_at(
    read_at: &mut ReadAt,
    at: u64,
    limit: u64,
    clamp: bool,
) -> Result<Element, MediaError> {
    let head = read_at(at, (limit - at).min(12))?;
    let (id, id_len) = vint(&head, 0, true).ok_or_else(|| malformed("a damaged element ID"))?;
    let (size, size_len) =
        vint(&head, id_len, false).ok_or_else(|| malformed("a damaged element size"))?;
    let body = at + (id_len + size_len) as u64;
    let unknown_size = size == (1u64 << (7 * size_len)) - 1;
    let end = if unknown_size { limit } else { body.saturating_add(size) };
    if body > limit || (end > limit && !clamp) {
        return Err(malformed("an element runs past its parent"));
    }
    let end = end.min(limit);
    Ok(Element { id, body, end, unknown_size })
}

/// An EBML variable-length integer at `at`: its value (with its length marker for IDs) and its length.
fn vint(bytes: &[u8], at: usize, keep_marker: bool) -> Option<(u64, usize)> {
    let first = *bytes.get(at)?;
    let len = first.leading_zeros() as usize + 1;
    if len > 8 {
        return None;
    }
    let mut value = if keep_marker { u64::from(first) } else { u64::from(first) & (0xFF >> len) };
    for byte in bytes.get(at + 1..at + len)? {
        value = value << 8 | u64::from(*byte);
    }
    Some((value, len))
}

/// A small element's whole body.
fn metadata(read_at: &mut ReadAt, element: &Element) -> Result<Vec<u8>, MediaError> {
    let len = element.end - element.body;
    if len > MAX_METADATA {
        return Err(malformed("a metadata element is larger than 64 MiB"));
    }
    read_at(element.body, len)
}

/// The (ID, body) pairs of a body held in memory.
fn children(body: &[u8]) -> Result<Vec<(u64, &[u8])>, MediaError> {
    Ok(children_at(body)?.into_iter().map(|(id, range)| (id, &body[range])).collect())
}

/// The (ID, body range) pairs of a body held in memory.
fn children_at(body: &[u8]) -> Result<Vec<(u64, std::ops::Range<usize>)>, MediaError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let (id, n) = vint(body, at, true).ok_or_else(|| malformed("a damaged element ID"))?;
        let (size, m) =
            vint(body, at + n, false).ok_or_else(|| malformed("a damaged element size"))?;
        let start = at + n + m;
        let end = usize::try_from(size).ok().and_then(|s| start.checked_add(s));
        let end = end
            .filter(|&e| e <= body.len())
            .ok_or_else(|| malformed("an element runs past its parent"))?;
        out.push((id, start..end));
        at = end;
    }
    Ok(out)
}

/// A big-endian unsigned integer of up to 8 bytes.
fn uint(bytes: &[u8]) -> u64 {
    bytes.iter().take(8).fold(0, |v, &b| v << 8 | u64::from(b))
}

/// A big-endian two's complement integer of up to 8 bytes.
fn signed(bytes: &[u8]) -> i64 {
    let bits = 8 * bytes.len().min(8) as u32;
    if bits == 0 {
        return 0;
    }
    ((uint(bytes) << (64 - bits)) as i64) >> (64 - bits)
}

/// A float element (4 or 8 bytes).
fn float(bytes: &[u8]) -> f64 {
    match bytes.len() {
        4 => f64::from(f32::from_bits(uint(bytes) as u32)),
        8 => f64::from_bits(uint(bytes)),
        _ => 0.0,
    }
}

/// A video or audio track entry (others are skipped).
fn track(entry: &[u8]) -> Result<Option<Pending>, MediaError> {
    let fields = children(entry)?;
    let get = |id: u64| fields.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
    let codec_id =
        get(CODEC_ID).map(|v| String::from_utf8_lossy(v).trim_end_matches('\0').to_owned());
    let (Some(number), Some(kind), Some(codec_id)) =
        (get(TRACK_NUMBER).map(uint), get(TRACK_TYPE), codec_id)
    else {
        return Ok(None);
    };
    let (kind, sample_rate) = match uint(kind) {
        1 => {
            let video = children(get(VIDEO).unwrap_or_default())?;
            let size = |id: u64| video.iter().find(|(i, _)| *i == id).map_or(0, |(_, v)| uint(v));
            let kind = TrackKind::Video {
                width: size(PIXEL_WIDTH) as u32,
                height: size(PIXEL_HEIGHT) as u32,
            };
            (kind, 0)
        }
        2 => {
            let audio = children(get(AUDIO).unwrap_or_default())?;
            let field = |id: u64| audio.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
            let rate = field(SAMPLING_FREQUENCY).map_or(8000.0, float);
            let channels = field(CHANNELS).map_or(1, uint);
            (TrackKind::Audio { channels: channels as u16 }, rate.round() as u32)
        }
        _ => return Ok(None),
    };
    // Matroska's FLAC private data is the native stream header, `fLaC` then the metadata blocks; MP4's
    // `dfLa` (which the decoding reads) holds the blocks alone.
    let private = get(CODEC_PRIVATE).map(|p| {
        if codec_id == "A_FLAC" {
            p.strip_prefix(b"fLaC").unwrap_or(p).to_vec()
        } else {
            p.to_vec()
        }
    });
    Ok(Some(Pending {
        number,
        kind,
        codec: codec_name(&codec_id),
        private,
        sample_rate,
        default_duration: get(DEFAULT_DURATION).map(uint),
        frames: Vec::new(),
        laced: false,
        discard_ns: 0,
    }))
}

/// A Matroska codec ID as the sample-entry code the MP4 reader would name the codec by.
fn codec_name(codec_id: &str) -> String {
    match codec_id {
        "V_VP9" => "vp09",
        "V_VP8" => "vp08",
        "V_AV1" => "av01",
        "V_MPEG4/ISO/AVC" => "avc1",
        "V_MPEGH/ISO/HEVC" => "hvc1",
        "A_OPUS" => "Opus",
        "A_VORBIS" => "vorbis",
        "A_FLAC" => "fLaC",
        "A_AAC" => "mp4a",
        other => other,
    }
    .to_owned()
}

/// The global tags (those whose targets name nothing): names lower-cased, string values.
fn global_tags(body: &[u8]) -> Result<Tags, MediaError> {
    let mut out = Vec::new();
    for (id, tag) in children(body)? {
        if id != TAG {
            continue;
        }
        let fields = children(tag)?;
        // Targets naming a track, edition, chapter or attachment (their UIDs) make the tag not global.
        let names_something = |targets: &[u8]| {
            children(targets).is_ok_and(|t| {
                t.iter().any(|(i, _)| {
                    [
                        id::TAG_TRACK_UID,
                        id::TAG_EDITION_UID,
                        id::TAG_CHAPTER_UID,
                        id::TAG_ATTACHMENT_UID,
                    ]
                    .contains(i)
                })
            })
        };
        let global = fields.iter().all(|(i, targets)| *i != TARGETS || !names_something(targets));
        if !global {
            continue;
        }
        for (i, simple) in fields {
            if i != SIMPLE_TAG {
                continue;
            }
            let parts = children(simple)?;
            let text = |id: u64| {
                parts
                    .iter()
                    .find(|(i, _)| *i == id)
                    .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            };
            if let (Some(name), Some(value)) = (text(TAG_NAME), text(TAG_STRING)) {
                out.push((name.to_lowercase(), value));
            }
        }
    }
    Ok(out)
}

/// Reads a cluster's blocks into their tracks; returns where the cluster ends.
fn cluster(
    read_at: &mut ReadAt,
    cluster: &Element,
    tracks: &mut [Pending],
) -> Result<u64, MediaError> {
    let mut time = 0i64;
    let mut at = cluster.body;
    while at < cluster.end {
        // A block cut short (a truncated file) ends the cluster: the frames before it are kept.
        let child = match element_at(read_at, at, cluster.end, false) {
            Ok(child) => child,
            Err(e @ MediaError::Io { .. }) => return Err(e),
            Err(_) => break,
        };
        if cluster.unknown_size && SEGMENT_CHILDREN.contains(&child.id) {
            return Ok(at);
        }
        match child.id {
            TIMESTAMP => {
                let value = uint(&read_at(child.body, (child.end - child.body).min(8))?);
                time = i64::try_from(value).map_err(|_| malformed("a cluster time past 2⁶³"))?;
            }
            SIMPLE_BLOCK => {
                block(read_at, child.body, child.end, time, None, tracks)?;
            }
            BLOCK_GROUP => {
                // Its children's headers only: the block's frame stays in the file.
                let (mut frame, mut referenced, mut discard) = (None, false, 0u64);
                let mut inner = child.body;
                while inner < child.end {
                    let part = element_at(read_at, inner, child.end, false)?;
                    match part.id {
                        BLOCK => frame = Some((part.body, part.end)),
                        REFERENCE_BLOCK => referenced = true,
                        DISCARD_PADDING => {
                            let bytes = read_at(part.body, (part.end - part.body).min(8))?;
                            discard = signed(&bytes).max(0) as u64;
                        }
                        _ => {}
                    }
                    inner = part.end;
                }
                if let Some((start, end)) = frame
                    && let Some(track) =
                        block(read_at, start, end, time, Some(!referenced), tracks)?
                {
                    tracks[track].discard_ns = tracks[track].discard_ns.saturating_add(discard);
                }
            }
            _ => {}
        }
        at = child.end;
    }
    Ok(cluster.end)
}

/// One block: a frame of its track at the cluster's time plus its own offset. `key` is the group's answer
/// (no `ReferenceBlock`) for a `Block`, `None` for a `SimpleBlock`, whose flags say. Returns the index of
/// the track it belongs to, if it is one of the tracks read.
fn block(
    read_at: &mut ReadAt,
    start: u64,
    end: u64,
    cluster_time: i64,
    key: Option<bool>,
    tracks: &mut [Pending],
) -> Result<Option<usize>, MediaError> {
    let head = read_at(start, (end - start).min(12))?;
    let (number, n) = vint(&head, 0, false).ok_or_else(|| malformed("a damaged block header"))?;
    let (Some(&t0), Some(&t1), Some(&flags)) = (head.get(n), head.get(n + 1), head.get(n + 2))
    else {
        return Err(malformed("a block shorter than its header"));
    };
    let Some(index) = tracks.iter().position(|t| t.number == number) else { return Ok(None) };
    let track = &mut tracks[index];
    let data = start + n as u64 + 3;
    let time = cluster_time
        .checked_add(i64::from(i16::from_be_bytes([t0, t1])))
        .ok_or_else(|| malformed("a block time past 2⁶³"))?;
    let keyframe = key.unwrap_or(flags & 0x80 != 0);
    let frames = if flags & 0x06 == 0 {
        vec![(data, end - data)]
    } else if matches!(track.kind, TrackKind::Video { .. }) {
        // Video is never laced in practice; its frames would have no times of their own.
        track.laced = true;
        return Ok(Some(index));
    } else {
        let header = read_at(data, (end - data).min(MAX_LACE_HEADER))?;
        laced_frames(&header, flags, data, end)?
    };
    for (offset, size) in frames {
        let size = u32::try_from(size).map_err(|_| malformed("a frame larger than 4 GiB"))?;
        // Laced frames share their block's time: audio is decoded in order, whatever its times.
        track.frames.push((time, offset, size, keyframe));
    }
    Ok(Some(index))
}

/// The most bytes of lace sizes a block is read for (Xiph lacing spends a byte per 255 bytes of each frame).
const MAX_LACE_HEADER: u64 = 1 << 16;

/// The frames of a laced block whose data (lace header first) starts at `data` and ends at `end`: each one's
/// offset and size. Xiph lacing (flags 0x02) writes each size but the last as a run of bytes summed until one
/// is below 255; EBML lacing (0x06) the first size as a number and each next as a signed difference; fixed
/// lacing (0x04) none, the frames being equal.
fn laced_frames(
    header: &[u8],
    flags: u8,
    data: u64,
    end: u64,
) -> Result<Vec<(u64, u64)>, MediaError> {
    let bad = || malformed("a damaged lace header");
    let count = usize::from(*header.first().ok_or_else(bad)?) + 1;
    let mut at = 1usize;
    let mut sizes: Vec<u64> = Vec::with_capacity(count);
    match flags & 0x06 {
        0x02 => {
            for _ in 1..count {
                let mut size = 0u64;
                loop {
                    let byte = *header.get(at).ok_or_else(bad)?;
                    at += 1;
                    size += u64::from(byte);
                    if byte < 255 {
                        break;
                    }
                }
                sizes.push(size);
            }
        }
        0x06 => {
            if count > 1 {
                let (first, len) = vint(header, at, false).ok_or_else(bad)?;
                at += len;
                sizes.push(first);
                for _ in 2..count {
                    let (raw, len) = vint(header, at, false).ok_or_else(bad)?;
                    at += len;
                    // A signed difference: the raw value less half its range.
                    let difference = raw as i64 - ((1i64 << (7 * len - 1)) - 1);
                    let previous = *sizes.last().ok_or_else(bad)? as i64;
                    sizes.push(u64::try_from(previous + difference).map_err(|_| bad())?);
                }
            }
        }
        _ => {
            let each = (end - data - 1) / count as u64;
            sizes.extend(std::iter::repeat_n(each, count - 1));
        }
    }
    let mut offset = data + at as u64;
    let used: u64 = sizes.iter().try_fold(0u64, |sum, &s| sum.checked_add(s)).ok_or_else(bad)?;
    let last = end.checked_sub(offset).and_then(|rest| rest.checked_sub(used)).ok_or_else(bad)?;
    sizes.push(last);
    let mut frames = Vec::with_capacity(count);
    for size in sizes {
        frames.push((offset, size));
        offset += size;
    }
    Ok(frames)
}

/// A track's frames as samples timed in `timescale` ticks a second (each lasts until the next frame; the last
/// as long as the file's default duration, or the one before it).
fn timed(track: Pending, scale: u64, timescale: u32) -> TrackInfo {
    // Timestamps in `scale` nanoseconds; ticks are 1 / timescale seconds (in 128 bits: no file overflows them).
    let ticks = |t: i64| i128::from(t) * i128::from(scale) * i128::from(timescale) / 1_000_000_000;
    let default =
        track.default_duration.map(|ns| i128::from(ns) * i128::from(timescale) / 1_000_000_000);
    // Blocks carry presentation times; decode times are the same times in order (B-frames shown later than
    // they are decoded get a composition offset).
    let shown: Vec<i128> = track.frames.iter().map(|f| ticks(f.0)).collect();
    let mut decoded = shown.clone();
    decoded.sort_unstable();
    let n = decoded.len();
    let clamp32 = |x: i128| u32::try_from(x.max(0)).unwrap_or(u32::MAX);
    let samples = (0..n)
        .map(|i| {
            let (_, offset, size, sync) = track.frames[i];
            let duration = match decoded.get(i + 1) {
                Some(next) => next - decoded[i],
                None => default
                    .unwrap_or_else(|| i.checked_sub(1).map_or(0, |p| decoded[i] - decoded[p])),
            };
            let composition =
                (shown[i] - decoded[i]).clamp(i128::from(i32::MIN), i128::from(i32::MAX));
            SampleInfo {
                offset,
                size,
                duration: clamp32(duration),
                composition_offset: composition as i32,
                sync,
            }
        })
        .collect();
    TrackInfo {
        kind: track.kind,
        timescale,
        codec: track.codec,
        sample_entry: Vec::new(),
        config: track.private,
        sample_rate: track.sample_rate,
        samples,
        media_start: None,
        rotation: 0,
        // FFmpeg's Matroska demuxer: 10⁹ / default duration, reduced to terms of at most 30 000.
        frame_rate: (matches!(track.kind, TrackKind::Video { .. }))
            .then_some(track.default_duration)
            .flatten()
            .and_then(|ns| Rational::approximate(1_000_000_000, ns, 30_000)),
        discard_end_ns: track.discard_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::read;
    use crate::media::Rational;
    use crate::media::ebml::{element, master, string, uint};
    use crate::media::mp4::TrackKind;

    /// A simple block of track 1 at `relative` ms into its cluster.
    fn simple_block(relative: i16, key: bool, data: &[u8]) -> Vec<u8> {
        let mut body = vec![0x81];
        body.extend(relative.to_be_bytes());
        body.push(if key { 0x80 } else { 0 });
        body.extend(data);
        element(0xA3, &body)
    }

    /// An element of unknown size (as live recorders write segments and clusters).
    fn unknown(id: [u8; 4], children: &[Vec<u8>]) -> Vec<u8> {
        [id.to_vec(), vec![0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF], children.concat()]
            .concat()
    }

    #[test]
    fn clusters_of_unknown_size_end_where_the_next_begins() {
        let video = master(0xE0, &[uint(0xB0, 4), uint(0xBA, 2)]);
        let entry = master(0xAE, &[uint(0xD7, 1), uint(0x83, 1), string(0x86, "V_VP9"), video]);
        let first = unknown(
            [0x1F, 0x43, 0xB6, 0x75],
            &[uint(0xE7, 0), simple_block(0, true, &[1, 2, 3]), simple_block(40, false, &[4, 5])],
        );
        let second =
            unknown([0x1F, 0x43, 0xB6, 0x75], &[uint(0xE7, 80), simple_block(0, true, &[6])]);
        let segment =
            unknown([0x18, 0x53, 0x80, 0x67], &[master(0x1654_AE6B, &[entry]), first, second]);
        let file = [master(0x1A45_DFA3, &[string(0x4282, "webm")]), segment].concat();
        let len = file.len() as u64;
        let (tracks, tags) =
            read(&mut |at, n| Ok(file[at as usize..(at + n) as usize].to_vec()), len)
                .expect("a WebM");
        assert!(tags.is_empty());
        assert_eq!(tracks.len(), 1);
        let track = &tracks[0];
        assert_eq!(
            (track.codec.as_str(), track.kind),
            ("vp09", TrackKind::Video { width: 4, height: 2 })
        );
        assert_eq!(track.timescale, 1000);
        let frames: Vec<Vec<u8>> = (track.samples.iter())
            .map(|s| file[s.offset as usize..s.offset as usize + s.size as usize].to_vec())
            .collect();
        assert_eq!(frames, [vec![1, 2, 3], vec![4, 5], vec![6]]);
        let durations: Vec<u32> = track.samples.iter().map(|s| s.duration).collect();
        assert_eq!(durations, [40, 40, 40]);
        let sync: Vec<bool> = track.samples.iter().map(|s| s.sync).collect();
        assert_eq!(sync, [true, false, true]);
        assert_eq!(track.frame_rate, None);
    }

    #[test]
    fn frames_shown_out_of_decode_order_get_composition_offsets() {
        // An H.264 track with a B-frame: decoded I, P, B; shown at 0, 80 and 40 ms.
        let video = master(0xE0, &[uint(0xB0, 4), uint(0xBA, 2)]);
        let entry = master(
            0xAE,
            &[
                uint(0xD7, 1),
                uint(0x83, 1),
                string(0x86, "V_MPEG4/ISO/AVC"),
                uint(0x23E383, 40_000_000),
                video,
            ],
        );
        let blocks = [
            simple_block(0, true, &[1]),
            simple_block(80, false, &[2]),
            simple_block(40, false, &[3]),
        ];
        let cluster = master(0x1F43_B675, &[&[uint(0xE7, 0)][..], &blocks].concat());
        let segment = master(0x1853_8067, &[master(0x1654_AE6B, &[entry]), cluster]);
        let file = [master(0x1A45_DFA3, &[string(0x4282, "matroska")]), segment].concat();
        let len = file.len() as u64;
        let (tracks, _) = read(&mut |at, n| Ok(file[at as usize..(at + n) as usize].to_vec()), len)
            .expect("a Matroska file");
        let track = &tracks[0];
        assert_eq!(track.codec, "avc1");
        let timing: Vec<(u32, i32)> =
            track.samples.iter().map(|s| (s.duration, s.composition_offset)).collect();
        // Decode times 0, 40, 80; each frame shown at its block's time.
        assert_eq!(timing, [(40, 0), (40, 40), (40, -40)]);
        assert_eq!(track.frame_rate, Rational::new(25, 1));
    }

    #[test]
    fn laced_audio_blocks_split_into_their_frames() {
        use super::laced_frames;
        // Three frames of 300, 5 and 7 bytes, after a 4-byte block header at offset 100.
        let data = 104;
        // Xiph: 300 = 255 + 45, then 5; the last takes the rest.
        let xiph = laced_frames(&[2, 255, 45, 5], 0x02, data, data + 4 + 312).expect("xiph");
        assert_eq!(xiph, [(108, 300), (408, 5), (413, 7)]);
        // EBML: 300 as a two-byte number (0x412C), then 5 - 300 = -295 as a signed two-byte number
        // (raw = -295 + 8191 = 7896 = 0x1ED8, marked 0x5ED8).
        let ebml =
            laced_frames(&[2, 0x41, 0x2C, 0x5E, 0xD8], 0x06, data, data + 5 + 312).expect("ebml");
        assert_eq!(ebml, [(109, 300), (409, 5), (414, 7)]);
        // Fixed: three frames of 10.
        let fixed = laced_frames(&[2], 0x04, data, data + 1 + 30).expect("fixed");
        assert_eq!(fixed, [(105, 10), (115, 10), (125, 10)]);
        // Sizes past the block's end are refused.
        assert!(laced_frames(&[1, 250], 0x02, data, data + 10).is_err());
    }

    #[test]
    fn a_default_duration_gives_ffmpegs_reduced_rate() {
        assert_eq!(
            Rational::approximate(1_000_000_000, 33_366_666, 30_000),
            Rational::new(30000, 1001)
        );
        assert_eq!(Rational::approximate(1_000_000_000, 41_666_667, 30_000), Rational::new(24, 1));
        assert_eq!(Rational::approximate(1_000_000_000, 80_000_000, 30_000), Rational::new(25, 2));
    }
}
