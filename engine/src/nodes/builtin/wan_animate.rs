//! Wan Animate 2's nodes (`comfy_extras.nodes_wan`): `WanAnimate2ToVideo`, its conditioning, and
//! `WanAnimate2Cache`, the model with the pose-branch cache.
//!
//! `WanAnimate2ToVideo` (as ComfyUI's): the reference image (its first frame, resized by area with a centre
//! crop; black without one) encoded as one latent frame before the video's; the conditioning video grey (the
//! last frame of `continue_motion` in front when continuing) encoded after it, the mask 0 on the reference's and
//! the continued frame's latent frames; the pose video from `video_frame_offset` on, its first `length` frames
//! resized the same way (its last frame held when it is shorter) and encoded; the CLIP vision states; on both
//! prompts. The pose values (latents, CLIP states — `clip_vision_output_pose`, else the reference's —, text —
//! `positive_pose`'s first prompt, else the positive's —, strength) apply between `pose_start_percent` and
//! `pose_end_percent`; `reference_image_strength` always. An empty latent one frame longer than the video.

use std::sync::Arc;

use super::latent::cat;
use super::pure::Pure;
use super::resize::resize;
use super::vae::encode_video;
use super::wan::{WAN21_CHANNELS, frame_range, grey_video, latent_frames, penultimate, size};
use crate::compute::Compute;
use crate::models::{AnimatePose, CondExtras, DiffusionModel};
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// The frames of `continue_motion` the node keeps (ComfyUI's `CONTINUE_MOTION_FRAMES`).
const CONTINUE_MOTION_FRAMES: usize = 1;
/// ComfyUI's `MAX_RESOLUTION`.
const MAX_RESOLUTION: i64 = 16384;

/// `WanAnimate2ToVideo`.
pub(super) struct WanAnimate2ToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanAnimate2ToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanAnimate2ToVideo {
        let int = |name: &str, tooltip: &str, default: i64, min: i64, step: Option<i64>| {
            let input = InputDef::bare(name, "INT")
                .tooltip(tooltip)
                .option("default", default)
                .option("min", min)
                .option("max", if name == "batch_size" { 4096 } else { MAX_RESOLUTION });
            match step {
                Some(step) => input.option("step", step),
                None => input,
            }
        };
        let float = |name: &str, tooltip: &str, default: f64, max: f64| {
            super::custom_sampling::tooltipped_scale(name, tooltip, (default, max))
        };
        let optional =
            |name: &str, ty: &str, tooltip: &str| InputDef::typed(name, ty).tooltip(tooltip);
        let spec = NodeSpec::new("WanAnimate2ToVideo", "", "model/conditioning/wan/animate")
            .python_module("comfy_extras.nodes_wan")
            .v3()
            .experimental()
            .description(
                "Animate a character in a reference image using a video, effectively replicating the facial \
                 animation, body motion and hands gesture from the video.",
            )
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"))
            .input(int("width", "Output video width in pixels.", 832, 16, Some(16)))
            .input(int("height", "Output video height in pixels.", 480, 16, Some(16)))
            .input(int("length", "Number of frames to generate.", 81, 1, Some(4)))
            .input(int("batch_size", "Number of videos to generate simultaneously.", 1, 1, None))
            .optional(optional("reference_image", "IMAGE", "The character to animate."))
            .optional(optional(
                "pose_video",
                "IMAGE",
                "The video whose motion is transferred to the reference character.",
            ))
            .optional(optional(
                "clip_vision_output",
                "CLIP_VISION_OUTPUT",
                "CLIP vision of the reference image.",
            ))
            .optional(optional(
                "positive_pose",
                "CONDITIONING",
                "Prompt for the pose-video branch, describing the motion rather than the character. Defaults to \
                 positive. Used for both the cond and uncond passes.",
            ))
            .optional(optional(
                "clip_vision_output_pose",
                "CLIP_VISION_OUTPUT",
                "CLIP vision of the pose video's first frame. Defaults to clip_vision_output.",
            ))
            .optional(optional(
                "continue_motion",
                "IMAGE",
                "Previous motion sequence to continue from for temporal consistency.",
            ))
            .input(int(
                "video_frame_offset",
                "Frames to seek into the pose video. Connect to the video_frame_offset output of the previous \
                 node when extending.",
                0,
                0,
                Some(1),
            ))
            .input(float(
                "pose_strength",
                "Scales the pose video's influence on the motion. 1.0 is the trained behavior; below weakens \
                 adherence, above amplifies. 0.0 mutes it but does not fully remove it.",
                1.0,
                10.0,
            ))
            .input(float(
                "pose_start_percent",
                "Sampling percent at which the pose influence starts. Outside the window the pose branch is \
                 skipped entirely, which also speeds those steps up.",
                0.0,
                1.0,
            ))
            .input(float(
                "pose_end_percent",
                "Sampling percent at which the pose influence ends. Motion is mostly established early, so e.g. \
                 0.7 can loosen fine detail while keeping the choreography.",
                1.0,
                1.0,
            ))
            .input(float(
                "reference_image_strength",
                "Scales how strongly generated frames attend to the reference image's latent frame. Below 1.0 \
                 loosens identity/appearance adherence (e.g. to let the prompt restyle), above tightens it \
                 against drift.",
                1.0,
                10.0,
            ))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"))
            .output(
                OutputDef::new("INT")
                    .named("trim_latent")
                    .tooltip("Number of latent frames that should be trimmed before decoding."),
            )
            .output(
                OutputDef::new("INT")
                    .named("trim_image")
                    .tooltip("Number of overlapping image frames when extending a video."),
            )
            .output(
                OutputDef::new("INT")
                    .named("video_frame_offset")
                    .tooltip("Frames to seek into the pose video."),
            );
        WanAnimate2ToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanAnimate2ToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let invalid = |message: String| NodeError::of_kind(ErrorKind::InvalidValue, message);
        let (start, end) = (inputs.float("pose_start_percent")?, inputs.float("pose_end_percent")?);
        if start > end {
            return Err(invalid(format!(
                "pose_start_percent ({start}) must not be greater than pose_end_percent ({end})."
            )));
        }
        let vae = inputs.vae("vae")?;
        let (width, height) = (size(inputs, "width")?, size(inputs, "height")?);
        let (length, batch) = (size(inputs, "length")?, size(inputs, "batch_size")?);
        let mut offset = size(inputs, "video_frame_offset")?;
        let image = |name: &str| inputs.optional_image(name);
        let fit = |frames: &Tensor| resize(frames, width, height, "area", true);
        let encode = |video: &Tensor| encode_video(&self.compute, vae, video, ctx);
        let frames = latent_frames(length);

