//! Video and audio as data: the `VIDEO` and `AUDIO` values, and their files.
//!
//! - [`Video`], [`VideoComponents`]: ComfyUI's two kinds of video (from components, from a file) and what
//!   they hold; [`Rational`], an exact frame rate.
//! - [`Audio`]: a waveform batch and its sample rate.
//! - `h264`: H.264 through OpenH264 (built from source with the C++ compiler); `colour`: RGB ↔ YUV 4:2:0;
//!   `mp4`: the MP4 writer and reader (Kiln's own: FFmpeg's tag layout, fast start); `sound`: audio in video
//!   files.
//! - `webm`: WebM files (`SaveWEBM`), on `ebml`, with VP9 (`vp9`, pure-Rust `rusty_vp9`) or AV1 (`av1`, rav1e);
//!   `mkv`: Matroska/WebM files read as the MP4 reader's tracks, so `LoadVideo` decodes VP9 WebMs.
//! - `opus`: Opus decoding and `.opus` files (on `ogg`, Kiln's Ogg page writer); `mp3`: MP3 files.
//!
//! Nothing here knows about nodes: the video and audio nodes turn [`MediaError`]s into node errors.

mod animation;
mod audio;
mod av1;
mod biquad;
mod bits;
mod colour;
mod ebml;
mod error;
mod h264;
mod mkv;
mod mp3;
mod mp4;
mod ogg;
mod opus;
mod rational;
mod sound;
mod tags;
mod video;
mod vp9;
mod webm;

pub(crate) use animation::{animated_webp, apng, comf_chunks, webp_exif};
pub use audio::Audio;
pub use biquad::Biquad;
pub use error::MediaError;
pub use mp3::Mp3Quality;
pub(crate) use mp3::mp3_file;
pub(crate) use opus::opus_file;
pub use rational::Rational;
pub(crate) use sound::flac_file;
pub use sound::load_audio;
pub(crate) use tags::{python_json, save_tags};
pub use video::{SaveOptions, Video, VideoComponents, VideoFile};
pub use webm::{WebmCodec, encode_webm};

/// The tags (`key`, `value`) of an MP4 file's movie metadata, in file order: what [`Video::save_mp4`] wrote
/// there (`prompt`, `workflow`, ...).
pub fn mp4_tags(bytes: &[u8]) -> Result<Vec<(String, String)>, MediaError> {
    Ok(mp4::Movie::open(&mp4::Source::Bytes(bytes.into()))?.tags)
}
