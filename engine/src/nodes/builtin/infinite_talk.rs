//! `WanInfiniteTalkToVideo` (`comfy_extras.nodes_wan`): InfiniteTalk's talking video on Wan 2.1 I2V. The node
//! puts the InfiniteTalk patch (`ModelPatchLoader`) on the model with the audio it projects from one or two
//! speakers' wav2vec2 states (`AudioEncoderEncode`), and gives an empty Wan 2.1 latent.
//!
//! - A start image is encoded as `WanImageToVideo` does (grey clip, the image in front, a mask of 0 on its
//!   latent frames) onto both prompts, the CLIP vision output beside it.
//! - Each speaker's states after the first are resampled from 50 to 25 frames a second (linear,
//!   `align_corners`); two speakers' clips are laid end to end (the first speaks, then the second), each zero
//!   while the other speaks, and the speakers' masks become token masks (nearest, at the token grid).
//! - Without previous frames the clip reads the audio from its start, and every model call sees the start
//!   image's latent as its first frame. With them (continuing a video), the last `motion_frame_count` frames
//!   are encoded as the motion latent every call sees, the audio is read from where they began, the sampled
//!   latent keeps the motion latent, and `trim_image` says how many frames to drop from the decoded clip.
//!
//! The audio reaches the negative prompt too (ComfyUI puts it on the model).

use std::sync::Arc;

use kiln_compute::Backend;
use kiln_models::family::{DiffusionNet, ModelPatchNet};
use kiln_models::wan::infinite_talk::{self, AudioWindows, InfiniteTalk, SpeakerFeatures};

use super::audio_encoder::{VIDEO_FPS, resampled_states};
use super::mask::mask;
use super::vae::encode_video;
use super::wan::{
    WAN21_CHANNELS, fit_frames, image_conditioned, latent_frame_range, latent_frames, penultimate,
    size,
};
use crate::compute::Compute;
use crate::models::device::{OnDevice, on_device, to_host};
use crate::models::{AudioEncoderOutput, DiffusionModel, ModelPatch, TalkApplication};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, DYNAMIC_COMBO, DynamicOption, ErrorKind, InputDef, Inputs, Node, NodeError,
    NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// `WanInfiniteTalkToVideo`.