        // The reference image: one latent frame before the video's.
        let reference = match image("reference_image")? {
            Some(image) => fit(&frame_range(image, ..1)?)?,
            None => Tensor::full(vec![1, height, width, 3], 0.0),
        };
        let reference = encode(&reference)?;
        let trim_latent = reference.dim(2);
        // The video: grey, the continued frame in front.
        let (video, continued) = match image("continue_motion")? {
            Some(motion) => {
                let kept = frame_range(motion, CONTINUE_MOTION_FRAMES..)?;
                offset = offset.saturating_sub(kept.dim(0));
                let kept = fit(&frame_range(&kept, length..)?)?;
                let continued = latent_frames(kept.dim(0));
                (grey_video(length, height, width, Some(&kept), None)?, continued)
            }
            None => (grey_video(length, height, width, None, None)?, 0),
        };
        let concat = cat(&reference, &encode(&video)?, 2)?;
        let (h, w) = (height / 8, width / 8);
        let given = trim_latent + continued;
        let mask: Vec<f32> = (0..frames + trim_latent)
            .flat_map(|f| std::iter::repeat_n(if f < given { 0.0 } else { 1.0 }, h * w))
            .collect();
        let mask = Tensor::new(vec![1, 1, frames + trim_latent, h, w], mask)
            .map_err(|e| NodeError::new(e.to_string()))?;
        let clip_vision = penultimate(inputs, "clip_vision_output")?;

        // The pose values.
        let latent = match image("pose_video")? {
            Some(pose) => {
                if pose.dim(0) <= offset {
                    return Err(invalid(format!(
                        "pose_video has {} frames but video_frame_offset is {offset} -- nothing left to read.",
                        pose.dim(0)
                    )));
                }
                let pose = fit(&frame_range(pose, offset..offset + length)?)?;
                Some(encode(&hold_last_frame(&pose, length)?)?)
            }
            None => None,
        };
        let clip_pose =
            penultimate(inputs, "clip_vision_output_pose")?.or_else(|| clip_vision.clone());
        let pose_prompt = match inputs.get("positive_pose") {
            Some(_) => inputs.conditioning("positive_pose")?.clone(),
            None => inputs.conditioning("positive")?.clone(),
        };
        let context = pose_prompt.entries.first().map(|e| e.cond.clone());
        let pose = AnimatePose {
            latent,
            clip_vision: clip_pose,
            context,
            strength: inputs.float("pose_strength")?,
            percent: (start, end),
        };
        let reference_strength = inputs.float("reference_image_strength")?;
        let set = |extras: &mut CondExtras| {
            extras.concat_latent_image = Some(concat.clone());
            extras.concat_mask = Some(mask.clone());
            if let Some(clip) = &clip_vision {
                extras.clip_vision = Some(clip.clone());
            }
            if reference_strength != 1.0 {
                extras.reference_strength = Some(reference_strength);
            }
            extras.animate_pose = Some(pose.clone());
        };
        let positive = inputs.conditioning("positive")?.with_extras(set);
        let negative = inputs.conditioning("negative")?.with_extras(set);
        let latent = Tensor::full(vec![batch, WAN21_CHANNELS, frames + trim_latent, h, w], 0.0);
        let trim_image = (continued * 4).saturating_sub(3);
        Ok(NodeResult::values([
            Value::Conditioning(Arc::new(positive)),
            Value::Conditioning(Arc::new(negative)),
            Value::Latent(Latent::new(latent)),
            Value::Int(trim_latent as i64),
            Value::Int(trim_image as i64),
            Value::Int((offset + length) as i64),
        ]))
    }
}

