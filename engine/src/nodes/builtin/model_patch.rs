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
            vae: inputs.vae("vae")?.clone(),
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
        let (vae, image) = (&application.vae, &application.image);
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