pub(super) struct WanInfiniteTalkToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanInfiniteTalkToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanInfiniteTalkToVideo {
        let mask_input = |name: &str, which: &str| {
            InputDef::typed(name, "MASK").tooltip(&format!(
                "Mask for the {which} speaker, required if using two audio inputs."
            ))
        };
        let options = [
            DynamicOption { key: "single_speaker", required: Vec::new(), optional: Vec::new() },
            DynamicOption {
                key: "two_speakers",
                required: Vec::new(),
                optional: vec![
                    InputDef::typed("audio_encoder_output_2", "AUDIO_ENCODER_OUTPUT"),
                    mask_input("mask_1", "first"),
                    mask_input("mask_2", "second"),
                ],
            },
        ];
        let spec =
            NodeSpec::new("WanInfiniteTalkToVideo", "", "model/conditioning/wan/infinite talk")
                .python_module("comfy_extras.nodes_wan")
                .v3()
                .dynamic_combo_of(InputDef::bare("mode", DYNAMIC_COMBO), &options)
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::typed("model_patch", "MODEL_PATCH"))
                .input(InputDef::typed("positive", "CONDITIONING"))
                .input(InputDef::typed("negative", "CONDITIONING"))
                .input(InputDef::typed("vae", "VAE"))
                .input(InputDef::int("width", 832, 16, 16384).option("step", 16))
                .input(InputDef::int("height", 480, 16, 16384).option("step", 16))
                .input(InputDef::int("length", 81, 1, 16384).option("step", 4))
                .optional(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
                .optional(InputDef::typed("start_image", "IMAGE"))
                .input(InputDef::typed("audio_encoder_output_1", "AUDIO_ENCODER_OUTPUT"))
                .input(
                    InputDef::bare("motion_frame_count", "INT")
                        .tooltip("Number of previous frames to use as motion context.")
                        .option("advanced", true)
                        .option("default", 9)
                        .option("min", 1)
                        .option("max", 33)
                        .option("step", 1),
                )
                .input(InputDef::float("audio_scale", 1.0, -10.0, 10.0).option("step", 0.01))
                .optional(InputDef::typed("previous_frames", "IMAGE"))
                .output(OutputDef::new("MODEL").named("model"))
                .output(OutputDef::new("CONDITIONING").named("positive"))
                .output(OutputDef::new("CONDITIONING").named("negative"))
                .output(OutputDef::new("LATENT").named("latent"))
                .output(OutputDef::new("INT").named("trim_image"));
        WanInfiniteTalkToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanInfiniteTalkToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let invalid = |msg: String| NodeError::of_kind(ErrorKind::InvalidValue, msg);
        let model = inputs.model("model")?;
        let patch = inputs.model_patch("model_patch")?;
        let net = talk_patch(model, patch)?;
        let vae = inputs.vae("vae")?;
        let (width, height, length) =
            (size(inputs, "width")?, size(inputs, "height")?, size(inputs, "length")?);
        let motion_frames = size(inputs, "motion_frame_count")?;
        let previous = match inputs.get("previous_frames") {
            Some(_) => Some(inputs.image("previous_frames")?),
            None => None,
        };
        if let Some(previous) = previous
            && previous.shape()[0] < motion_frames
        {
            return Err(invalid("Not enough previous frames provided.".to_owned()));
        }
        // The second speaker's inputs come with the `two_speakers` mode only.
        let two = inputs.string("mode")? == "two_speakers";
        let given = |name: &str| two && inputs.get(&format!("mode.{name}")).is_some();
        let (second, masks) = (given("audio_encoder_output_2"), given("mask_1") && given("mask_2"));
        if second && !masks {
            return Err(invalid(
                "Masks must be provided if two audio encoder outputs are used.".into(),
            ));
        }
        if masks && !second {
            return Err(invalid(
                "Second audio encoder output must be provided if two masks are used.".into(),
            ));
        }

        let frames = latent_frames(length);
        let latent = Tensor::full(vec![1, WAN21_CHANNELS, frames, height / 8, width / 8], 0.0);
        let concat = match inputs.get("start_image") {
            Some(_) => {
                let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
                let clip = super::wan::start_clip(
                    &self.compute,
                    vae,
                    &start,
                    [length, height, width],
                    ctx,
                )?;
                Some(clip)
            }
            None => None,
        };

        let features = net.config.features;
        let first = inputs.audio_encoder_output("audio_encoder_output_1")?;
        let mut speakers = vec![speaker_features(first, features)?];
        if second {
            let output = inputs.audio_encoder_output("mode.audio_encoder_output_2")?;
            speakers.push(speaker_features(output, features)?);
            speakers = one_after_another(&speakers);
        }
        let token_masks = match masks {
            true => {
                let (first, second) = (mask(inputs, "mode.mask_1")?, mask(inputs, "mode.mask_2")?);
                Some(token_masks(first, second, [height / 8 / 2, width / 8 / 2])?)
            }
            false => None,
        };

        let (audio_start, motion, trim) = match (previous, &concat) {
            (Some(previous), _) => {
                let last = fit_frames(previous, motion_frames.., width, height)?;
                let motion = encode_video(&self.compute, vae, &last, ctx)?;
                (previous.shape()[0] - motion_frames, motion, motion_frames)
            }
            (None, Some((encoded, _))) => (0, latent_frame_range(encoded, 0..1)?, 0),
            (None, None) => {
                return Err(invalid(
                    "WanInfiniteTalkToVideo needs a start_image (or previous_frames to continue a video): \
                     every step shows the model its first frame"
                        .to_owned(),
                ));
            }
        };
        let speaker_windows: Vec<SpeakerFeatures<'_>> = speakers
            .iter()
            .map(|values| SpeakerFeatures { values, frames: values.len() / features })
            .collect();
        let windows = infinite_talk::audio_windows(
            &speaker_windows,
            features,
            audio_start,
            audio_start + length,
        )
        .map_err(node_error)?;
        let audio = on_device(self.compute.device(), Project { patch: net, windows: &windows })
            .map_err(node_error)?;

        let application = TalkApplication {
            patch: patch.clone(),
            audio,
            scale: inputs.float("audio_scale")? as f32,
            masks: token_masks,
            motion,
            extend: previous.is_some(),
        };
        let patched =
            DiffusionModel { infinite_talk: Some(Arc::new(application)), ..model.as_ref().clone() };
        let clip_vision = penultimate(inputs, "clip_vision_output")?;
        let [positive, negative, latent] = image_conditioned(inputs, concat, clip_vision, latent)?;
        Ok(NodeResult::values([
            Value::Model(Arc::new(patched)),
            positive,
            negative,
            latent,
            Value::Int(trim as i64),
        ]))
    }
}

