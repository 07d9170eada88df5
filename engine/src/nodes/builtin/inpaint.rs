//! Inpainting and image-conditioned editing: `ImagePadForOutpaint` (the canvas grown, with the mask of what
//! is new), `InpaintModelConditioning` (`nodes.py`) and `InstructPixToPixConditioning`
//! (`comfy_extras.nodes_ip2p`), which encode the image and hand it to the model beside the prompt, and
//! `DifferentialDiffusion`, which makes a soft mask's grey levels count.

use std::sync::Arc;

use super::image::dims;
use super::mask::{mask, tensor};
use super::pure::Pure;
use super::resize::resize;
use super::vae::encode;
use crate::compute::Compute;
use crate::models::{Conditioning, DiffusionModel};
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// `ImagePadForOutpaint`'s declaration.
fn pad_spec() -> NodeSpec {
    let side = |name: &str| InputDef::int(name, 0, 0, 16384).option("step", 8);
    NodeSpec::new("ImagePadForOutpaint", "Pad Image for Outpainting", "image/transform")
        .input(InputDef::typed("image", "IMAGE"))
        .input(side("left"))
        .input(side("top"))
        .input(side("right"))
        .input(side("bottom"))
        .input(InputDef::int("feathering", 40, 0, 16384).option("step", 1).option("advanced", true))
        .output(OutputDef::new("IMAGE"))
        .output(OutputDef::new("MASK"))
        .aliases(&["extend canvas", "expand image"])
}

/// A non-negative size input.
fn size(inputs: &Inputs, name: &str) -> Result<usize, NodeError> {
    let v = inputs.int(name)?;
    usize::try_from(v).map_err(|_| NodeError::new(format!("`{name}` must be 0 or more, got {v}")))
}

/// `ImagePadForOutpaint`: the image on a larger grey (0.5) canvas, and a mask that is 1 on the new border and,
/// within `feathering` pixels of a grown side, fades into the image as `((f − d) / f)²`.
fn pad_for_outpaint(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let image = inputs.image("image")?;
    let (b, h, w, c) = dims(image)?;
    let [left, top, right, bottom] =
        ["left", "top", "right", "bottom"].map(|name| size(inputs, name));
    let (left, top, right, bottom) = (left?, top?, right?, bottom?);
    let feathering = size(inputs, "feathering")?;
    let (nh, nw) = (h + top + bottom, w + left + right);
    let mut padded = vec![0.5f32; b * nh * nw * c];
    for i in 0..b {
        for y in 0..h {
            let src = &image.data()[((i * h + y) * w) * c..][..w * c];
            padded[((i * nh + y + top) * nw + left) * c..][..w * c].copy_from_slice(src);
        }
    }
    let mut mask = vec![1f32; nh * nw];
    for y in 0..h {
        for x in 0..w {
            let mut v = 0f32;
            if feathering > 0 && feathering * 2 < h && feathering * 2 < w {
                // The distance to the nearest grown side (an ungrown side counts as far away).
                let from_top = if top != 0 { y } else { h };
                let from_bottom = if bottom != 0 { h - y } else { h };
                let from_left = if left != 0 { x } else { w };
                let from_right = if right != 0 { w - x } else { w };
                let d = from_top.min(from_bottom).min(from_left).min(from_right);
                if d < feathering {
                    // Python floats, stored into an f32 tensor.
                    let f = (feathering - d) as f64 / feathering as f64;
                    v = (f * f) as f32;
                }
            }
            mask[(y + top) * nw + x + left] = v;
        }
    }
    Ok(vec![
        Value::Image(tensor(vec![b, nh, nw, c], padded)?),
        Value::Mask(tensor(vec![1, nh, nw], mask)?),
    ])
}

/// The positive and negative with the image latent (and the mask) set on each entry.
fn with_concat(
    inputs: &Inputs,
    latent: &Tensor,
    concat_mask: Option<&Tensor>,
) -> Result<[Value; 2], NodeError> {
    let set = |name: &str| -> Result<Value, NodeError> {
        let conditioning: Conditioning = inputs.conditioning(name)?.with_extras(|e| {
            e.concat_latent_image = Some(latent.clone());
            if let Some(m) = concat_mask {
                e.concat_mask = Some(m.clone());
            }
        });
        Ok(Value::Conditioning(Arc::new(conditioning)))
    };
    Ok([set("positive")?, set("negative")?])
}

