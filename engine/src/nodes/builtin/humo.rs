//! `WanHuMoImageToVideo` (`comfy_extras.nodes_wan`): HuMo's conditioning. An empty Wan 2.1 latent; the reference
//! image (its first frame, resized bilinearly with a centre crop) encoded as the positive prompt's reference
//! latent, zeros as the negative's (a zero latent for both without an image); and the audio embedding HuMo's
//! blocks attend to, built from the Whisper states of `AudioEncoderEncode` (zeros on the negative prompt, and
//! on both without audio).
//!
//! The audio embedding, as ComfyUI builds it: the first `2·⌊samples / 640⌋` Whisper frames (50 per second) of
//! the first clip, five features per frame (the means of layers 0–7, 8–15, 16–23 and 24–31 and the last
//! state), each resampled linearly to 25 per second (`align_corners`), then one window of 8 feature frames per
//! latent frame: the first latent frame's is 3 zero frames and frames −2…2, latent frame k's frames 4k − 5 …
//! 4k + 2 (zeros outside the clip).

use std::sync::Arc;

use kiln_models::wan::Humo;

use super::audio_encoder::{VIDEO_FPS, resample_frames};
use super::vae::encode_video;
use super::wan::{VideoRequest, WAN21_CHANNELS, fit_frames, latent_frames, video_inputs};
use crate::compute::Compute;
use crate::models::{AudioEncoderOutput, CondExtras};
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// Resampled audio samples per Whisper frame pair: ComfyUI keeps `2·⌊samples / 640⌋` frames.
const SAMPLES_PER_FRAME_PAIR: usize = 640;
/// Feature frames in a latent frame's window, and layer groups of a feature (HuMo's `audio_proj` input).
const WINDOW: usize = Humo::WINDOW;
const GROUPS: usize = Humo::GROUPS;
/// Whisper layers averaged per group; the fifth group is the last state.
const LAYERS_PER_GROUP: usize = 8;
/// The states HuMo reads: 32 layers' inputs and the last state (Whisper large-v3's).
const STATES: usize = 4 * LAYERS_PER_GROUP + 1;
/// The feature width of the zero embedding without audio (ComfyUI's fixed 1280, Whisper large-v3's).
const SILENT_CHANNELS: usize = kiln_models::whisper::Config::large_v3().width;

