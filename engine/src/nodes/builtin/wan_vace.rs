//! `WanVaceToVideo` (`comfy_extras.nodes_wan`): the control a Wan VACE model reads. The control video (grey
//! where none is given) split by the control masks into what stays (inactive) and what the model makes
//! (reactive), both VAE-encoded; the masks folded to 64 channels, one per pixel of each latent position's 8×8,
//! resampled to the latent frames; a reference image's latent (with the latent space's zero beside it) put
//! before the video, its frame masked as given and reported as `trim_latent`. Appended to both prompts' VACE
//! controls with the strength.

use std::sync::Arc;

use super::mask::mask;
use super::resize::resize;
use super::vae::encode_video;
use super::wan::{VideoRequest, conditioned, conditioning_spec, fit_frames, latent_frames};
use crate::compute::Compute;
use crate::models::{CondExtras, VaceControl};
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// The Wan 2.1 VAE's spatial downscale, which the masks are folded by.
const STRIDE: usize = 8;
/// Latent channels of the Wan 2.1 VAE.
const CHANNELS: usize = 16;

/// `WanVaceToVideo`.
pub(super) struct WanVaceToVideo {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl WanVaceToVideo {
    pub(super) fn new(compute: Arc<Compute>) -> WanVaceToVideo {
        let spec = conditioning_spec("WanVaceToVideo", "model/conditioning/wan/vace", &[]);
        let spec = NodeSpec { outputs: Vec::new(), ..spec }
            .input(InputDef::float("strength", 1.0, 0.0, 1000.0).option("step", 0.01))
            .optional(InputDef::typed("control_video", "IMAGE"))
            .optional(InputDef::typed("control_masks", "MASK"))
            .optional(InputDef::typed("reference_image", "IMAGE"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"))
            .output(OutputDef::new("INT").named("trim_latent"))
            .aliases(&["video conditioning", "video control"]);
        WanVaceToVideo { spec: Arc::new(spec), compute }
    }
}

impl Node for WanVaceToVideo {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let VideoRequest { vae, width, height, length, batch } = VideoRequest::read(inputs)?;
        let strength = inputs.float("strength")?;
        let (h, w) = (height / STRIDE, width / STRIDE);
        if length == 0 || h == 0 || w == 0 || height % STRIDE != 0 || width % STRIDE != 0 {
            return Err(NodeError::new(format!(
                "WanVaceToVideo needs a width and height that are multiples of {STRIDE} and a length of 1 or \
                 more, got {width}×{height}×{length}"
            )));
        }
        let latent_format = vae.net.family().latent();
        if latent_format.channels != CHANNELS || vae.net.downscale() != STRIDE {
            return Err(NodeError::new(
                "WanVaceToVideo needs the Wan 2.1 VAE (16 latent channels, 8× down), as VACE models read",
            ));
        }
        let plane = height * width;
        // The control video `[length, H, W, 3]`, grey (0.5) where none is given or after its last frame.
        let mut video = vec![0.5f32; length * plane * 3];
        if inputs.get("control_video").is_some() {
            let given = fit_frames(inputs.image("control_video")?, ..length, width, height)?;
            let c = given.shape()[3];
            for (dst, src) in video.chunks_exact_mut(3).zip(given.data().chunks_exact(c)) {
                dst.copy_from_slice(&src[..3.min(c)]);
            }
        }
        // The masks `[length, H, W]`, 1 (make it) where none is given or after the last.
        let mut masks = vec![1.0f32; length * plane];
        if inputs.get("control_masks").is_some() {
            let (m, [n, mh, mw]) = mask(inputs, "control_masks")?;
            let n = n.min(length);
            let first = Tensor::new(vec![n, mh, mw, 1], m.data()[..n * mh * mw].to_vec())
                .map_err(|e| NodeError::new(e.to_string()))?;
            let resized = resize(&first, width, height, "bilinear", true)?;
            masks[..n * plane].copy_from_slice(resized.data());
        }
        let split = |reactive: bool| -> Result<Tensor, NodeError> {
            let values = video
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let m = masks[i / 3];
                    (v - 0.5) * if reactive { m } else { 1.0 - m } + 0.5
                })
                .collect();
            Tensor::new(vec![length, height, width, 3], values)
                .map_err(|e| NodeError::new(e.to_string()))
        };
        let inactive = encode_video(&self.compute, vae, &split(false)?, ctx)?;
        let reactive = encode_video(&self.compute, vae, &split(true)?, ctx)?;
        let mut frames = join(&inactive, &reactive, 1)?;
        let mut latent_length = latent_frames(length);
        let mut trim = 0;
        let mut mask = fold_mask(&masks, length, latent_length, h, w);
        if inputs.get("reference_image").is_some() {
            let image = fit_frames(inputs.image("reference_image")?, ..1, width, height)?;
            let encoded = encode_video(&self.compute, vae, &image, ctx)?;
            let zero = latent_format.process_out(&vec![0.0; encoded.data().len()], encoded.shape());
            let zero = Tensor::new(encoded.shape().to_vec(), zero)
                .map_err(|e| NodeError::new(e.to_string()))?;
            let reference = join(&encoded, &zero, 1)?;
            trim = reference.shape()[2];
            frames = join(&reference, &frames, 2)?;
            // The reference's frames are given: mask 0.
            let mut padded = Vec::with_capacity(mask.len() + 64 * trim * h * w);
            for channel in mask.chunks_exact(latent_length * h * w) {
                padded.extend(std::iter::repeat_n(0.0, trim * h * w));
                padded.extend_from_slice(channel);
            }
            mask = padded;
            latent_length += trim;
        }
        let mask = Tensor::new(vec![1, STRIDE * STRIDE, latent_length, h, w], mask)
            .map_err(|e| NodeError::new(e.to_string()))?;
        let control = VaceControl { frames, mask, strength };
        let set = |extras: &mut CondExtras| extras.vace.push(control.clone());
        let latent = Tensor::full(vec![batch, CHANNELS, latent_length, h, w], 0.0);
        let [positive, negative, latent] = conditioned(inputs, set, latent)?;
        Ok(NodeResult::values([positive, negative, latent, Value::Int(trim as i64)]))
    }
}

