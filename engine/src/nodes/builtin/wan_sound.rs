//! `WanSoundImageToVideo` and `WanSoundImageToVideoExtend` (`comfy_extras.nodes_wan`): Wan 2.2 S2V's
//! conditioning, as ComfyUI's `wan_sound_to_video` builds it. An empty Wan 2.1 latent, and on both prompts:
//!
//! - the audio: every wav2vec2 state of the first clip resampled from 50 to 30 frames a second, then one
//!   audio frame per video frame at 16 a second (`get_audio_embed_bucket_fps`: frame i reads audio frame
//!   round(i · 30 / 16), zeros past the audio, whole clips of the video's length), the clip's frames from
//!   `frame_offset` on, `[1, states, width, frames]` (zeros on the negative prompt; zeros past the pieces where
//!   an extension of another length runs beyond them); none past the audio's end;
//! - the reference image (its first frame, resized bilinearly with a centre crop), encoded, appended to the
//!   reference latents;
//! - the motion latent: the last 73 frames of `ref_motion` (grey frames in front of fewer) encoded, its last
//!   19 latent frames; the extending node takes the video latent's last 19 frames and reads the audio from
//!   where that latent ends;
//! - the control video encoded over its first frames, the rest the VAE's zero latent.

use std::sync::Arc;

use super::audio_encoder::resampled_states;
use super::vae::encode_video;
use super::wan::{
    WAN21_CHANNELS, fit_frames, grey_video, latent_frame_range, latent_frames, size,
    with_leading_frames,
};
use crate::compute::Compute;
use crate::models::{AudioEncoderOutput, CondExtras};
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// The audio's frames a second after resampling, and the video's (S2V's 16 fps).
const AUDIO_FPS: f64 = 30.0;
const VIDEO_FPS: f64 = 16.0;
/// The motion frames the S2V model reads: the last 73 video frames, 19 latent frames.
const MOTION_FRAMES: usize = 73;
const MOTION_LATENT_FRAMES: usize = 19;

/// `WanSoundImageToVideo`, or (`extend`) `WanSoundImageToVideoExtend`.
pub(super) struct WanSoundImageToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
    extend: bool,
}

impl WanSoundImageToVideo {
    /// `WanSoundImageToVideo`.
    pub(super) fn new(compute: Arc<Compute>) -> WanSoundImageToVideo {
        let spec = spec("WanSoundImageToVideo")
            .input(InputDef::int("width", 832, 16, 16384).option("step", 16))
            .input(InputDef::int("height", 480, 16, 16384).option("step", 16))
            .input(length())
            .input(InputDef::int("batch_size", 1, 1, 4096));
        let spec = optional(spec).optional(InputDef::typed("ref_motion", "IMAGE"));
        WanSoundImageToVideo { spec: Arc::new(outputs(spec)), compute, extend: false }
    }

    /// `WanSoundImageToVideoExtend`.
    pub(super) fn extend(compute: Arc<Compute>) -> WanSoundImageToVideo {
        let spec = spec("WanSoundImageToVideoExtend")
            .input(length())
            .input(InputDef::typed("video_latent", "LATENT"));
        WanSoundImageToVideo { spec: Arc::new(outputs(optional(spec))), compute, extend: true }
    }
}

/// Both nodes' first inputs.
fn spec(name: &str) -> NodeSpec {
    NodeSpec::new(name, "", "model/conditioning/wan/sound")
        .python_module("comfy_extras.nodes_wan")
        .v3()
        .input(InputDef::typed("positive", "CONDITIONING"))
        .input(InputDef::typed("negative", "CONDITIONING"))
        .input(InputDef::typed("vae", "VAE"))
}

fn length() -> InputDef {
    InputDef::int("length", 77, 1, 16384).option("step", 4)
}

/// Both nodes' optional inputs (before `ref_motion`).
fn optional(spec: NodeSpec) -> NodeSpec {
    spec.optional(InputDef::typed("audio_encoder_output", "AUDIO_ENCODER_OUTPUT"))
        .optional(InputDef::typed("ref_image", "IMAGE"))
        .optional(InputDef::typed("control_video", "IMAGE"))
}

fn outputs(spec: NodeSpec) -> NodeSpec {
    spec.output(OutputDef::new("CONDITIONING").named("positive"))
        .output(OutputDef::new("CONDITIONING").named("negative"))
        .output(OutputDef::new("LATENT").named("latent"))
}

