//! Whisper large-v3's audio encoder and torchaudio's resampler against `scripts/reference/whisper.py`'s
//! fixtures, recorded from ComfyUI itself (its `WhisperLargeV3` with tiny dims, run as its `encode_audio`
//! does) and torchaudio 2.11.1: the resampled clip, the log-mel features (of one clip and of a batch, whose
//! floor is shared), every layer's state, both key layouts, other rate pairs, and the files refused.

use std::collections::BTreeMap;

use kiln_compute::memory::SafetensorsFile;
use kiln_compute::{Backend as _, DType};
use kiln_models::Header;
use kiln_models::resample::{Resampler, resample};
use kiln_models::whisper::{self, Config, FRAMES, Layout, Whisper};

use crate::common::{TempTensors, assert_close, assert_within, cpu, fixture, read_tensors};

type Tensors = BTreeMap<String, (Vec<usize>, Vec<f32>)>;

/// The fixture's tiny encoder.
const TINY: Config = Config { mels: 128, width: 80, layers: 3 };

/// `features` `[B, mels, FRAMES]` split into its first `head` frames `[B, mels, head]` and the rest.
fn split_frames(features: &[f32], head: usize) -> (Vec<f32>, Vec<f32>) {
    let (mut first, mut rest) = (Vec::new(), Vec::new());
    for row in features.chunks_exact(FRAMES) {
        first.extend_from_slice(&row[..head]);
        rest.extend_from_slice(&row[head..]);
    }
    (first, rest)
}

/// Each channel of `[.., T]` resampled.
fn resample_rows(x: &[f32], len: usize, orig: u32, new: u32) -> Vec<f32> {
    let r = Resampler::new(orig, new).unwrap();
    x.chunks_exact(len).flat_map(|row| r.apply(row)).collect()
}

/// The encoder of `file` run on the features of `audio` `[B, C, T]` at 16 kHz: every state.
fn run(file: &std::path::Path, layout: Layout, features: &[f32], batch: usize) -> Vec<Vec<f32>> {
    let sf = SafetensorsFile::open(file).unwrap();
    let header = Header::new(&sf, "");
    let (config, found) = whisper::detect(&header).unwrap().expect("a Whisper encoder");
    assert_eq!((config, found), (TINY, layout));
    let (b, manager) = cpu(64 << 20);
    let weights =
        manager.load(&whisper::load_plan(&header, &config, layout), &mut |_, _| {}).unwrap();
    let model = Whisper::new(config, weights);
    let mel = b.from_f32(&[batch, config.mels, FRAMES], features, DType::F32).unwrap();
    let out = model.forward(&*b, &mel).unwrap();
    assert_eq!(out.states.len(), config.layers + 1);
    assert_eq!(b.to_f32(&out.last).unwrap(), b.to_f32(&out.states[config.layers]).unwrap());
    out.states.iter().map(|s| b.to_f32(s).unwrap()).collect()
}

#[test]
fn whisper_encodes_audio_as_comfyui() {
    let io = read_tensors("whisper/io.safetensors");
    let (audio_shape, audio) = &io["audio"];
    let &[batch, channels, samples] = audio_shape.as_slice() else { panic!("audio [B, C, T]") };

    // torchaudio's resample to 16 kHz, per channel.
    let (resampled_shape, want) = &io["resampled"];
    let resampled = resample_rows(audio, samples, 24000, 16000);
    assert_within("resampled", &resampled, want, 1e-5);
    assert_close("resampled", &resampled, want, 1e-4);

    // The features: the fixture keeps the first frames; every later one is the floor (zeros after the clip).
    let shape = [batch, channels, resampled_shape[2]];
    let features = whisper::log_mel(&resampled, shape, TINY.mels).unwrap();
    let (want_head, want) = &io["features"];
    let (head, rest) = split_frames(&features, want_head[2]);
    assert_close("features", &head, want, 1e-4);
    let floor = io["features_floor"].1[0];
    assert_within("features after the clip", &rest, &vec![floor; rest.len()], 1e-4 * floor.abs());

    let states = run(&fixture("whisper/weights.safetensors"), Layout::Hf, &features, batch);
    for (i, got) in states.iter().enumerate() {
        assert_close(&format!("state {i}"), got, &io[&format!("state.{i}")].1, 1e-4);
    }

    // ComfyUI's encode_audio end to end: the same, and the resampled length.
    let sf = SafetensorsFile::open(fixture("whisper/weights.safetensors")).unwrap();
    let header = Header::new(&sf, "");
    let (b, manager) = cpu(64 << 20);
    let weights =
        manager.load(&whisper::load_plan(&header, &TINY, Layout::Hf), &mut |_, _| {}).unwrap();
    let model = Whisper::new(TINY, weights);
    let encoded = model.encode_audio(&*b, audio, [batch, channels, samples], 24000).unwrap();
    assert_eq!(encoded.samples, resampled_shape[2]);
    assert_eq!(encoded.output.last.shape(), [batch, whisper::POSITIONS, TINY.width]);
    let last = b.to_f32(&encoded.output.last).unwrap();
    assert_close("encode_audio", &last, &io[&format!("state.{}", TINY.layers)].1, 1e-4);
}

