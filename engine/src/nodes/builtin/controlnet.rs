//! ControlNets: `ControlNetLoader` (`nodes.py`), `ControlNetApplyAdvanced` (`nodes.py`), which puts a ControlNet
//! with its image on both conditionings, and `ControlNetInpaintingAliMamaApply` (`comfy_extras.nodes_controlnet`),
//! which hands an inpainting ControlNet the masked image and the mask. The sampler prepares each image once per
//! run ([`with_hints`]: resized to the latents' size in pixels, VAE-encoded into the model's latent space, the
//! mask channel added) and the model adds the ControlNet's outputs while sampling is within its range.

use std::sync::Arc;

use super::hints::{HintPixels, encoded_hint, with_mask_channels};
use super::image::dims;
use super::loaders::{find, progress};
use super::mask::{mask, tensor};
use super::resize::resize;
use crate::compute::Compute;
use crate::models::{Conditioning, ControlApplication, DiffusionModel, ModelEnv, Vae, load};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// ComfyUI's words when a ControlNet that encodes its image has no VAE.
pub(super) const NEEDS_VAE: &str = "This Controlnet needs a VAE but none was provided, please use a \
                                    ControlNetApply node with a VAE input and connect it.";

/// `ControlNetLoader`: a ControlNet from `controlnet/`.
pub(super) struct ControlNetLoader(pub(super) ModelEnv);

impl Node for ControlNetLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("controlnet");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("ControlNetLoader", "Load ControlNet Model", "model/loaders")
                .input(InputDef::choices("control_net_name", &files))
                .output(OutputDef::new("CONTROL_NET"))
                .aliases(&[
                    "controlnet",
                    "control net",
                    "cn",
                    "load controlnet",
                    "controlnet loader",
                ])
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "controlnet", inputs, "control_net_name")?;
        let net = load::load_controlnet(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::ControlNet(Arc::new(net))]))
    }
}

/// The inputs both apply nodes share after the conditionings and the ControlNet: strength and range.
fn strength_inputs(spec: NodeSpec, advanced: bool) -> NodeSpec {
    // V3 writes `advanced` first.
    let percent = |name: &str, default: f64| {
        let input = InputDef::bare(name, "FLOAT");
        let input = if advanced { input.option("advanced", true) } else { input };
        input.option("default", default).option("min", 0.0).option("max", 1.0).option("step", 0.001)
    };
    spec.input(InputDef::float("strength", 1.0, 0.0, 10.0).option("step", 0.01))
        .input(percent("start_percent", 0.0))
        .input(percent("end_percent", 1.0))
}

/// `ControlNetApplyAdvanced`'s declaration.
fn apply_spec() -> NodeSpec {
    let spec = NodeSpec::new(
        "ControlNetApplyAdvanced",
        "Apply ControlNet",
        "model/conditioning/controlnet",
    )
    .input(InputDef::typed("positive", "CONDITIONING"))
    .input(InputDef::typed("negative", "CONDITIONING"))
    .input(InputDef::typed("control_net", "CONTROL_NET"))
    .input(InputDef::typed("image", "IMAGE"));
    strength_inputs(spec, false)
        .optional(InputDef::typed("vae", "VAE"))
        .output(OutputDef::new("CONDITIONING").named("positive"))
        .output(OutputDef::new("CONDITIONING").named("negative"))
        .aliases(&["controlnet", "apply controlnet", "use controlnet", "control net"])
}

/// `ControlNetInpaintingAliMamaApply`'s declaration.
fn inpainting_spec() -> NodeSpec {
    let spec = NodeSpec::new(
        "ControlNetInpaintingAliMamaApply",
        "Apply ControlNet Inpainting (AliMama)",
        "model/conditioning/controlnet",
    )
    .python_module("comfy_extras.nodes_controlnet")
    .v3()
    .input(InputDef::typed("positive", "CONDITIONING"))
    .input(InputDef::typed("negative", "CONDITIONING"))
    .input(InputDef::typed("control_net", "CONTROL_NET"))
    .input(InputDef::typed("vae", "VAE"))
    .input(InputDef::typed("image", "IMAGE"))
    .input(InputDef::typed("mask", "MASK"));
    strength_inputs(spec, true)
        .output(OutputDef::new("CONDITIONING").named("positive"))
        .output(OutputDef::new("CONDITIONING").named("negative"))
        .aliases(&["masked controlnet"])
}

/// `ControlNetApplyAdvanced` and `ControlNetInpaintingAliMamaApply`.
pub(super) struct ControlNetApply {
    spec: Arc<NodeSpec>,
    inpainting: bool,
}

impl ControlNetApply {
    /// `ControlNetApplyAdvanced`.
    pub(super) fn advanced() -> ControlNetApply {
        ControlNetApply { spec: Arc::new(apply_spec()), inpainting: false }
    }

    /// `ControlNetInpaintingAliMamaApply`.
    pub(super) fn inpainting() -> ControlNetApply {
        ControlNetApply { spec: Arc::new(inpainting_spec()), inpainting: true }
    }
}

