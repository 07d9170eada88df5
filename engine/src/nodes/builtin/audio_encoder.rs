//! Audio encoders (`comfy_extras.nodes_audio_encoder`): `AudioEncoderLoader` loads one from `audio_encoders/`
//! (Whisper large-v3, [`kiln_models::whisper`], or wav2vec2, [`kiln_models::wav2vec2`]), and
//! `AudioEncoderEncode` runs a clip through it as ComfyUI's `encode_audio` does: resampled to 16 kHz, then the
//! encoder (Whisper: the channels averaged, padded or cut to 30 s, log-mel features; wav2vec2: the channels
//! averaged, the raw waveform); its output is every layer's state (what HuMo reads) and the resampled clip's
//! length.

use std::sync::Arc;

use kiln_compute::Backend;

use super::audio::audio;
use super::loaders::{find, progress};
use crate::compute::Compute;
use crate::media::Audio;
use crate::models::device::{OnDevice, on_device, to_host};
use crate::models::{AudioEncoder, AudioEncoderNet, AudioEncoderOutput, ModelEnv, load};
use crate::nodes::error::node_error;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's module of these nodes.
const MODULE: &str = "comfy_extras.nodes_audio_encoder";

/// `AudioEncoderLoader`: an audio encoder from `audio_encoders/`.
pub(super) struct AudioEncoderLoader(pub(super) ModelEnv);

impl Node for AudioEncoderLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("audio_encoders");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("AudioEncoderLoader", "Load Audio Encoder", "model/loaders")
                .python_module(MODULE)
                .v3()
                .input(InputDef::v3_combo("audio_encoder_name", &files))
                .output(OutputDef::new("AUDIO_ENCODER"))
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "audio_encoders", inputs, "audio_encoder_name")?;
        let net =
            load::load_audio_encoder(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::AudioEncoder(Arc::new(net))]))
    }
}

/// `AudioEncoderEncode`.
pub(super) struct AudioEncoderEncode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl AudioEncoderEncode {
    pub(super) fn new(compute: Arc<Compute>) -> AudioEncoderEncode {
        let spec = NodeSpec::new("AudioEncoderEncode", "", "model/conditioning")
            .python_module(MODULE)
            .v3()
            .input(InputDef::typed("audio_encoder", "AUDIO_ENCODER"))
            .input(InputDef::typed("audio", "AUDIO"))
            .output(OutputDef::new("AUDIO_ENCODER_OUTPUT"));
        AudioEncoderEncode { spec: Arc::new(spec), compute }
    }
}

impl Node for AudioEncoderEncode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let encoder = inputs.audio_encoder("audio_encoder")?;
        let audio = audio(inputs, "audio", "AudioEncoderEncode")?;
        let output = encode(&self.compute, encoder, &audio)?;
        Ok(NodeResult::values([Value::AudioEncoderOutput(Arc::new(output))]))
    }
}

/// `audio` through `encoder` on the compute device, its states brought back to the host.
pub(crate) fn encode(
    compute: &Compute,
    encoder: &AudioEncoder,
    audio: &Audio,
) -> Result<AudioEncoderOutput, NodeError> {
    on_device(compute.device(), Encode { encoder, audio }).map_err(node_error)
}

/// One clip batch through the encoder.
struct Encode<'a> {
    encoder: &'a AudioEncoder,
    audio: &'a Audio,
}

impl OnDevice for Encode<'_> {
    type Output = Result<AudioEncoderOutput, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        let waveform = self.audio.waveform();
        let shape = [self.audio.batch(), self.audio.channels(), self.audio.samples()];
        let rate = self.audio.sample_rate();
        // As ComfyUI loads the model before it encodes: top residency priority.
        let encoding = match self.encoder.net.as_ref() {
            AudioEncoderNet::Whisper(net) => {
                net.weights.activate()?;
                net.encode_audio(b, waveform.data(), shape, rate)?
            }
            AudioEncoderNet::Wav2Vec2(net) => {
                net.weights.activate()?;
                net.encode_audio(b, waveform.data(), shape, rate)?
            }
        };
        // (The last state, ComfyUI's `encoded_audio`, is the last of the states.)
        Ok(AudioEncoderOutput {
            layers: encoding
                .output
                .states
                .iter()
                .map(|t| to_host(b, t))
                .collect::<kiln_models::Result<_>>()?,
            samples: encoding.samples,
        })
    }
}

/// Encoder frames per second (Whisper's and wav2vec2's 20 ms hop).
const ENCODER_FPS: f64 = 50.0;
/// Feature frames per second HuMo and InfiniteTalk read (their videos' 25 fps).
pub(super) const VIDEO_FPS: f64 = 25.0;