/// `[B, H, W, C]` cropped to `h × w` at (`top`, `left`).
fn crop(image: &Tensor, top: usize, left: usize, h: usize, w: usize) -> Result<Tensor, NodeError> {
    let (b, ih, iw, c) = dims(image)?;
    let mut out = Vec::with_capacity(b * h * w * c);
    for i in 0..b {
        for y in 0..h {
            out.extend_from_slice(&image.data()[((i * ih + y + top) * iw + left) * c..][..w * c]);
        }
    }
    tensor(vec![b, h, w, c], out)
}

/// The crop ComfyUI makes to a multiple of `d` (8, or the VAE's downscale): the cropped size and the offsets
/// that center it.
fn crop_to(h: usize, w: usize, d: usize) -> (usize, usize, usize, usize) {
    (h / d * d, w / d * d, (h % d) / 2, (w % d) / 2)
}

/// The `mask` input `[B_m, H', W']` resized bilinearly to the image's `w` × `h`, as `[B_m, h, w, 1]`.
fn mask_at_image_size(inputs: &Inputs, w: usize, h: usize) -> Result<(Tensor, usize), NodeError> {
    let (m, [mb, mh, mw]) = mask(inputs, "mask")?;
    let as_image = tensor(vec![mb, mh, mw, 1], m.data().to_vec())?;
    Ok((resize(&as_image, w, h, "bilinear", false)?, mb))
}

/// `InpaintModelConditioning`: the image with the masked region greyed out, encoded as the model's image
/// latent (with the mask) on both conditionings; the latent to sample is the whole image encoded, with the
/// mask as its noise mask unless `noise_mask` is off.
pub(super) struct InpaintModelConditioning {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl InpaintModelConditioning {
    pub(super) fn new(compute: Arc<Compute>) -> InpaintModelConditioning {
        let spec = NodeSpec::new(
            "InpaintModelConditioning",
            "InpaintModelConditioning",
            "model/conditioning",
        )
        .input(InputDef::typed("positive", "CONDITIONING"))
        .input(InputDef::typed("negative", "CONDITIONING"))
        .input(InputDef::typed("vae", "VAE"))
        .input(InputDef::typed("pixels", "IMAGE"))
        .input(InputDef::typed("mask", "MASK"))
        .input(InputDef::boolean("noise_mask", true).tooltip(
            "Add a noise mask to the latent so sampling will only happen within the mask. Might \
             improve results or completely break things depending on the model.",
        ))
        .output(OutputDef::new("CONDITIONING").named("positive"))
        .output(OutputDef::new("CONDITIONING").named("negative"))
        .output(OutputDef::new("LATENT").named("latent"));
        InpaintModelConditioning { spec: Arc::new(spec), compute }
    }
}

impl Node for InpaintModelConditioning {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let vae = inputs.vae("vae")?;
        let pixels = inputs.image("pixels")?;
        let (_, h, w, _) = dims(pixels)?;
        let (resized, mb) = mask_at_image_size(inputs, w, h)?;
        let (ch, cw, top, left) = crop_to(h, w, 8);
        let cropped_mask = crop(&resized, top, left, ch, cw)?;
        let cropped = crop(pixels, top, left, ch, cw)?;
        let greyed = grey_masked(&cropped, &cropped_mask, mb)?;
        let concat = encode(&self.compute, vae, &greyed, ctx)?;
        let samples = encode(&self.compute, vae, pixels, ctx)?;
        let mask = tensor(vec![mb, 1, ch, cw], cropped_mask.data().to_vec())?;
        let [positive, negative] = with_concat(inputs, &concat, Some(&mask))?;
        let mut latent = Latent::new(samples);
        if inputs.bool("noise_mask")? {
            latent.noise_mask = Some(mask);
        }
        Ok(NodeResult::values([positive, negative, Value::Latent(latent)]))
    }
}

/// `pixels` `[B, H, W, C]` grey where the mask `[B_m, H, W, 1]` (`B_m` 1 or B) rounds to 1: (p − 0.5)·(1 −
/// round(m)) + 0.5 on the colour channels, as ComfyUI's inpainting nodes grey them.
fn grey_masked(pixels: &Tensor, mask: &Tensor, mb: usize) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(pixels)?;
    let plane = h * w;
    let mut greyed = pixels.data().to_vec();
    for i in 0..b {
        let keep = &mask.data()[(i % mb) * plane..][..plane];
        for (p, k) in greyed[i * plane * c..][..plane * c].chunks_mut(c).zip(keep) {
            let k = 1.0 - k.round_ties_even();
            p.iter_mut().take(3).for_each(|v| *v = (*v - 0.5) * k + 0.5);
        }
    }
    tensor(vec![b, h, w, c], greyed)
}

