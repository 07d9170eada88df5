//! WanDancer's music features against `scripts/reference/wan_dancer_audio.py`'s fixtures, recorded from ComfyUI's
//! own `WanDancerEncodeAudio` (comfy_extras/nodes_wandancer.py at 0f1fa67a): the node's 35 features per frame,
//! tempi, onset peaks and beats for clips at 15360 Hz (where its resampling is the identity), the start tempo of a
//! stereo clip at 22050 Hz, an empty clip (one frame, as ComfyUI pads it), and the clips refused.

use kiln_models::music_features::{
    FEATURE_RATE, FEATURES, MusicFeatures, music_features, start_bpm,
};
use kiln_models::resample::Resampler;

use crate::common::{assert_close, fixture, read_tensors};

/// The fixtures' `cases.json`.
fn cases() -> serde_json::Map<String, serde_json::Value> {
    let path = fixture("wan_dancer_audio/cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(cases)) => cases,
        other => panic!("{}: not an object of cases: {other:?}", path.display()),
    }
}

/// A clip of `clips.safetensors` (16-bit PCM `[channels, samples]`) as ComfyUI's node reads it: each sample over
/// 32768, the channels averaged in f32.
fn mono_clip(case: &str) -> Vec<f32> {
    let path = fixture("wan_dancer_audio/clips.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let view = file.tensor(case).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(view.dtype(), safetensors::Dtype::I16, "{case}: 16-bit PCM");
    let &[channels, samples] = view.shape() else { panic!("{case}: [channels, samples]") };
    let pcm: Vec<f32> = view
        .data()
        .chunks_exact(2)
        .map(|c| f32::from(i16::from_le_bytes([c[0], c[1]])) / 32768.0)
        .collect();
    (0..samples)
        .map(|t| {
            let sum = (0..channels).fold(0f32, |s, c| s + pcm[c * samples + t]);
            sum / channels as f32
        })
        .collect()
}

/// A JSON value as f64.
fn number(case: &serde_json::Value, key: &str) -> f64 {
    case[key].as_f64().unwrap_or_else(|| panic!("{key}: not a number"))
}

/// A JSON list of frame indices.
fn frames(case: &serde_json::Value, key: &str) -> Vec<usize> {
    let list = case[key].as_array().unwrap_or_else(|| panic!("{key}: not a list"));
    list.iter().map(|v| v.as_u64().expect("a frame index") as usize).collect()
}

/// Asserts two tempi are the same (the JSON's decimal round trip aside).
#[track_caller]
fn assert_bpm(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() <= 1e-9 * want, "{what}: {got} bpm, want {want}");
}

/// Columns `range` of `[frames, FEATURES]` rows.
fn columns(values: &[f32], range: std::ops::Range<usize>) -> Vec<f32> {
    values.chunks_exact(FEATURES).flat_map(|row| row[range.clone()].to_vec()).collect()
}

/// The largest error of `got` against `want`, relative to `want`'s largest magnitude.
fn relative_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs())) / scale
}

/// Compares Kiln's features of a case with ComfyUI's, group by group.
fn check(case: &str, want: &serde_json::Value, got: &MusicFeatures, features: &[f32]) {
    assert_bpm(&format!("{case}: start tempo"), got.start_bpm, number(want, "start_bpm"));
    assert_bpm(&format!("{case}: tempo"), got.tempo, number(want, "tempo"));
    assert_eq!(got.peaks, frames(want, "peaks"), "{case}: onset peaks");
    assert_eq!(got.beats, frames(want, "beats"), "{case}: beats");
    assert_eq!(got.frames, number(want, "frames") as usize, "{case}: frames");
    assert_eq!(got.values.len(), features.len(), "{case}: values");
    for (name, range) in [("envelope", 0..1), ("mfcc", 1..21), ("chroma", 21..33)] {
        let (g, w) = (columns(&got.values, range.clone()), columns(features, range));
        eprintln!(
            "{case}: {name} max error {:.3e} of its largest magnitude",
            relative_error(&g, &w)
        );
        assert_close(&format!("{case}: {name}"), &g, &w, 1e-4);
    }
    assert_eq!(
        columns(&got.values, 33..35),
        columns(features, 33..35),
        "{case}: peak and beat one-hots"
    );
}

#[test]
fn music_features_match_comfyui() {
    let features = read_tensors("wan_dancer_audio/features.safetensors");
    let cases = cases();
    let mut checked = 0;
    for (case, want) in &cases {
        if want.get("tempo").is_none() {
            continue;
        }
        assert_eq!(
            number(want, "rate"),
            f64::from(FEATURE_RATE),
            "{case}: recorded at the feature rate"
        );
        let clip = mono_clip(case);
        let got = music_features(&clip, FEATURE_RATE).unwrap();
        let (shape, values) = &features[case.as_str()];
        assert_eq!(shape, &[got.frames, FEATURES], "{case}: features shape");
        check(case, want, &got, values);
        checked += 1;
    }
    assert_eq!(checked, 4, "the click, swing, short and empty cases");
}

#[test]
fn resampling_to_the_feature_rate_keeps_the_samples() {
    // torchaudio returns the waveform unchanged when the rates are equal, which the fixtures rely on.
    let clip = mono_clip("click");
    assert_eq!(Resampler::new(FEATURE_RATE, FEATURE_RATE).unwrap().apply(&clip), clip);
}

#[test]
fn start_tempo_of_a_stereo_clip_matches_comfyui() {
    let cases = cases();
    let want = &cases["stereo_22050"];
    let rate = number(want, "rate") as u32;
    assert_eq!((rate, number(want, "channels")), (22050, 2.0));
    let got = start_bpm(&mono_clip("stereo_22050"), rate).unwrap();
    assert_bpm("stereo start tempo", got, number(want, "start_bpm"));
}

#[test]
fn clips_without_features_are_refused() {
    for (clip, rate, says) in [
        (&[0.1, 0.2][..], 0, "at least 96 Hz, got 0 Hz"),
        (&[0.1; 20000][..], 95, "at least 96 Hz, got 95 Hz"),
        (&[0.1, f32::INFINITY][..], 15360, "sample 1 of the clip is inf"),
    ] {
        let err = music_features(clip, rate).unwrap_err().to_string();
        assert!(err.contains(says), "{err:?} should say {says:?}");
    }
    assert!(start_bpm(&[0.1], 95).is_err());
}
