//! MP3 files as ComfyUI's PyAV writes them through libmp3lame (`SaveAudioAdvanced`, `SaveAudioMP3`), encoded
//! by `rusty_mp3` (pure Rust): VBR at LAME's `V0` or CBR at 128 or 320 kbps, behind an ID3v2.4 tag holding the
//! prompt and workflow as `TXXX` frames, as FFmpeg's muxer writes metadata (the frontend reads them there).

use super::{Audio, MediaError};

/// `SaveAudioAdvanced`'s MP3 qualities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mp3Quality {
    /// Variable bitrate at LAME's best quality (`-V0`, `qscale` with quality 0).
    V0,
    /// A constant bitrate, in kbps.
    Cbr(u32),
}

impl Mp3Quality {
    /// The quality `SaveAudioMP3`'s and `SaveAudioAdvanced`'s combo names.
    pub fn from_name(name: &str) -> Option<Mp3Quality> {
        match name {
            "V0" => Some(Mp3Quality::V0),
            "128k" => Some(Mp3Quality::Cbr(128)),
            "320k" => Some(Mp3Quality::Cbr(320)),
            _ => None,
        }
    }
}

/// Clip `item` of `audio` as an MP3 file (mono, or stereo from the first two channels) with `tags`.
pub(crate) fn mp3_file(
    audio: &Audio,
    item: usize,
    quality: Mp3Quality,
    tags: &[(String, String)],
) -> Result<Vec<u8>, MediaError> {
    let channels = audio.channels().min(2);
    if channels == 0 {
        return Err(MediaError::Invalid("the audio has no channels".to_owned()));
    }
    let planes: Vec<&[f32]> = (0..channels).map(|c| audio.channel(item, c)).collect();
    let interleaved: Vec<f32> =
        (0..audio.samples()).flat_map(|i| planes.iter().map(move |p| p[i])).collect();
    let config = match quality {
        Mp3Quality::V0 => rusty_mp3::Mp3EncoderConfig {
            bitrate_kbps: 0,
            vbr_quality: Some(rusty_mp3::vbr_quality_index(0.0)),
        },
        Mp3Quality::Cbr(kbps) => {
            rusty_mp3::Mp3EncoderConfig { bitrate_kbps: kbps, vbr_quality: None }
        }
    };
    let failed = |e: rusty_mp3::Error| MediaError::Encode(format!("MP3: {e}"));
    let mut encoder = rusty_mp3::Mp3Encoder::new(config);
    encoder.push_pcm_f32(&interleaved, channels as u16, audio.sample_rate()).map_err(failed)?;
    encoder.finish();
    let mut out = id3v2(tags);
    loop {
        match encoder.next_packet() {
            Ok(packet) => out.extend_from_slice(&packet),
            Err(rusty_mp3::Error::Eof | rusty_mp3::Error::Again) => break,
            Err(e) => return Err(failed(e)),
        }
    }
    Ok(out)
}

/// An ID3v2.4 tag of one `TXXX` frame per tag (UTF-8, the tag's name as the description); nothing without tags.
fn id3v2(tags: &[(String, String)]) -> Vec<u8> {
    if tags.is_empty() {
        return Vec::new();
    }
    let mut frames = Vec::new();
    for (name, value) in tags {
        let mut body = vec![3u8]; // UTF-8
        body.extend(name.as_bytes());
        body.push(0);
        body.extend(value.as_bytes());
        frames.extend(b"TXXX");
        frames.extend(syncsafe(body.len() as u32));
        frames.extend([0, 0]); // flags
        frames.extend(body);
    }
    let mut out = b"ID3".to_vec();
    out.extend([4, 0, 0]); // version 2.4.0, no flags
    out.extend(syncsafe(frames.len() as u32));
    out.extend(frames);
    out
}

/// A 28-bit size as ID3v2 writes it: seven bits a byte, the high bit clear.
fn syncsafe(n: u32) -> [u8; 4] {
    [(n >> 21) as u8 & 0x7F, (n >> 14) as u8 & 0x7F, (n >> 7) as u8 & 0x7F, n as u8 & 0x7F]
}
