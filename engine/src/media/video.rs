//! `VIDEO`: ComfyUI's two kinds of video. One made from components (`CreateVideo`: frames, optional audio, an
//! exact frame rate and the bit depth to encode at) encodes nothing until it is saved; one from a file
//! (`LoadVideo`, trims) decodes on demand within its trim window.
//!
//! Invariant: a saved frame rate is the exact `round(fps · 1000) / 1000` (the track's timescale is
//! `round(fps · 1000)` with every frame 1000 ticks long), and a saved video has one frame per input frame.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::colour::rgb_to_yuv420;
use super::h264::{self, H264Encoder};
use super::mp4::{self, Movie, Source, TrackInfo, TrackKind};
use super::{Audio, MediaError, Rational, vp9};
use crate::tensor::Tensor;

/// Frames, audio and frame rate (ComfyUI's `VideoComponents`).
#[derive(Debug, Clone, PartialEq)]
pub struct VideoComponents {
    /// `[N, H, W, 3]` in 0..1.
    pub images: Tensor,
    /// The sound, if any.
    pub audio: Option<Arc<Audio>>,
    /// Frames per second, exact.
    pub frame_rate: Rational,
}

/// A video file (or in-memory file) and the window of it in use.
#[derive(Debug, Clone, PartialEq)]
pub struct VideoFile {
    source: Source,
    /// Seconds; negative counts from the end.
    start: f64,
    /// Seconds; 0 runs to the end.
    duration: f64,
}

/// A `VIDEO` value.
#[derive(Debug, Clone, PartialEq)]
pub enum Video {
    /// Made from components; `bit_depth` is the depth `SaveVideo` encodes at (8 or 10).
    Components {
        /// The frames, audio and rate.
        components: VideoComponents,
        /// Bits per sample when encoded.
        bit_depth: u8,
    },
    /// Read from a file, within a trim window.
    File(VideoFile),
}

/// How [`Video::save_mp4`] encodes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaveOptions {
    /// Re-encode with this CRF (0..=51; OpenH264 applies it as a constant quantizer). `None` keeps an H.264
    /// file's stream as it is and encodes frames at the default quality.
    pub crf: Option<f64>,
    /// Tags written into the file (`prompt`, `workflow`, ...), values as given.
    pub tags: Vec<(String, String)>,
}

impl Video {
    /// A video of the file at `path` (nothing is read until it is used).
    pub fn from_path(path: PathBuf) -> Video {
        Video::File(VideoFile { source: Source::Path(path), start: 0.0, duration: 0.0 })
    }

    /// A video of an in-memory file.
    pub fn from_bytes(bytes: Arc<[u8]>) -> Video {
        Video::File(VideoFile { source: Source::Bytes(bytes), start: 0.0, duration: 0.0 })
    }

    /// Bytes held in memory (frames, audio, an in-memory file).
    pub fn byte_size(&self) -> usize {
        match self {
            Video::Components { components, .. } => {
                components.images.byte_size()
                    + components.audio.as_ref().map_or(0, |a| a.waveform().byte_size())
            }
            Video::File(file) => match &file.source {
                Source::Bytes(bytes) => bytes.len(),
                Source::Path(_) => 0,
            },
        }
    }

    /// The frames, audio and frame rate (a file is decoded within its window).
    pub fn components(&self) -> Result<VideoComponents, MediaError> {
        match self {
            Video::Components { components, .. } => Ok(components.clone()),
            Video::File(file) => file.components(),
        }
    }

    /// The depth of the samples: the components' chosen depth, or the file's.
    pub fn bit_depth(&self) -> Result<u8, MediaError> {
        match self {
            Video::Components { bit_depth, .. } => Ok(*bit_depth),
            Video::File(file) => {
                let movie = Movie::open(&file.source)?;
                let video = movie.video().ok_or(MediaError::NoVideoStream)?;
                if !is_h264(&video.codec) {
                    // Decoded frames are 8-bit, whatever the file's depth.
                    return Ok(8);
                }
                Ok(video.config.as_deref().map_or(8, h264::bit_depth))
            }
        }
    }

