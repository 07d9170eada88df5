//! The MP4 reader: the top-level boxes are walked by their headers (the media data is never loaded), the
//! movie box is parsed whole, and samples are read where the sample tables place them.
//!
//! Invariant: every size and offset comes from the file and is checked before use; a damaged or hostile file
//! is a [`MediaError`], never a panic or an allocation larger than the file.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

use super::TrackKind;
use crate::media::MediaError;

/// The largest movie box Kiln reads (sample tables of hours of video fit well below this).
const MAX_MOOV: u64 = 512 << 20;

/// Where a file's bytes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A file on disk.
    Path(PathBuf),
    /// Bytes in memory.
    Bytes(Arc<[u8]>),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Path(path) => path.display().to_string(),
            Source::Bytes(_) => "the in-memory video".to_owned(),
        }
    }
}

enum Reader {
    File { file: File, path: PathBuf, len: u64 },
    Bytes(Arc<[u8]>),
}

impl Reader {
    fn open(source: &Source) -> Result<Reader, MediaError> {
        match source {
            Source::Path(path) => {
                let io = |source| MediaError::Io { path: path.clone(), source };
                let file = File::open(path).map_err(io)?;
                let len = file.metadata().map_err(io)?.len();
                Ok(Reader::File { file, path: path.clone(), len })
            }
            Source::Bytes(bytes) => Ok(Reader::Bytes(bytes.clone())),
        }
    }

    fn len(&self) -> u64 {
        match self {
            Reader::File { len, .. } => *len,
            Reader::Bytes(bytes) => bytes.len() as u64,
        }
    }

    fn read_at(&mut self, offset: u64, len: u64) -> Result<Vec<u8>, MediaError> {
        let end = offset.checked_add(len).filter(|&end| end <= self.len()).ok_or_else(|| {
            MediaError::Malformed(format!(
                "{len} bytes at offset {offset} lie past the end of the file ({} bytes)",
                self.len()
            ))
        })?;
        match self {
            Reader::File { file, path, .. } => {
                let io = |source| MediaError::Io { path: path.clone(), source };
                let mut out = vec![0u8; len as usize];
                file.seek(SeekFrom::Start(offset)).map_err(io)?;
                file.read_exact(&mut out).map_err(io)?;
                Ok(out)
            }
            Reader::Bytes(bytes) => Ok(bytes[offset as usize..end as usize].to_vec()),
        }
    }
}

/// Where one sample is and how it is timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SampleInfo {
    pub(crate) offset: u64,
    pub(crate) size: u32,
    /// In the track's timescale.
    pub(crate) duration: u32,
    pub(crate) composition_offset: i32,
    pub(crate) sync: bool,
}

/// One track of a file.
#[derive(Debug, Clone)]
pub(crate) struct TrackInfo {
    pub(crate) kind: TrackKind,
    pub(crate) timescale: u32,
    /// The sample entry's code (`avc1`, `hvc1`, `mp4a`, ...).
    pub(crate) codec: String,
    /// The whole sample entry box.
    pub(crate) sample_entry: Vec<u8>,
    /// The codec's configuration: `avcC`'s record, `esds`' decoder-specific info, `dfLa`'s metadata blocks.
    pub(crate) config: Option<Vec<u8>>,
    /// Audio: samples per second as the sample entry gives it.
    pub(crate) sample_rate: u32,
    pub(crate) samples: Vec<SampleInfo>,
    pub(crate) media_start: Option<i64>,
    /// Clockwise display rotation from the track matrix, in degrees (0, 90, 180, 270).
    pub(crate) rotation: u32,
    /// The frame rate the container declares (a Matroska track's default duration); `None`: the samples'.
    pub(crate) frame_rate: Option<crate::media::Rational>,
    /// Nanoseconds of decoded sound to drop from the end (Matroska's `DiscardPadding`: an Opus encoder's
    /// padding of the last frame); 0 for MP4.
    pub(crate) discard_end_ns: u64,
}

impl TrackInfo {
    /// The media's length in seconds.
    pub(crate) fn duration_seconds(&self) -> f64 {
        let ticks: u64 = self.samples.iter().map(|s| u64::from(s.duration)).sum();
        ticks as f64 / f64::from(self.timescale.max(1))
    }
}

