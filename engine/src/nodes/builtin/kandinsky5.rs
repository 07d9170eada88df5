//! The Kandinsky 5 video nodes (`comfy_extras.nodes_kandinsky5`): `Kandinsky5ImageToVideo` (the empty 16-channel
//! video latent; with a start image, its frames encoded, set on both prompts as the frames that replace the start
//! of the model's input (`time_dim_replace`) beside the mask of which latent frames they cover, and handed out as
//! `cond_latent`) and `NormalizeVideoLatentStart` (a video latent's first frames moved to the mean and standard
//! deviation of the frames after them).

use std::sync::Arc;

use super::pure::Pure;
use super::vae::encode_video;
use super::wan::{VideoRequest, conditioned, fit_frames, frame_mask, latent_frames, video_inputs};
use crate::compute::Compute;
use crate::models::CondExtras;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// ComfyUI's module of both nodes.
const MODULE: &str = "comfy_extras.nodes_kandinsky5";
/// Channels of the HunyuanVideo 1.0 VAE's latent, Kandinsky 5's video models'.
const CHANNELS: usize = 16;
/// Pixels per latent position of that VAE.
const DOWNSCALE: usize = 8;

/// `Kandinsky5ImageToVideo`: the empty latent `[batch, 16, ⌊(length − 1)/4⌋ + 1, height / 8, width / 8]`, and with a
/// start image (its first `length` frames resized with a centre crop and encoded) both prompts carrying the
/// encoded frames (`time_dim_replace`) and the mask that is 0 on the latent frames they cover (`concat_mask`);
/// `cond_latent` is the encoded frames (empty without a start image).
pub(super) struct Kandinsky5ImageToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl Kandinsky5ImageToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> Kandinsky5ImageToVideo {
        let spec = NodeSpec::new("Kandinsky5ImageToVideo", "", "model/conditioning/kandinsky")
            .python_module(MODULE)
            .v3()
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"));
        let spec = video_inputs(spec, (768, 512), (16, 16), 121)
            .optional(InputDef::typed("start_image", "IMAGE"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent").tooltip("Empty video latent"))
            .output(OutputDef::new("LATENT").named("cond_latent").tooltip(
                "Clean encoded start images, used to replace the noisy start of the model output latents",
            ));
        Kandinsky5ImageToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for Kandinsky5ImageToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let (h, w) = (height / DOWNSCALE, width / DOWNSCALE);
        let frames = latent_frames(length);
        let latent = Tensor::full(vec![batch, CHANNELS, frames, h, w], 0.0);
        let start = match inputs.get("start_image") {
            None => None,
            Some(_) => {
                let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
                let encoded = encode_video(&self.compute, vae, &start, ctx)?;
                let given = latent_frames(start.shape()[0]);
                let mask = frame_mask(&encoded, frames, |f| f < given)?;
                Some((encoded, mask))
            }
        };
        let set = |extras: &mut CondExtras| {
            if let Some((encoded, mask)) = &start {
                extras.time_dim_replace = Some(encoded.clone());
                extras.concat_mask = Some(mask.clone());
            }
        };
        let [positive, negative, latent] = conditioned(inputs, set, latent)?;
        // ComfyUI hands out an empty dict without a start image; an empty latent replaces nothing downstream.
        let cond_latent = match start {
            Some((encoded, _)) => encoded,
            None => Tensor::full(vec![0, CHANNELS, 0, h, w], 0.0),
        };
        Ok(NodeResult::values([
            positive,
            negative,
            latent,
            Value::Latent(Latent::new(cond_latent)),
        ]))
    }
}

/// `NormalizeVideoLatentStart`.
pub(super) fn normalize_video_latent_start() -> Pure {
    let spec = NodeSpec::new("NormalizeVideoLatentStart", "", "model/conditioning")
        .python_module(MODULE)
        .v3()
        .description(
            "Normalizes the initial frames of a video latent to match the mean and standard deviation of \
             subsequent reference frames. Helps reduce differences between the starting frames and the rest of \
             the video.",
        )
        .input(InputDef::typed("latent", "LATENT"))
        .input(frame_count(
            "start_frame_count",
            4,
            "Number of latent frames to normalize, counted from the start",
        ))
        .input(frame_count(
            "reference_frame_count",
            5,
            "Number of latent frames after the start frames to use as reference",
        ))
        .output(OutputDef::new("LATENT").named("latent"));
    Pure::new(spec, |inputs| {
        let latent = inputs.latent("latent")?;
        let count = |name: &str| {
            usize::try_from(inputs.int(name)?)
                .map_err(|_| NodeError::new(format!("`{name}` must be 1 or more")))
        };
        let samples = normalize_start(
            &latent.samples,
            count("start_frame_count")?,
            count("reference_frame_count")?,
        )?;
        Ok(vec![Value::Latent(Latent { samples, ..latent.clone() })])
    })
}

/// A frame-count `INT` input, its tooltip written before its range as ComfyUI writes it.
fn frame_count(name: &str, default: i64, tooltip: &str) -> InputDef {
    InputDef::bare(name, "INT")
        .option("tooltip", tooltip)
        .option("default", default)
        .option("min", 1)
        .option("max", 16384)
        .option("step", 1)
}

/// ComfyUI's `NormalizeVideoLatentStart` on `samples` `[B, C, T, h, w]`: each of the first `start` frames (of each
/// sample) standardised over its channels and pixels, then scaled and shifted to the standard deviation and
/// mean of the next `min(reference, T − 1)` frames of the whole batch, those clamped to within (−0.35, +0.5) and
/// (−0.3, +0.35) of the frame's own (torch's unbiased std). A one-frame latent is returned as it is.
fn normalize_start(samples: &Tensor, start: usize, reference: usize) -> Result<Tensor, NodeError> {
    let &[batch, channels, frames, h, w] = samples.shape() else {
        return Err(NodeError::new(format!(
            "NormalizeVideoLatentStart takes a video latent [B, C, T, H, W], not {:?}",
            samples.shape()
        )));
    };
    if frames <= 1 {
        return Ok(samples.clone());
    }
    let start = start.min(frames);
    let reference_end = (start + reference.min(frames - 1)).min(frames);
    if reference_end <= start {
        return Err(NodeError::new(format!(
            "NormalizeVideoLatentStart: no reference frames after the first {start} of {frames}: lower \
             start_frame_count"
        )));
    }
    let plane = h * w;
    let at = |b: usize, c: usize, t: usize| ((b * channels + c) * frames + t) * plane;
    let values = samples.data();
    let frame_values = |b: usize, t: usize| {
        (0..channels).flat_map(move |c| values[at(b, c, t)..][..plane].iter().copied())
    };
    let reference_values = (0..batch)
        .flat_map(|b| (start..reference_end).flat_map(move |t| frame_values(b, t)))
        .map(f64::from);
    let (ref_mean, ref_std) = mean_std(reference_values);
    let mut out = values.to_vec();
    for b in 0..batch {
        for t in 0..start {
            let (mean, std) = mean_std(frame_values(b, t).map(f64::from));
            let target_mean = ref_mean.clamp(mean - 0.3, mean + 0.35);
            let target_std = ref_std.clamp(std - 0.35, std + 0.5);
            for c in 0..channels {
                for v in &mut out[at(b, c, t)..][..plane] {
                    let z = (f64::from(*v) - mean) / (std + 1e-8);
                    *v = (z * target_std + target_mean) as f32;
                }
            }
        }
    }
    Tensor::new(samples.shape().to_vec(), out).map_err(|e| NodeError::new(e.to_string()))
}

/// The mean and the unbiased standard deviation (torch's default) of `values`.
fn mean_std(values: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let (n, sum) = values.clone().fold((0usize, 0.0), |(n, s), v| (n + 1, s + v));
    let mean = sum / n.max(1) as f64;
    let squares: f64 = values.map(|v| (v - mean) * (v - mean)).sum();
    (mean, (squares / (n.saturating_sub(1)).max(1) as f64).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_frames_take_the_references_statistics() {
        // One sample, one channel, 3 frames of 2 pixels: frame 0 far from frames 1 and 2.
        let samples =
            Tensor::new(vec![1, 1, 3, 1, 2], vec![10.0, 12.0, 0.0, 1.0, 0.5, 1.5]).unwrap();
        let out = normalize_start(&samples, 1, 5).unwrap();
        // Frame 0: mean 11, std √2; the references' mean 0.75 and std ≈ 0.6455 are clamped to 10.7 and √2 − 0.35.
        let (mean, std) = (11.0f64, 2f64.sqrt());
        let (target_mean, target_std) = (mean - 0.3, std - 0.35);
        let want = |v: f64| ((v - mean) / (std + 1e-8) * target_std + target_mean) as f32;
        assert!((out.data()[0] - want(10.0)).abs() < 1e-5, "{:?}", out.data());
        assert!((out.data()[1] - want(12.0)).abs() < 1e-5, "{:?}", out.data());
        assert_eq!(&out.data()[2..], &samples.data()[2..]);
    }

    #[test]
    fn a_one_frame_latent_is_unchanged_and_no_reference_is_refused() {
        let one = Tensor::new(vec![1, 1, 1, 1, 2], vec![1.0, 2.0]).unwrap();
        assert_eq!(normalize_start(&one, 4, 5).unwrap(), one);
        let two = Tensor::new(vec![1, 1, 2, 1, 1], vec![1.0, 2.0]).unwrap();
        assert!(normalize_start(&two, 4, 5).is_err());
    }
}