    /// Width and height.
    pub fn dimensions(&self) -> Result<(usize, usize), MediaError> {
        match self {
            Video::Components { components, .. } => {
                let shape = components.images.shape();
                Ok((shape.get(2).copied().unwrap_or(0), shape.get(1).copied().unwrap_or(0)))
            }
            Video::File(file) => {
                let movie = Movie::open(&file.source)?;
                match movie.video().ok_or(MediaError::NoVideoStream)? {
                    TrackInfo { kind: TrackKind::Video { width, height }, rotation, .. } => {
                        let (w, h) = (*width as usize, *height as usize);
                        Ok(if rotation % 180 == 90 { (h, w) } else { (w, h) })
                    }
                    TrackInfo { .. } => Err(MediaError::NoVideoStream),
                }
            }
        }
    }

    /// Seconds of video (within the trim window).
    pub fn duration(&self) -> Result<f64, MediaError> {
        match self {
            Video::Components { components, .. } => {
                Ok(components.images.dim(0) as f64 / components.frame_rate.to_f64())
            }
            Video::File(file) => file.duration(),
        }
    }

    /// The same video cut to `duration` seconds (0: to the end) from `start` (negative: from the end), as
    /// ComfyUI's `as_trimmed`; `None` when `strict` and the video is shorter than asked. Frames from
    /// components are encoded to an in-memory MP4 first, as ComfyUI does.
    pub fn trimmed(
        &self,
        start: f64,
        duration: f64,
        strict: bool,
    ) -> Result<Option<Video>, MediaError> {
        let file = match self {
            Video::Components { .. } => {
                if self.duration()? < start + duration {
                    return Ok(None);
                }
                let bytes = self.encode_mp4(&SaveOptions::default())?;
                return Ok(Some(Video::File(VideoFile {
                    source: Source::Bytes(bytes.into()),
                    start,
                    duration,
                })));
            }
            Video::File(file) => file,
        };
        let trimmed =
            VideoFile { source: file.source.clone(), start: start + file.start, duration };
        if trimmed.duration()? < duration && strict {
            return Ok(None);
        }
        Ok(Some(Video::File(trimmed)))
    }

    /// Writes the video as an MP4 with H.264 video at `path`.
    pub fn save_mp4(&self, path: &Path, options: &SaveOptions) -> Result<(), MediaError> {
        let bytes = self.encode_mp4(options)?;
        std::fs::write(path, bytes)
            .map_err(|source| MediaError::Io { path: path.to_owned(), source })
    }

    /// The MP4 [`Video::save_mp4`] writes.
    pub fn encode_mp4(&self, options: &SaveOptions) -> Result<Vec<u8>, MediaError> {
        match self {
            Video::Components { components, bit_depth } => encode(components, *bit_depth, options),
            Video::File(file) => {
                let movie = Movie::open(&file.source)?;
                let video = movie.video().ok_or(MediaError::NoVideoStream)?;
                let untrimmed = file.start == 0.0 && file.duration == 0.0;
                // A Matroska file's tracks have no MP4 sample entries to copy: those are re-encoded.
                let mp4_entries = movie.tracks.iter().all(|t| !t.sample_entry.is_empty());
                if options.crf.is_none() && untrimmed && is_h264(&video.codec) && mp4_entries {
                    return remux(movie, &options.tags);
                }
                let mut tags = movie.tags.clone();
                drop(movie);
                override_tags(&mut tags, &options.tags);
                let depth = self.bit_depth()?;
                let options = SaveOptions { tags, ..options.clone() };
                encode(&file.components()?, depth, &options)
            }
        }
    }
}

fn is_h264(codec: &str) -> bool {
    matches!(codec, "avc1" | "avc3")
}

fn override_tags(tags: &mut Vec<(String, String)>, new: &[(String, String)]) {
    tags.retain(|(k, _)| !new.iter().any(|(n, _)| n == k));
    tags.extend(new.iter().cloned());
}

