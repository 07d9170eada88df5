//! `BerniniConditioning` (`comfy_extras.nodes_bernini`): Bernini's in-context conditioning for a Wan 2.2 A14B
//! pair. The source video (fitted to the clip), the reference video and each reference image (each at its own
//! aspect, the long edge capped) are encoded and ride with both prompts as `context_latents`, which the model
//! reads as extra token streams after the video's ([`kiln_models::wan::WanInput::context_latents`]); the
//! latent to sample is zeros.

use std::sync::Arc;

use super::resize::resize;
use super::vae::encode_video;
use super::wan::{WAN21_CHANNELS, conditioned, frame_range, latent_frames, size};
use crate::compute::Compute;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;

/// The most reference images (`reference_image_0` … `reference_image_7`).
const REFERENCE_IMAGES: usize = 8;
/// Sides snap to multiples of this.
const STRIDE: usize = 16;
/// `ref_max_size` when the prompt leaves it out.
const REF_MAX_SIZE: usize = 848;

const DESCRIPTION: &str = "Conditioning node for Bernini in-context video/image conditioning. It can be used for \
the following tasks: t2v (text-to-video), v2v (video-to-video), rv2v (reference-guided video editing), r2v \
(reference-to-video), ads2v (insert image/video into video).Reference images injected as in-context tokens (r2v, \
rv2v) are encoded independently at their own native aspect ratio (long edge capped at ref_max_size)";

/// `BerniniConditioning`.
pub(super) struct BerniniConditioning {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl BerniniConditioning {
    pub(super) fn new(compute: Arc<Compute>) -> BerniniConditioning {
        let side =
            |name: &str, default: i64| InputDef::int(name, default, 16, 8192).option("step", 16);
        let tooltip =
            |name: &str, text: &str| InputDef::typed(name, "IMAGE").option("tooltip", text);
        let spec = NodeSpec::new("BerniniConditioning", "Bernini Conditioning", "model/conditioning/bernini")
            .python_module("comfy_extras.nodes_bernini")
            .v3()
            .description(DESCRIPTION)
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("vae", "VAE"))
            .input(side("width", 832))
            .input(side("height", 480))
            .input(InputDef::int("length", 81, 1, 8192).option("step", 4))
            .input(InputDef::int("batch_size", 1, 1, 4096))
            .optional(tooltip(
                "source_video",
                "Source video to edit or restyle (v2v, rv2v). Resized to width/height and trimmed to length.",
            ))
            .optional(tooltip("reference_video", "Video to insert into the source video (ads2v)."))
            .optional_autogrow_prefix(
                "reference_images",
                tooltip(
                    "reference_image",
                    "Reference image injected as an in-context token (r2v, rv2v).",
                ),
                "reference_image_",
                REFERENCE_IMAGES,
            )
            .optional(
                InputDef::bare("ref_max_size", "INT")
                    .option(
                        "tooltip",
                        "Max size for the long edge of reference_video and reference_images. Resized with \
                         preserved aspect ratio and snapped to 16px.",
                    )
                    .option("default", REF_MAX_SIZE as i64)
                    .option("min", 16)
                    .option("max", 8192)
                    .option("step", 16),
            )
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"));
        BerniniConditioning { spec: Arc::new(spec), compute }
    }
}

impl Node for BerniniConditioning {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let vae = inputs.vae("vae")?;
        let (width, height) = (size(inputs, "width")?, size(inputs, "height")?);
        let (length, batch) = (size(inputs, "length")?, size(inputs, "batch_size")?);
        let max_size = match inputs.get("ref_max_size") {
            Some(_) => size(inputs, "ref_max_size")?,
            None => REF_MAX_SIZE,
        };
        let image = |name: &str| inputs.optional_image(name);
        // The streams in ComfyUI's order: source video, reference video, then each reference image (by input
        // name, each image of a batch on its own).
        let mut streams = Vec::new();
        if let Some(source) = image("source_video")? {
            streams.push(resize(&frame_range(source, ..length)?, width, height, "area", true)?);
        }
        if let Some(video) = image("reference_video")? {
            streams.push(long_edge_at_most(&frame_range(video, ..length)?, max_size)?);
        }
        for i in 0..REFERENCE_IMAGES {
            let Some(images) = image(&format!("reference_images.reference_image_{i}"))? else {
                continue;
            };
            for n in 0..images.shape()[0] {
                streams.push(long_edge_at_most(&frame_range(images, n..n + 1)?, max_size)?);
            }
        }
        let context = streams
            .iter()
            .map(|frames| encode_video(&self.compute, vae, frames, ctx))
            .collect::<Result<Vec<_>, _>>()?;
        let latent = Tensor::full(
            vec![batch, WAN21_CHANNELS, latent_frames(length), height / 8, width / 8],
            0.0,
        );
        let set = |extras: &mut crate::models::CondExtras| {
            if !context.is_empty() {
                extras.context_latents = context.clone();
            }
        };
        Ok(NodeResult::values(conditioned(inputs, set, latent)?))
    }
}

/// ComfyUI's `_resize_long_edge`: the aspect kept, the long edge at most `max_size` (never enlarged), each side
/// then rounded (half to even) to a multiple of 16 and at least 16, resampled with `area` and no crop.
fn long_edge_at_most(images: &Tensor, max_size: usize) -> Result<Tensor, NodeError> {
    let (h, w) = (images.shape()[1], images.shape()[2]);
    let scale = (max_size as f64 / h.max(w) as f64).min(1.0);
    let snap = |side: usize| {
        let steps = (side as f64 * scale / STRIDE as f64).round_ties_even() as usize;
        (steps * STRIDE).max(STRIDE)
    };
    resize(images, snap(w), snap(h), "area", false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny Wan t2v model with two in-context latents, one as
    /// long as the latent and one frame, plain and in context windows of 3 latent frames: the engine's sampler
    /// cuts the long one to each window (with the retained first frame) and keeps the image whole, as ComfyUI
    /// does, and gives ComfyUI's latents (`scripts/reference/wan_windows.py`).
    #[test]
    fn context_latents_are_cut_to_context_windows_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/bernini.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-bernini-windows-{}", std::process::id()));
        let path = dir.join("t2v.safetensors");
        crate::fixtures::write_f32(&path, &crate::fixtures::tiny_wan_t2v());
        let latents = vec![io["context_latent.video"].clone(), io["context_latent.image"].clone()];
        let extras = crate::models::CondExtras { context_latents: latents, ..Default::default() };
        super::super::windowed::check_wan_windows(&path, &io, &extras);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn the_long_edge_is_capped_and_sides_snap_to_16_as_comfyui_does() {
        let image = |h: usize, w: usize| Tensor::full(vec![1, h, w, 3], 0.5);
        let sides = |t: Tensor| (t.shape()[1], t.shape()[2]);
        // 1000 × 600 capped at 848: 508.8 → 512 (31.8 steps → 32), 848.
        assert_eq!(sides(long_edge_at_most(&image(600, 1000), 848).unwrap()), (512, 848));
        // Never enlarged; 40 = 2.5 steps rounds half to even (2 steps, 32); a side under one step takes one.
        assert_eq!(sides(long_edge_at_most(&image(40, 100), 848).unwrap()), (32, 96));
        assert_eq!(sides(long_edge_at_most(&image(4, 100), 848).unwrap()), (16, 96));
    }
}