/// `WanHuMoImageToVideo`.
pub(super) struct WanHuMoImageToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanHuMoImageToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanHuMoImageToVideo {
        let spec = NodeSpec::new("WanHuMoImageToVideo", "", "model/conditioning/wan/humo")
            .python_module("comfy_extras.nodes_wan")
            .v3()
            .experimental()
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"));
        let spec = video_inputs(spec, (832, 480), (16, 16), 97)
            .optional(InputDef::typed("audio_encoder_output", "AUDIO_ENCODER_OUTPUT"))
            .optional(InputDef::typed("ref_image", "IMAGE"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"));
        WanHuMoImageToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanHuMoImageToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let frames = latent_frames(length);
        let (h, w) = (height / 8, width / 8);
        let latent = Tensor::full(vec![batch, WAN21_CHANNELS, frames, h, w], 0.0);
        let (reference, negative_reference) = match inputs.get("ref_image") {
            Some(_) => {
                let image = fit_frames(inputs.image("ref_image")?, ..1, width, height)?;
                let encoded = encode_video(&self.compute, vae, &image, ctx)?;
                let zeros = Tensor::full(encoded.shape().to_vec(), 0.0);
                (encoded, zeros)
            }
            None => {
                let zeros = Tensor::full(vec![batch, WAN21_CHANNELS, 1, h, w], 0.0);
                (zeros.clone(), zeros)
            }
        };
        let (audio, negative_audio) = match inputs.get("audio_encoder_output") {
            Some(_) => {
                let embed =
                    audio_embed(inputs.audio_encoder_output("audio_encoder_output")?, length)?;
                let zeros = Tensor::full(embed.shape().to_vec(), 0.0);
                (embed, zeros)
            }
            None => {
                let zeros =
                    Tensor::full(vec![batch, frames + 1, WINDOW, GROUPS, SILENT_CHANNELS], 0.0);
                (zeros.clone(), zeros)
            }
        };
        let set = |reference: Tensor, audio: Tensor| {
            move |extras: &mut CondExtras| {
                extras.reference_latents.push(reference.clone());
                extras.audio_embed = Some(audio.clone());
            }
        };
        let positive = inputs.conditioning("positive")?.with_extras(set(reference, audio));
        let negative =
            inputs.conditioning("negative")?.with_extras(set(negative_reference, negative_audio));
        Ok(NodeResult::values([
            Value::Conditioning(Arc::new(positive)),
            Value::Conditioning(Arc::new(negative)),
            Value::Latent(Latent::new(latent)),
        ]))
    }
}

/// HuMo's audio embedding `[1, latent frames, 8, 5, C]` of a clip of `length` frames from Whisper's states (the
/// first clip of the batch), as `WanHuMoImageToVideo` builds it (see the module's doc).
fn audio_embed(output: &AudioEncoderOutput, length: usize) -> Result<Tensor, NodeError> {
    if output.layers.len() < STATES {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "HuMo reads Whisper large-v3's {STATES} states (32 layers and the last); this audio encoder \
                 gives {}: load whisper_large_v3",
                output.layers.len()
            ),
        ));
    }
    let &[_, tokens, channels] = output.layers[0].shape() else {
        return Err(NodeError::new(format!(
            "audio encoder states [B, frames, width], got {:?}",
            output.layers[0].shape()
        )));
    };
    let kept = tokens.min(output.samples / SAMPLES_PER_FRAME_PAIR * 2);
    if kept == 0 {
        // ComfyUI's interpolation to no frames raises.
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "HuMo needs at least 40 ms of audio ({SAMPLES_PER_FRAME_PAIR} samples at 16 kHz); this clip has {} \
                 after resampling",
                output.samples
            ),
        ));
    }
    // The first clip's first `kept` frames of a state, `[kept, C]`.
    let state = |i: usize| &output.layers[i].data()[..kept * channels];
    let mut features = Vec::with_capacity(GROUPS);
    for group in 0..GROUPS {
        let mut mean = vec![0f32; kept * channels];
        let layers = if group < 4 {
            group * LAYERS_PER_GROUP..(group + 1) * LAYERS_PER_GROUP
        } else {
            4 * LAYERS_PER_GROUP..STATES
        };
        let count = layers.len() as f32;
        for layer in layers {
            mean.iter_mut().zip(state(layer)).for_each(|(m, v)| *m += v);
        }
        if count > 1.0 {
            mean.iter_mut().for_each(|m| *m /= count);
        }
        features.push(resample_frames(&mean, kept, channels, VIDEO_FPS));
    }
    let resampled = features[0].len() / channels;
    // Feature frame i of group g, or zeros outside the clip.
    let feature = |i: isize, g: usize| -> Option<&[f32]> {
        usize::try_from(i)
            .ok()
            .filter(|&i| i < resampled)
            .map(|i| &features[g][i * channels..][..channels])
    };
    let frames = latent_frames(length);
    let mut values = Vec::with_capacity(frames * WINDOW * GROUPS * channels);
    for k in 0..frames as isize {
        let window: Vec<Option<isize>> = if k == 0 {
            [None, None, None].into_iter().chain((-2..3).map(Some)).collect()
        } else {
            (4 * k - 5..4 * k + 3).map(Some).collect()
        };
        for i in window {
            for g in 0..GROUPS {
                match i.and_then(|i| feature(i, g)) {
                    Some(f) => values.extend_from_slice(f),
                    None => values.extend(std::iter::repeat_n(0.0, channels)),
                }
            }
        }
    }
    Tensor::new(vec![1, frames, WINDOW, GROUPS, channels], values)
        .map_err(|e| NodeError::new(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `wan.py`'s tiny HuMo 1.7B (the t2v variant with the audio weights its `humo.safetensors` holds), f32,
    /// written under `dir`.
    fn write_humo_model(dir: &std::path::Path) -> std::path::PathBuf {
        let mut t = crate::fixtures::tiny_wan_t2v();
        for (name, value) in crate::fixtures::model_tensors("wan/humo.safetensors") {
            if name.starts_with("audio_proj.") || name.contains(".audio_cross_attn_wrapper.") {
                t.insert(name, value);
            }
        }
        let path = dir.join("humo.safetensors");
        crate::fixtures::write_f32(&path, &t);
        path
    }

    /// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny HuMo 1.7B with an audio embedding of the latent's
    /// 5 frames, plain and in context windows of 3 latent frames: the engine's sampler cuts the audio to each
    /// window (without the retained frame) as `WAN21_HuMo` does and gives ComfyUI's latents
    /// (`scripts/reference/wan_windows.py`).
    #[test]
    fn audio_is_cut_to_context_windows_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/humo.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-humo-windows-{}", std::process::id()));
        let path = write_humo_model(&dir);
        let extras = crate::models::CondExtras {
            audio_embed: Some(io["audio"].clone()),
            ..crate::models::CondExtras::default()
        };
        super::super::windowed::check_wan_windows(&path, &io, &extras);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// ComfyUI's own `WanHuMoImageToVideo` on random Whisper states (`scripts/reference/humo_audio.py`): the
    /// audio embedding of the positive prompt, for a clip whose windows run past the audio and one within it.
    #[test]
    fn the_audio_embedding_is_comfyuis() {
        let io = crate::fixtures::tensors("humo/audio.safetensors");
        let layers: Vec<Tensor> = (0..STATES).map(|i| io[&format!("layer.{i}")].clone()).collect();
        let samples = io["samples"].data()[0] as usize;
        let output = AudioEncoderOutput { layers, samples };
        for case in ["long", "short"] {
            let length = io[&format!("length.{case}")].data()[0] as usize;
            let got = audio_embed(&output, length).unwrap();
            let want = &io[&format!("embed.{case}")];
            assert_eq!(got.shape(), want.shape(), "{case}");
            let worst =
                got.data().iter().zip(want.data()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{case}: max |difference| {worst}");
        }
        let short = AudioEncoderOutput { samples: 639, ..output.clone() };
        let err = audio_embed(&short, 9).unwrap_err().to_string();
        assert!(err.contains("40 ms") && err.contains("639"), "{err}");
        let shallow = AudioEncoderOutput { layers: output.layers[..3].to_vec(), ..output };
        let err = audio_embed(&shallow, 9).unwrap_err().to_string();
        assert!(err.contains("33 states") && err.contains("gives 3"), "{err}");
    }
}