/// `VAEEncodeForInpaint`: the image cropped to the VAE's multiple with the masked region greyed out, encoded;
/// the mask (bilinear at the image's size, rounded) grown by `grow_mask_by` pixels rides along as the latent's
/// noise mask, so sampling repaints only there.
pub(super) struct VaeEncodeForInpaint {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl VaeEncodeForInpaint {
    pub(super) fn new(compute: Arc<Compute>) -> VaeEncodeForInpaint {
        let spec =
            NodeSpec::new("VAEEncodeForInpaint", "VAE Encode (for Inpainting)", "model/latent")
                .input(InputDef::typed("pixels", "IMAGE"))
                .input(InputDef::typed("vae", "VAE"))
                .input(InputDef::typed("mask", "MASK"))
                .input(InputDef::int("grow_mask_by", 6, 0, 64).option("step", 1))
                .output(OutputDef::new("LATENT"))
                .aliases(&[]);
        VaeEncodeForInpaint { spec: Arc::new(spec), compute }
    }
}

impl Node for VaeEncodeForInpaint {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let vae = inputs.vae("vae")?;
        let pixels = inputs.image("pixels")?;
        let (b, h, w, _) = dims(pixels)?;
        let (resized, mb) = mask_at_image_size(inputs, w, h)?;
        if mb != 1 && mb != b {
            return Err(NodeError::new(format!(
                "VAEEncodeForInpaint: a mask of {mb} frames for {b} images (give one, or one per image)"
            )));
        }
        let (ch, cw, top, left) = crop_to(h, w, vae.net.downscale());
        let cropped_mask = crop(&resized, top, left, ch, cw)?;
        let greyed = grey_masked(&crop(pixels, top, left, ch, cw)?, &cropped_mask, mb)?;
        let samples = encode(&self.compute, vae, &greyed, ctx)?;
        let grow = usize::try_from(inputs.int("grow_mask_by")?)
            .map_err(|_| NodeError::new("`grow_mask_by` must be 0 or more"))?;
        let noise_mask = grown(&cropped_mask, [mb, ch, cw], grow)?;
        Ok(NodeResult::values([Value::Latent(Latent {
            noise_mask: Some(noise_mask),
            ..Latent::new(samples)
        })]))
    }
}

/// The rounded mask `[B, H, W, 1]` grown by `grow` pixels as ComfyUI grows it: a `grow` × `grow` box of ones
/// convolved over it with ceil((grow − 1) / 2) zeros of padding, clamped to 1 and cut to H × W (a pixel is set
/// when any pixel of its box is); `[B, 1, H, W]`. `grow` 0 keeps the mask, rounded.
fn grown(mask: &Tensor, [b, h, w]: [usize; 3], grow: usize) -> Result<Tensor, NodeError> {
    let rounded: Vec<f32> = mask.data().iter().map(|v| v.round_ties_even()).collect();
    if grow == 0 {
        return tensor(vec![b, 1, h, w], rounded);
    }
    let pad = (grow - 1).div_ceil(2);
    let mut out = vec![0f32; b * h * w];
    for i in 0..b {
        let plane = &rounded[i * h * w..][..h * w];
        for y in 0..h {
            for x in 0..w {
                // Output (y, x) sums input rows y − pad .. y − pad + grow and the columns alike (zeros outside).
                let mut sum = 0f32;
                for r in y.saturating_sub(pad)..(y + grow).saturating_sub(pad).min(h) {
                    for c in x.saturating_sub(pad)..(x + grow).saturating_sub(pad).min(w) {
                        sum += plane[r * w + c];
                    }
                }
                out[(i * h + y) * w + x] = sum.clamp(0.0, 1.0).round_ties_even();
            }
        }
    }
    tensor(vec![b, 1, h, w], out)
}

