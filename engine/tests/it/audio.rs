//! Audio as data: LoadAudio of WAV and FLAC, SaveAudio / PreviewAudio FLAC files with their names and tags,
//! TrimAudioDuration and AudioConcat as ComfyUI computes them, the recording, joining, mixing and filtering
//! nodes chained in a graph, and audio inside saved videos.

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

/// The mixing nodes in one graph as a user chains them: a recording (the frontend's WAV in the temp folder)
/// joined with a loaded clip at another rate, overlaid on silence, quieter, equalised; a silent video's `None`
/// audio passes through AudioMerge; a mono clip cannot be split.
#[test]
fn recorded_and_loaded_clips_join_mix_and_filter() {
    let mut h = Harness::new(CachePolicy::None);
    std::fs::write(h.roots.input.join("tone.wav"), wav(&tone(1600), 16000)).expect("write");
    std::fs::create_dir_all(h.roots.temp.join("audio")).expect("mkdir");
    std::fs::write(h.roots.temp.join("audio/recording-1.wav"), wav(&tone(400), 8000))
        .expect("write");
    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "tone.wav"}},
        "2": {"class_type": "RecordAudio", "inputs": {"audio": "audio/recording-1.wav [temp]"}},
        "3": {"class_type": "JoinAudioChannels", "inputs": {"audio_left": ["1", 0], "audio_right": ["2", 0]}},
        "4": {"class_type": "EmptyAudio", "inputs": {"duration": 0.5, "sample_rate": 16000, "channels": 2}},
        "5": {"class_type": "AudioMerge", "inputs": {"audio1": ["4", 0], "audio2": ["3", 0], "merge_method": "add"}},
        "6": {"class_type": "AudioAdjustVolume", "inputs": {"audio": ["5", 0], "volume": -6}},
        "7": {"class_type": "AudioEqualizer3Band", "inputs": {"audio": ["6", 0], "low_gain_dB": 3.0, "low_freq": 100, "mid_gain_dB": 0.0, "mid_freq": 1000, "mid_q": 0.707, "high_gain_dB": -3.0, "high_freq": 5000}},
        "8": {"class_type": "SplitAudioChannels", "inputs": {"audio": ["7", 0]}},
        "9": {"class_type": "SaveAudio", "inputs": {"audio": ["8", 1], "filename_prefix": "right"}},
        "10": {"class_type": "SaveAudio", "inputs": {"audio": ["7", 0], "filename_prefix": "mixed"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let mixed = media::load_audio(&h.roots.output.join("mixed_00001.flac")).expect("decodes");
    // Silence of 0.5 s at 16 kHz sets the length; the 400 samples at 8 kHz became 800 at 16 kHz, the join
    // was cut to them, and the rest of the overlay is the silence.
    assert_eq!(mixed.waveform().shape(), [1, 2, 8000]);
    assert_eq!(mixed.sample_rate(), 16000);
    assert!(rms(&mixed.channel(0, 0)[..800]) > 0.05, "the tone is there");
    // Then silence, once the filters' ringing has died away.
    assert!(mixed.channel(0, 0)[4000..].iter().all(|&v| v.abs() < 1e-4), "then silence");
    let right = media::load_audio(&h.roots.output.join("right_00001.flac")).expect("decodes");
    assert_eq!(right.waveform().shape(), [1, 1, 8000]);
    assert_eq!(right.channel(0, 0), mixed.channel(0, 1));

    // A video made without sound has no audio: AudioMerge gives the other clip unchanged.
    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "tone.wav"}},
        "2": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 2, "color": 0}},
        "3": {"class_type": "CreateVideo", "inputs": {"images": ["2", 0], "fps": 8.0}},
        "4": {"class_type": "GetVideoComponents", "inputs": {"video": ["3", 0]}},
        "5": {"class_type": "AudioMerge", "inputs": {"audio1": ["4", 1], "audio2": ["1", 0], "merge_method": "mean"}},
        "6": {"class_type": "SaveAudio", "inputs": {"audio": ["5", 0], "filename_prefix": "passed"}},
    }));
    assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
    let passed = media::load_audio(&h.roots.output.join("passed_00001.flac")).expect("decodes");
    let source = tone(1600);
    assert_eq!(passed.waveform().shape(), [1, 1, 1600]);
    assert_eq!(passed.channel(0, 0)[100], f32::from(source[100]) / 32768.0);

    let ran = h.run(json!({
        "1": {"class_type": "LoadAudio", "inputs": {"audio": "tone.wav"}},
        "2": {"class_type": "SplitAudioChannels", "inputs": {"audio": ["1", 0]}},
        "3": {"class_type": "PreviewAudio", "inputs": {"audio": ["2", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("must fail") };
    assert!(failure.message.contains("must be stereo (2 channels), got 1"), "{}", failure.message);
    let ran = h.run(json!({
        "1": {"class_type": "RecordAudio", "inputs": {"audio": "audio/missing.wav [temp]"}},
        "2": {"class_type": "PreviewAudio", "inputs": {"audio": ["1", 0]}},
    }));
    let Outcome::Failed(failure) = &ran.summary.outcome else { panic!("must fail") };
    assert!(
        failure.message.contains("no recording `audio/missing.wav [temp]`"),
        "{}",
        failure.message
    );
}

/// The root mean square of samples.
fn rms(x: &[f32]) -> f32 {
    (x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32).sqrt()
}

#[test]
fn save_audio_advanced_writes_flac_mp3_and_opus_that_load_back() {
    let mut h = Harness::new(CachePolicy::None);
    // Two seconds of a 440 Hz tone at 44.1 kHz, a rate Opus does not take (it is resampled to 48 kHz).
    let tone: Vec<i16> = (0..88_200)
        .map(|i| {
            ((i as f32 * 2.0 * std::f32::consts::PI * 440.0 / 44_100.0).sin() * 12_000.0) as i16
        })
        .collect();
    std::fs::write(h.roots.input.join("a.wav"), wav(&tone, 44_100)).expect("write");
    let source_rms = 12_000.0 / 32_768.0 / 2f32.sqrt();
    let save = |h: &mut Harness, node: serde_json::Value| {
        let ran = h.run_validated(
            &h.validate(json!({
                "1": {"class_type": "LoadAudio", "inputs": {"audio": "a.wav"}},
                "2": node,
            })),
            json!({"workflow": {"id": "wf-audio"}}),
        );
        assert_eq!(ran.summary.outcome, Outcome::Success, "{:?}", ran.events);
        let (_, files) = &ran.summary.outputs[&NodeId::from("2")].named[0];
        files[0].filename.clone()
    };
    let flac = save(
        &mut h,
        json!({"class_type": "SaveAudioAdvanced", "inputs": {
        "audio": ["1", 0], "filename_prefix": "audio/adv", "format": "flac"}}),
    );
    assert_eq!(flac, "adv_00001.flac");
    let mp3 = save(
        &mut h,
        json!({"class_type": "SaveAudioAdvanced", "inputs": {
        "audio": ["1", 0], "filename_prefix": "audio/adv", "format": "mp3", "format.quality": "V0"}}),
    );
    let mp3_cbr = save(
        &mut h,
        json!({"class_type": "SaveAudioMP3", "inputs": {
        "audio": ["1", 0], "filename_prefix": "audio/cbr", "quality": "128k"}}),
    );
    let opus = save(
        &mut h,
        json!({"class_type": "SaveAudioAdvanced", "inputs": {
        "audio": ["1", 0], "filename_prefix": "audio/adv", "format": "opus", "format.quality": "96k"}}),
    );
    let opus_old = save(
        &mut h,
        json!({"class_type": "SaveAudioOpus", "inputs": {
        "audio": ["1", 0], "filename_prefix": "audio/old", "quality": "64k"}}),
    );
    assert_eq!((mp3.as_str(), opus.as_str()), ("adv_00002.mp3", "adv_00003.opus"));
    assert_eq!((mp3_cbr.as_str(), opus_old.as_str()), ("cbr_00001.mp3", "old_00001.opus"));

    for name in [&mp3, &mp3_cbr] {
        let bytes = std::fs::read(h.roots.output.join("audio").join(name)).expect("mp3");
        // An ID3v2.4 tag whose TXXX frames hold the prompt and workflow, as the frontend reads them.
        assert_eq!(&bytes[..4], b"ID3\x04");
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("TXXX") && text.contains("workflow\0{\"id\": \"wf-audio\"}"),
            "{name}"
        );
        assert!(text.contains("prompt\0{"), "{name}");
        // Symphonia's decoder (not the encoder's crate) reads it back: the tone, at its rate.
        let audio = media::load_audio(&h.roots.output.join("audio").join(name)).expect("decodes");
        assert_eq!((audio.sample_rate(), audio.channels()), (44_100, 1), "{name}");
        assert!(audio.samples() >= 88_200, "{name}: {} samples", audio.samples());
        let level = rms(&audio.channel(0, 0)[4_000..84_000]);
        assert!((level / source_rms - 1.0).abs() < 0.05, "{name}: rms {level} vs {source_rms}");
    }
    let cbr_len =
        std::fs::metadata(h.roots.output.join("audio").join(&mp3_cbr)).expect("size").len();
    // 2 s at 128 kbps: 32 kB of frames, give or take a frame and the tag.
    assert!((30_000..36_000).contains(&cbr_len), "{cbr_len} bytes");

    for name in [&opus, &opus_old] {
        let bytes = std::fs::read(h.roots.output.join("audio").join(name)).expect("opus");
        assert_eq!(&bytes[..4], b"OggS");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("OpusHead") && text.contains("OpusTags"), "{name}");
        assert!(
            text.contains("workflow={\"id\": \"wf-audio\"}") && text.contains("prompt={"),
            "{name}"
        );
        // Symphonia's Ogg reader checks every page's CRC; the end is trimmed to the resampled length exactly.
        let audio = media::load_audio(&h.roots.output.join("audio").join(name)).expect("decodes");
        assert_eq!((audio.sample_rate(), audio.channels()), (48_000, 1), "{name}");
        assert_eq!(audio.samples(), 96_000, "{name}");
        // In step with the source resampled to 48 kHz (torchaudio's resampler, as ComfyUI resamples): the
        // pre-skip matches the encoder's delay.
        let source: Vec<f32> = tone.iter().map(|&s| f32::from(s) / 32_768.0).collect();
        let expected = kiln_models::resample::resample(&source, 44_100, 48_000).expect("resample");
        let decoded = &audio.channel(0, 0)[4_000..92_000];
        let noise: Vec<f32> =
            decoded.iter().zip(&expected[4_000..92_000]).map(|(a, b)| a - b).collect();
        let snr = 20.0 * (rms(&expected[4_000..92_000]) / rms(&noise)).log10();
        assert!(snr > 30.0, "{name}: {snr} dB against the resampled source");
    }
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