/// ComfyUI's `linear_interpolation(features, 50, fps)` (nodes_wan's, for HuMo's, InfiniteTalk's and S2V's
/// audio): `frames` feature frames `[frames, C]` resampled to ⌊frames / 50 · fps⌋ by
/// `F.interpolate(mode="linear", align_corners=True)` (f32 positions, as torch computes them).
pub(super) fn resample_frames(
    features: &[f32],
    frames: usize,
    channels: usize,
    fps: f64,
) -> Vec<f32> {
    let out_frames = (frames as f64 / ENCODER_FPS * fps) as usize;
    let scale =
        if out_frames > 1 { (frames as f32 - 1.0) / (out_frames as f32 - 1.0) } else { 0.0 };
    let mut out = Vec::with_capacity(out_frames * channels);
    for i in 0..out_frames {
        let position = scale * i as f32;
        let at = (position.floor() as usize).min(frames.saturating_sub(1));
        let next = if at + 1 < frames { at + 1 } else { at };
        let lambda = position - at as f32;
        let (a, b) =
            (&features[at * channels..][..channels], &features[next * channels..][..channels]);
        out.extend(a.iter().zip(b).map(|(a, b)| (1.0 - lambda) * a + lambda * b));
    }
    out
}

/// The encoder's states from `first` on, each the first clip's `[frames, width]` resampled from 50 frames a
/// second to `fps` ([`resample_frames`]), with the states' width.
pub(super) fn resampled_states(
    output: &AudioEncoderOutput,
    first: usize,
    fps: f64,
) -> Result<(Vec<Vec<f32>>, usize), NodeError> {
    let (tokens, width) = match output.layers.first().map(Tensor::shape) {
        Some(&[_, tokens, width]) if tokens > 0 => (tokens, width),
        other => {
            return Err(NodeError::new(format!(
                "audio encoder states [B, frames, width], got {other:?}"
            )));
        }
    };
    let states = output.layers[first.min(output.layers.len())..]
        .iter()
        .map(|state| resample_frames(&state.data()[..tokens * width], tokens, width, fps))
        .collect();
    Ok((states, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `AudioEncoderLoader` takes a Whisper file and both wav2vec2 configurations, and `AudioEncoderEncode` gives
    /// ComfyUI's states on a stereo 24 kHz clip (kiln-models' fixtures, recorded from ComfyUI's own encoders by
    /// `scripts/reference/whisper.py` and `wav2vec2.py`).
    #[test]
    fn whisper_and_wav2vec2_files_encode_a_clip_as_comfyui() {
        let dir = std::env::temp_dir().join(format!("kiln-audio-encoders-{}", std::process::id()));
        let folder = dir.join("audio_encoders");
        std::fs::create_dir_all(&folder).unwrap();
        let fixtures =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tests/fixtures");
        let env = ModelEnv::cpu(&dir);
        for (weights, io, prefix) in [
            ("whisper/weights.safetensors", "whisper/io.safetensors", ""),
            ("wav2vec2/large.safetensors", "wav2vec2/io.safetensors", "large."),
            ("wav2vec2/base.safetensors", "wav2vec2/io.safetensors", "base."),
        ] {
            let path = folder.join(weights.replace('/', "-"));
            std::fs::copy(fixtures.join(weights), &path).unwrap();
            let encoder = load::load_audio_encoder(&env, &path, &mut |_, _| {}).unwrap();
            let io = crate::fixtures::tensors(&format!("../../models/tests/fixtures/{io}"));
            let audio = Audio::new(io["audio"].clone(), 24000).unwrap();
            let output = encode(&env.compute, &encoder, &audio).unwrap();
            assert_eq!(output.samples, audio.samples() * 2 / 3, "{weights}");
            for (i, state) in output.layers.iter().enumerate() {
                let want = &io[&format!("{prefix}state.{i}")];
                assert_eq!(state.shape(), want.shape(), "{weights} state {i}");
                let scale = want.data().iter().fold(1e-6f32, |m, v| m.max(v.abs()));
                let worst = state
                    .data()
                    .iter()
                    .zip(want.data())
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(worst <= 1e-4 * scale, "{weights} state {i}: max |difference| {worst}");
            }
        }
        // Another file is refused, naming what Kiln runs.
        let other = fixtures.join("wan/humo.safetensors");
        let err = load::load_audio_encoder(&env, &other, &mut |_, _| {}).unwrap_err().to_string();
        assert!(err.contains("Whisper large-v3, wav2vec2"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