/// `InstructPixToPixConditioning`: the image (cropped to a multiple of 8) encoded as the image latent on
/// both conditionings; the latent to sample is zeros of its shape.
pub(super) struct InstructPixToPixConditioning {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl InstructPixToPixConditioning {
    pub(super) fn new(compute: Arc<Compute>) -> InstructPixToPixConditioning {
        let spec =
            NodeSpec::new("InstructPixToPixConditioning", "", "model/conditioning/instructpix2pix")
                .python_module("comfy_extras.nodes_ip2p")
                .v3()
                .input(InputDef::typed("positive", "CONDITIONING"))
                .input(InputDef::typed("negative", "CONDITIONING"))
                .input(InputDef::typed("vae", "VAE"))
                .input(InputDef::typed("pixels", "IMAGE"))
                .output(OutputDef::new("CONDITIONING").named("positive"))
                .output(OutputDef::new("CONDITIONING").named("negative"))
                .output(OutputDef::new("LATENT").named("latent"));
        InstructPixToPixConditioning { spec: Arc::new(spec), compute }
    }
}

impl Node for InstructPixToPixConditioning {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let pixels = inputs.image("pixels")?;
        let (_, h, w, _) = dims(pixels)?;
        let (ch, cw, top, left) = crop_to(h, w, 8);
        let cropped = crop(pixels, top, left, ch, cw)?;
        let concat = encode(&self.compute, inputs.vae("vae")?, &cropped, ctx)?;
        let zeros = Tensor::full(concat.shape().to_vec(), 0.0);
        let [positive, negative] = with_concat(inputs, &concat, None)?;
        Ok(NodeResult::values([positive, negative, Value::Latent(Latent::new(zeros))]))
    }
}

/// `ImagePadForOutpaint`.
pub(super) fn pad_node() -> Pure {
    Pure::new(pad_spec(), pad_for_outpaint)
}

/// `DifferentialDiffusion`: the model with the mask function that lets an inpainting mask's grey levels set
/// how much each area changes (`comfy_extras.nodes_differential_diffusion`).
pub(super) fn differential_diffusion_node() -> Pure {
    Pure::new(
        NodeSpec::new("DifferentialDiffusion", "Differential Diffusion", "experimental")
            .python_module("comfy_extras.nodes_differential_diffusion")
            .v3()
            .experimental()
            .input(InputDef::typed("model", "MODEL"))
            .optional(InputDef::float("strength", 1.0, 0.0, 1.0).option("step", 0.01))
            .output(OutputDef::new("MODEL"))
            .aliases(&["inpaint gradient", "variable denoise strength"]),
        |inputs| {
            let strength = if inputs.has("strength") { inputs.float("strength")? } else { 1.0 };
            let model = inputs.model("model")?;
            let patched = DiffusionModel {
                differential_diffusion: Some(strength as f32),
                ..model.as_ref().clone()
            };
            Ok(vec![Value::Model(Arc::new(patched))])
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::Output;

    /// ComfyUI's VAEEncodeForInpaint on the tiny Wan 2.1 VAE (`scripts/reference/inpaint.py`): a soft mask of
    /// another size resized and cropped with the image, the greyed image encoded, the mask grown by 0, 3 and 6.
    #[test]
    fn encode_for_inpaint_greys_crops_and_grows_the_mask_as_comfyui() {
        let io = crate::fixtures::tensors("inpaint/encode_for_inpaint.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-encode-inpaint-{}", std::process::id()));
        let (env, vae) = crate::fixtures::tiny_wan_vae(&dir);
        let vae = Arc::new(vae);
        let node = VaeEncodeForInpaint::new(env.compute.clone());
        let ctx = crate::fixtures::quiet_context(&dir);
        for grow in [0, 3, 6] {
            let inputs = Inputs::from_values([
                ("pixels".to_owned(), Value::Image(io["pixels"].clone())),
                ("vae".to_owned(), Value::Vae(vae.clone())),
                ("mask".to_owned(), Value::Mask(io["mask"].clone())),
                ("grow_mask_by".to_owned(), Value::Int(grow)),
            ]);
            let result = node.execute(&inputs, &ctx).expect("the node runs");
            let Some(Output::One(Value::Latent(latent))) = result.outputs.first() else {
                panic!("one latent")
            };
            // Kiln keeps an image's latent from a video VAE 4-D (ComfyUI's [1, 16, 1, 4, 5] without its frame).
            assert_eq!(latent.samples.shape(), [1, 16, 4, 5]);
            crate::fixtures::assert_relative(
                "samples",
                latent.samples.data(),
                io["samples"].data(),
                1e-4,
            );
            assert_eq!(
                latent.noise_mask.as_ref(),
                Some(&io[&format!("noise_mask.{grow}")]),
                "{grow}"
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}