/// Encodes frames (and audio) as H.264 in MP4.
fn encode(
    components: &VideoComponents,
    bit_depth: u8,
    options: &SaveOptions,
) -> Result<Vec<u8>, MediaError> {
    let shape = components.images.shape();
    let &[n, height, width, channels] = shape else {
        return Err(MediaError::Invalid(format!(
            "video frames must be [N, H, W, C], got {shape:?}"
        )));
    };
    if n == 0 {
        return Err(MediaError::NoFrames);
    }
    if channels < 3 {
        return Err(MediaError::Invalid(format!("video frames need 3 channels, got {channels}")));
    }
    if width % 2 != 0 || height % 2 != 0 {
        return Err(MediaError::OddDimensions { width, height });
    }
    if bit_depth > 8 {
        return Err(MediaError::Encode(format!(
            "{bit_depth}-bit H.264 is not available: Kiln's encoder (OpenH264) writes 8-bit video; set bit_depth to 8"
        )));
    }
    let timescale = u32::try_from(components.frame_rate.thousandths())
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| {
            MediaError::Invalid(format!("frame rate {} cannot be stored", components.frame_rate))
        })?;
    let fps = f64::from(timescale) / 1000.0;
    let mut encoder = H264Encoder::new(fps, options.crf)?;
    let frame_len = height * width * channels;
    let mut rgb = Vec::with_capacity(height * width * 3);
    for frame in components.images.data().chunks_exact(frame_len) {
        rgb.clear();
        rgb.extend(frame.chunks_exact(channels).flat_map(|p| [p[0], p[1], p[2]]));
        encoder.push(&rgb_to_yuv420(&rgb, width, height))?;
    }
    let stream = encoder.finish()?;
    let (w, h) = (width as u32, height as u32);
    let video = mp4::Track {
        kind: TrackKind::Video { width: w, height: h },
        timescale,
        sample_entry: mp4::avc1_entry(w, h, &stream.config),
        samples: stream
            .units
            .into_iter()
            .map(|unit| mp4::Sample {
                data: unit.data,
                duration: 1000,
                composition_offset: 0,
                sync: unit.keyframe,
            })
            .collect(),
        media_start: None,
    };
    let mut tracks = vec![video];
    if let Some(audio) = &components.audio {
        // The audio of as many samples as the frames last, rounded up (ComfyUI's cut), of the first clip.
        let rate = f64::from(audio.sample_rate());
        let keep = (rate * n as f64 * 1000.0 / f64::from(timescale)).ceil() as usize;
        tracks.push(super::sound::mp4_track(audio, keep)?);
    }
    Ok(mp4::write(&tracks, &options.tags))
}

/// The file's tracks copied as they are, with its tags overridden by `tags`.
fn remux(mut movie: Movie, tags: &[(String, String)]) -> Result<Vec<u8>, MediaError> {
    let mut all_tags = movie.tags.clone();
    override_tags(&mut all_tags, tags);
    let infos = movie.tracks.clone();
    let mut tracks = Vec::with_capacity(infos.len());
    for info in infos {
        let mut samples = Vec::with_capacity(info.samples.len());
        for sample in &info.samples {
            samples.push(mp4::Sample {
                data: movie.read(sample)?,
                duration: sample.duration,
                composition_offset: sample.composition_offset,
                sync: sample.sync,
            });
        }
        tracks.push(mp4::Track {
            kind: info.kind,
            timescale: info.timescale,
            sample_entry: info.sample_entry,
            samples,
            media_start: info.media_start,
        });
    }
    Ok(mp4::write(&tracks, &all_tags))
}

impl VideoFile {
    /// The untrimmed length of the video track in seconds.
    fn raw_duration(&self) -> Result<f64, MediaError> {
        let movie = Movie::open(&self.source)?;
        let video = movie.video().ok_or(MediaError::NoVideoStream)?;
        let start = video.media_start.unwrap_or(0) as f64 / f64::from(video.timescale);
        Ok(video.duration_seconds() - start)
    }

    /// The trim window as (start ≥ 0, duration; 0 = to the end).
    fn window(&self) -> Result<(f64, f64), MediaError> {
        let start = if self.start < 0.0 {
            (self.raw_duration()? + self.start).max(0.0)
        } else {
            self.start
        };
        Ok((start, self.duration))
    }

    fn duration(&self) -> Result<f64, MediaError> {
        let raw = self.raw_duration()?;
        let from_start = if self.start < 0.0 { raw.min(-self.start) } else { raw - self.start };
        Ok(if self.duration > 0.0 { self.duration.min(from_start) } else { from_start })
    }

