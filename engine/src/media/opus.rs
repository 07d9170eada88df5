//! Opus through `rusty-opus`, a pure-Rust encoder and decoder (bit-exact on RFC 8251's decoder vectors):
//! decoding a WebM's or Ogg file's Opus as FFmpeg does (48 kHz, the encoder's pre-skip dropped), and the
//! `.opus` files of `SaveAudioAdvanced` and `SaveAudioOpus` as ComfyUI's PyAV writes them (libopus at a
//! target bitrate, the audio resampled up to a rate Opus takes, the tags as Vorbis comments in `OpusTags`).

use rusty_opus::{Application, OpusDecoder, OpusEncoder};

use super::ogg::OggStream;
use super::{Audio, MediaError};

/// Decoded sound: one plane of samples per channel, and the rate.
pub(crate) type Sound = (Vec<Vec<f32>>, u32);

/// Opus decodes at 48 kHz here (FFmpeg's rate for Opus), and granule positions count at 48 kHz.
const RATE: u32 = 48_000;
/// The longest Opus packet: 120 ms at 48 kHz.
const MAX_FRAME: usize = RATE as usize * 120 / 1000;
/// The rates the encoder takes (ComfyUI's `_OPUS_RATES`).
const ENCODER_RATES: [u32; 5] = [8000, 12000, 16000, 24000, 48000];
/// The encoder's look-ahead at 48 kHz, the pre-skip its files carry: 2.5 ms. (libopus adds 4 ms of delay
/// compensation in its audio mode, so FFmpeg writes 312; rusty-opus's output starts 120 samples late, which
/// the test aligning a decoded tone with its source measures.)
const PRE_SKIP: u64 = 120;

fn failed(what: &'static str) -> impl Fn(rusty_opus::Error) -> MediaError {
    move |e| MediaError::Decode { kind: "audio", message: format!("Opus {what}: {e}") }
}

/// The `OpusHead` an MP4's `dOps` box stands for (its fields big-endian, no magic); `None` when `config` is not
/// a `dOps` body (an `OpusHead` already).
pub(crate) fn head_of_dops(config: &[u8]) -> Option<Vec<u8>> {
    if config.starts_with(b"OpusHead") || config.len() < 11 {
        return None;
    }
    let mut head = b"OpusHead".to_vec();
    head.push(1); // version
    head.push(config[1]); // channels
    head.extend(u16::from_be_bytes([config[2], config[3]]).to_le_bytes()); // pre-skip
    head.extend(u32::from_be_bytes([config[4], config[5], config[6], config[7]]).to_le_bytes());
    head.extend(i16::from_be_bytes([config[8], config[9]]).to_le_bytes()); // output gain
    head.push(config[10]); // channel mapping family
    head.extend_from_slice(&config[11..]); // the mapping table, if any
    Some(head)
}

/// The planes and rate of a track's packets, given its `OpusHead` (Matroska's codec private data, an Ogg
/// stream's first packet); the pre-skip is dropped with `skip_pre_roll` (unless the container skips it).
/// `None` for a stream this decoder does not take (more than two channels, or several streams).
pub(crate) fn decode(
    head: &[u8],
    packets: impl IntoIterator<Item = Result<Vec<u8>, MediaError>>,
    skip_pre_roll: bool,
) -> Result<Option<Sound>, MediaError> {
    if head.len() < 19 || &head[..8] != b"OpusHead" {
        return Err(MediaError::Decode { kind: "audio", message: "Opus: no OpusHead".into() });
    }
    let channels = usize::from(head[9]);
    let pre_skip = usize::from(u16::from_le_bytes([head[10], head[11]]));
    let family = head[18];
    // One stream of one or two channels: family 0, or family 1 with a single stream.
    let one_stream = family == 0 || (family == 1 && head.get(19) == Some(&1));
    if !one_stream || !(1..=2).contains(&channels) {
        tracing::warn!(channels, family, "Opus audio with more than two channels; ignoring it");
        return Ok(None);
    }
    let mut decoder = OpusDecoder::new(RATE as i32, channels).map_err(failed("decoding"))?;
    let mut planes = vec![Vec::new(); channels];
    let mut pcm = vec![0f32; MAX_FRAME * channels];
    for packet in packets {
        let n = decoder.decode(&packet?, MAX_FRAME, &mut pcm).map_err(failed("decoding"))?;
        for (i, sample) in pcm[..n * channels].iter().enumerate() {
            planes[i % channels].push(*sample);
        }
    }
    if skip_pre_roll {
        for plane in &mut planes {
            plane.drain(..pre_skip.min(plane.len()));
        }
    }
    Ok(Some((planes, RATE)))
}