/// The InfiniteTalk network of `patch`, checked against `model`: a Wan 2.1 model of the patch's width.
fn talk_patch<'p>(
    model: &DiffusionModel,
    patch: &'p ModelPatch,
) -> Result<&'p InfiniteTalk, NodeError> {
    let ModelPatchNet::InfiniteTalk(net) = patch.net.as_ref() else {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "{} is not an InfiniteTalk patch (wan2.1_infiniteTalk_single or _multi): load one with \
                 ModelPatchLoader",
                patch.path.display()
            ),
        ));
    };
    let fits = match model.net.as_ref() {
        DiffusionNet::Wan(wan) => {
            !wan.config.is_wan22()
                && wan.config.s2v.is_none()
                && wan.config.dim == net.config.dim
                && wan.config.layers <= net.config.blocks
        }
        _ => false,
    };
    if !fits {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "{} patches a Wan 2.1 model {} wide (the I2V 14B); {} is not one",
                patch.path.display(),
                net.config.dim,
                model.path.display()
            ),
        ));
    }
    Ok(net)
}

/// One speaker's features `[frames, (states − 1) · width]` at 25 frames a second: the first clip's states
/// after the first (wav2vec2's 12 layers), each resampled from the encoder's 50 frames a second, layer-major
/// per frame (ComfyUI's `linear_interpolation(stack(states)[1:], 50, 25).movedim(0, 1)`).
fn speaker_features(output: &AudioEncoderOutput, features: usize) -> Result<Vec<f32>, NodeError> {
    let (resampled, width) = resampled_states(output, 1, VIDEO_FPS)?;
    let states = output.layers.len();
    if states.saturating_sub(1) * width != features {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "this InfiniteTalk patch reads {} values of audio features a frame; the audio encoder gives {} \
                 states of {width} ({} after the first): encode the audio with wav2vec2 (base, 768 wide)",
                features,
                states,
                states.saturating_sub(1)
            ),
        ));
    }
    let frames = resampled.first().map_or(0, |state| state.len() / width);
    if frames == 0 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            "InfiniteTalk needs at least 40 ms of audio (two encoder frames)".to_owned(),
        ));
    }
    let mut out = Vec::with_capacity(frames * features);
    for f in 0..frames {
        for state in &resampled {
            out.extend_from_slice(&state[f * width..][..width]);
        }
    }
    Ok(out)
}

/// Speakers' features laid end to end (ComfyUI's "add" mode): each as long as all of them together, zero but
/// for its own stretch, the first speaker's first.
fn one_after_another(speakers: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let total: usize = speakers.iter().map(Vec::len).sum();
    let mut offset = 0;
    speakers
        .iter()
        .map(|speaker| {
            let mut full = vec![0.0; total];
            full[offset..offset + speaker.len()].copy_from_slice(speaker);
            offset += speaker.len();
            full
        })
        .collect()
}

/// The two speakers' masks (one each, `[B, H, W]` with their sizes) at the token grid `[rows, cols]`, nearest
/// (torch's legacy nearest: source index ⌊i · in / out⌋, no centre crop), 1 where positive: `[2, rows · cols]`.
fn token_masks(
    (first, [n1, h, w]): (Tensor, [usize; 3]),
    (second, dims): (Tensor, [usize; 3]),
    [rows, cols]: [usize; 2],
) -> Result<Tensor, NodeError> {
    if n1 != 1 || dims != [1, h, w] {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "InfiniteTalk takes one mask per speaker of one size; got {n1} of {h}×{w} and {} of {}×{}",
                dims[0], dims[1], dims[2]
            ),
        ));
    }
    let source = |i: usize, from: usize, to: usize| {
        ((i as f32 * (from as f32 / to as f32)).floor() as usize).min(from - 1)
    };
    let mut values = Vec::with_capacity(2 * rows * cols);
    for m in [&first, &second] {
        for i in 0..rows {
            let y = source(i, h, rows);
            for j in 0..cols {
                let x = source(j, w, cols);
                values.push(if m.data()[y * w + x] > 0.0 { 1.0 } else { 0.0 });
            }
        }
    }
    Tensor::new(vec![2, rows * cols], values).map_err(|e| NodeError::new(e.to_string()))
}

