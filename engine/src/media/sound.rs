//! Audio codecs: FLAC written by `flacenc` (audio files, and the audio track `SaveVideo` puts in an MP4), and
//! decoding by Symphonia (audio files: WAV, FLAC, MP3, Ogg Vorbis, M4A/AAC; and the AAC, FLAC or Vorbis track of
//! a video file) or, for Opus (a WebM's, an `.opus` file's), by `opus`.
//!
//! Invariant: samples reach 16-bit FLAC as FFmpeg's float-to-s16 conversion gives them (`round(x · 32768)`,
//! clipped), and decoded integer samples come back as ComfyUI scales them (`/ 2¹⁵`, `/ 2³¹`).

use std::fs::File;
use std::path::Path;

use flacenc::bitsink::ByteSink;
use flacenc::component::{BitRepr, MetadataBlockData, Stream};
use flacenc::error::Verify;
use symphonia::core::audio::{AudioBuffer, AudioBufferRef, Signal};
use symphonia::core::codecs::{
    CODEC_TYPE_AAC, CODEC_TYPE_FLAC, CODEC_TYPE_OPUS, CODEC_TYPE_VORBIS, CodecParameters, Decoder,
    DecoderOptions,
};
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::{FormatOptions, FormatReader, Packet, Track as FormatTrack};
use symphonia::core::io::MediaSourceStream;
use symphonia::core::meta::MetadataOptions;
use symphonia::core::probe::Hint;

use super::mp4::{self, Movie, Track, TrackInfo, TrackKind};
use super::{Audio, MediaError};

/// The first clip of `audio`, cut to `keep` samples, as an MP4 track of FLAC frames.
pub(crate) fn mp4_track(audio: &Audio, keep: usize) -> Result<Track, MediaError> {
    let clip = audio.slice(0, keep)?;
    let channels = clip.channels().min(8);
    let stream = flac_stream(&clip, 0, channels)?;
    let mut info = ByteSink::new();
    stream.stream_info().write(&mut info).map_err(encode_failed)?;
    // The STREAMINFO block, marked last, is the whole of `dfLa`'s metadata.
    let block = [&[0x80, 0, 0, 34][..], info.as_slice()].concat();
    let dfla = mp4::full_box(b"dfLa", 0, 0, &block);
    let mut samples = Vec::with_capacity(stream.frame_count());
    for n in 0..stream.frame_count() {
        let Some(frame) = stream.frame(n) else { continue };
        let mut sink = ByteSink::new();
        frame.write(&mut sink).map_err(encode_failed)?;
        samples.push(mp4::Sample {
            data: sink.as_slice().to_vec(),
            duration: frame.block_size() as u32,
            composition_offset: 0,
            sync: true,
        });
    }
    Ok(Track {
        kind: TrackKind::Audio { channels: channels as u16 },
        timescale: clip.sample_rate(),
        sample_entry: mp4::audio_entry(b"fLaC", channels as u16, clip.sample_rate(), &dfla),
        samples,
        media_start: None,
    })
}

/// One clip of `audio` as a FLAC file with `tags` in a Vorbis comment.
pub(crate) fn flac_file(
    audio: &Audio,
    item: usize,
    tags: &[(String, String)],
) -> Result<Vec<u8>, MediaError> {
    let mut stream = flac_stream(audio, item, audio.channels().min(8))?;
    if !tags.is_empty() {
        let block = MetadataBlockData::new_unknown(4, &vorbis_comment(tags))
            .map_err(|e| MediaError::Encode(format!("the tags do not fit a FLAC comment: {e}")))?;
        stream.add_metadata_block(block);
    }
    let mut sink = ByteSink::new();
    stream.write(&mut sink).map_err(encode_failed)?;
    Ok(sink.as_slice().to_vec())
}

fn encode_failed(e: impl std::fmt::Display) -> MediaError {
    MediaError::Encode(format!("FLAC: {e}"))
}