/// An opened file (an MP4, or a Matroska/WebM file read by `media::mkv`): its tracks and tags.
pub(crate) struct Movie {
    reader: Reader,
    pub(crate) tracks: Vec<TrackInfo>,
    /// The `mdta` (or iTunes-style) tags, in file order.
    pub(crate) tags: Vec<(String, String)>,
}

impl Movie {
    /// Reads the structure of the file at `source`.
    pub(crate) fn open(source: &Source) -> Result<Movie, MediaError> {
        let mut reader = Reader::open(source)?;
        let len = reader.len();
        if reader.read_at(0, len.min(4))? == [0x1A, 0x45, 0xDF, 0xA3] {
            let (tracks, tags) = crate::media::mkv::read(&mut |at, n| reader.read_at(at, n), len)?;
            return Ok(Movie { reader, tracks, tags });
        }
        let mut at = 0u64;
        let mut moov = None;
        let mut fragmented = false;
        let mut first = true;
        while at + 8 <= len {
            let header = reader.read_at(at, (len - at).min(16))?;
            let size32 = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let kind = [header[4], header[5], header[6], header[7]];
            if first && !is_top_level_box(&kind) {
                return Err(MediaError::UnsupportedContainer { what: sniff(&header, source) });
            }
            first = false;
            let (size, header_len) = match size32 {
                0 => (len - at, 8),
                1 if header.len() >= 16 => (
                    u64::from_be_bytes([
                        header[8], header[9], header[10], header[11], header[12], header[13],
                        header[14], header[15],
                    ]),
                    16,
                ),
                n => (u64::from(n), 8),
            };
            if size < header_len || at + size > len {
                // A truncated last box (a file still being written) ends the walk.
                if &kind == b"mdat" {
                    break;
                }
                return Err(MediaError::Malformed(format!(
                    "box `{}` at offset {at} has an impossible size {size}",
                    String::from_utf8_lossy(&kind)
                )));
            }
            match &kind {
                b"moov" => {
                    if size > MAX_MOOV {
                        return Err(MediaError::Malformed(format!(
                            "the movie box is {size} bytes, more than Kiln reads"
                        )));
                    }
                    moov = Some(reader.read_at(at + header_len, size - header_len)?);
                }
                b"moof" => fragmented = true,
                _ => {}
            }
            at += size;
        }
        let moov = moov.ok_or_else(|| {
            MediaError::Malformed(format!("{} has no movie box (`moov`)", source.describe()))
        })?;
        let mut tracks = Vec::new();
        let mut tags = Vec::new();
        for (kind, body) in children(&moov)? {
            match &kind {
                b"trak" => {
                    if let Some(track) = trak(body)? {
                        tracks.push(track);
                    }
                }
                b"udta" => tags.extend(udta(body)?),
                b"meta" => tags.extend(meta(body)?),
                _ => {}
            }
        }
        if fragmented && tracks.iter().all(|t| t.samples.is_empty()) {
            return Err(MediaError::UnsupportedContainer {
                what: "a fragmented MP4 (its samples are in movie fragments)".to_owned(),
            });
        }
        Ok(Movie { reader, tracks, tags })
    }

    /// The first video track.
    pub(crate) fn video(&self) -> Option<&TrackInfo> {
        self.tracks.iter().find(|t| matches!(t.kind, TrackKind::Video { .. }))
    }

    /// The last audio track (ComfyUI takes the last decodable one).
    pub(crate) fn audio(&self) -> Option<&TrackInfo> {
        self.tracks.iter().rev().find(|t| matches!(t.kind, TrackKind::Audio { .. }))
    }

    /// One sample's bytes.
    pub(crate) fn read(&mut self, sample: &SampleInfo) -> Result<Vec<u8>, MediaError> {
        self.reader.read_at(sample.offset, u64::from(sample.size))
    }
}

fn is_top_level_box(kind: &[u8; 4]) -> bool {
    matches!(
        kind,
        b"ftyp" | b"moov" | b"mdat" | b"free" | b"skip" | b"wide" | b"pnot" | b"styp" | b"uuid"
    )
}