/// `a` and `b` `[1, …]` joined along `dim` (1: channels, 2: frames) of their `[1, C, T, h, w]`.
fn join(a: &Tensor, b: &Tensor, dim: usize) -> Result<Tensor, NodeError> {
    let (sa, sb) = (a.shape(), b.shape());
    let fits = sa.len() == 5
        && sb.len() == 5
        && sa[0] == 1
        && sb[0] == 1
        && (0..5).all(|d| d == dim || sa[d] == sb[d]);
    if !fits {
        return Err(NodeError::new(format!(
            "latents {sa:?} and {sb:?} cannot be joined on dimension {dim}"
        )));
    }
    // Blocks of the part below `dim` interleave: channels join whole; frames join per channel.
    let (na, nb): (usize, usize) = (sa[dim..].iter().product(), sb[dim..].iter().product());
    let outer: usize = sa[..dim].iter().product();
    let mut out = Vec::with_capacity(a.data().len() + b.data().len());
    for i in 0..outer {
        out.extend_from_slice(&a.data()[i * na..][..na]);
        out.extend_from_slice(&b.data()[i * nb..][..nb]);
    }
    let mut shape = sa.to_vec();
    shape[dim] += sb[dim];
    Tensor::new(shape, out).map_err(|e| NodeError::new(e.to_string()))
}

