//! Model patches (`comfy_extras.nodes_model_patch`): `ModelPatchLoader` loads one from `model_patches/`, and
//! `QwenImageDiffsynthControlnet` puts one with its control image on a model (DiffSynth's block-wise ControlNet
//! on Qwen-Image, the Fun ControlNet on Z-Image), and `USOStyleReference` puts USO's style projector with a
//! style image's SigLIP states on a FLUX.1 model. The sampler prepares the image once per run ([`with_hints`]: resized by area to the latents' size in
//! pixels, VAE-encoded into the model's latent space, the mask channels added); the model runs the patch after
//! every block.

use std::sync::Arc;

use super::hints::{HintPixels, encoded_hint, with_mask_channels};
use super::loaders::{find, progress};
use super::mask::{mask, tensor};
use super::resize::resize;
use kiln_models::family::ModelPatchNet;

use crate::compute::Compute;
use crate::models::{DiffusionModel, ModelEnv, ModelPatchApplication, UsoStyle, load};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// `ModelPatchLoader`: a model patch from `model_patches/`.
pub(super) struct ModelPatchLoader(pub(super) ModelEnv);

impl Node for ModelPatchLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("model_patches");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("ModelPatchLoader", "Load Model Patch", "model/loaders")
                .python_module("comfy_extras.nodes_model_patch")
                .experimental()
                .input(InputDef::choices("name", &files))
                .output(OutputDef::new("MODEL_PATCH"))
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "model_patches", inputs, "name")?;
        let patch =
            load::load_model_patch(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::ModelPatch(Arc::new(patch))]))
    }
}

/// `QwenImageDiffsynthControlnet` (any model patch with a control image) and `ZImageFunControlnet` (the same,
/// its image optional beside an inpainting image and a mask, which only the Fun ControlNet's later releases
/// read): the model with the patch and its control image (RGB) applied after the patches it has.
pub(super) struct QwenImageDiffsynthControlnet(Arc<NodeSpec>);

impl QwenImageDiffsynthControlnet {
    /// `QwenImageDiffsynthControlnet`.
    pub(super) fn new() -> QwenImageDiffsynthControlnet {
        let spec = NodeSpec::new(
            "QwenImageDiffsynthControlnet",
            "Apply Qwen Image DiffSynth ControlNet",
            "model/patch/qwen",
        )
        .python_module("comfy_extras.nodes_model_patch")
        .experimental()
        .input(InputDef::typed("model", "MODEL"))
        .input(InputDef::typed("model_patch", "MODEL_PATCH"))
        .input(InputDef::typed("vae", "VAE"))
        .input(InputDef::typed("image", "IMAGE"))
        .input(strength())
        .optional(InputDef::typed("mask", "MASK"))
        .output(OutputDef::new("MODEL"));
        QwenImageDiffsynthControlnet(Arc::new(spec))
    }

    /// `ZImageFunControlnet`.
    pub(super) fn z_image() -> QwenImageDiffsynthControlnet {
        let spec = NodeSpec::new(
            "ZImageFunControlnet",
            "Apply Z-Image Fun ControlNet",
            "model/patch/z-image",
        )
        .python_module("comfy_extras.nodes_model_patch")
        .experimental()
        .input(InputDef::typed("model", "MODEL"))
        .input(InputDef::typed("model_patch", "MODEL_PATCH"))
        .input(InputDef::typed("vae", "VAE"))
        .input(strength())
        .optional(InputDef::typed("image", "IMAGE"))
        .optional(InputDef::typed("inpaint_image", "IMAGE"))
        .optional(InputDef::typed("mask", "MASK"))
        .output(OutputDef::new("MODEL"));
        QwenImageDiffsynthControlnet(Arc::new(spec))
    }
}

/// The patch nodes' `strength`.
fn strength() -> InputDef {
    InputDef::float("strength", 1.0, -10.0, 10.0).option("step", 0.01)
}

