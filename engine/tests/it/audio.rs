//! Audio as data: LoadAudio of WAV and FLAC, SaveAudio / PreviewAudio FLAC files with their names and tags,
//! TrimAudioDuration and AudioConcat as ComfyUI computes them, and audio inside saved videos.

use std::sync::Arc;

use kiln_engine::cache::CachePolicy;
use kiln_engine::exec::Outcome;
use kiln_engine::graph::NodeId;
use kiln_engine::media::{self, Audio, Rational, SaveOptions, Video, VideoComponents};
use kiln_engine::nodes::FileKind;
use kiln_engine::tensor::Tensor;
use serde_json::json;

use crate::harness::Harness;

/// A 16-bit PCM WAV of `samples` (mono) at `rate`.
pub(crate) fn wav(samples: &[i16], rate: u32) -> Vec<u8> {
    let data: Vec<u8> = samples.iter().flat_map(|s| s.to_le_bytes()).collect();
    let mut out = b"RIFF".to_vec();
    out.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
    out.extend_from_slice(b"WAVEfmt ");
    out.extend_from_slice(&16u32.to_le_bytes());
    out.extend_from_slice(&1u16.to_le_bytes()); // PCM
    out.extend_from_slice(&1u16.to_le_bytes()); // mono
    out.extend_from_slice(&rate.to_le_bytes());
    out.extend_from_slice(&(rate * 2).to_le_bytes());
    out.extend_from_slice(&2u16.to_le_bytes());
    out.extend_from_slice(&16u16.to_le_bytes());
    out.extend_from_slice(b"data");
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    out.extend_from_slice(&data);
    out
}

fn tone(n: usize) -> Vec<i16> {
    (0..n).map(|i| ((i as f32 * 0.05).sin() * 12000.0) as i16).collect()
}

#[test]
fn load_save_and_reload_keep_the_samples() {
    let mut h = Harness::new(CachePolicy::None);
    let samples = tone(8000);
    std::fs::write(h.roots.input.join("tone.wav"), wav(&samples, 16000)).expect("write");
    let ran = h.run_validated(
        &h.validate(json!({
            "1": {"class_type": "LoadAudio", "inputs": {"audio": "tone.wav"}},
            "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/kiln"}},
            "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["1", 0]}},
        })),
        json!({"workflow": {"id": "wf-audio"}}),
    );
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let saved = &ran.summary.outputs[&NodeId::from("2")];
    assert!(saved.images.is_empty());
    let (key, files) = &saved.named[0];
    assert_eq!(key, "audio");
    assert_eq!(files[0].filename, "kiln_00001.flac");
    assert_eq!((files[0].subfolder.as_str(), files[0].kind), ("audio", FileKind::Output));
    let (_, previews) = &ran.summary.outputs[&NodeId::from("3")].named[0];
    assert!(previews[0].filename.starts_with("ComfyUI_temp_"), "{}", previews[0].filename);
    assert_eq!(previews[0].kind, FileKind::Temp);

    // The FLAC holds the 16-bit samples exactly, and the tags as a Vorbis comment.
    let flac_path = h.roots.output.join("audio/kiln_00001.flac");
    let back = media::load_audio(&flac_path).expect("decodes");
    assert_eq!(back.waveform().shape(), [1, 1, 8000]);
    assert_eq!(back.sample_rate(), 16000);
    for (got, want) in back.channel(0, 0).iter().zip(&samples) {
        assert_eq!(*got, f32::from(*want) / 32768.0);
    }
    let bytes = std::fs::read(&flac_path).expect("flac");
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains(r#"workflow={"id": "wf-audio"}"#), "no workflow tag");
    assert!(text.contains("prompt={"), "no prompt tag");

    // The counter continues after the highest file (the name has no trailing underscore).
    let again = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "tone.wav"}},
        "2": {"class_type": "SaveAudio", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/kiln"}},
    }));
    assert_eq!(again.summary.outputs[&NodeId::from("2")].named[0].1[0].filename, "kiln_00002.flac");
}

#[test]
fn trim_and_concat_follow_comfyui() {
    let mut h = Harness::new(CachePolicy::None);
    std::fs::write(h.roots.input.join("a.wav"), wav(&tone(1000), 1000)).expect("write");
    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "a.wav"}},
        "2": {"class_type": "TrimAudioDuration", "inputs": {"audio": ["1", 0], "start_index": -0.25, "duration": 0.1}},
        "3": {"class_type": "AudioConcat", "inputs": {"audio1": ["2", 0], "audio2": ["1", 0], "direction": "before"}},
        "4": {"class_type": "SaveAudio", "inputs": {"audio": ["3", 0], "filename_prefix": "joined"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let joined = media::load_audio(&h.roots.output.join("joined_00001.flac")).expect("decodes");
    // Mono made stereo; 1000 samples of audio2 then the 100 trimmed from 750.
    assert_eq!(joined.waveform().shape(), [1, 2, 1100]);
    let source = tone(1000);
    assert_eq!(joined.channel(0, 1)[1000], f32::from(source[750]) / 32768.0);
    assert_eq!(joined.channel(0, 0)[999], f32::from(source[999]) / 32768.0);

    // A window outside the clip is an error, as in ComfyUI.
    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "a.wav"}},
        "2": {"class_type": "TrimAudioDuration", "inputs": {"audio": ["1", 0], "start_index": 5.0, "duration": 1.0}},
        "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["2", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("must fail") };
    assert!(failure.message.starts_with("TrimAudioDuration: Start time"), "{}", failure.message);
}

#[test]
fn save_audio_advanced_writes_flac_and_names_missing_encoders() {
    let mut h = Harness::new(CachePolicy::None);
    std::fs::write(h.roots.input.join("a.wav"), wav(&tone(500), 8000)).expect("write");
    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "a.wav"}},
        "2": {"class_type": "SaveAudioAdvanced", "inputs": {"audio": ["1", 0], "filename_prefix": "audio/adv", "format": "flac"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    assert!(h.roots.output.join("audio/adv_00001.flac").is_file());
    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "a.wav"}},
        "2": {"class_type": "SaveAudioAdvanced", "inputs": {
            "audio": ["1", 0], "filename_prefix": "audio/adv", "format": "mp3", "format.quality": "V0"}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("mp3 must fail") };
    assert!(failure.message.contains("no mp3 encoder"), "{}", failure.message);
}

#[test]
fn audio_rides_along_in_saved_videos() {
    let rate = 8000;
    let samples: Vec<f32> = (0..rate).map(|i| (i as f32 * 0.01).sin() * 0.5).collect();
    let audio =
        Audio::new(Tensor::new(vec![1, 1, rate], samples.clone()).expect("shape"), rate as u32)
            .expect("audio");
    let video = Video::Components {
        components: VideoComponents {
            images: Tensor::full(vec![4, 16, 16, 3], 0.5),
            audio: Some(Arc::new(audio)),
            frame_rate: Rational::new(8, 1).expect("rate"),
        },
        bit_depth: 8,
    };
    let bytes = video.encode_mp4(&SaveOptions::default()).expect("encodes");
    let back = Video::from_bytes(bytes.into()).components().expect("decodes");
    let audio = back.audio.expect("the audio track comes back");
    // Cut to the frames' length: 4 frames at 8 fps is half a second.
    assert_eq!(audio.waveform().shape(), [1, 1, 4000]);
    for (got, want) in audio.channel(0, 0).iter().zip(&samples) {
        assert!((got - want).abs() <= 1.0 / 32768.0, "{got} vs {want}");
    }
}
