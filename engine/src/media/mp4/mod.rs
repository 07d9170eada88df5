//! ISO base media files (MP4, QuickTime `.mov`): the tracks Kiln writes and reads, sample by sample.
//!
//! `write` lays a file out as FFmpeg's `movflags=use_metadata_tags+faststart` does: `ftyp`, then `moov` (with
//! the tags as an `mdta` key list), then one `mdat` whose chunks interleave the tracks by time. `read` finds
//! the tracks of a file without loading its media data and reads samples on demand.
//!
//! Invariant: sample entries (`avc1`, `mp4a`, `fLaC`, ...) are carried as the bytes the file holds, so a track
//! read from one file is written to another unchanged.

mod boxes;
mod read;
mod write;

pub(crate) use boxes::full as full_box;
pub(crate) use read::{Movie, SampleInfo, Source, TrackInfo};
pub(crate) use write::write;

/// What a track carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TrackKind {
    /// Pictures of this size.
    Video { width: u32, height: u32 },
    /// Sound with this many channels.
    Audio { channels: u16 },
}

/// One sample to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sample {
    pub(crate) data: Vec<u8>,
    /// In the track's timescale.
    pub(crate) duration: u32,
    /// Presentation time minus decode time, in the track's timescale (B-frames).
    pub(crate) composition_offset: i32,
    /// A random-access point (keyframe).
    pub(crate) sync: bool,
}

/// A track to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Track {
    pub(crate) kind: TrackKind,
    pub(crate) timescale: u32,
    /// The whole sample entry box (`avc1`, `fLaC`, `mp4a`, ...).
    pub(crate) sample_entry: Vec<u8>,
    pub(crate) samples: Vec<Sample>,
    /// Where presentation starts in the media (an edit list of one entry), when not at zero.
    pub(crate) media_start: Option<i64>,
}

/// An `avc1` sample entry around an `avcC` record.
pub(crate) fn avc1_entry(width: u32, height: u32, avc_config: &[u8]) -> Vec<u8> {
    let mut body = vec![0u8; 6];
    body.extend_from_slice(&1u16.to_be_bytes()); // data_reference_index
    body.extend_from_slice(&[0u8; 16]);
    body.extend_from_slice(&(width as u16).to_be_bytes());
    body.extend_from_slice(&(height as u16).to_be_bytes());
    body.extend_from_slice(&0x0048_0000u32.to_be_bytes());
    body.extend_from_slice(&0x0048_0000u32.to_be_bytes());
    body.extend_from_slice(&[0u8; 4]);
    body.extend_from_slice(&1u16.to_be_bytes()); // frame_count
    let mut compressor = [0u8; 32];
    let name = b"OpenH264";
    compressor[0] = name.len() as u8;
    compressor[1..=name.len()].copy_from_slice(name);
    body.extend_from_slice(&compressor);
    body.extend_from_slice(&0x0018u16.to_be_bytes());
    body.extend_from_slice(&0xffffu16.to_be_bytes());
    body.extend(boxes::plain(b"avcC", avc_config));
    boxes::plain(b"avc1", &body)
}

/// An audio sample entry of `code` with its codec box (`dfLa`, `esds`, ...).
pub(crate) fn audio_entry(
    code: &[u8; 4],
    channels: u16,
    sample_rate: u32,
    codec_box: &[u8],
) -> Vec<u8> {
    let mut body = vec![0u8; 6];
    body.extend_from_slice(&1u16.to_be_bytes());
    body.extend_from_slice(&[0u8; 8]);
    body.extend_from_slice(&channels.to_be_bytes());
    body.extend_from_slice(&16u16.to_be_bytes());
    body.extend_from_slice(&[0u8; 4]);
    // 16.16 fixed point; rates that do not fit are 0 (the codec box holds the rate).
    let rate = if sample_rate <= 0xffff { sample_rate << 16 } else { 0 };
    body.extend_from_slice(&rate.to_be_bytes());
    body.extend_from_slice(codec_box);
    boxes::plain(code, &body)
}
