//! The MP4 writer: `ftyp`, `moov` before the media (fast start), `mdat` with one chunk per track per second,
//! chunks ordered by time.

use super::boxes::{container, full, plain};
use super::{Track, TrackKind};

/// Movie-header time units per second.
const MOVIE_TIMESCALE: u32 = 1000;

/// The identity display matrix.
const MATRIX: [u32; 9] = [0x0001_0000, 0, 0, 0, 0x0001_0000, 0, 0, 0, 0x4000_0000];

/// A chunk: a run of one track's samples stored together.
struct Chunk {
    track: usize,
    first: usize,
    count: usize,
    start_seconds: f64,
}

/// The file of `tracks` with `tags` (key, value) in the movie's `mdta` metadata.
pub(crate) fn write(tracks: &[Track], tags: &[(String, String)]) -> Vec<u8> {
    let chunks = chunks(tracks);
    let data_len: u64 = tracks.iter().flat_map(|t| &t.samples).map(|s| s.data.len() as u64).sum();
    let wide = data_len > u64::from(u32::MAX) / 2;
    let ftyp = ftyp();
    // The movie box's size does not depend on the offsets it holds: lay it out once to learn where the media
    // starts, then again with the real offsets.
    let zeros = vec![0u64; chunks.len()];
    let moov_len = moov(tracks, &chunks, &zeros, wide, tags).len() as u64;
    let mdat_header: u64 = if data_len + 8 > u64::from(u32::MAX) { 16 } else { 8 };
    let mut offsets = Vec::with_capacity(chunks.len());
    let mut at = ftyp.len() as u64 + moov_len + mdat_header;
    for chunk in &chunks {
        offsets.push(at);
        at += tracks[chunk.track].samples[chunk.first..chunk.first + chunk.count]
            .iter()
            .map(|s| s.data.len() as u64)
            .sum::<u64>();
    }
    let moov = moov(tracks, &chunks, &offsets, wide, tags);
    let mut out = Vec::with_capacity(ftyp.len() + moov.len() + data_len as usize + 16);
    out.extend_from_slice(&ftyp);
    out.extend_from_slice(&moov);
    if mdat_header == 16 {
        out.extend_from_slice(&1u32.to_be_bytes());
        out.extend_from_slice(b"mdat");
        out.extend_from_slice(&(data_len + 16).to_be_bytes());
    } else {
        out.extend_from_slice(&((data_len + 8) as u32).to_be_bytes());
        out.extend_from_slice(b"mdat");
    }
    for chunk in &chunks {
        for sample in &tracks[chunk.track].samples[chunk.first..chunk.first + chunk.count] {
            out.extend_from_slice(&sample.data);
        }
    }
    out
}

fn ftyp() -> Vec<u8> {
    let mut body = b"isom".to_vec();
    body.extend_from_slice(&0x200u32.to_be_bytes());
    for brand in [b"isom", b"iso2", b"avc1", b"mp41"] {
        body.extend_from_slice(brand);
    }
    plain(b"ftyp", &body)
}

/// Each track's samples cut into runs of at most a second, all runs in order of their start time.
fn chunks(tracks: &[Track]) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    for (index, track) in tracks.iter().enumerate() {
        let mut time = 0u64;
        let mut first = 0;
        let mut chunk_start = 0u64;
        for (i, sample) in track.samples.iter().enumerate() {
            if i > first && time - chunk_start >= u64::from(track.timescale) {
                chunks.push(Chunk {
                    track: index,
                    first,
                    count: i - first,
                    start_seconds: chunk_start as f64 / f64::from(track.timescale),
                });
                first = i;
                chunk_start = time;
            }
            time += u64::from(sample.duration);
        }
        if first < track.samples.len() {
            chunks.push(Chunk {
                track: index,
                first,
                count: track.samples.len() - first,
                start_seconds: chunk_start as f64 / f64::from(track.timescale),
            });
        }
    }
    chunks.sort_by(|a, b| a.start_seconds.total_cmp(&b.start_seconds).then(a.track.cmp(&b.track)));
    chunks
}

fn track_duration(track: &Track) -> u64 {
    track.samples.iter().map(|s| u64::from(s.duration)).sum()
}

fn in_movie_time(duration: u64, timescale: u32) -> u32 {
    let scaled = duration * u64::from(MOVIE_TIMESCALE) / u64::from(timescale.max(1));
    u32::try_from(scaled).unwrap_or(u32::MAX)
}

