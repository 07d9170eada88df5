//! The HunyuanVideo 1.5 nodes (`comfy_extras.nodes_hunyuan`): `EmptyHunyuanVideo15Latent` (zeros in the
//! HunyuanVideo 1.5 VAE's 32-channel, 16× latent) and `HunyuanVideo15ImageToVideo` (the start image's frames
//! encoded into the front of a conditioning latent, zeros after them, the mask of which latent frames are given,
//! and the CLIP vision output's last hidden state, set on both prompts); and the channels a HunyuanVideo 1.5 model
//! reads beside the latents, as ComfyUI's `HunyuanVideo15.concat_cond` builds them from the conditioning.

use std::sync::Arc;

use super::clip_vision::vision_output;
use super::concat::{join_channels, resize_to_batch};
use super::pure::Pure;
use super::vae::encode_video;
use super::wan::{
    VideoRequest, conditioned, fit_frames, frame_mask, latent_frames, set_image, size, video_inputs,
};
use super::wan_concat::{
    as_video, check, mean_channels, pad_frames, process_in_groups, resize_frames,
};
use crate::compute::Compute;
use crate::models::{CondExtras, LatentFormat};
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// Channels of the HunyuanVideo 1.5 VAE's latent.
const CHANNELS: usize = 32;
/// Pixels per latent position of the HunyuanVideo 1.5 VAE.
const DOWNSCALE: usize = 16;
/// ComfyUI's module of both nodes.
const MODULE: &str = "comfy_extras.nodes_hunyuan";
/// Both nodes' category.
const CATEGORY_LATENT: &str = "model/latent/hunyuan video";

/// A zero HunyuanVideo 1.5 latent `[batch, 32, ⌊(length − 1)/4⌋ + 1, height / 16, width / 16]`.
fn zero_latent(batch: usize, length: usize, height: usize, width: usize) -> Tensor {
    let shape = vec![batch, CHANNELS, latent_frames(length), height / DOWNSCALE, width / DOWNSCALE];
    Tensor::full(shape, 0.0)
}

/// `EmptyHunyuanVideo15Latent` ("Empty HunyuanVideo 1.5 Latent"): zeros in the 16× latent, marked as made for a
/// 16× VAE.
pub(super) fn empty_hunyuan_video15_latent() -> Pure {
    let spec = NodeSpec::new(
        "EmptyHunyuanVideo15Latent",
        "Empty HunyuanVideo 1.5 Latent",
        CATEGORY_LATENT,
    )
    .python_module(MODULE)
    .v3();
    let spec = video_inputs(spec, (848, 480), (16, 16), 25).output(OutputDef::new("LATENT"));
    Pure::new(spec, |inputs| {
        let latent = zero_latent(
            size(inputs, "batch_size")?,
            size(inputs, "length")?,
            size(inputs, "height")?,
            size(inputs, "width")?,
        );
        let latent = Latent { downscale_ratio_spacial: Some(DOWNSCALE), ..Latent::new(latent) };
        Ok(vec![Value::Latent(latent)])
    })
}

/// `HunyuanVideo15ImageToVideo`: the empty latent, and on both prompts the start image's conditioning (its
/// first `length` frames resized with a centre crop and encoded, in front of zero frames, with the mask that is
/// 0 on the latent frames they cover) and the CLIP vision output's last hidden state, each where given.
pub(super) struct HunyuanVideo15ImageToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl HunyuanVideo15ImageToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> HunyuanVideo15ImageToVideo {
        let spec =
            NodeSpec::new("HunyuanVideo15ImageToVideo", "", "model/conditioning/hunyuan video")
                .python_module(MODULE)
                .v3()
                .input(InputDef::typed("positive", "CONDITIONING"))
                .input(InputDef::typed("negative", "CONDITIONING"))
                .input(InputDef::typed("vae", "VAE"));
        let spec = video_inputs(spec, (848, 480), (16, 16), 33)
            .optional(InputDef::typed("start_image", "IMAGE"))
            .optional(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"));
        HunyuanVideo15ImageToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for HunyuanVideo15ImageToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let latent = zero_latent(batch, length, height, width);
        let frames = latent.shape()[2];
        let concat = match inputs.get("start_image") {
            None => None,
            Some(_) => {
                let start = fit_frames(inputs.image("start_image")?, ..length, width, height)?;
                // Only the given frames are encoded; the latent frames after them stay zero.
                let encoded = encode_video(&self.compute, vae, &start, ctx)?;
                let given = latent_frames(start.shape()[0]);
                let mask = frame_mask(&encoded, frames, |f| f < given)?;
                Some((pad_frames(&encoded, frames)?, mask))
            }
        };
        let clip_vision = match inputs.get("clip_vision_output") {
            None => None,
            Some(_) => Some(vision_output(inputs, "clip_vision_output")?.last_hidden_state.clone()),
        };
        let set =
            |extras: &mut CondExtras| set_image(extras, concat.as_ref(), clip_vision.as_ref());
        Ok(NodeResult::values(conditioned(inputs, set, latent)?))
    }
}