impl Node for QwenImageDiffsynthControlnet {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let patch = inputs.model_patch("model_patch")?.clone();
        let other_node = match patch.net.as_ref() {
            ModelPatchNet::Uso(_) => Some(
                "USO's style projector, which takes a CLIP vision output: apply it with USOStyleReference",
            ),
            ModelPatchNet::InfiniteTalk(_) => {
                Some("InfiniteTalk, which takes audio: apply it with WanInfiniteTalkToVideo")
            }
            ModelPatchNet::AnimaLllite(_) => Some(
                "an Anima ControlNet-LLLite, which reads pixels: apply it with AnimaLLLiteApply",
            ),
            _ => None,
        };
        if let Some(other_node) = other_node {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("{} is {other_node}", patch.path.display()),
            ));
        }
        if patch.net.family() != model.net.family() {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!(
                    "{} patches {} models; the model is {}",
                    patch.path.display(),
                    patch.net.family().name(),
                    model.net.family().name()
                ),
            ));
        }
        // The patches Kiln runs steer by the control image alone (the Fun ControlNet's inpainting image is
        // read only by its later releases, which Kiln refuses at loading).
        if inputs.get("image").is_none() {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("{} steers by a control image: connect `image`", patch.path.display()),
            ));
        }
        let image = rgb(inputs.image("image")?)?;
        // The mask says where to keep the image: the patch takes its complement.
        let kept = match inputs.get("mask") {
            Some(_) => {
                let (m, [b, h, w]) = mask(inputs, "mask")?;
                Some(tensor(vec![b, h, w], m.data().iter().map(|v| 1.0 - v).collect())?)
            }
            None => None,
        };
        let application = ModelPatchApplication {
            patch,
            image,
            vae: Some(inputs.vae("vae")?.clone()),
            sigma_range: None,
            strength: inputs.float("strength")?,
            mask: kept,
            hint: None,
        };
        let mut patched = DiffusionModel::clone(model);
        patched.model_patches.push(application);
        Ok(NodeResult::values([Value::Model(Arc::new(patched))]))
    }
}