/// What a file that is not MP4 appears to be.
fn sniff(header: &[u8], source: &Source) -> String {
    let name = source.describe();
    let what = if header.starts_with(b"RIFF") {
        "a RIFF file (AVI or WAV)"
    } else if header.starts_with(b"GIF8") {
        "a GIF image"
    } else if header.starts_with(b"OggS") {
        "an Ogg file"
    } else if header.starts_with(&[0x47]) {
        "an MPEG transport stream or unknown data"
    } else if header.starts_with(&[0, 0, 1, 0xba]) {
        "an MPEG program stream"
    } else {
        "not an MP4 or QuickTime file"
    };
    format!(
        "{name} is {what}; Kiln reads video from MP4, QuickTime (.mov) and Matroska/WebM files only"
    )
}

fn malformed(what: &str) -> MediaError {
    MediaError::Malformed(what.to_owned())
}

/// A box's type and body.
type Child<'a> = ([u8; 4], &'a [u8]);

/// The child boxes of a container's body.
fn children(mut data: &[u8]) -> Result<Vec<Child<'_>>, MediaError> {
    let mut out = Vec::new();
    while data.len() >= 8 {
        let size32 = u32::from_be_bytes([data[0], data[1], data[2], data[3]]);
        let kind = [data[4], data[5], data[6], data[7]];
        let (size, header) = match size32 {
            0 => (data.len() as u64, 8),
            1 => {
                let wide = data.get(8..16).ok_or_else(|| malformed("a box header is truncated"))?;
                (
                    u64::from_be_bytes(
                        wide.try_into().map_err(|_| malformed("a box header is truncated"))?,
                    ),
                    16,
                )
            }
            n => (u64::from(n), 8),
        };
        if size < header || size > data.len() as u64 {
            return Err(MediaError::Malformed(format!(
                "box `{}` has an impossible size {size}",
                String::from_utf8_lossy(&kind)
            )));
        }
        out.push((kind, &data[header as usize..size as usize]));
        data = &data[size as usize..];
    }
    Ok(out)
}

fn child<'a>(data: &'a [u8], kind: &[u8; 4]) -> Result<Option<&'a [u8]>, MediaError> {
    Ok(children(data)?.into_iter().find(|(k, _)| k == kind).map(|(_, b)| b))
}