fn moov(
    tracks: &[Track],
    chunks: &[Chunk],
    offsets: &[u64],
    wide: bool,
    tags: &[(String, String)],
) -> Vec<u8> {
    let duration =
        tracks.iter().map(|t| in_movie_time(track_duration(t), t.timescale)).max().unwrap_or(0);
    let mut mvhd = Vec::new();
    mvhd.extend_from_slice(&[0u8; 8]); // creation, modification
    mvhd.extend_from_slice(&MOVIE_TIMESCALE.to_be_bytes());
    mvhd.extend_from_slice(&duration.to_be_bytes());
    mvhd.extend_from_slice(&0x0001_0000u32.to_be_bytes()); // rate
    mvhd.extend_from_slice(&0x0100u16.to_be_bytes()); // volume
    mvhd.extend_from_slice(&[0u8; 10]);
    MATRIX.iter().for_each(|m| mvhd.extend_from_slice(&m.to_be_bytes()));
    mvhd.extend_from_slice(&[0u8; 24]);
    mvhd.extend_from_slice(&(tracks.len() as u32 + 1).to_be_bytes());
    let mut children = vec![full(b"mvhd", 0, 0, &mvhd)];
    for (index, track) in tracks.iter().enumerate() {
        let mine: Vec<(&Chunk, u64)> = chunks
            .iter()
            .zip(offsets)
            .filter(|(c, _)| c.track == index)
            .map(|(c, &o)| (c, o))
            .collect();
        children.push(trak(index as u32 + 1, track, &mine, wide));
    }
    if !tags.is_empty() {
        children.push(container(b"udta", &[metadata(tags)]));
    }
    container(b"moov", &children)
}

fn trak(id: u32, track: &Track, chunks: &[(&Chunk, u64)], wide: bool) -> Vec<u8> {
    let duration = track_duration(track);
    let (width, height, volume, handler, name, header) = match track.kind {
        TrackKind::Video { width, height } => {
            (width, height, 0u16, b"vide", "VideoHandler", full(b"vmhd", 0, 1, &[0u8; 8]))
        }
        TrackKind::Audio { .. } => {
            (0, 0, 0x0100, b"soun", "SoundHandler", full(b"smhd", 0, 0, &[0u8; 4]))
        }
    };
    let mut tkhd = Vec::new();
    tkhd.extend_from_slice(&[0u8; 8]);
    tkhd.extend_from_slice(&id.to_be_bytes());
    tkhd.extend_from_slice(&[0u8; 4]);
    tkhd.extend_from_slice(&in_movie_time(duration, track.timescale).to_be_bytes());
    tkhd.extend_from_slice(&[0u8; 8]);
    tkhd.extend_from_slice(&[0u8; 4]); // layer, alternate group
    tkhd.extend_from_slice(&volume.to_be_bytes());
    tkhd.extend_from_slice(&[0u8; 2]);
    MATRIX.iter().for_each(|m| tkhd.extend_from_slice(&m.to_be_bytes()));
    tkhd.extend_from_slice(&(width << 16).to_be_bytes());
    tkhd.extend_from_slice(&(height << 16).to_be_bytes());

    let mut mdhd = Vec::new();
    mdhd.extend_from_slice(&[0u8; 8]);
    mdhd.extend_from_slice(&track.timescale.to_be_bytes());
    mdhd.extend_from_slice(&u32::try_from(duration).unwrap_or(u32::MAX).to_be_bytes());
    mdhd.extend_from_slice(&0x55c4u16.to_be_bytes()); // language `und`
    mdhd.extend_from_slice(&[0u8; 2]);
    let mut hdlr = vec![0u8; 4];
    hdlr.extend_from_slice(handler);
    hdlr.extend_from_slice(&[0u8; 12]);
    hdlr.extend_from_slice(name.as_bytes());
    hdlr.push(0);
    let dinf = container(
        b"dinf",
        &[full(b"dref", 0, 0, &[&1u32.to_be_bytes()[..], &full(b"url ", 0, 1, &[])].concat())],
    );
    let minf = container(b"minf", &[header, dinf, stbl(track, chunks, wide)]);
    let mdia = container(b"mdia", &[full(b"mdhd", 0, 0, &mdhd), full(b"hdlr", 0, 0, &hdlr), minf]);
    let mut children = vec![full(b"tkhd", 0, 3, &tkhd)];
    if let Some(start) = track.media_start {
        let mut elst = 1u32.to_be_bytes().to_vec();
        let movie_duration =
            in_movie_time(duration.saturating_sub(start.max(0) as u64), track.timescale);
        elst.extend_from_slice(&movie_duration.to_be_bytes());
        elst.extend_from_slice(&(start as i32).to_be_bytes());
        elst.extend_from_slice(&0x0001_0000u32.to_be_bytes());
        children.push(container(b"edts", &[full(b"elst", 0, 0, &elst)]));
    }
    children.push(mdia);
    container(b"trak", &children)
}