impl Node for ControlNetApply {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let strength = inputs.float("strength")?;
        let (positive, negative) =
            (inputs.conditioning("positive")?, inputs.conditioning("negative")?);
        // ComfyUI hands the conditionings back untouched at strength 0.
        if strength == 0.0 {
            return Ok(NodeResult::values([
                Value::Conditioning(positive.clone()),
                Value::Conditioning(negative.clone()),
            ]));
        }
        let control_net = inputs.control_net("control_net")?.clone();
        let mut image = inputs.image("image")?.clone();
        let mut kept = None;
        if self.inpainting && control_net.net.concat_mask() {
            // The ControlNet sees the image with the masked area black, and where the image is kept.
            let (m, [mb, mh, mw]) = mask(inputs, "mask")?;
            let keep: Vec<f32> = m.data().iter().map(|v| 1.0 - v).collect();
            let keep = tensor(vec![mb, 1, mh, mw], keep)?;
            image = masked(&image, &keep)?;
            kept = Some(keep);
        }
        let application = ControlApplication {
            control_net,
            image,
            strength,
            percent: (inputs.float("start_percent")?, inputs.float("end_percent")?),
            vae: match inputs.get("vae") {
                Some(_) => Some(inputs.vae("vae")?.clone()),
                None => None,
            },
            mask: kept,
            hint: None,
        };
        let apply = |c: &Conditioning| {
            Value::Conditioning(Arc::new(c.with_extras(|e| e.controls.push(application.clone()))))
        };
        Ok(NodeResult::values([apply(positive), apply(negative)]))
    }
}

/// `image` `[B, H, W, C]` times `keep` `[Bm, 1, h, w]` (bilinear to the image's size, then rounded), batches
/// broadcast as torch does.
fn masked(image: &Tensor, keep: &Tensor) -> Result<Tensor, NodeError> {
    let (b, h, w, c) = dims(image)?;
    let &[mb, 1, mh, mw] = keep.shape() else {
        return Err(NodeError::new(format!("a mask [B, 1, H, W], got {:?}", keep.shape())));
    };
    let as_image = tensor(vec![mb, mh, mw, 1], keep.data().to_vec())?;
    let resized = resize(&as_image, w, h, "bilinear", true)?;
    if b == 0 || mb == 0 || !(mb == b || mb == 1 || b == 1) {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("a mask of {mb} images for {b} images"),
        ));
    }
    let batch = b.max(mb);
    let plane = h * w;
    let mut out = Vec::with_capacity(batch * plane * c);
    for i in 0..batch {
        let pixels = &image.data()[(i % b) * plane * c..][..plane * c];
        let m = &resized.data()[(i % mb) * plane..][..plane];
        for (p, &k) in pixels.chunks_exact(c).zip(m) {
            out.extend(p.iter().map(|v| v * k.round_ties_even()));
        }
    }
    tensor(vec![batch, h, w, c], out)
}

/// `conditioning` with each ControlNet's hint prepared for latents of `latent_shape` (`[B, C, h, w]`, or one
/// frame `[B, C, 1, h, w]`): the image resized (nearest, centre crop) to the latents' size in pixels,
/// VAE-encoded, in the model's latent space, with the mask channel for a ControlNet that has one. A
/// ControlNet applied to several prompts is encoded once (`done` holds the prepared ones); one without a VAE
/// is left unprepared, and fails the first model call in its range with [`NEEDS_VAE`].
pub(super) fn with_hints(
    compute: &Compute,
    model: &DiffusionModel,
    conditioning: &Conditioning,
    latent_shape: &[usize],
    done: &mut Vec<ControlApplication>,
    ctx: &Context,
) -> Result<Conditioning, NodeError> {
    let mut out = conditioning.clone();
    for entry in &mut out.entries {
        for application in &mut entry.extras.controls {
            // Without a VAE there is nothing to encode with: the model call in its range fails, as ComfyUI's
            // `get_control` does (a range no step falls in never asks).
            let Some(vae) = application.vae.clone() else {
                continue;
            };
            if let Some(prepared) = done.iter().find(|d| same_control(d, application)) {
                application.hint.clone_from(&prepared.hint);
                continue;
            }
            let net_family = application.control_net.net.family();
            if net_family != model.net.family() {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "{} is a {} ControlNet; the model is {}",
                        application.control_net.path.display(),
                        net_family.name(),
                        model.net.family().name()
                    ),
                ));
            }
            application.hint = Some(hint(compute, model, application, &vae, latent_shape, ctx)?);
            done.push(application.clone());
        }
    }
    Ok(out)
}

/// Whether `a` and `b` are the same ControlNet on the same image (whatever their hints).
fn same_control(a: &ControlApplication, b: &ControlApplication) -> bool {
    ControlApplication { hint: None, ..a.clone() } == ControlApplication { hint: None, ..b.clone() }
}

/// The prepared hint `[B, C, h, w]` of one application, its image encoded by `vae` (ComfyUI's
/// `ControlNet.get_control` before the model).
fn hint(
    compute: &Compute,
    model: &DiffusionModel,
    application: &ControlApplication,
    vae: &Vae,
    latent_shape: &[usize],
    ctx: &Context,
) -> Result<Tensor, NodeError> {
    // The ControlNet's `preprocess_image` between the resize and the VAE (SD3.5's canny and depth).
    let net = &application.control_net.net;
    let preprocess = |a: f32| net.preprocess_hint(a);
    let pixels = HintPixels { method: "nearest-exact", preprocess: Some(&preprocess) };
    let encoded = encoded_hint(compute, model, vae, &application.image, latent_shape, pixels, ctx)?;
    let &[_, _, eh, ew] = encoded.shape() else {
        return Err(NodeError::new(format!("an encoded hint {:?}", encoded.shape())));
    };
    if !application.control_net.net.concat_mask() {
        return Ok(encoded);
    }
    // The mask channel: the mask (or ones) at the latents' size, repeated to the batch.
    let mask = match &application.mask {
        Some(m) => {
            let &[mb, 1, mh, mw] = m.shape() else {
                return Err(NodeError::new(format!("a mask [B, 1, H, W], got {:?}", m.shape())));
            };
            let as_image = tensor(vec![mb, mh, mw, 1], m.data().to_vec())?;
            resize(&as_image, ew, eh, "nearest-exact", true)?
        }
        None => Tensor::full(vec![1, eh, ew, 1], 1.0),
    };
    with_mask_channels(&encoded, &mask, 1)
}