/// The masks `[length, H, W]` as `[64, frames, h, w]`: channel `8y + x` holds pixel (y, x) of each latent
/// position's 8×8, and latent frame t reads pixel frame ⌊(t + ½)·length / frames⌋ (ComfyUI's view, permute
/// and `nearest-exact` interpolation in time).
fn fold_mask(masks: &[f32], length: usize, frames: usize, h: usize, w: usize) -> Vec<f32> {
    let (height, width) = (h * STRIDE, w * STRIDE);
    let mut out = Vec::with_capacity(STRIDE * STRIDE * frames * h * w);
    for y in 0..STRIDE {
        for x in 0..STRIDE {
            for t in 0..frames {
                let src =
                    (((t as f64 + 0.5) * length as f64 / frames as f64) as usize).min(length - 1);
                let frame = &masks[src * height * width..][..height * width];
                for i in 0..h {
                    for j in 0..w {
                        out.push(frame[(i * STRIDE + y) * width + j * STRIDE + x]);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    /// The tiny VACE model (`wan_windows.py`'s: the t2v variant with the VACE blocks `wan.py`'s `vace_weights`
    /// makes of its own tensors), f32, written under `dir`.
    fn write_vace_model(dir: &std::path::Path) -> std::path::PathBuf {
        let mut t = crate::fixtures::tiny_wan_t2v();
        let mut extra = std::collections::BTreeMap::new();
        for (n, source) in [(0, 1), (1, 0)] {
            let from = format!("blocks.{source}.");
            for (name, value) in &t {
                if let Some(rest) = name.strip_prefix(&from) {
                    extra.insert(format!("vace_blocks.{n}.{rest}"), value.clone());
                }
            }
            for part in ["weight", "bias"] {
                let o = t[&format!("blocks.{source}.cross_attn.o.{part}")].clone();
                extra.insert(format!("vace_blocks.{n}.after_proj.{part}"), o);
            }
        }
        for part in ["weight", "bias"] {
            let o = t[&format!("blocks.0.self_attn.o.{part}")].clone();
            extra.insert(format!("vace_blocks.0.before_proj.{part}"), o);
        }
        let ti2v = crate::fixtures::model_tensors("wan/ti2v.safetensors");
        let (shape, values) = &ti2v["patch_embedding.weight"];
        let row = values.len() / shape[0];
        let doubled = values.chunks(row).flat_map(|r| r.iter().chain(r)).copied().collect();
        let mut doubled_shape = shape.clone();
        doubled_shape[1] *= 2;
        extra.insert("vace_patch_embedding.weight".into(), (doubled_shape, doubled));
        extra.insert("vace_patch_embedding.bias".into(), ti2v["patch_embedding.bias"].clone());
        t.extend(extra);
        let path = dir.join("vace.safetensors");
        crate::fixtures::write_f32(&path, &t);
        path
    }

    /// ComfyUI's CFGGuider (cfg 2, euler, 3 steps) on the tiny VACE model with a control video and its mask,
    /// plain and in context windows of 3 latent frames (the first frame's conditioning retained, the causal fix):
    /// the engine's sampler cuts the VACE control to each window as ComfyUI does and gives ComfyUI's latents
    /// (`scripts/reference/wan_windows.py`).
    #[test]
    fn vace_controls_are_cut_to_context_windows_as_comfyuis() {
        let io = crate::fixtures::tensors("context_windows/vace.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-vace-windows-{}", std::process::id()));
        let path = write_vace_model(&dir);
        let control = VaceControl {
            frames: io["vace_frames"].clone(),
            mask: io["vace_mask"].clone(),
            strength: 0.8,
        };
        let extras = CondExtras { vace: vec![control], ..CondExtras::default() };
        super::super::windowed::check_wan_windows(&path, &io, &extras);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn masks_fold_each_latent_positions_pixels_into_channels_and_frames_by_nearest() {
        // 5 pixel frames of 8×16 → 2 latent frames of 1×2; frame k is all k, except pixel (3, 2) of frame 4.
        let (length, h, w) = (5, 1, 2);
        let mut masks: Vec<f32> =
            (0..length).flat_map(|k| std::iter::repeat_n(k as f32, 8 * 16)).collect();
        masks[4 * 128 + 3 * 16 + 2] = 9.0;
        let out = fold_mask(&masks, length, 2, h, w);
        assert_eq!(out.len(), 64 * 2 * 2);
        let at = |c: usize, t: usize, j: usize| out[(c * 2 + t) * 2 + j];
        // Latent frame 0 reads pixel frame ⌊0.5·5/2⌋ = 1; frame 1 reads ⌊1.5·5/2⌋ = 3.
        assert_eq!((at(0, 0, 0), at(63, 1, 1)), (1.0, 3.0));
        let out = fold_mask(&masks, length, 1, h, w);
        // One latent frame reads pixel frame 2; with 5 it would read each; channel 8·3 + 2, column 0.
        assert_eq!(out[(3 * 8 + 2) * 2], 2.0);
        let out = fold_mask(&masks, length, 5, h, w);
        assert_eq!(
            (out[((3 * 8 + 2) * 5 + 4) * 2], out[((3 * 8 + 2) * 5 + 4) * 2 + 1]),
            (9.0, 4.0)
        );
    }
}
