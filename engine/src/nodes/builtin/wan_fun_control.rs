//! The Wan Fun Control nodes (`comfy_extras.nodes_wan`): `WanFunControlToVideo` (Wan 2.1 Fun Control: the
//! control video's latent and the start image's side by side, CLIP vision states) and `Wan22FunControlToVideo`
//! (Wan 2.2 Fun Control A14B and 5B: the same in the VAE's own latent, with the start frames' mask between them
//! and the reference image's latent for the model's reference convolution). The parts nobody gave are the latent
//! space's zero in VAE space (ComfyUI's `process_out` of zeros), so the sampler's `process_latent_in` makes them
//! zero again.

use std::sync::Arc;

use super::vae::encode_video;
use super::wan::{
    VideoRequest, WAN21_CHANNELS, conditioned, conditioning_spec, first_last_mask, fit_frames,
    latent_frames, penultimate,
};
use crate::compute::Compute;
use crate::models::{CondExtras, LatentFormat};
use crate::nodes::{Context, Inputs, Node, NodeError, NodeResult, NodeSpec};
use crate::tensor::Tensor;

/// `WanFunControlToVideo` (Wan 2.1) or `Wan22FunControlToVideo`.
pub(super) struct WanFunControlToVideo {
    spec: Arc<NodeSpec>,
    wan22: bool,
    compute: Arc<Compute>,
}

impl WanFunControlToVideo {
    /// `WanFunControlToVideo`.
    pub(super) fn wan21(compute: Arc<Compute>) -> WanFunControlToVideo {
        let optional = ["clip_vision_output", "start_image", "control_video"];
        let spec = conditioning_spec("WanFunControlToVideo", CATEGORY, &optional);
        WanFunControlToVideo { spec: Arc::new(spec), wan22: false, compute }
    }

    /// `Wan22FunControlToVideo`.
    pub(super) fn wan22(compute: Arc<Compute>) -> WanFunControlToVideo {
        let spec =
            conditioning_spec("Wan22FunControlToVideo", CATEGORY, &["ref_image", "control_video"]);
        WanFunControlToVideo { spec: Arc::new(spec), wan22: true, compute }
    }
}

const CATEGORY: &str = "model/conditioning/wan/fun control";

impl Node for WanFunControlToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let frames = latent_frames(length);
        // Wan 2.1's node makes the 2.1 latent whatever the VAE; 2.2's the VAE's own.
        let (format, scale) = if self.wan22 {
            (vae.net.family().latent(), vae.net.downscale())
        } else {
            (LatentFormat::WAN21, 8)
        };
        let channels = format.channels;
        if self.wan22 && channels != WAN21_CHANNELS && channels != 48 {
            return Err(NodeError::new(format!(
                "Wan22FunControlToVideo needs a Wan VAE (16 or 48 latent channels); this one has {channels}"
            )));
        }
        let (h, w) = (height / scale, width / scale);
        let mut concat = Concat::zero(&format, [batch, 2 * channels, frames, h, w]);
        let encode = |name: &str, range: std::ops::RangeTo<usize>| -> Result<_, NodeError> {
            match inputs.get(name) {
                None => Ok(None),
                Some(_) => {
                    let frames = fit_frames(inputs.image(name)?, range, width, height)?;
                    let encoded = encode_video(&self.compute, vae, &frames, ctx)?;
                    Ok(Some((frames.shape()[0], encoded)))
                }
            }
        };
        // ComfyUI's Wan22FunControlToVideo declares no start image (its code reads one that never comes).
        let start = if self.wan22 { None } else { encode("start_image", ..length)? };
        if let Some((_, encoded)) = &start {
            concat.put(encoded, channels)?;
        }
        if let Some((_, encoded)) = encode("control_video", ..length)? {
            concat.put(&encoded, 0)?;
        }
        let reference = if self.wan22 { encode("ref_image", ..1)?.map(|(_, r)| r) } else { None };
        let mask = if self.wan22 {
            let start = start.as_ref().map(|(n, _)| Tensor::full(vec![*n, 1, 1, 1], 0.0));
            Some(first_last_mask((h, w), frames, start.as_ref(), None)?)
        } else {
            None
        };
        let clip_vision = penultimate(inputs, "clip_vision_output")?;
        let concat = concat.into_tensor()?;
        let set = |extras: &mut CondExtras| {
            extras.concat_latent_image = Some(concat.clone());
            if let Some(mask) = &mask {
                extras.concat_mask = Some(mask.clone());
                extras.concat_mask_index = Some(channels);
            }
            if let Some(reference) = &reference {
                extras.reference_latents.push(reference.clone());
            }
            if let Some(states) = &clip_vision {
                extras.clip_vision = Some(states.clone());
            }
        };
        let latent = Tensor::full(vec![batch, channels, frames, h, w], 0.0);
        Ok(NodeResult::values(conditioned(inputs, set, latent)?))
    }
}

/// The conditioning latent being built: `[B, 2C, T, h, w]`, each group of C channels starting as the latent
/// space's zero in VAE space.
struct Concat {
    shape: [usize; 5],
    values: Vec<f32>,
}

impl Concat {
    /// The latent space's zero of `format`, in VAE space, repeated over both channel groups.
    fn zero(format: &LatentFormat, shape: [usize; 5]) -> Concat {
        let [batch, channels, frames, h, w] = shape;
        let group = channels / 2;
        let zero = format.process_out(&vec![0.0; group], &[1, group]);
        let plane = frames * h * w;
        let mut values = Vec::with_capacity(batch * channels * plane);
        for _ in 0..batch {
            for c in 0..channels {
                values.extend(std::iter::repeat_n(zero[c % group], plane));
            }
        }
        Concat { shape, values }
    }

    /// Writes `encoded` `[1, C, T', h, w]` over channels `at..at + C` of every sample, its first frames up to
    /// the conditioning's (ComfyUI's `concat_latent[:, at:, :T'] = encoded[:, :, :T]`).
    fn put(&mut self, encoded: &Tensor, at: usize) -> Result<(), NodeError> {
        let [batch, channels, frames, h, w] = self.shape;
        let &[1, c, t, eh, ew] = encoded.shape() else {
            return Err(NodeError::new(format!(
                "expected a VAE-encoded clip [1, C, T, h, w], got {:?}",
                encoded.shape()
            )));
        };
        if at + c > channels || (eh, ew) != (h, w) {
            return Err(NodeError::new(format!(
                "this VAE encoded the video to {:?}; the conditioning needs {} channels at {h}×{w}",
                encoded.shape(),
                channels / 2
            )));
        }
        let plane = h * w;
        let given = t.min(frames);
        for s in 0..batch {
            for ch in 0..c {
                let dst = ((s * channels + at + ch) * frames) * plane;
                let src = ch * t * plane;
                self.values[dst..dst + given * plane]
                    .copy_from_slice(&encoded.data()[src..src + given * plane]);
            }
        }
        Ok(())
    }

    fn into_tensor(self) -> Result<Tensor, NodeError> {
        Tensor::new(self.shape.to_vec(), self.values).map_err(|e| NodeError::new(e.to_string()))
    }
}
