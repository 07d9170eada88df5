//! The audio nodes of `comfy_extras.nodes_audio` that make, split, join, mix and filter clips:
//! `EmptyAudio`, `SplitAudioChannels`, `JoinAudioChannels`, `AudioMerge`, `AudioAdjustVolume` and
//! `AudioEqualizer3Band`, and the sample-rate matching `AudioConcat` shares with them.
//!
//! Invariant: as in ComfyUI, a missing clip (`None`, e.g. the audio of a silent video) passes through: these
//! nodes give `None` for `None`, and a two-input node gives the other input when one is `None`. Two clips of
//! different rates meet at the higher one, the other resampled as torchaudio's `resample` does.

use std::sync::Arc;

use super::video::{MediaNode, audio_input, media_error};
use crate::media::{Audio, Biquad};
use crate::nodes::{ErrorKind, InputDef, Inputs, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// A clip as a node's output value.
fn value(audio: Audio) -> Value {
    Value::Audio(Arc::new(audio))
}

/// A node's failure with ComfyUI's message.
fn invalid(message: impl Into<String>) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// A waveform of `shape` from `data`, as a clip at `rate`.
pub(super) fn clip(shape: Vec<usize>, data: Vec<f32>, rate: u32) -> Result<Audio, NodeError> {
    let waveform = Tensor::new(shape, data).map_err(|e| NodeError::new(e.to_string()))?;
    Audio::new(waveform, rate).map_err(media_error)
}

/// The spec of a node of `nodes_audio`.
fn audio_spec(name: &str, display: &str) -> NodeSpec {
    NodeSpec::new(name, display, "audio").python_module("comfy_extras.nodes_audio").v3()
}

/// An `AUDIO` input.
fn audio_in(name: &str) -> InputDef {
    InputDef::typed(name, "AUDIO").with_options()
}

/// Both clips at the higher of their rates (ComfyUI's `match_audio_sample_rates`).
pub(super) fn match_rates(a: &Audio, b: &Audio) -> Result<(Audio, Audio), NodeError> {
    let rate = a.sample_rate().max(b.sample_rate());
    Ok((a.resampled(rate).map_err(media_error)?, b.resampled(rate).map_err(media_error)?))
}

/// `EmptyAudio`: `duration` seconds of silence at `sample_rate` in `channels` channels.
pub(super) fn empty_audio() -> MediaNode {
    let spec = audio_spec("EmptyAudio", "Empty Audio")
        .input(
            InputDef::bare("duration", "FLOAT")
                .tooltip("Duration of the empty audio clip in seconds")
                .option("default", 60.0)
                .option("min", 0.0)
                .option("max", u64::MAX)
                .option("step", 0.01),
        )
        .input(
            InputDef::bare("sample_rate", "INT")
                .tooltip("Sample rate of the empty audio clip.")
                .option("advanced", true)
                .option("default", 44100)
                .option("min", 1)
                .option("max", 192000),
        )
        .input(
            InputDef::bare("channels", "INT")
                .tooltip("Number of audio channels (1 for mono, 2 for stereo).")
                .option("advanced", true)
                .option("default", 2)
                .option("min", 1)
                .option("max", 2),
        )
        .output(OutputDef::new("AUDIO"))
        .aliases(&["blank audio"]);
    MediaNode::new(spec, |inputs, _| {
        let rate = u32::try_from(inputs.int("sample_rate")?)
            .ok()
            .filter(|&r| r > 0)
            .ok_or_else(|| invalid("EmptyAudio: the sample rate must be a positive integer"))?;
        let channels = usize::try_from(inputs.int("channels")?)
            .ok()
            .filter(|c| (1..=2).contains(c))
            .ok_or_else(|| invalid("EmptyAudio: channels must be 1 or 2"))?;
        let samples = silent_samples(inputs.float("duration")?, rate)?;
        let data = vec![0.0; channels * samples];
        Ok(NodeResult::values([value(clip(vec![1, channels, samples], data, rate)?)]))
    })
}

/// Samples in `duration` seconds at `rate`: Python's `int(round(duration * rate))`, halves to even.
fn silent_samples(duration: f64, rate: u32) -> Result<usize, NodeError> {
    let samples = (duration * f64::from(rate)).round_ties_even();
    // A billion samples (over 6 hours at 44.1 kHz, 4 GB a channel) is past any clip a workflow makes.
    if !(0.0..=1e9).contains(&samples) {
        return Err(invalid(format!(
            "EmptyAudio: {duration} s at {rate} Hz is {samples} samples; at most 1e9 are made"
        )));
    }
    Ok(samples as usize)
}

/// `SplitAudioChannels`: a stereo clip's left and right channels as two mono clips.
pub(super) fn split_audio_channels() -> MediaNode {
    let spec = audio_spec("SplitAudioChannels", "Split Audio Channels")
        .description("Separates the audio into left and right channels.")
        .input(audio_in("audio"))
        .output(OutputDef::new("AUDIO").named("left"))
        .output(OutputDef::new("AUDIO").named("right"))
        .aliases(&["stereo to mono"]);
    MediaNode::new(spec, |inputs, _| {
        let Some(audio) = audio_input(inputs, "audio")? else {
            return Ok(NodeResult::values([Value::none(), Value::none()]));
        };
        if audio.channels() != 2 {
            return Err(invalid(format!(
                "AudioSplit: Input audio must be stereo (2 channels), got {} channel(s).",
                audio.channels()
            )));
        }
        let channel = |c: usize| -> Result<Value, NodeError> {
            let data = (0..audio.batch()).flat_map(|b| audio.channel(b, c).to_vec()).collect();
            Ok(value(clip(vec![audio.batch(), 1, audio.samples()], data, audio.sample_rate())?))
        };
        Ok(NodeResult::values([channel(0)?, channel(1)?]))
    })
}

/// The clips of a two-input node.
pub(super) enum Pair {
    /// Both are there.
    Both(Arc<Audio>, Arc<Audio>),
    /// One or both are `None`: the node gives this (the other clip, or `None`).
    Passed(Value),
}

impl Pair {
    /// The clips of inputs `first` and `second`.
    pub(super) fn of(inputs: &Inputs, first: &str, second: &str) -> Result<Pair, NodeError> {
        Ok(match (audio_input(inputs, first)?, audio_input(inputs, second)?) {
            (Some(a), Some(b)) => Pair::Both(a.clone(), b.clone()),
            (Some(one), None) | (None, Some(one)) => Pair::Passed(Value::Audio(one.clone())),
            (None, None) => Pair::Passed(Value::none()),
        })
    }
}

/// `JoinAudioChannels`: two mono clips as the left and right channels of one, at the higher rate and the
/// shorter length.
pub(super) fn join_audio_channels() -> MediaNode {
    let spec = audio_spec("JoinAudioChannels", "Join Audio Channels")
        .description("Joins left and right mono audio channels into a stereo audio.")
        .input(audio_in("audio_left"))
        .input(audio_in("audio_right"))
        .output(OutputDef::new("AUDIO").named("audio"));
    MediaNode::new(spec, |inputs, _| match Pair::of(inputs, "audio_left", "audio_right")? {
        Pair::Both(left, right) => Ok(NodeResult::values([value(join(&left, &right)?)])),
        Pair::Passed(passed) => Ok(NodeResult::values([passed])),
    })
}

/// Mono `left` and `right` as one stereo clip at the higher rate, cut to the shorter length.
fn join(left: &Audio, right: &Audio) -> Result<Audio, NodeError> {
    if left.channels() != 1 || right.channels() != 1 {
        return Err(invalid("AudioJoin: Both input audios must be mono."));
    }
    let (left, right) = match_rates(left, right)?;
    if left.batch() != right.batch() {
        return Err(invalid(format!(
            "JoinAudioChannels: cannot join a batch of {} clips with a batch of {}",
            left.batch(),
            right.batch()
        )));
    }
    let samples = left.samples().min(right.samples());
    let data = (0..left.batch())
        .flat_map(|b| [&left.channel(b, 0)[..samples], &right.channel(b, 0)[..samples]])
        .flatten()
        .copied()
        .collect();
    clip(vec![left.batch(), 2, samples], data, left.sample_rate())
}

/// How `AudioMerge` combines two waveforms.
#[derive(Debug, Clone, Copy)]
enum Merge {
    Add,
    Mean,
    Subtract,
    Multiply,
}

impl Merge {
    /// The method a `merge_method` choice names.
    fn of(name: &str) -> Result<Merge, NodeError> {
        Ok(match name {
            "add" => Merge::Add,
            "mean" => Merge::Mean,
            "subtract" => Merge::Subtract,
            "multiply" => Merge::Multiply,
            other => return Err(invalid(format!("AudioMerge: unknown merge_method `{other}`"))),
        })
    }

    /// One sample of the first clip combined with one of the second.
    fn apply(self, a: f32, b: f32) -> f32 {
        match self {
            Merge::Add => a + b,
            Merge::Mean => (a + b) / 2.0,
            Merge::Subtract => a - b,
            Merge::Multiply => a * b,
        }
    }
}

/// `AudioMerge`: two clips overlaid sample by sample at the higher rate, the second cut or padded with silence
/// to the first's length, a clip of one channel (or a batch of one) spread over the other's, scaled back under 1
/// when the result peaks above it.
pub(super) fn audio_merge() -> MediaNode {
    let spec = audio_spec("AudioMerge", "Merge Audio")
        .description("Combine two audio tracks by overlaying their waveforms.")
        .input(audio_in("audio1"))
        .input(audio_in("audio2"))
        .input(
            InputDef::bare("merge_method", "COMBO")
                .tooltip("The method used to combine the audio waveforms.")
                .option("multiselect", false)
                .option("options", vec!["add", "mean", "subtract", "multiply"]),
        )
        .output(OutputDef::new("AUDIO"))
        .aliases(&["mix audio", "overlay audio", "layer audio"]);
    MediaNode::new(spec, |inputs, _| {
        let (a, b) = match Pair::of(inputs, "audio1", "audio2")? {
            Pair::Both(a, b) => (a, b),
            Pair::Passed(passed) => return Ok(NodeResult::values([passed])),
        };
        let method = Merge::of(inputs.string("merge_method")?)?;
        let (a, b) = match_rates(&a, &b)?;
        if a.samples() == 0 || b.samples() == 0 {
            return Ok(NodeResult::values([value(a)]));
        }
        Ok(NodeResult::values([value(merge(&a, &b, method)?)]))
    })
}

/// `a` and `b` (at one rate, neither empty) combined by `method`, `b` cut or padded to `a`'s length and its
/// batch and channels broadcast as torch broadcasts them, then divided by the peak when it passes 1.
fn merge(a: &Audio, b: &Audio, method: Merge) -> Result<Audio, NodeError> {
    let spread = |x: usize, y: usize, what: &str| -> Result<usize, NodeError> {
        match (x, y) {
            _ if x == y => Ok(x),
            (1, n) | (n, 1) => Ok(n),
            _ => Err(invalid(format!("AudioMerge: cannot overlay {x} {what} on {y} {what}"))),
        }
    };
    let batch = spread(a.batch(), b.batch(), "clips")?;
    let channels = spread(a.channels(), b.channels(), "channels")?;
    let samples = a.samples();
    fn row(audio: &Audio, i: usize, c: usize) -> &[f32] {
        audio.channel(i.min(audio.batch() - 1), c.min(audio.channels() - 1))
    }
    let mut data = Vec::with_capacity(batch * channels * samples);
    for i in 0..batch {
        for c in 0..channels {
            let (x, y) = (row(a, i, c), row(b, i, c));
            let padded = y.iter().copied().chain(std::iter::repeat(0.0));
            data.extend(x.iter().zip(padded).map(|(&x, y)| method.apply(x, y)));
        }
    }
    let peak = data.iter().fold(0f32, |m, v| m.max(v.abs()));
    if peak > 1.0 {
        for v in &mut data {
            *v /= peak;
        }
    }
    clip(vec![batch, channels, samples], data, a.sample_rate())
}

/// `AudioAdjustVolume`: the clip times `10^(volume / 20)`.
pub(super) fn audio_adjust_volume() -> MediaNode {
    let spec = audio_spec("AudioAdjustVolume", "Adjust Audio Volume")
        .description("Adjust the volume of the audio by a specified amount in decibels (dB).")
        .input(audio_in("audio"))
        .input(
            InputDef::bare("volume", "INT")
                .tooltip("Volume adjustment in decibels (dB). 0 = no change, +6 = double, -6 = half, etc")
                .option("default", 1)
                .option("min", -100)
                .option("max", 100),
        )
        .output(OutputDef::new("AUDIO"))
        .aliases(&["audio gain", "loudness", "audio level"]);
    MediaNode::new(spec, |inputs, _| {
        let Some(audio) = audio_input(inputs, "audio")? else {
            return Ok(NodeResult::values([Value::none()]));
        };
        let volume = inputs.int("volume")?;
        if volume == 0 {
            return Ok(NodeResult::values([Value::Audio(audio.clone())]));
        }
        Ok(NodeResult::values([value(adjust_volume(audio, volume)?)]))
    })
}

/// `audio` times `10^(volume / 20)`: Python's power in f64, applied to the f32 waveform as an f32 scalar.
fn adjust_volume(audio: &Audio, volume: i64) -> Result<Audio, NodeError> {
    let gain = 10f64.powf(volume as f64 / 20.0) as f32;
    audio
        .map_channels(audio.sample_rate(), |x| x.iter().map(|v| v * gain).collect())
        .map_err(media_error)
}

/// `AudioEqualizer3Band`: a low shelf, a peak and a high shelf, each applied when its gain is not 0.
pub(super) fn audio_equalizer_3band() -> MediaNode {
    let gain = |name: &str, tooltip: &str| {
        InputDef::bare(name, "FLOAT")
            .tooltip(tooltip)
            .option("default", 0.0)
            .option("min", -24.0)
            .option("max", 24.0)
            .option("step", 0.1)
    };
    let freq = |name: &str, tooltip: &str, default: i64, min: i64, max: i64| {
        InputDef::bare(name, "INT")
            .tooltip(tooltip)
            .option("default", default)
            .option("min", min)
            .option("max", max)
    };
    let spec = audio_spec("AudioEqualizer3Band", "Audio Equalizer (3-Band)")
        .experimental()
        .input(audio_in("audio"))
        .input(gain("low_gain_dB", "Gain for Low frequencies (Bass)"))
        .input(freq("low_freq", "Cutoff frequency for Low shelf", 100, 20, 500))
        .input(gain("mid_gain_dB", "Gain for Mid frequencies"))
        .input(freq("mid_freq", "Center frequency for Mids", 1000, 200, 4000))
        .input(
            InputDef::bare("mid_q", "FLOAT")
                .tooltip("Q factor (bandwidth) for Mids")
                .option("default", 0.707)
                .option("min", 0.1)
                .option("max", 10.0)
                .option("step", 0.1),
        )
        .input(gain("high_gain_dB", "Gain for High frequencies (Treble)"))
        .input(freq("high_freq", "Cutoff frequency for High shelf", 5000, 1000, 15000))
        .output(OutputDef::new("AUDIO"))
        .aliases(&["eq", "bass boost", "treble boost", "equalizer"]);
    MediaNode::new(spec, |inputs, _| {
        let Some(audio) = audio_input(inputs, "audio")? else {
            return Ok(NodeResult::values([Value::none()]));
        };
        let float = |name: &str| inputs.float(name).map(|v| v as f32);
        let bands = Bands {
            low: (float("low_gain_dB")?, float("low_freq")?),
            mid: (float("mid_gain_dB")?, float("mid_freq")?, float("mid_q")?),
            high: (float("high_gain_dB")?, float("high_freq")?),
        };
        if audio.samples() == 0 {
            return Ok(NodeResult::values([Value::Audio(audio.clone())]));
        }
        Ok(NodeResult::values([value(bands.apply(audio)?)]))
    })
}

/// `AudioEqualizer3Band`'s settings: each band's gain in dB and frequency in Hz, and the peak's Q.
struct Bands {
    low: (f32, f32),
    mid: (f32, f32, f32),
    high: (f32, f32),
}

impl Bands {
    /// The shelves' fixed Q.
    const SHELF_Q: f32 = 0.707;

    /// `audio` through the bands whose gain is not 0, low to high.
    fn apply(&self, audio: &Audio) -> Result<Audio, NodeError> {
        let rate = audio.sample_rate();
        let (low, (mid_gain, mid_freq, mid_q), high) = (self.low, self.mid, self.high);
        let filters: Vec<Biquad> = [
            (low.0 != 0.0).then(|| Biquad::bass(rate, low.0, low.1, Self::SHELF_Q)),
            (mid_gain != 0.0).then(|| Biquad::peaking(rate, mid_gain, mid_freq, mid_q)),
            (high.0 != 0.0).then(|| Biquad::treble(rate, high.0, high.1, Self::SHELF_Q)),
        ]
        .into_iter()
        .flatten()
        .collect();
        audio
            .map_channels(rate, |x| {
                filters.iter().fold(x.to_vec(), |signal, filter| filter.apply(&signal))
            })
            .map_err(media_error)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// The clips of `scripts/reference/audio_nodes.py` and their rates.
    fn fixture() -> (BTreeMap<String, Tensor>, serde_json::Value) {
        let io = crate::fixtures::tensors("audio_nodes/io.safetensors");
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/audio_nodes/cases.json");
        let cases =
            serde_json::from_slice(&std::fs::read(path).expect("cases.json")).expect("json");
        (io, cases)
    }

    fn clip_of(io: &BTreeMap<String, Tensor>, cases: &serde_json::Value, name: &str) -> Audio {
        let rate = cases["rates"][name].as_u64().expect("a rate") as u32;
        Audio::new(io[name].clone(), rate).expect("audio")
    }

    /// The largest difference from ComfyUI's clip, relative to its peak; the shape and rate must agree.
    pub(in crate::nodes::builtin) fn assert_close(got: &Audio, want: &Audio, what: &str) {
        assert_eq!(got.waveform().shape(), want.waveform().shape(), "{what}");
        assert_eq!(got.sample_rate(), want.sample_rate(), "{what}");
        let peak = want.waveform().data().iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .waveform()
            .data()
            .iter()
            .zip(want.waveform().data())
            .fold(0f32, |m, (g, w)| m.max((g - w).abs()));
        assert!(worst <= 1e-4 * peak.max(1e-6), "{what}: off by {worst} (peak {peak})");
    }

    #[test]
    fn the_equalizer_matches_comfyuis() {
        let (io, cases) = fixture();
        let input = clip_of(&io, &cases, "eq.in");
        for name in ["eq.all", "eq.mid"] {
            let c = &cases["eq"][name];
            let f = |k: &str| c[k].as_f64().expect("a number") as f32;
            let bands = Bands {
                low: (f("low_gain_dB"), f("low_freq")),
                mid: (f("mid_gain_dB"), f("mid_freq"), f("mid_q")),
                high: (f("high_gain_dB"), f("high_freq")),
            };
            assert_close(
                &bands.apply(&input).expect("filtered"),
                &clip_of(&io, &cases, name),
                name,
            );
        }
    }

    #[test]
    fn merging_resamples_pads_broadcasts_and_rescales_as_comfyui() {
        let (io, cases) = fixture();
        let b = clip_of(&io, &cases, "merge.b");
        for (first, method, want) in [
            ("merge.a", Merge::Add, "merge.add"),
            ("merge.a", Merge::Mean, "merge.mean"),
            ("merge.a", Merge::Subtract, "merge.subtract"),
            ("merge.a", Merge::Multiply, "merge.multiply"),
            ("merge.loud", Merge::Add, "merge.loud_add"),
        ] {
            let (a, b) = match_rates(&clip_of(&io, &cases, first), &b).expect("rates");
            let merged = merge(&a, &b, method).expect("merged");
            assert_close(&merged, &clip_of(&io, &cases, want), want);
        }
        let peak = clip_of(&io, &cases, "merge.loud_add")
            .waveform()
            .data()
            .iter()
            .fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(peak, 1.0, "a peak past 1 is scaled back to 1");
    }

    #[test]
    fn joining_and_the_volume_match_comfyui() {
        let (io, cases) = fixture();
        let (left, right) = (clip_of(&io, &cases, "join.left"), clip_of(&io, &cases, "join.right"));
        assert_close(
            &join(&left, &right).expect("joined"),
            &clip_of(&io, &cases, "join.out"),
            "join",
        );
        assert!(join(&clip_of(&io, &cases, "merge.a"), &right).is_err(), "stereo is refused");
        let quieter = adjust_volume(&clip_of(&io, &cases, "merge.a"), -7).expect("volume");
        assert_close(&quieter, &clip_of(&io, &cases, "volume.out"), "volume");
    }

    #[test]
    fn empty_audio_rounds_halves_to_even_as_python() {
        assert_eq!(silent_samples(0.0125, 44100).expect("samples"), 551);
        assert_eq!(silent_samples(0.5, 3).expect("samples"), 2);
        assert_eq!(silent_samples(2.5, 1).expect("samples"), 2);
        assert!(silent_samples(1e12, 44100).is_err());
    }
}