fn flac_stream(audio: &Audio, item: usize, channels: usize) -> Result<Stream, MediaError> {
    if channels == 0 {
        return Err(MediaError::Invalid("the audio has no channels".to_owned()));
    }
    let samples = audio.samples();
    let mut interleaved = Vec::with_capacity(samples * channels);
    for i in 0..samples {
        for c in 0..channels {
            let x = audio.channel(item, c)[i];
            interleaved.push((x * 32768.0).round().clamp(-32768.0, 32767.0) as i32);
        }
    }
    let config = flacenc::config::Encoder::default()
        .into_verified()
        .map_err(|(_, e)| MediaError::Encode(format!("FLAC settings: {e}")))?;
    let source = flacenc::source::MemSource::from_samples(
        &interleaved,
        channels,
        16,
        audio.sample_rate() as usize,
    );
    let mut stream = flacenc::encode_with_fixed_block_size(&config, source, config.block_size)
        .map_err(encode_failed)?;
    // flacenc lowers the minimum block size to a short last frame's; FLAC's STREAMINFO leaves the last frame
    // out of it (and Symphonia reads a stream whose sizes differ as variable-block, misreading its frames).
    stream
        .stream_info_mut()
        .set_block_sizes(config.block_size, config.block_size)
        .map_err(encode_failed)?;
    Ok(stream)
}