#[test]
fn whisper_features_floor_over_the_whole_batch() {
    let io = read_tensors("whisper/io.safetensors");
    let (shape, audio) = &io["batch.audio"];
    let &[batch, channels, samples] = shape.as_slice() else { panic!("audio [B, C, T]") };
    let features = whisper::log_mel(audio, [batch, channels, samples], TINY.mels).unwrap();
    let (want_shape, want) = &io["batch.features"];
    let (head, rest) = split_frames(&features, want_shape[2]);
    assert_close("batch features", &head, want, 1e-4);
    let floor = io["batch.features_floor"].1[0];
    assert_within("batch features after the clips", &rest, &vec![floor; rest.len()], 1e-4);
}

#[test]
fn whisper_reads_both_layouts_and_ignores_the_decoder() {
    let io = read_tensors("whisper/io.safetensors");
    let weights = read_tensors("whisper/weights.safetensors");
    let (resampled_shape, resampled) = &io["resampled"];
    let shape = [resampled_shape[0], resampled_shape[1], resampled_shape[2]];
    let features = whisper::log_mel(resampled, shape, TINY.mels).unwrap();
    let want = &io[&format!("state.{}", TINY.layers)].1;

    // The released file holds the decoder too.
    let mut with_decoder = weights.clone();
    with_decoder
        .insert("model.decoder.embed_positions.weight".into(), (vec![4, 80], vec![0.5; 320]));
    with_decoder
        .insert("model.decoder.layers.0.fc1.weight".into(), (vec![320, 80], vec![1.0; 25600]));
    let file = TempTensors::new("whisper-decoder", with_decoder);
    let states = run(&file.0, Layout::Hf, &features, 1);
    assert_close("with the decoder", &states[TINY.layers], want, 1e-4);

    let bare: Tensors = weights
        .into_iter()
        .map(|(name, t)| (name.strip_prefix("model.").expect("model.encoder.*").to_owned(), t))
        .collect();
    let file = TempTensors::new("whisper-bare", bare);
    let states = run(&file.0, Layout::Bare, &features, 1);
    assert_close("encoder.* layout", &states[TINY.layers], want, 1e-4);
}

#[test]
fn whisper_refuses_a_width_not_divisible_by_twenty() {
    let mut weights = read_tensors("whisper/weights.safetensors");
    weights
        .insert("model.encoder.conv1.weight".into(), (vec![90, 128, 3], vec![0.0; 90 * 128 * 3]));
    weights.insert(
        "model.encoder.embed_positions.weight".into(),
        (vec![1500, 90], vec![0.0; 135_000]),
    );
    let file = TempTensors::new("whisper-width", weights);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = whisper::detect(&Header::new(&sf, "")).unwrap_err().to_string();
    assert!(err.contains("20 attention heads") && err.contains("90"), "{err}");

    // A misshapen weight is named.
    let mut weights = read_tensors("whisper/weights.safetensors");
    weights.insert("model.encoder.layers.1.fc1.weight".into(), (vec![160, 80], vec![0.0; 12_800]));
    let file = TempTensors::new("whisper-fc1", weights);
    let sf = SafetensorsFile::open(&file.0).unwrap();
    let err = whisper::detect(&Header::new(&sf, "")).unwrap_err().to_string();
    assert!(
        err.contains("model.encoder.layers.1.fc1.weight") && err.contains("[320, 80]"),
        "{err}"
    );

    // Another model is not a Whisper encoder.
    let sf = SafetensorsFile::open(fixture("clip_vision/clip.safetensors")).unwrap();
    assert!(whisper::detect(&Header::new(&sf, "")).unwrap().is_none());
}

#[test]
fn whisper_expected_shapes_are_the_released_names() {
    let shapes = whisper::expected_shapes(&Config::large_v3());
    let get = |name: &str| shapes.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone());
    assert_eq!(get("model.encoder.conv1.weight"), Some(vec![1280, 128, 3]));
    assert_eq!(get("model.encoder.layers.31.fc1.weight"), Some(vec![5120, 1280]));
    assert_eq!(get("model.encoder.layers.0.self_attn.k_proj.bias"), None);
    assert_eq!(shapes.len(), 5 + 32 * 15 + 2);
    // The fixture's file has exactly these names for its config.
    let weights = read_tensors("whisper/weights.safetensors");
    let names: Vec<&String> = weights.keys().collect();
    let mut want: Vec<String> =
        whisper::expected_shapes(&TINY).into_iter().map(|(n, _)| n).collect();
    want.sort();
    assert_eq!(names, want.iter().collect::<Vec<_>>());
}

#[test]
fn resample_matches_torchaudio_for_other_rates() {
    let io = read_tensors("whisper/io.safetensors");
    let mut cases = 0;
    for (name, (shape, input)) in &io {
        let Some(pair) = name.strip_prefix("resample.").and_then(|n| n.strip_suffix(".in")) else {
            continue;
        };
        let (orig, new) = pair.split_once('_').unwrap();
        let (orig, new): (u32, u32) = (orig.parse().unwrap(), new.parse().unwrap());
        let (want_shape, want) = &io[&format!("resample.{pair}.out")];
        let len = shape[1];
        assert_eq!(Resampler::new(orig, new).unwrap().output_len(len), want_shape[1], "{pair}");
        let got = resample_rows(input, len, orig, new);
        assert_within(&format!("resample {pair}"), &got, want, 1e-5);
        assert_close(&format!("resample {pair}"), &got, want, 1e-4);
        if orig == new {
            assert_eq!(&got, input);
        }
        cases += 1;
    }
    assert_eq!(cases, 8);
    assert!(resample(&[0.0; 4], 16000, 0).is_err());
}