/// The `extra` channels a HunyuanVideo 1.5 model reads beside latents of `shape` `[B, C, T, h, w]`, or a Kandinsky
/// 5 video model (whose image latent ComfyUI always leaves zero: `image` `None`): the conditioning's `image` latent
/// (zeros without one) resized to the latents and put in the model's space, then one mask channel, 1 where a
/// frame is given (the nodes store 0 there in `mask`; without a mask, zeros), frames past the mask's 0; `None`
/// for a model that reads none. `denoise_mask` is the latent's noise mask, the mask used when the conditioning
/// has none.
pub(super) fn concat_channels(
    extra: usize,
    latent: &LatentFormat,
    (image, mask): (Option<&Tensor>, Option<&Tensor>),
    shape: &[usize],
    denoise_mask: Option<&[f32]>,
) -> Result<Option<Tensor>, NodeError> {
    if extra == 0 {
        return Ok(None);
    }
    let &[batch, channels, frames, h, w] = shape else {
        return Err(NodeError::new(format!(
            "a HunyuanVideo 1.5 model takes video latents [B, C, T, h, w], not {shape:?}"
        )));
    };
    let image_channels = extra - 1;
    let image = match image {
        None => Tensor::full(vec![batch, image_channels, frames, h, w], 0.0),
        Some(image) => {
            let image = resize_frames(&as_video(image)?, w, h)?;
            resize_to_batch(&process_in_groups(latent, &image)?, batch)?
        }
    };
    let mask = match (mask, denoise_mask) {
        (Some(mask), _) => Some(as_video(mask)?),
        (None, Some(mask)) => Some(
            Tensor::new(vec![batch, channels, frames, h, w], mask.to_vec())
                .map_err(|e| NodeError::new(e.to_string()))?,
        ),
        (None, None) => None,
    };
    let mask = match mask {
        None => Tensor::full(vec![batch, 1, frames, h, w], 0.0),
        Some(mask) => {
            let mask = mean_channels(&mask)?.map(|v| 1.0 - v);
            resize_to_batch(&pad_frames(&resize_frames(&mask, w, h)?, frames)?, batch)?
        }
    };
    for (what, t) in [("image latent", &image), ("mask", &mask)] {
        if t.shape()[2] != frames {
            return Err(NodeError::new(format!(
                "the conditioning's {what} covers {} frames, the latents {frames} (make the latent and the \
                 conditioning with one HunyuanVideo15ImageToVideo)",
                t.shape()[2]
            )));
        }
    }
    check(join_channels(&image, &mask)?, extra, frames)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 2-channel latent format with the identity map, so the tiny image latent's values come through as they
    /// are.
    const PLAIN: LatentFormat = LatentFormat {
        channels: 2,
        normalize: kiln_models::latent::Normalize::Identity,
        ..LatentFormat::HUNYUAN_VIDEO15
    };

    fn ramp(shape: Vec<usize>) -> Tensor {
        let n = shape.iter().product();
        Tensor::new(shape, (0..n).map(|i| i as f32).collect()).unwrap()
    }

    #[test]
    fn without_an_image_the_channels_are_zero() {
        let shape = [2, 2, 3, 2, 2];
        let got = concat_channels(3, &PLAIN, (None, None), &shape, None).unwrap().unwrap();
        assert_eq!(got.shape(), &[2, 3, 3, 2, 2]);
        assert!(got.data().iter().all(|&v| v == 0.0));
        assert!(concat_channels(0, &PLAIN, (None, None), &shape, None).unwrap().is_none());
    }

    #[test]
    fn the_image_latent_then_the_inverted_mask() {
        // Two image channels over three frames, the first frame given.
        let image = ramp(vec![1, 2, 3, 2, 2]);
        let mask = Tensor::new(vec![1, 1, 3, 2, 2], [0.0; 4].into_iter().chain([1.0; 8]).collect())
            .unwrap();
        let channels = (Some(&image), Some(&mask));
        let got = concat_channels(3, &PLAIN, channels, &[1, 2, 3, 2, 2], None).unwrap().unwrap();
        assert_eq!(got.shape(), &[1, 3, 3, 2, 2]);
        assert_eq!(&got.data()[..24], image.data());
        let mask: Vec<f32> = got.data()[24..].to_vec();
        assert_eq!(mask, [[1.0; 4], [0.0; 4], [0.0; 4]].concat());
    }

    #[test]
    fn a_conditioning_of_another_length_is_refused() {
        let short = ramp(vec![1, 2, 2, 2, 2]);
        let err =
            concat_channels(3, &PLAIN, (Some(&short), None), &[1, 2, 3, 2, 2], None).unwrap_err();
        assert!(err.to_string().contains("covers 2 frames, the latents 3"), "{err}");
    }
}