    fn components(&self) -> Result<VideoComponents, MediaError> {
        let (start, duration) = self.window()?;
        let mut movie = Movie::open(&self.source)?;
        let video = movie.video().ok_or(MediaError::NoVideoStream)?.clone();
        if !is_h264(&video.codec) && video.codec != "vp09" {
            return Err(MediaError::UnsupportedCodec {
                kind: "video",
                codec: video.codec.clone(),
                supported: "Kiln decodes H.264 video (avc1/avc3) and VP9",
            });
        }
        let timescale = f64::from(video.timescale);
        let media_start = video.media_start.unwrap_or(0);
        // Presentation times in ticks, in decode order.
        let mut dts = 0i64;
        let mut times = Vec::with_capacity(video.samples.len());
        for sample in &video.samples {
            times.push(dts + i64::from(sample.composition_offset) - media_start);
            dts += i64::from(sample.duration);
        }
        let start_ticks = (start * timescale) as i64;
        let end_ticks = (duration > 0.0).then_some(((start + duration) * timescale) as i64);
        // Past the window's end plus the largest reordering delay, no sample can still be shown in it.
        let delay =
            video.samples.iter().map(|s| i64::from(s.composition_offset)).max().unwrap_or(0);
        let mut feed = Vec::new();
        let mut dts = -media_start;
        for sample in &video.samples {
            if end_ticks.is_some_and(|end| dts > end + delay) {
                break;
            }
            feed.push(*sample);
            dts += i64::from(sample.duration);
        }
        let mut shown: Vec<i64> = times[..feed.len()].to_vec();
        shown.sort_unstable();
        let samples = feed.iter().map(|s| movie.read(s));
        let decoded = if video.codec == "vp09" {
            vp9::decode(samples)?
        } else {
            let config = video.config.as_deref().ok_or_else(|| {
                MediaError::Malformed("the H.264 track has no avcC configuration".to_owned())
            })?;
            h264::decode(config, samples)?
        };
        let (mut width, mut height) = (0, 0);
        let mut frames = Vec::new();
        let mut kept = 0;
        for (frame, &pts) in decoded.into_iter().zip(&shown) {
            if pts < start_ticks || end_ticks.is_some_and(|end| pts >= end) {
                continue;
            }
            let frame = rotate(frame, video.rotation);
            if kept == 0 {
                (width, height) = (frame.width, frame.height);
            } else if (frame.width, frame.height) != (width, height) {
                return Err(MediaError::Decode {
                    kind: "video",
                    message: format!(
                        "the resolution changes mid-stream ({width}x{height} -> {}x{})",
                        frame.width, frame.height
                    ),
                });
            }
            frames.extend_from_slice(&frame.rgb);
            kept += 1;
        }
        let images = Tensor::new(vec![kept, height, width, 3], frames)
            .map_err(|e| MediaError::Invalid(e.to_string()))?;
        let frame_rate = average_rate(&video);
        let audio = match movie.audio().cloned() {
            Some(track) => super::sound::decode_track(&mut movie, &track, start, duration)?,
            None => None,
        };
        Ok(VideoComponents { images, audio: audio.map(Arc::new), frame_rate })
    }
}

/// FFmpeg's average frame rate of a track: the rate the container declares, else frames · timescale / duration
/// (1 when unknown).
fn average_rate(track: &TrackInfo) -> Rational {
    if let Some(rate) = track.frame_rate {
        return rate;
    }
    let ticks: u64 = track.samples.iter().map(|s| u64::from(s.duration)).sum();
    Rational::new(track.samples.len() as u64 * u64::from(track.timescale), ticks)
        .unwrap_or(Rational::ONE)
}

/// A decoded frame turned clockwise by `degrees` (0, 90, 180 or 270).
fn rotate(frame: h264::DecodedFrame, degrees: u32) -> h264::DecodedFrame {
    let (w, h) = (frame.width, frame.height);
    // For each pixel of the turned frame, the pixel of the decoded one it shows.
    let source = |x: usize, y: usize| match degrees {
        90 => (y, h - 1 - x),
        180 => (w - 1 - x, h - 1 - y),
        _ => (w - 1 - y, x),
    };
    let (nw, nh) = match degrees {
        90 | 270 => (h, w),
        180 => (w, h),
        _ => return frame,
    };
    let mut rgb = Vec::with_capacity(frame.rgb.len());
    for y in 0..nh {
        for x in 0..nw {
            let (sx, sy) = source(x, y);
            let at = (sy * w + sx) * 3;
            rgb.extend_from_slice(&frame.rgb[at..at + 3]);
        }
    }
    h264::DecodedFrame { width: nw, height: nh, rgb }
}