/// The first three channels of an image.
fn rgb(image: &Tensor) -> Result<Tensor, NodeError> {
    let &[b, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    if c <= 3 {
        return Ok(image.clone());
    }
    let data = image.data().chunks_exact(c).flat_map(|p| p[..3].iter().copied()).collect();
    tensor(vec![b, h, w, 3], data)
}

/// `model` with each model patch's hint prepared for latents of `latent_shape`: the image resized by area
/// (centre crop) to the latents' size in pixels, VAE-encoded, in the model's latent space, then the patch's
/// mask channels (the mask bilinear at the latents' size, or ones). ComfyUI's `DiffSynthCnetPatch`.
pub(super) fn with_hints(
    compute: &Compute,
    model: &DiffusionModel,
    latent_shape: &[usize],
    ctx: &Context,
) -> Result<DiffusionModel, NodeError> {
    let mut prepared = model.clone();
    for application in &mut prepared.model_patches {
        if let ModelPatchNet::AnimaLllite(net) = application.patch.net.as_ref() {
            let (image, mask) = (&application.image, application.mask.as_ref());
            application.hint = Some(lllite_pixels(&net.config, image, mask, latent_shape)?);
            continue;
        }
        let image = &application.image;
        let vae = application.vae.as_ref().ok_or_else(|| {
            NodeError::new(format!(
                "{} has no VAE to encode its image",
                application.patch.path.display()
            ))
        })?;
        // The latents' size, or theirs padded as the patch's model pads them.
        let mut shape = latent_shape.to_vec();
        let rank = shape.len();
        if rank >= 2 {
            let (h, w) = application.patch.net.hint_size(shape[rank - 2], shape[rank - 1]);
            (shape[rank - 2], shape[rank - 1]) = (h, w);
        }
        let encoded = encoded_hint(
            compute,
            model,
            vae,
            image,
            &shape,
            HintPixels { method: "area", preprocess: None },
            ctx,
        )?;
        let copies = application.patch.net.mask_channels();
        if copies == 0 {
            application.hint = Some(encoded);
            continue;
        }
        let (h, w) = (encoded.shape()[2], encoded.shape()[3]);
        // A mask is one channel (bilinear to the latents' size, no crop), whatever the patch's width; without
        // one, every mask channel is ones.
        let (mask, copies) = match &application.mask {
            Some(m) => {
                let (mb, mh, mw) = (m.shape()[0], m.shape()[1], m.shape()[2]);
                let as_image = tensor(vec![mb, mh, mw, 1], m.data().to_vec())?;
                (resize(&as_image, w, h, "bilinear", false)?, 1)
            }
            None => (Tensor::full(vec![1, h, w, 1], 1.0), copies),
        };
        application.hint = Some(with_mask_channels(&encoded, &mask, copies)?);
    }
    Ok(prepared)
}

/// `USOStyleReference`: the model with USO's style projector and a style image's SigLIP states (layers −20 and
/// −11 of `all_hidden_states`, and the penultimate one), whose style tokens go before the prompt's.
pub(super) fn uso_style_reference_node() -> super::pure::Pure {
    super::pure::Pure::new(
        NodeSpec::new("USOStyleReference", "Apply USO Style Reference", "model/patch/flux")
            .python_module("comfy_extras.nodes_model_patch")
            .experimental()
            .input(InputDef::typed("model", "MODEL"))
            .input(InputDef::typed("model_patch", "MODEL_PATCH"))
            .input(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
            .output(OutputDef::new("MODEL")),
        |inputs| {
            let model = inputs.model("model")?;
            let patch = inputs.model_patch("model_patch")?.clone();
            let invalid = |msg: String| NodeError::of_kind(ErrorKind::InvalidValue, msg);
            if !matches!(patch.net.as_ref(), ModelPatchNet::Uso(_)) {
                return Err(invalid(format!(
                    "{} is not USO's style projector (uso-flux1-projector)",
                    patch.path.display()
                )));
            }
            let Some(Value::ClipVisionOutput(vision)) = inputs.get("clip_vision_output") else {
                return Err(invalid("`clip_vision_output` is not a CLIP vision output".to_owned()));
            };
            let all = &vision.all_hidden_states;
            let (Some(penultimate), true) = (&vision.penultimate_hidden_states, all.len() >= 20)
            else {
                return Err(invalid(format!(
                    "USO reads a SigLIP tower's hidden states of layers −20 and −11; this CLIP vision output \
                     has {} (use sigclip_vision_patch14_384)",
                    all.len()
                )));
            };
            let states =
                [all[all.len() - 20].clone(), all[all.len() - 11].clone(), penultimate.clone()];
            let mut patched = model.as_ref().clone();
            patched.uso_styles.push(UsoStyle { projector: patch, states });
            Ok(vec![Value::Model(Arc::new(patched))])
        },
    )
}

/// `AnimaLLLiteApply`: the model with an Anima ControlNet-LLLite and its control image (and, for the inpainting
/// kind, its mask: zeros without one) applied after the patches it has, between the sigmas of `start_percent` and
/// `end_percent` on the model's sampling as it is now (ComfyUI's `percent_to_sigma` at the node).
pub(super) fn anima_lllite_apply_node() -> super::pure::Pure {
    let percent =
        |name: &str, default: f64| InputDef::float(name, default, 0.0, 1.0).option("step", 0.001);
    super::pure::Pure::new(
        NodeSpec::new("AnimaLLLiteApply", "Apply Anima LLLite", "model_patches/anima")
            .python_module("comfy_extras.nodes_model_patch")
            .experimental()
            .input(InputDef::typed("model", "MODEL"))
            .input(InputDef::typed("model_patch", "MODEL_PATCH"))
            .input(InputDef::typed("image", "IMAGE"))
            .input(strength())
            .input(percent("start_percent", 0.0))
            .input(percent("end_percent", 1.0))
            .optional(InputDef::typed("mask", "MASK"))
            .output(OutputDef::new("MODEL")),
        |inputs| {
            let model = inputs.model("model")?;
            let patch = inputs.model_patch("model_patch")?.clone();
            let ModelPatchNet::AnimaLllite(net) = patch.net.as_ref() else {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "{} is not an Anima ControlNet-LLLite (it patches {} models)",
                        patch.path.display(),
                        patch.net.family().name()
                    ),
                ));
            };
            if model.net.family() != patch.net.family() {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "{} patches Anima models; the model is {}",
                        patch.path.display(),
                        model.net.family().name()
                    ),
                ));
            }
            let image = rgb(inputs.image("image")?)?;
            let mask = match (net.config.cond_in_channels, inputs.get("mask")) {
                (4, Some(_)) => Some(mask(inputs, "mask")?.0),
                (4, None) => {
                    let [b, h, w, _] = image.shape() else {
                        unreachable!("rgb gives [B, H, W, 3]")
                    };
                    Some(Tensor::full(vec![*b, *h, *w], 0.0))
                }
                _ => None,
            };
            let sampling = &model.sampling;
            let range = (
                sampling.percent_to_sigma(inputs.float("start_percent")?),
                sampling.percent_to_sigma(inputs.float("end_percent")?),
            );
            let application = ModelPatchApplication {
                patch,
                image,
                vae: None,
                sigma_range: Some(range),
                strength: inputs.float("strength")?,
                mask,
                hint: None,
            };
            let mut patched = model.as_ref().clone();
            patched.model_patches.push(application);
            Ok(vec![Value::Model(Arc::new(patched))])
        },
    )
}

