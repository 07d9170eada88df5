//! Opus audio (a WebM's usual sound) through `opus-decoder`, a pure-Rust decoder that passes RFC 8251's
//! conformance vectors: mono or stereo streams (channel mapping family 0), at 48 kHz as FFmpeg decodes them,
//! the encoder's pre-skip dropped from the start as FFmpeg drops it.

use opus_decoder::OpusDecoder;

use super::MediaError;

/// Decoded sound: one plane of samples per channel, and the rate.
pub(crate) type Sound = (Vec<Vec<f32>>, u32);

/// Opus always decodes at 48 kHz here (FFmpeg's libopus rate for Opus in WebM).
const RATE: u32 = 48_000;
/// The longest Opus packet: 120 ms.
const MAX_FRAME: usize = RATE as usize * 120 / 1000;

/// The planes and rate of a track's packets, given its `OpusHead` (the Matroska codec private data); `None`
/// for a stream this decoder does not take (more than two channels).
pub(crate) fn decode(
    head: &[u8],
    packets: impl IntoIterator<Item = Result<Vec<u8>, MediaError>>,
) -> Result<Option<Sound>, MediaError> {
    let failed = |e: opus_decoder::OpusError| MediaError::Decode {
        kind: "audio",
        message: format!("Opus: {e}"),
    };
    if head.len() < 19 || &head[..8] != b"OpusHead" {
        return Err(MediaError::Decode {
            kind: "audio",
            message: "Opus: the track has no OpusHead".into(),
        });
    }
    let channels = usize::from(head[9]);
    let pre_skip = usize::from(u16::from_le_bytes([head[10], head[11]]));
    let family = head[18];
    if family != 0 || !(1..=2).contains(&channels) {
        tracing::warn!(
            channels,
            family,
            "the video's Opus audio has more than two channels; ignoring it"
        );
        return Ok(None);
    }
    let mut decoder = OpusDecoder::new(RATE, channels).map_err(failed)?;
    let mut planes = vec![Vec::new(); channels];
    let mut pcm = vec![0f32; MAX_FRAME * channels];
    for packet in packets {
        let n = decoder.decode_float(&packet?, &mut pcm, false).map_err(failed)?;
        for (i, sample) in pcm[..n * channels].iter().enumerate() {
            planes[i % channels].push(*sample);
        }
    }
    for plane in &mut planes {
        plane.drain(..pre_skip.min(plane.len()));
    }
    Ok(Some((planes, RATE)))
}