impl Node for WanSoundImageToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let vae = inputs.vae("vae")?;
        let length = size(inputs, "length")?;
        let image = |name: &str| inputs.optional_image(name);
        let encode = |video: &Tensor| encode_video(&self.compute, vae, video, ctx);
        let (width, height, batch, frame_offset, motion) = if self.extend {
            let video = &inputs.latent("video_latent")?.samples;
            let &[n, _, frames, h, w] = video.shape() else {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "video_latent must be a video latent [B, C, T, H, W], got {:?}",
                        video.shape()
                    ),
                ));
            };
            (w * 8, h * 8, n, frames * 4, Some(last_frames(video, MOTION_LATENT_FRAMES)?))
        } else {
            let (width, height) = (size(inputs, "width")?, size(inputs, "height")?);
            let motion = match image("ref_motion")? {
                Some(images) => {
                    let fitted = fit_frames(images, MOTION_FRAMES.., width, height)?;
                    let clip = match fitted.shape()[0] {
                        n if n < MOTION_FRAMES => {
                            grey_video(MOTION_FRAMES, height, width, None, Some(&fitted))?
                        }
                        _ => fitted,
                    };
                    Some(last_frames(&encode(&clip)?, MOTION_LATENT_FRAMES)?)
                }
                None => None,
            };
            (width, height, size(inputs, "batch_size")?, 0, motion)
        };
        let frames = latent_frames(length);
        let (h, w) = (height / 8, width / 8);
        let audio = match inputs.get("audio_encoder_output") {
            Some(_) => {
                let output = inputs.audio_encoder_output("audio_encoder_output")?;
                sound_embed(output, frames * 4, frame_offset)?
            }
            None => None,
        };
        let reference = match image("ref_image")? {
            Some(image) => Some(encode(&fit_frames(image, ..1, width, height)?)?),
            None => None,
        };
        // The control latent: the VAE's zero latent, the control video's encoded over its first frames.
        let shape = [batch, WAN21_CHANNELS, frames, h, w];
        let zeros = vec![0.0; shape.iter().product()];
        let control = kiln_models::wan::family::WAN21_LATENT.process_out(&zeros, &shape);
        let mut control =
            Tensor::new(shape.to_vec(), control).map_err(|e| NodeError::new(e.to_string()))?;
        if let Some(video) = image("control_video")? {
            let encoded = encode(&fit_frames(video, ..length, width, height)?)?;
            control = with_leading_frames(&control, &encoded, "the control video's latent")?;
        }
        let set = |audio: Option<Tensor>| {
            let (reference, motion, control) = (reference.clone(), motion.clone(), control.clone());
            move |extras: &mut CondExtras| {
                if let Some(audio) = &audio {
                    extras.audio_embed = Some(audio.clone());
                }
                if let Some(reference) = &reference {
                    extras.reference_latents.push(reference.clone());
                }
                if let Some(motion) = &motion {
                    extras.reference_motion = Some(motion.clone());
                }
                extras.control_video = Some(control.clone());
            }
        };
        let silent = audio.as_ref().map(|a| Tensor::full(a.shape().to_vec(), 0.0));
        let positive = inputs.conditioning("positive")?.with_extras(set(audio));
        let negative = inputs.conditioning("negative")?.with_extras(set(silent));
        let latent = Tensor::full(shape.to_vec(), 0.0);
        Ok(NodeResult::values([
            Value::Conditioning(Arc::new(positive)),
            Value::Conditioning(Arc::new(negative)),
            Value::Latent(Latent::new(latent)),
        ]))
    }
}

/// A video latent's last `n` frames (all of them when it has fewer).
fn last_frames(latent: &Tensor, n: usize) -> Result<Tensor, NodeError> {
    let t = latent.dim(2);
    latent_frame_range(latent, t.saturating_sub(n)..t)
}

/// The audio S2V reads for the video frames `offset..offset + frames` of a clip made in pieces of `frames`
/// (see the module's doc), `[1, states, width, frames]`; `None` past the audio's last piece.
fn sound_embed(
    output: &AudioEncoderOutput,
    frames: usize,
    offset: usize,
) -> Result<Option<Tensor>, NodeError> {
    let (states, width) = resampled_states(output, 0, AUDIO_FPS)?;
    let audio_frames = states[0].len() / width;
    let indices = bucket_indices(audio_frames, frames);
    if offset >= indices.len() {
        return Ok(None);
    }
    // A clip that runs past the last whole piece (an extension of another length) reads zeros there, as the
    // pieces do past the audio; ComfyUI hands the model the shorter audio, which its injectors cannot split.
    let kept: Vec<Option<usize>> =
        (offset..offset + frames).map(|k| indices.get(k).copied().flatten()).collect();
    let mut values = Vec::with_capacity(states.len() * width * frames);
    for state in &states {
        for c in 0..width {
            values.extend(kept.iter().map(|at| at.map_or(0.0, |i| state[i * width + c])));
        }
    }
    let shape = vec![1, states.len(), width, frames];
    Tensor::new(shape, values).map(Some).map_err(|e| NodeError::new(e.to_string()))
}