/// Clip `item` of `audio` as an Ogg Opus file at `bitrate` bits a second, with `tags` as its comments. The
/// rate goes up to the next one Opus takes (48 kHz above them), resampled as torchaudio does; more than two
/// channels are refused (ComfyUI's PyAV writes mono or stereo).
pub(crate) fn opus_file(
    audio: &Audio,
    item: usize,
    bitrate: u32,
    tags: &[(String, String)],
) -> Result<Vec<u8>, MediaError> {
    let channels = audio.channels();
    if !(1..=2).contains(&channels) {
        return Err(MediaError::Encode(format!(
            "Opus files hold mono or stereo audio, and this audio has {channels} channels"
        )));
    }
    let source = audio.sample_rate();
    let rate = ENCODER_RATES.into_iter().find(|&r| r >= source).unwrap_or(RATE);
    let planes: Vec<Vec<f32>> = (0..channels)
        .map(|c| {
            let plane = audio.channel(item, c);
            if rate == source {
                Ok(plane.to_vec())
            } else {
                kiln_models::resample::resample(plane, source, rate)
                    .map_err(|e| MediaError::Encode(format!("resampling to {rate} Hz: {e}")))
            }
        })
        .collect::<Result<_, _>>()?;
    let samples = planes.first().map_or(0, Vec::len);
    let encode_failed = |e: rusty_opus::Error| MediaError::Encode(format!("Opus: {e}"));
    let mut encoder =
        OpusEncoder::new(rate as i32, channels, Application::Audio).map_err(encode_failed)?;
    encoder.bitrate_bps = bitrate as i32;
    // 20 ms frames; the last one padded with silence, and the file's last granule position cuts it off.
    let frame = rate as usize / 50;
    let per_frame = (RATE / 50) as u64;
    let mut packets = Vec::new();
    let mut pcm = vec![0f32; frame * channels];
    let mut out = vec![0u8; 4000];
    // Granule positions count every decoded sample at 48 kHz, the pre-skip included (RFC 7845).
    let mut granule = 0;
    // Enough frames to hold the pre-skip as well as the sound (the encoder's look-ahead), padded with silence.
    let frames = (samples + (PRE_SKIP as usize * rate as usize / RATE as usize)).div_ceil(frame);
    for f in 0..frames {
        pcm.fill(0.0);
        for (i, plane) in planes.iter().enumerate() {
            for (j, &x) in plane.iter().skip(f * frame).take(frame).enumerate() {
                pcm[j * channels + i] = x;
            }
        }
        let len = encoder.encode(&pcm, frame, &mut out).map_err(encode_failed)?;
        granule += per_frame;
        packets.push((out[..len].to_vec(), granule));
    }
    // The last page's granule position is where the sound ends (RFC 7845's end trimming).
    let end = PRE_SKIP + (samples as u64 * u64::from(RATE)).div_ceil(u64::from(rate));
    if let Some(last) = packets.last_mut() {
        last.1 = end.min(last.1);
    }
    let mut head = b"OpusHead".to_vec();
    head.push(1); // version
    head.push(channels as u8);
    head.extend((PRE_SKIP as u16).to_le_bytes());
    head.extend(source.to_le_bytes()); // the input's rate, for players that resample back
    head.extend(0i16.to_le_bytes()); // output gain
    head.push(0); // channel mapping family: mono or stereo
    let mut comments = b"OpusTags".to_vec();
    comments.extend(super::sound::vorbis_comment(tags));
    let mut stream = OggStream::new(0x4B69_6C6E); // "Kiln"
    stream.header(&head);
    stream.header(&comments);
    stream.audio(&packets);
    Ok(stream.finish())
}