fn stbl(track: &Track, chunks: &[(&Chunk, u64)], wide: bool) -> Vec<u8> {
    let samples = &track.samples;
    let mut stsd = 1u32.to_be_bytes().to_vec();
    stsd.extend_from_slice(&track.sample_entry);
    let mut children = vec![full(b"stsd", 0, 0, &stsd)];

    let runs = run_lengths(samples.iter().map(|s| s.duration));
    let mut stts = (runs.len() as u32).to_be_bytes().to_vec();
    for (count, delta) in runs {
        stts.extend_from_slice(&count.to_be_bytes());
        stts.extend_from_slice(&delta.to_be_bytes());
    }
    children.push(full(b"stts", 0, 0, &stts));

    if samples.iter().any(|s| s.composition_offset != 0) {
        let runs = run_lengths(samples.iter().map(|s| s.composition_offset));
        let version = u8::from(runs.iter().any(|(_, o)| *o < 0));
        let mut ctts = (runs.len() as u32).to_be_bytes().to_vec();
        for (count, offset) in runs {
            ctts.extend_from_slice(&count.to_be_bytes());
            ctts.extend_from_slice(&offset.to_be_bytes());
        }
        children.push(full(b"ctts", version, 0, &ctts));
    }

    if samples.iter().any(|s| !s.sync) {
        let sync: Vec<u32> =
            samples.iter().enumerate().filter(|(_, s)| s.sync).map(|(i, _)| i as u32 + 1).collect();
        let mut stss = (sync.len() as u32).to_be_bytes().to_vec();
        sync.iter().for_each(|n| stss.extend_from_slice(&n.to_be_bytes()));
        children.push(full(b"stss", 0, 0, &stss));
    }

    let mut stsc_entries: Vec<(u32, u32)> = Vec::new();
    for (i, (chunk, _)) in chunks.iter().enumerate() {
        if stsc_entries.last().is_none_or(|&(_, n)| n != chunk.count as u32) {
            stsc_entries.push((i as u32 + 1, chunk.count as u32));
        }
    }
    let mut stsc = (stsc_entries.len() as u32).to_be_bytes().to_vec();
    for (first, count) in stsc_entries {
        stsc.extend_from_slice(&first.to_be_bytes());
        stsc.extend_from_slice(&count.to_be_bytes());
        stsc.extend_from_slice(&1u32.to_be_bytes());
    }
    children.push(full(b"stsc", 0, 0, &stsc));

    let mut stsz = 0u32.to_be_bytes().to_vec();
    stsz.extend_from_slice(&(samples.len() as u32).to_be_bytes());
    samples.iter().for_each(|s| stsz.extend_from_slice(&(s.data.len() as u32).to_be_bytes()));
    children.push(full(b"stsz", 0, 0, &stsz));

    let mut offsets = (chunks.len() as u32).to_be_bytes().to_vec();
    for (_, offset) in chunks {
        if wide {
            offsets.extend_from_slice(&offset.to_be_bytes());
        } else {
            offsets.extend_from_slice(&(*offset as u32).to_be_bytes());
        }
    }
    children.push(full(if wide { b"co64" } else { b"stco" }, 0, 0, &offsets));
    container(b"stbl", &children)
}

fn run_lengths<T: PartialEq + Copy>(values: impl Iterator<Item = T>) -> Vec<(u32, T)> {
    let mut runs: Vec<(u32, T)> = Vec::new();
    for value in values {
        match runs.last_mut() {
            Some((count, last)) if *last == value => *count += 1,
            _ => runs.push((1, value)),
        }
    }
    runs
}

/// `meta` with an `mdta` handler, the keys, and each value as a UTF-8 `data` item (FFmpeg's
/// `use_metadata_tags`).
fn metadata(tags: &[(String, String)]) -> Vec<u8> {
    let mut hdlr = vec![0u8; 4];
    hdlr.extend_from_slice(b"mdta");
    hdlr.extend_from_slice(&[0u8; 12]);
    hdlr.push(0);
    let mut keys = (tags.len() as u32).to_be_bytes().to_vec();
    let mut items = Vec::new();
    for (index, (key, value)) in tags.iter().enumerate() {
        keys.extend(plain(b"mdta", key.as_bytes()));
        let mut data = 1u32.to_be_bytes().to_vec(); // UTF-8
        data.extend_from_slice(&[0u8; 4]); // locale
        data.extend_from_slice(value.as_bytes());
        items.push(plain(&(index as u32 + 1).to_be_bytes(), &plain(b"data", &data)));
    }
    let ilst = container(b"ilst", &items);
    let body = [full(b"hdlr", 0, 0, &hdlr), full(b"keys", 0, 0, &keys), ilst].concat();
    full(b"meta", 0, 0, &body)
}