/// The audio frame each video frame reads (`None` past the audio) for an audio of `audio_frames` frames at 30 a
/// second cut into clips of `frames` video frames at 16 a second, as ComfyUI's `get_audio_embed_bucket_fps`
/// (m = 0) and `get_sample_indices` compute them: enough whole clips to cover the audio and then some, video
/// frame i at audio frame round(i · step · 30) with numpy's float64 `linspace` step and half-to-even rounding.
fn bucket_indices(audio_frames: usize, frames: usize) -> Vec<Option<usize>> {
    let scale = AUDIO_FPS / VIDEO_FPS;
    let clips = (audio_frames as f64 / (frames as f64 * scale)) as usize + 1;
    let samples = clips * frames;
    let padded = ((samples as f64 / VIDEO_FPS * AUDIO_FPS).ceil() as usize).max(audio_frames);
    let step = (samples as f64 / VIDEO_FPS) / samples as f64;
    (0..samples)
        .map(|i| {
            let at = (i as f64 * step * AUDIO_FPS).round_ties_even() as usize;
            Some(at.min(padded - 1)).filter(|&at| at < audio_frames)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::audio_encoder::resample_frames;
    use super::*;

    /// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny S2V (`wan_s2v.py`'s `s2v_weights.safetensors`) with
    /// WanSoundImageToVideo's audio, reference, motion latent and control video, plain and in context windows of 3
    /// latent frames: the engine's sampler cuts the control video to each window and hands every window the
    /// rest whole, as ComfyUI does (`scripts/reference/wan_windows.py`).
    #[test]
    fn s2v_conditioning_follows_context_windows_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/s2v.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-s2v-windows-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/tests/fixtures/wan/s2v_weights.safetensors");
        let path = dir.join("s2v.safetensors");
        std::fs::copy(&fixture, &path).unwrap();
        let extras = crate::models::CondExtras {
            audio_embed: Some(io["audio"].clone()),
            reference_latents: vec![io["reference"].clone()],
            reference_motion: Some(io["motion"].clone()),
            control_video: Some(io["control"].clone()),
            ..crate::models::CondExtras::default()
        };
        super::super::windowed::check_wan_windows(&path, &io, &extras);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// `scripts/reference/wan_s2v.py`'s fixture (kiln-models'), from ComfyUI's own node functions.
    #[test]
    fn the_audio_is_bucketed_per_video_frame_as_comfyui_does() {
        let io = crate::fixtures::tensors("../../models/tests/fixtures/wan/s2v.safetensors");
        let states = &io["bucket.states"];
        let [count, tokens, width] = states.shape()[..] else { panic!("[states, T, C]") };
        let layers = states
            .data()
            .chunks_exact(tokens * width)
            .map(|s| Tensor::new(vec![1, tokens, width], s.to_vec()).unwrap())
            .collect();
        let output = AudioEncoderOutput { layers, samples: tokens * 320 };
        let interp: Vec<f32> = output
            .layers
            .iter()
            .flat_map(|l| resample_frames(l.data(), tokens, width, AUDIO_FPS))
            .collect();
        let close = |what: &str, got: &[f32], want: &[f32]| {
            crate::fixtures::assert_within(what, got, want, 1e-5)
        };
        close("interp", &interp, io["interp"].data());
        assert_eq!(count, 3);
        for case in ["first", "next", "long"] {
            let length = io[&format!("bucket.length.{case}")].data()[0] as usize;
            let offset = io[&format!("bucket.offset.{case}")].data()[0] as usize;
            let got = sound_embed(&output, latent_frames(length) * 4, offset).unwrap().unwrap();
            let want = &io[&format!("bucket.embed.{case}")];
            assert_eq!(got.shape(), want.shape(), "{case}");
            close(case, got.data(), want.data());
        }
        // Past the audio's last clip there is nothing to read.
        assert!(sound_embed(&output, 12, 48).unwrap().is_none());
        // A clip running past the last whole piece (2 pieces of 8 here) reads zeros beyond it, keeping its length.
        let partial = sound_embed(&output, 8, 12).unwrap().unwrap();
        assert_eq!(partial.shape(), [1, 3, 8, 8]);
        let at = |c: usize, k: usize| partial.data()[c * 8 + k];
        assert!((0..4).any(|k| at(0, k) != 0.0) && (4..8).all(|k| at(0, k) == 0.0));
    }

    #[test]
    fn the_control_default_is_the_vaes_zero_latent() {
        let io = crate::fixtures::tensors("../../models/tests/fixtures/wan/s2v.safetensors");
        let want = &io["control_default"];
        let shape = [1, 16, 3, 8, 8];
        let got =
            kiln_models::wan::family::WAN21_LATENT.process_out(&vec![0.0; 16 * 3 * 64], &shape);
        let worst = got.iter().zip(want.data()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < 1e-6, "max |difference| {worst}");
    }
}