/// An LLLite's control input for latents of `latent_shape` (`AnimaLLLitePatch`): the image resized bicubic,
/// centre-cropped, to 8× the latents' size padded to the DiT's patches, clamped to [0, 1] and moved to [-1, 1],
/// `[B, 3, H, W]`; for the inpainting kind, then its mask (nearest, centre-cropped, 1 from 0.5 on) as ±1, the masked
/// pixels blanked first where the file says so.
fn lllite_pixels(
    config: &kiln_models::anima::LlliteConfig,
    image: &Tensor,
    mask: Option<&Tensor>,
    latent_shape: &[usize],
) -> Result<Tensor, NodeError> {
    let rank = latent_shape.len();
    // The latents as the DiT pads them to its 2×2 patches, in pixels.
    let (h, w) = match latent_shape {
        [.., h, w] if rank >= 4 => (h.div_ceil(2) * 16, w.div_ceil(2) * 16),
        other => {
            return Err(NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("an Anima LLLite steers image latents; got {other:?}"),
            ));
        }
    };
    if rank == 5 && latent_shape[2] != 1 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("an Anima LLLite steers one frame; the latent has {}", latent_shape[2]),
        ));
    }
    let image = resize(image, w, h, "bicubic", true)?;
    let batch = image.shape()[0];
    let pixels: Vec<f32> = image.data().iter().map(|v| v.clamp(0.0, 1.0) * 2.0 - 1.0).collect();
    let mask = match (mask, config.cond_in_channels) {
        (Some(m), 4) => {
            let (mb, mh, mw) = (m.shape()[0], m.shape()[1], m.shape()[2]);
            let resized = resize(
                &tensor(vec![mb, mh, mw, 1], m.data().to_vec())?,
                w,
                h,
                "nearest-exact",
                true,
            )?;
            if batch % mb != 0 {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("an Anima LLLite mask of {mb} cannot go with {batch} images"),
                ));
            }
            Some(
                resized
                    .data()
                    .iter()
                    .map(|&v| if v >= 0.5 { 1.0 } else { 0.0 })
                    .collect::<Vec<f32>>(),
            )
        }
        _ => None,
    };
    let channels = if mask.is_some() { 4 } else { 3 };
    let plane = h * w;
    let mut out = vec![0.0f32; batch * channels * plane];
    for s in 0..batch {
        for i in 0..plane {
            let m = mask.as_ref().map(|m| m[(s % (m.len() / plane)) * plane + i]);
            let blank = config.inpaint_masked_input && m.is_some_and(|m| m >= 0.5);
            for c in 0..3 {
                let v = pixels[(s * plane + i) * 3 + c];
                out[(s * channels + c) * plane + i] = if blank { 0.0 } else { v };
            }
            if let Some(m) = m {
                out[(s * channels + 3) * plane + i] = m * 2.0 - 1.0;
            }
        }
    }
    tensor(vec![batch, channels, h, w], out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An LLLite config of `cond_in_channels` (the pixel preparation reads nothing else but the masking flag).
    fn config(cond_in_channels: usize) -> kiln_models::anima::LlliteConfig {
        kiln_models::anima::LlliteConfig {
            cond_in_channels,
            cond_dim: 16,
            cond_emb_dim: 16,
            resblocks: 0,
            aspp_dilations: Vec::new(),
            inpaint_masked_input: cond_in_channels == 4,
            model_dim: 128,
            modules: Vec::new(),
        }
    }

    #[test]
    fn lllite_pixels_are_comfyuis() {
        // `scripts/reference/anima_lllite.py`: what ComfyUI's `AnimaLLLitePatch` feeds the conditioning CNN.
        let io: std::collections::BTreeMap<String, Tensor> =
            crate::fixtures::model_tensors("anima_lllite/io.safetensors")
                .into_iter()
                .map(|(name, (shape, values))| (name, Tensor::new(shape, values).unwrap()))
                .collect();
        let close = |what: &str, got: &Tensor, want: &Tensor| {
            assert_eq!(got.shape(), want.shape(), "{what}");
            let worst =
                got.data().iter().zip(want.data()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-4, "{what}: off by {worst}");
        };
        // An image of another size and aspect, bicubic and centre-cropped to the latents' 8×.
        let got =
            lllite_pixels(&config(3), &io["control_a.image"], None, &[1, 16, 1, 8, 8]).unwrap();
        close("control", &got, &io["control_a.cond_image"]);
        // The inpainting kind: the mask nearest-exact, thresholded, the masked pixels blanked, then ±1.
        for case in ["inpaint_a", "inpaint_resize"] {
            let (image, mask) = (&io[&format!("{case}.image")], &io[&format!("{case}.mask")]);
            let got = lllite_pixels(&config(4), image, Some(mask), &[1, 16, 1, 6, 10]).unwrap();
            close(case, &got, &io[&format!("{case}.cond_image")]);
        }
        // An odd-sized latent is padded to the DiT's patches first.
        let got =
            lllite_pixels(&config(3), &io["control_a.image"], None, &[1, 16, 1, 7, 7]).unwrap();
        assert_eq!(got.shape(), [1, 3, 64, 64]);
    }
}