/// `frames` with its last frame repeated to `length` frames (ComfyUI's padding of a short pose video).
fn hold_last_frame(frames: &Tensor, length: usize) -> Result<Tensor, NodeError> {
    let n = frames.dim(0);
    if n >= length || n == 0 {
        return Ok(frames.clone());
    }
    let frame: usize = frames.shape()[1..].iter().product();
    let mut values = frames.data().to_vec();
    let last = values[(n - 1) * frame..].to_vec();
    for _ in n..length {
        values.extend_from_slice(&last);
    }
    let mut shape = frames.shape().to_vec();
    shape[0] = length;
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

/// `WanAnimate2Cache`: the model with the pose-branch cache (`kiln_models::wan::PoseCache`), made for each
/// sampling run.
pub(super) fn wan_animate2_cache() -> Pure {
    let spec = NodeSpec::new("WanAnimate2Cache", "", "model/conditioning/wan/animate")
        .python_module("comfy_extras.nodes_wan")
        .v3()
        .experimental()
        .description(
            "Caches the pose-video's per-block activations so it runs once instead of on every sampling step. \
             Roughly halves generation time Tradeoff is ~12.5 GB of system RAM at 480x832/81 frames in bf16 \
             (scales with resolution and length). With context windows each window is cached separately, so \
             RAM scales with the window count; use the static_standard schedule, as uniform schedules shift the \
             windows every step and nothing ever recurs to hit the cache.",
        )
        .input(InputDef::typed("model", "MODEL"))
        .input(
            InputDef::v3_combo_described(
                "device",
                &["cpu", "gpu"],
                "Where to keep the cache. cpu (RAM) is the safe choice, the cache will not fit in VRAM alongside \
                 the model at typical sizes. gpu (VRAM) can be faster if it fits.",
                "cpu",
            ),
        )
        .input(
            InputDef::v3_combo_described(
                "dtype",
                &["default", "int8", "int4"],
                "Storage precision. default stores the activations in the model's compute dtype. int8 halves \
                 the cache, int4 quarters it, convrot is used to retain accuracy.",
                "default",
            ),
        )
        .output(OutputDef::new("MODEL"));
    Pure::new(spec, |inputs| {
        let dtype = inputs.string("dtype")?;
        let dtype = kiln_models::wan::CacheDtype::from_name(dtype).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::InvalidValue, format!("unknown cache dtype '{dtype}'"))
        })?;
        let on_device = inputs.string("device")? == "gpu";
        let model = inputs.model("model")?;
        let settings = kiln_models::wan::CacheSettings { dtype, on_device };
        let patched = DiffusionModel { pose_cache: Some(settings), ..model.as_ref().clone() };
        Ok(vec![Value::Model(Arc::new(patched))])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::context_windows::{ContextWindows, Fuse, Schedule};
    use crate::models::{Cond, Conditioning, Noise, load};
    use kiln_models::sampling::Sampler;
    use kiln_models::wan::{CacheDtype, CacheSettings};

    /// `scripts/reference/wan_animate2.py`'s windowed sampling record, from ComfyUI's own sampler.
    fn fixture() -> std::collections::BTreeMap<String, Tensor> {
        crate::fixtures::tensors("context_windows/sampling.safetensors")
    }

    /// The tiny Wan DiT's I2V variant (kiln-models' `wan/weights.safetensors` without FLF2V's `emb_pos`) marked
    /// as Wan Animate 2, written under `dir`.
    fn write_model(dir: &std::path::Path) -> std::path::PathBuf {
        let models = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tests/fixtures");
        let bytes = std::fs::read(models.join("wan/weights.safetensors")).expect("the tiny Wan");
        let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let i2v: Vec<_> =
            file.tensors().into_iter().filter(|(name, _)| name != "img_emb.emb_pos").collect();
        let (key, value) = kiln_models::wan::animate2_metadata();
        let metadata = std::collections::HashMap::from([(key, value)]);
        std::fs::create_dir_all(dir.join("diffusion_models")).unwrap();
        let path = dir.join("diffusion_models/animate2.safetensors");
        safetensors::serialize_to_file(i2v, Some(metadata), &path).unwrap();
        path
    }

    fn windows(schedule: Schedule, fuse: Fuse, freenoise: bool, causal: bool) -> ContextWindows {
        ContextWindows {
            schedule,
            fuse,
            length: 3,
            overlap: 1,
            stride: 1,
            closed_loop: false,
            dim: 2,
            freenoise,
            cond_retain: if causal { vec![0] } else { Vec::new() },
            split_conds: false,
            latent_retain: Vec::new(),
            causal_fix: causal,
        }
    }

    /// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny Animate 2 model with `WanAnimate2ToVideo`'s
    /// conditioning, plain, with `ContextWindowsManual` (the template's static windows with FreeNoise, the causal
    /// fix and the reference retained; uniform windows with the overlap-linear fuse; the relative fuse; the
    /// latent's first frame retained in every window) and with `WanAnimate2Cache` (int8), alone and under
    /// windows: the engine's `sample()` gives ComfyUI's latents.
    #[test]
    fn windowed_and_cached_sampling_follow_comfyui() {
        let io = fixture();
        let dir = std::env::temp_dir().join(format!("kiln-animate2-{}", std::process::id()));
        let path = write_model(&dir);
        let env = crate::models::ModelEnv::cpu(&dir);
        let model = load::load_diffusion_model(&env, &path, None, &mut |_, _| {}).unwrap();
        let pose = AnimatePose {
            latent: Some(io["pose_video_latent"].clone()),
            clip_vision: Some(io["clip"].clone()),
            context: Some(io["context.positive"].clone()),
            strength: 1.0,
            percent: (0.0, 1.0),
        };
        let extras = CondExtras {
            concat_latent_image: Some(io["concat_latent_image"].clone()),
            concat_mask: Some(io["concat_mask"].clone()),
            clip_vision: Some(io["clip"].clone()),
            animate_pose: Some(pose),
            ..CondExtras::default()
        };
        let side = |name: &str| Conditioning {
            entries: vec![Cond { cond: io[name].clone(), pooled: None, extras: extras.clone() }],
        };
        let (positive, negative) = (side("context.positive"), side("context.negative"));
        let latent = Latent::new(Tensor::full(vec![1, 16, 5, 4, 6], 0.0));
        let ctx = crate::fixtures::quiet_context(&dir);
        let int8 = Some(CacheSettings { dtype: CacheDtype::Int8, on_device: false });
        let template = windows(Schedule::StaticStandard, Fuse::Pyramid, true, true);
        let retain_latent = ContextWindows {
            cond_retain: vec![0],
            latent_retain: vec![0],
            ..windows(Schedule::StaticStandard, Fuse::Pyramid, false, false)
        };
        let cases = [
            ("plain", None, None),
            ("windows", Some(template.clone()), None),
            ("windows_cache", Some(template.clone()), int8),
            (
                "windows_uniform",
                Some(windows(Schedule::UniformStandard, Fuse::OverlapLinear, false, false)),
                None,
            ),
            (
                "windows_relative",
                Some(windows(Schedule::StaticStandard, Fuse::Relative, true, true)),
                None,
            ),
            ("windows_latent_retain", Some(retain_latent), None),
            ("cache", None, int8),
        ];
        let seed = io["seed"].data()[0] as u64;
        let run = |model: &DiffusionModel,
                   sides: (&Conditioning, &Conditioning),
                   sigmas: &str,
                   case: &str| {
            let job = super::super::sampler::Sampling {
                model,
                positive: sides.0,
                negative: Some(sides.1),
                cfg: 2.0,
                dual: None,
                perp_neg: None,
                sampler: Sampler::Euler.into(),
                sigmas: io[sigmas].data(),
                noise: Noise::Random(seed),
                latent: &latent,
            };
            let got = super::super::sampler::sample(&env.compute, job, &ctx).unwrap().samples;
            let want = &io[&format!("out.{case}")];
            assert_eq!(got.shape(), want.shape(), "{case}");
            crate::fixtures::assert_relative(case, got.data(), want.data(), 1e-4);
        };
        for (case, windows, cache) in cases {
            let patched = DiffusionModel {
                context_windows: windows.map(Arc::new),
                pose_cache: cache,
                ..model.clone()
            };
            run(&patched, (&positive, &negative), "sigmas", case);
        }
        // The pose in a part of sampling whose ends are two of the sigmas: there the predictions with and
        // without the pose are averaged, as ComfyUI's two conditionings in range are.
        let window = |side: &Conditioning| {
            side.with_extras(|e| {
                if let Some(pose) = e.animate_pose.as_mut() {
                    pose.percent = (0.25, 0.75);
                }
            })
        };
        run(&model, (&window(&positive), &window(&negative)), "sigmas4", "pose_window");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