/// A Vorbis comment block's body: the vendor, then `key=value` entries, lengths little-endian.
/// A Vorbis comment block (vendor, then `key=value` entries): FLAC's and Opus's tags.
pub(crate) fn vorbis_comment(tags: &[(String, String)]) -> Vec<u8> {
    let vendor = b"Kiln";
    let mut out = (vendor.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(vendor);
    out.extend_from_slice(&(tags.len() as u32).to_le_bytes());
    for (key, value) in tags {
        let entry = format!("{key}={value}");
        out.extend_from_slice(&(entry.len() as u32).to_le_bytes());
        out.extend_from_slice(entry.as_bytes());
    }
    out
}

/// The audio of `track` from `start` seconds for `duration` (0: to the end), or `None` when its codec is
/// not one Kiln decodes (the video is then silent, as ComfyUI skips an undecodable stream).
pub(crate) fn decode_track(
    movie: &mut Movie,
    track: &TrackInfo,
    start: f64,
    duration: f64,
) -> Result<Option<Audio>, MediaError> {
    let decoded = match track.codec.as_str() {
        "Opus" => {
            let Some(config) = &track.config else { return Ok(None) };
            // An MP4's `dOps` box holds the OpusHead fields big-endian, and its edit list (the media start
            // below) skips the pre-skip; Matroska's private data is the OpusHead itself.
            let (head, skip_pre_roll) = match super::opus::head_of_dops(config) {
                Some(head) => (head, track.media_start.is_none()),
                None => (config.clone(), true),
            };
            let packets = track.samples.iter().map(|s| movie.read(s));
            super::opus::decode(&head, packets, skip_pre_roll)?
        }
        "mp4a" | "fLaC" | "vorbis" => symphonia_track(movie, track)?,
        other => {
            tracing::warn!(
                codec = other,
                "the video's audio track is in a codec Kiln does not decode; ignoring it"
            );
            return Ok(None);
        }
    };
    let Some((mut planes, rate)) = decoded else { return Ok(None) };
    // The padding the container asks to discard from the end, in samples (FFmpeg rounds to nearest).
    let padding =
        ((track.discard_end_ns as u128 * u128::from(rate) + 500_000_000) / 1_000_000_000) as usize;
    for plane in &mut planes {
        plane.truncate(plane.len().saturating_sub(padding));
    }
    // Encoder priming that an edit list skips.
    let skip = track.media_start.map_or(0, |s| {
        (s.max(0) as u64 * u64::from(rate) / u64::from(track.timescale.max(1))) as usize
    });
    let from = skip + (start * f64::from(rate)) as usize;
    let to = if duration > 0.0 { from + (duration * f64::from(rate)) as usize } else { usize::MAX };
    let planes: Vec<Vec<f32>> = planes
        .into_iter()
        .map(|p| p.get(from.min(p.len())..to.min(p.len())).unwrap_or_default().to_vec())
        .collect();
    if planes.is_empty() {
        return Ok(None);
    }
    Audio::from_planar(planes, rate).map(Some)
}

/// An AAC, FLAC or Vorbis track's planes and rate, decoded by Symphonia; `None` without a configuration.
fn symphonia_track(
    movie: &mut Movie,
    track: &TrackInfo,
) -> Result<Option<super::opus::Sound>, MediaError> {
    let Some(config) = &track.config else { return Ok(None) };
    let (codec, extra) = match track.codec.as_str() {
        // dfLa holds metadata blocks; the decoder wants STREAMINFO's body.
        "fLaC" => (CODEC_TYPE_FLAC, config.get(4..38).unwrap_or_default().to_vec()),
        "vorbis" => (CODEC_TYPE_VORBIS, vorbis_headers(config)?),
        _ => (CODEC_TYPE_AAC, config.clone()),
    };
    let mut params = CodecParameters::new();
    params
        .for_codec(codec)
        .with_sample_rate(track.sample_rate)
        .with_extra_data(extra.into_boxed_slice());
    if let TrackKind::Audio { channels } = track.kind {
        params.with_channels(channel_mask(channels));
    }
    let mut decoder = symphonia::default::get_codecs()
        .make(&params, &DecoderOptions::default())
        .map_err(|e| decode_failed(&e))?;
    let mut planes: Vec<Vec<f32>> = Vec::new();
    let mut ts = 0u64;
    for sample in &track.samples {
        let data = movie.read(sample)?;
        let packet = Packet::new_from_slice(0, ts, u64::from(sample.duration), &data);
        ts += u64::from(sample.duration);
        match decoder.decode(&packet) {
            Ok(buffer) => append(&mut planes, buffer),
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(decode_failed(&e)),
        }
    }
    let rate = decoder.codec_params().sample_rate.unwrap_or(track.sample_rate).max(1);
    Ok(Some((planes, rate)))
}

/// Matroska's Vorbis private data (the identification, comment and setup headers, Xiph-laced) as Symphonia's
/// decoder takes it: the identification header, then the setup header.
fn vorbis_headers(private: &[u8]) -> Result<Vec<u8>, MediaError> {
    let bad =
        || MediaError::Decode { kind: "audio", message: "Vorbis: malformed codec headers".into() };
    if private.first() != Some(&2) {
        return Err(bad());
    }
    let mut at = 1;
    let mut sizes = [0usize; 2];
    for size in &mut sizes {
        loop {
            let byte = *private.get(at).ok_or_else(bad)?;
            at += 1;
            *size += usize::from(byte);
            if byte < 255 {
                break;
            }
        }
    }
    let ident = private.get(at..at + sizes[0]).ok_or_else(bad)?;
    let setup = private.get(at + sizes[0] + sizes[1]..).ok_or_else(bad)?;
    Ok([ident, setup].concat())
}

fn channel_mask(channels: u16) -> symphonia::core::audio::Channels {
    use symphonia::core::audio::Channels;
    match channels {
        1 => Channels::FRONT_LEFT,
        _ => Channels::FRONT_LEFT | Channels::FRONT_RIGHT,
    }
}

fn decode_failed(e: &SymphoniaError) -> MediaError {
    match e {
        SymphoniaError::Unsupported(what) => MediaError::UnsupportedCodec {
            kind: "audio",
            codec: (*what).to_owned(),
            supported: "Kiln decodes WAV, FLAC, MP3, Ogg Vorbis and AAC audio",
        },
        other => MediaError::Decode { kind: "audio", message: other.to_string() },
    }
}

/// Appends a decoded buffer's channels as f32 (integers scaled as ComfyUI scales them).
fn append(planes: &mut Vec<Vec<f32>>, buffer: AudioBufferRef<'_>) {
    let mut out = AudioBuffer::<f32>::new(buffer.capacity() as u64, *buffer.spec());
    buffer.convert(&mut out);
    let channels = out.spec().channels.count();
    if planes.len() < channels {
        planes.resize_with(channels, Vec::new);
    }
    for (c, plane) in planes.iter_mut().enumerate().take(channels) {
        plane.extend_from_slice(out.chan(c));
    }
}

/// Decodes the first audio stream of an audio (or video) file: `[1, channels, samples]` at its own rate.
pub fn load_audio(path: &Path) -> Result<Audio, MediaError> {
    // MP4/M4A through Kiln's own reader, which applies the edit list (AAC's encoder priming) as FFmpeg does.
    if let Ok(mut movie) = Movie::open(&mp4::Source::Path(path.to_owned()))
        && let Some(track) = movie.audio().cloned()
        && let Some(audio) = decode_track(&mut movie, &track, 0.0, 0.0)?
    {
        return Ok(audio);
    }
    let io = |source| MediaError::Io { path: path.to_owned(), source };
    let file = File::open(path).map_err(io)?;
    let stream = MediaSourceStream::new(Box::new(file), Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = path.extension().and_then(|e| e.to_str()) {
        hint.with_extension(ext);
    }
    let probed = symphonia::default::get_probe()
        .format(&hint, stream, &FormatOptions::default(), &MetadataOptions::default())
        .map_err(|e| match e {
            SymphoniaError::Unsupported(_) => MediaError::UnsupportedContainer {
                what: format!(
                    "{} is not an audio format Kiln reads (WAV, FLAC, MP3, Ogg, M4A/MP4)",
                    path.display()
                ),
            },
            other => decode_failed(&other),
        })?;
    let mut format = probed.format;
    let track = format
        .tracks()
        .iter()
        .find(|t| {
            t.codec_params.codec != symphonia::core::codecs::CODEC_TYPE_NULL
                && t.codec_params.sample_rate.is_some()
        })
        .ok_or_else(|| MediaError::Invalid("No audio stream found in the file.".to_owned()))?
        .clone();
    if track.codec_params.codec == CODEC_TYPE_OPUS {
        return ogg_opus(&mut *format, &track);
    }
    let mut decoder: Box<dyn Decoder> = symphonia::default::get_codecs()
        .make(&track.codec_params, &DecoderOptions::default())
        .map_err(|e| decode_failed(&e))?;
    let mut planes: Vec<Vec<f32>> = Vec::new();
    loop {
        let packet = match format.next_packet() {
            Ok(packet) => packet,
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break;
            }
            Err(SymphoniaError::ResetRequired) => break,
            Err(e) => return Err(decode_failed(&e)),
        };
        if packet.track_id() != track.id {
            continue;
        }
        match decoder.decode(&packet) {
            Ok(buffer) => append(&mut planes, buffer),
            Err(SymphoniaError::DecodeError(_)) => continue,
            Err(e) => return Err(decode_failed(&e)),
        }
    }
    if planes.first().is_none_or(Vec::is_empty) {
        return Err(MediaError::Invalid("No audio frames decoded.".to_owned()));
    }
    let rate = track.codec_params.sample_rate.unwrap_or(1);
    Audio::from_planar(planes, rate)
}

/// An Ogg Opus stream (an `.opus` file) demuxed by Symphonia and decoded by `opus`, cut to the length its last
/// page's granule position gives (the end trimming FFmpeg applies).
fn ogg_opus(format: &mut dyn FormatReader, track: &FormatTrack) -> Result<Audio, MediaError> {
    let head = track.codec_params.extra_data.clone().unwrap_or_default();
    let mut packets = Vec::new();
    loop {
        match format.next_packet() {
            Ok(packet) if packet.track_id() == track.id => packets.push(Ok(packet.data.to_vec())),
            Ok(_) => {}
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break;
            }
            Err(SymphoniaError::ResetRequired) => break,
            Err(e) => return Err(decode_failed(&e)),
        }
    }
    let (mut planes, rate) =
        super::opus::decode(&head, packets, true)?.ok_or_else(|| MediaError::UnsupportedCodec {
            kind: "audio",
            codec: "Opus with more than two channels".to_owned(),
            supported: "Kiln decodes mono and stereo Opus",
        })?;
    // The reader learns the stream's end once it has read the last page.
    let params = (format.tracks().iter().find(|t| t.id == track.id))
        .map_or(&track.codec_params, |t| &t.codec_params);
    // Every decoded sample, less the pre-skip (already dropped) and the end padding the granule trims.
    if let Some(frames) = params.n_frames {
        let trimmed = u64::from(params.delay.unwrap_or(0)) + u64::from(params.padding.unwrap_or(0));
        let keep = frames.saturating_sub(trimmed) as usize;
        for plane in &mut planes {
            plane.truncate(keep);
        }
    }
    if planes.first().is_none_or(Vec::is_empty) {
        return Err(MediaError::Invalid("No audio frames decoded.".to_owned()));
    }
    Audio::from_planar(planes, rate)
}