/// The audio through the patch's projection on the device, back on the host.
struct Project<'a> {
    patch: &'a InfiniteTalk,
    windows: &'a AudioWindows,
}

impl OnDevice for Project<'_> {
    type Output = Result<Tensor, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        self.patch.weights.activate()?;
        to_host(b, &self.patch.project(b, self.windows)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scripts/reference/infinite_talk.py`'s fixture (kiln-models'), from ComfyUI's own node code.
    fn fixture() -> std::collections::BTreeMap<String, Tensor> {
        crate::fixtures::tensors("../../models/tests/fixtures/wan/infinite_talk.safetensors")
    }

    fn close(what: &str, got: &[f32], want: &[f32]) {
        crate::fixtures::assert_within(what, got, want, 1e-5);
    }

    #[test]
    fn each_speakers_states_after_the_first_are_resampled_to_25_frames_a_second() {
        let io = fixture();
        for case in ["odd", "even"] {
            let states = &io[&format!("states.{case}")];
            let [count, frames, width] = states.shape()[..] else { panic!("[states, T, C]") };
            let layers = states
                .data()
                .chunks_exact(frames * width)
                .map(|s| Tensor::new(vec![1, frames, width], s.to_vec()).unwrap())
                .collect();
            let output = AudioEncoderOutput { layers, samples: frames * 320 };
            let got = speaker_features(&output, (count - 1) * width).unwrap();
            close(case, &got, io[&format!("features.{case}")].data());
        }
        // An encoder of another width is refused, naming the one the patch reads.
        let output =
            AudioEncoderOutput { layers: vec![Tensor::full(vec![1, 40, 4], 0.0); 4], samples: 0 };
        let err = speaker_features(&output, 9216).unwrap_err().to_string();
        assert!(err.contains("wav2vec2") && err.contains("9216"), "{err}");
    }

    #[test]
    fn two_speakers_are_laid_end_to_end_and_their_masks_become_token_masks() {
        let io = fixture();
        let raw = |k: usize| io[&format!("raw.two.{k}")].data().to_vec();
        let both = one_after_another(&[raw(0), raw(1)]);
        for (k, got) in both.iter().enumerate() {
            assert_eq!(got.as_slice(), io[&format!("audio.two.{k}")].data(), "speaker {k}");
        }

        let masks = &io["masks"];
        let [_, h, w] = masks.shape()[..] else { panic!("[2, H, W]") };
        let one = |k: usize| {
            let values = masks.data()[k * h * w..][..h * w].to_vec();
            (Tensor::new(vec![1, h, w], values).unwrap(), [1, h, w])
        };
        let got = token_masks(one(0), one(1), [4, 6]).unwrap();
        assert_eq!(got.data(), io["token_masks"].data());
        let err = token_masks(one(0), (Tensor::full(vec![2, h, w], 1.0), [2, h, w]), [4, 6])
            .unwrap_err()
            .to_string();
        assert!(err.contains("one mask per speaker"), "{err}");
    }

    /// The tiny Wan DiT's expert variant (kiln-models' `wan/weights.safetensors` without the CLIP branch) and
    /// the fixture's tiny InfiniteTalk patch, written under `dir`.
    fn write_models(dir: &std::path::Path, io: &std::collections::BTreeMap<String, Tensor>) {
        use safetensors::{Dtype, tensor::TensorView};
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tests/fixtures");
        let bytes = std::fs::read(models.join("wan/weights.safetensors")).expect("the tiny Wan");
        let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let expert: Vec<(String, TensorView<'_>)> = file
            .tensors()
            .into_iter()
            .filter(|(name, _)| !name.starts_with("img_emb.") && !name.contains("_img."))
            .collect();
        std::fs::create_dir_all(dir.join("diffusion_models")).unwrap();
        safetensors::serialize_to_file(
            expert,
            None,
            &dir.join("diffusion_models/expert.safetensors"),
        )
        .unwrap();
        let patch: Vec<(String, Vec<u8>, Vec<usize>)> = io
            .iter()
            .filter_map(|(name, t)| {
                let bytes = t.data().iter().flat_map(|v| v.to_le_bytes()).collect();
                Some((name.strip_prefix("patch.")?.to_owned(), bytes, t.shape().to_vec()))
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = patch
            .iter()
            .map(|(name, bytes, shape)| {
                (name.clone(), TensorView::new(Dtype::F32, shape.clone(), bytes).unwrap())
            })
            .collect();
        std::fs::create_dir_all(dir.join("model_patches")).unwrap();
        safetensors::serialize_to_file(views, None, &dir.join("model_patches/talk.safetensors"))
            .unwrap();
    }

    /// ComfyUI's CFGGuider (cfg 1, euler, 2 steps) with the node's wrappers on the tiny Wan 2.1 model and patch
    /// (`infinite_talk.py`'s sampling case): every model call sees the motion latent over its first frames, and a
    /// continuation keeps it in the sampled latent.
    #[test]
    fn sampling_shows_the_model_the_motion_latent_at_every_step_as_comfyui_does() {
        use crate::models::{Cond, CondExtras, Conditioning, Noise, load};
        use crate::value::Latent;
        use kiln_models::sampling::Sampler;

        let io = fixture();
        let dir = std::env::temp_dir().join(format!("kiln-infinite-talk-{}", std::process::id()));
        write_models(&dir, &io);
        let env = crate::models::ModelEnv::cpu(&dir);
        let model = load::load_diffusion_model(
            &env,
            &dir.join("diffusion_models/expert.safetensors"),
            None,
            &mut |_, _| {},
        )
        .unwrap();
        let patch = Arc::new(
            load::load_model_patch(
                &env,
                &dir.join("model_patches/talk.safetensors"),
                &mut |_, _| {},
            )
            .unwrap(),
        );
        let concat = io["sample.concat"].clone();
        let extras = CondExtras {
            concat_latent_image: Some(concat.clone()),
            concat_mask: Some(io["sample.concat_mask"].clone()),
            ..CondExtras::default()
        };
        let context = io["sample.context"].clone();
        let side = |cond: Tensor| Conditioning {
            entries: vec![Cond { cond, pooled: None, extras: extras.clone() }],
        };
        let positive = side(context.clone());
        let negative = side(Tensor::full(context.shape().to_vec(), 0.0));
        let latent = Latent::new(Tensor::full(vec![1, 16, 3, 4, 6], 0.0));
        let ctx = crate::fixtures::quiet_context(&dir);
        let seed = io["sample.seed"].data()[0] as u64;
        for (case, motion, extend) in [
            ("base", latent_frame_range(&concat, 0..1).unwrap(), false),
            ("extend", io["sample.motion.extend"].clone(), true),
        ] {
            let application = TalkApplication {
                patch: patch.clone(),
                audio: io["sample.embeds"].clone(),
                scale: 1.0,
                masks: None,
                motion,
                extend,
            };
            let talking =
                DiffusionModel { infinite_talk: Some(Arc::new(application)), ..model.clone() };
            let job = super::super::sampler::Sampling {
                model: &talking,
                positive: &positive,
                negative: Some(&negative),
                cfg: 1.0,
                dual: None,
                perp_neg: None,
                sampler: Sampler::Euler.into(),
                sigmas: io["sample.sigmas"].data(),
                noise: Noise::Random(seed),
                latent: &latent,
            };
            let got = super::super::sampler::sample(&env.compute, job, &ctx).unwrap().samples;
            let want = &io[&format!("sample.out.{case}")];
            assert_eq!(got.shape(), want.shape(), "{case}");
            crate::fixtures::assert_relative(case, got.data(), want.data(), 1e-4);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