/// A big-endian reader over a box body.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    fn new(data: &'a [u8], what: &'static str) -> Cursor<'a> {
        Cursor { data, at: 0, what }
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], MediaError> {
        let out = self.data.get(self.at..self.at.saturating_add(n)).ok_or_else(|| {
            MediaError::Malformed(format!("the `{}` box is truncated", self.what))
        })?;
        self.at += n;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, MediaError> {
        Ok(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, MediaError> {
        let b = self.bytes(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, MediaError> {
        let b = self.bytes(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, MediaError> {
        let b = self.bytes(8)?;
        Ok(u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
    /// A full box's version (flags skipped).
    fn version(&mut self) -> Result<u8, MediaError> {
        let v = self.u8()?;
        self.bytes(3)?;
        Ok(v)
    }
    /// An entry count, checked against the bytes left for entries of `entry` bytes.
    fn count(&mut self, entry: usize) -> Result<usize, MediaError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(entry) > self.data.len().saturating_sub(self.at) {
            return Err(MediaError::Malformed(format!(
                "the `{}` box counts {n} entries it does not hold",
                self.what
            )));
        }
        Ok(n)
    }
}

/// A track, or `None` for one that is neither video nor audio.
fn trak(body: &[u8]) -> Result<Option<TrackInfo>, MediaError> {
    let mdia = child(body, b"mdia")?.ok_or_else(|| malformed("a track has no `mdia` box"))?;
    let hdlr = child(mdia, b"hdlr")?.ok_or_else(|| malformed("a track has no `hdlr` box"))?;
    let mut c = Cursor::new(hdlr, "hdlr");
    c.version()?;
    c.u32()?;
    let handler = c.bytes(4)?;
    let is_video = handler == b"vide";
    if !is_video && handler != b"soun" {
        return Ok(None);
    }
    let mdhd = child(mdia, b"mdhd")?.ok_or_else(|| malformed("a track has no `mdhd` box"))?;
    let mut c = Cursor::new(mdhd, "mdhd");
    let timescale = if c.version()? == 1 {
        c.bytes(16)?;
        c.u32()?
    } else {
        c.bytes(8)?;
        c.u32()?
    };
    if timescale == 0 {
        return Err(malformed("a track's timescale is zero"));
    }
    let minf = child(mdia, b"minf")?.ok_or_else(|| malformed("a track has no `minf` box"))?;
    let stbl = child(minf, b"stbl")?.ok_or_else(|| malformed("a track has no sample table"))?;
    let stsd = child(stbl, b"stsd")?.ok_or_else(|| malformed("a track has no `stsd` box"))?;
    let mut c = Cursor::new(stsd, "stsd");
    c.version()?;
    if c.u32()? == 0 {
        return Err(malformed("a track has no sample description"));
    }
    let (code, entry_body) = *children(&stsd[8..])?
        .first()
        .ok_or_else(|| malformed("a track's sample description is empty"))?;
    let entry_len = entry_body.len() + 8;
    let sample_entry = stsd[8..8 + entry_len].to_vec();
    let codec = String::from_utf8_lossy(&code).into_owned();
    let (kind, config, sample_rate) = if is_video {
        let mut c = Cursor::new(entry_body, "visual sample entry");
        c.bytes(24)?;
        let (width, height) = (u32::from(c.u16()?), u32::from(c.u16()?));
        let config = match entry_body.get(78..) {
            Some(rest) => children(rest).ok().and_then(|boxes| {
                boxes.into_iter().find(|(k, _)| k == b"avcC").map(|(_, b)| b.to_vec())
            }),
            None => None,
        };
        (TrackKind::Video { width, height }, config, 0)
    } else {
        audio_entry(&code, entry_body)?
    };
    let samples = sample_table(stbl, is_video)?;
    let media_start = match child(body, b"edts")? {
        Some(edts) => edit_start(edts)?,
        None => None,
    };
    let rotation = match child(body, b"tkhd")? {
        Some(tkhd) => rotation(tkhd)?,
        None => 0,
    };
    Ok(Some(TrackInfo {
        kind,
        timescale,
        codec,
        sample_entry,
        config,
        sample_rate,
        samples,
        media_start,
        rotation,
        frame_rate: None,
        discard_end_ns: 0,
    }))
}

/// An audio sample entry's channels, codec configuration and rate (QuickTime versions 1 and 2 included).
fn audio_entry(
    code: &[u8; 4],
    body: &[u8],
) -> Result<(TrackKind, Option<Vec<u8>>, u32), MediaError> {
    let mut c = Cursor::new(body, "audio sample entry");
    c.bytes(8)?;
    let version = c.u16()?;
    c.bytes(6)?;
    let mut channels = c.u16()?;
    c.bytes(6)?;
    let mut rate = c.u32()? >> 16;
    let boxes_at = match version {
        1 => 28 + 16,
        2 => {
            c.bytes(4)?;
            rate = f64::from_bits(c.u64()?) as u32;
            channels = c.u32()? as u16;
            28 + 36
        }
        _ => 28,
    };
    let boxes = body.get(boxes_at..).map(children).transpose()?.unwrap_or_default();
    let find = |kind: &[u8; 4]| boxes.iter().find(|(k, _)| k == kind).map(|(_, b)| *b);
    let config = match code {
        b"mp4a" => find(b"esds")
            .or_else(|| find(b"wave").and_then(|w| child(w, b"esds").ok().flatten()))
            .map(decoder_specific_info)
            .transpose()?
            .flatten(),
        b"fLaC" => find(b"dfLa").map(|b| b.get(4..).unwrap_or_default().to_vec()),
        b"Opus" => find(b"dOps").map(<[u8]>::to_vec),
        _ => None,
    };
    Ok((TrackKind::Audio { channels }, config, rate))
}

/// The `DecoderSpecificInfo` (AAC's AudioSpecificConfig) inside an `esds` box.
fn decoder_specific_info(esds: &[u8]) -> Result<Option<Vec<u8>>, MediaError> {
    let mut c = Cursor::new(esds, "esds");
    c.version()?;
    // Descriptors: tag, then a length in up to four 7-bit groups.
    fn descriptor<'a>(c: &mut Cursor<'a>) -> Result<(u8, usize), MediaError> {
        let tag = c.u8()?;
        let mut len = 0usize;
        for _ in 0..4 {
            let b = c.u8()?;
            len = (len << 7) | usize::from(b & 0x7f);
            if b & 0x80 == 0 {
                break;
            }
        }
        Ok((tag, len))
    }
    let (tag, _) = descriptor(&mut c)?;
    if tag != 3 {
        return Ok(None);
    }
    c.bytes(2)?; // ES_ID
    let flags = c.u8()?;
    if flags & 0x80 != 0 {
        c.bytes(2)?;
    }
    if flags & 0x40 != 0 {
        let n = c.u8()?;
        c.bytes(usize::from(n))?;
    }
    if flags & 0x20 != 0 {
        c.bytes(2)?;
    }
    let (tag, _) = descriptor(&mut c)?;
    if tag != 4 {
        return Ok(None);
    }
    c.bytes(13)?;
    let (tag, len) = descriptor(&mut c)?;
    if tag != 5 {
        return Ok(None);
    }
    Ok(Some(c.bytes(len)?.to_vec()))
}

/// The samples of a sample table: offsets from the chunk tables, sizes, durations, composition offsets and
/// sync flags.
fn sample_table(stbl: &[u8], is_video: bool) -> Result<Vec<SampleInfo>, MediaError> {
    let boxes = children(stbl)?;
    let find = |kind: &[u8; 4]| boxes.iter().find(|(k, _)| k == kind).map(|(_, b)| *b);

    let mut sizes = Vec::new();
    if let Some(stsz) = find(b"stsz") {
        let mut c = Cursor::new(stsz, "stsz");
        c.version()?;
        let fixed = c.u32()?;
        let count = c.u32()? as usize;
        if fixed == 0 {
            let mut c2 = Cursor::new(&stsz[12..], "stsz");
            for _ in 0..count {
                sizes.push(c2.u32()?);
            }
        } else {
            if count > (64 << 20) {
                return Err(malformed("the `stsz` box counts more samples than Kiln reads"));
            }
            sizes = vec![fixed; count];
        }
    } else if let Some(stz2) = find(b"stz2") {
        let mut c = Cursor::new(stz2, "stz2");
        c.version()?;
        c.bytes(3)?;
        let field = c.u8()?;
        let count = c.u32()? as usize;
        for _ in 0..count {
            sizes.push(match field {
                8 => u32::from(c.u8()?),
                16 => u32::from(c.u16()?),
                _ => {
                    return Err(malformed(
                        "the `stz2` box has 4-bit sizes, which Kiln does not read",
                    ));
                }
            });
        }
    } else {
        return Err(malformed("a sample table has no sample sizes"));
    }
    let n = sizes.len();

    let mut durations = Vec::with_capacity(n);
    if let Some(stts) = find(b"stts") {
        let mut c = Cursor::new(stts, "stts");
        c.version()?;
        for _ in 0..c.count(8)? {
            let (count, delta) = (c.u32()? as usize, c.u32()?);
            let count = count.min(n - durations.len());
            durations.extend(std::iter::repeat_n(delta, count));
        }
    }
    durations.resize(n, durations.last().copied().unwrap_or(1));

    let mut offsets_ct = Vec::with_capacity(n);
    if let Some(ctts) = find(b"ctts") {
        let mut c = Cursor::new(ctts, "ctts");
        c.version()?;
        for _ in 0..c.count(8)? {
            let (count, offset) = (c.u32()? as usize, c.u32()? as i32);
            let count = count.min(n - offsets_ct.len());
            offsets_ct.extend(std::iter::repeat_n(offset, count));
        }
    }
    offsets_ct.resize(n, 0);

    let sync: Option<Vec<u32>> = match find(b"stss") {
        Some(stss) => {
            let mut c = Cursor::new(stss, "stss");
            c.version()?;
            let count = c.count(4)?;
            Some((0..count).map(|_| c.u32()).collect::<Result<_, _>>()?)
        }
        None => None,
    };

    let chunk_offsets: Vec<u64> = if let Some(stco) = find(b"stco") {
        let mut c = Cursor::new(stco, "stco");
        c.version()?;
        let count = c.count(4)?;
        (0..count).map(|_| c.u32().map(u64::from)).collect::<Result<_, _>>()?
    } else if let Some(co64) = find(b"co64") {
        let mut c = Cursor::new(co64, "co64");
        c.version()?;
        let count = c.count(8)?;
        (0..count).map(|_| c.u64()).collect::<Result<_, _>>()?
    } else {
        return Err(malformed("a sample table has no chunk offsets"));
    };

    let stsc = find(b"stsc").ok_or_else(|| malformed("a sample table has no `stsc` box"))?;
    let mut c = Cursor::new(stsc, "stsc");
    c.version()?;
    let runs: Vec<(u32, u32)> = (0..c.count(12)?)
        .map(|_| {
            let first = c.u32()?;
            let per = c.u32()?;
            c.u32()?;
            Ok((first, per))
        })
        .collect::<Result<_, MediaError>>()?;

    let mut samples = Vec::with_capacity(n);
    let mut sample = 0usize;
    for (i, &(first, per)) in runs.iter().enumerate() {
        let last =
            runs.get(i + 1).map_or(chunk_offsets.len() as u32, |next| next.0.saturating_sub(1));
        for chunk in first..=last {
            let Some(&base) = chunk_offsets.get(chunk.saturating_sub(1) as usize) else { break };
            let mut offset = base;
            for _ in 0..per {
                if sample >= n {
                    break;
                }
                let size = sizes[sample];
                let is_sync = match &sync {
                    Some(list) => list.binary_search(&(sample as u32 + 1)).is_ok(),
                    None => true,
                };
                samples.push(SampleInfo {
                    offset,
                    size,
                    duration: durations[sample],
                    composition_offset: offsets_ct[sample],
                    sync: is_sync || !is_video,
                });
                offset += u64::from(size);
                sample += 1;
            }
        }
    }
    if samples.len() != n {
        return Err(MediaError::Malformed(format!(
            "the chunk tables place {} of the {n} samples",
            samples.len()
        )));
    }
    Ok(samples)
}

/// The media time the first edit starts at, when it is not zero (an empty first edit is skipped).
fn edit_start(edts: &[u8]) -> Result<Option<i64>, MediaError> {
    let Some(elst) = child(edts, b"elst")? else { return Ok(None) };
    let mut c = Cursor::new(elst, "elst");
    let version = c.version()?;
    let entry = if version == 1 { 20 } else { 12 };
    for _ in 0..c.count(entry)? {
        let (_, media_time) = if version == 1 {
            (c.u64()?, c.u64()? as i64)
        } else {
            (u64::from(c.u32()?), i64::from(c.u32()? as i32))
        };
        c.u32()?;
        if media_time >= 0 {
            return Ok((media_time > 0).then_some(media_time));
        }
    }
    Ok(None)
}

/// The clockwise rotation of a track's display matrix, in degrees.
fn rotation(tkhd: &[u8]) -> Result<u32, MediaError> {
    let mut c = Cursor::new(tkhd, "tkhd");
    let skip = if c.version()? == 1 { 32 } else { 20 };
    c.bytes(skip + 16)?;
    let a = c.u32()? as i32;
    let b = c.u32()? as i32;
    Ok(match (a.signum(), b.signum()) {
        (0, 1) => 90,
        (-1, 0) => 180,
        (0, -1) => 270,
        _ => 0,
    })
}

fn udta(body: &[u8]) -> Result<Vec<(String, String)>, MediaError> {
    match child(body, b"meta")? {
        Some(meta_body) => meta(meta_body),
        None => Ok(Vec::new()),
    }
}

/// Tags of a `meta` box: the `mdta` keys with their `ilst` values.
fn meta(body: &[u8]) -> Result<Vec<(String, String)>, MediaError> {
    // ISO's `meta` is a full box; QuickTime's is not: find the children either way.
    let body =
        if body.get(4..8) == Some(b"hdlr") { body } else { body.get(4..).unwrap_or_default() };
    let Some(keys) = child(body, b"keys")? else { return Ok(Vec::new()) };
    let mut c = Cursor::new(keys, "keys");
    c.version()?;
    let count = c.count(8)?;
    let mut names = Vec::with_capacity(count);
    for _ in 0..count {
        let size = c.u32()? as usize;
        c.bytes(4)?;
        names.push(String::from_utf8_lossy(c.bytes(size.saturating_sub(8))?).into_owned());
    }
    let Some(ilst) = child(body, b"ilst")? else { return Ok(Vec::new()) };
    let mut tags = Vec::new();
    for (index, item) in children(ilst)? {
        let index = u32::from_be_bytes(index) as usize;
        let Some(name) = index.checked_sub(1).and_then(|i| names.get(i)) else { continue };
        if let Some(data) = child(item, b"data")? {
            let value = data.get(8..).unwrap_or_default();
            tags.push((name.clone(), String::from_utf8_lossy(value).into_owned()));
        }
    }
    Ok(tags)
}
