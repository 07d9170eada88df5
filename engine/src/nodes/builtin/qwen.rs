//! The Qwen-Image nodes (`comfy_extras.nodes_qwen`): `TextEncodeQwenImageEdit` and
//! `TextEncodeQwenImageEditPlus` encode a prompt with images the Qwen2.5-VL encoder sees, and set the same
//! images, VAE-encoded, as the reference latents the Edit model attends to;
//! `EmptyQwenImageLayeredLatentImage` is Qwen-Image-Layered's empty latent, one frame per layer and one for the
//! composite.

use std::sync::Arc;

use kiln_models::family::{EditPrompt, PromptTokens};

use super::conditioning::Encode;
use super::pure::Pure;
use super::resize::resize;
use super::vae;
use crate::compute::Compute;
use crate::models::device::on_device;
use crate::models::{Conditioning, TextEncoder};
use crate::nodes::error::node_error;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// Pixels the Edit nodes scale reference images to before VAE-encoding them (1024²).
const REFERENCE_PIXELS: f64 = 1024.0 * 1024.0;
/// Pixels `TextEncodeQwenImageEditPlus` scales images to for the vision encoder (384²).
const VISION_PIXELS: f64 = 384.0 * 384.0;

/// Which of the two nodes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Edit,
    Plus,
}

/// `TextEncodeQwenImageEdit` or `TextEncodeQwenImageEditPlus`.
pub(super) struct TextEncodeQwenImageEdit {
    spec: Arc<NodeSpec>,
    kind: Kind,
    compute: Arc<Compute>,
}

impl TextEncodeQwenImageEdit {
    /// `TextEncodeQwenImageEdit`: one optional image, seen by the encoder at about 1024² pixels.
    pub(super) fn edit(compute: Arc<Compute>) -> TextEncodeQwenImageEdit {
        let spec = spec("TextEncodeQwenImageEdit", &["image"]);
        TextEncodeQwenImageEdit { spec: Arc::new(spec), kind: Kind::Edit, compute }
    }

    /// `TextEncodeQwenImageEditPlus`: up to three images, seen by the encoder at about 384² pixels.
    pub(super) fn plus(compute: Arc<Compute>) -> TextEncodeQwenImageEdit {
        let spec = spec("TextEncodeQwenImageEditPlus", &["image1", "image2", "image3"]);
        TextEncodeQwenImageEdit { spec: Arc::new(spec), kind: Kind::Plus, compute }
    }
}

/// The node's declaration: clip, prompt, then the optional VAE and image inputs.
fn spec(name: &str, images: &[&str]) -> NodeSpec {
    let mut spec = NodeSpec::new(name, "", "model/conditioning/qwen image")
        .python_module("comfy_extras.nodes_qwen")
        .v3()
        .input(InputDef::typed("clip", "CLIP"))
        .input(
            InputDef::typed("prompt", "STRING")
                .option("multiline", true)
                .option("dynamicPrompts", true),
        )
        .optional(InputDef::typed("vae", "VAE"));
    for image in images {
        spec = spec.optional(InputDef::typed(image, "IMAGE"));
    }
    spec.output(OutputDef::new("CONDITIONING"))
}

impl Node for TextEncodeQwenImageEdit {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let prompt = inputs.string("prompt")?;
        let vae = match inputs.get("vae") {
            Some(_) => Some(inputs.vae("vae")?),
            None => None,
        };
        let slots: &[&str] = match self.kind {
            Kind::Edit => &["image"],
            Kind::Plus => &["image1", "image2", "image3"],
        };
        let mut present = [false; 3];
        let mut seen = Vec::new();
        let mut references = Vec::new();
        for (i, slot) in slots.iter().enumerate() {
            if inputs.get(slot).is_none() {
                continue;
            }
            let image = inputs.image(slot)?;
            present[i] = true;
            // Edit shows the encoder the 1024² image it encodes; Plus a 384² one, and encodes at 1024²
            // rounded to multiples of 8.
            let (vision, reference) = match self.kind {
                Kind::Edit => {
                    let scaled = scale_to_area(image, REFERENCE_PIXELS, 1)?;
                    (scaled.clone(), scaled)
                }
                Kind::Plus => (
                    scale_to_area(image, VISION_PIXELS, 1)?,
                    scale_to_area(image, REFERENCE_PIXELS, 8)?,
                ),
            };
            seen.push(vision_input(clip, &vision)?);
            if let Some(vae) = vae {
                references.push(vae::encode(&self.compute, vae, &reference, ctx)?);
            }
        }
        let edit = match self.kind {
            Kind::Edit => EditPrompt::Edit { image: present[0] },
            Kind::Plus => EditPrompt::Plus { pictures: present },
        };
        let ids = clip.net.tokenize_edit(prompt, edit).map_err(node_error)?;
        if !clip.net.reads_edit_images(prompt) {
            seen.clear();
        }
        ctx.check_interrupt()?;
        let tokens = PromptTokens::Ids(ids);
        let encode = Encode { clip, tokens: &tokens, images: &seen };
        let mut cond = on_device(self.compute.device(), encode).map_err(node_error)?;
        cond.extras.reference_latents = references;
        let conditioning = Conditioning { entries: vec![cond] };
        Ok(NodeResult::values([Value::Conditioning(Arc::new(conditioning))]))
    }
}

/// `image` `[B, H, W, C]` resized ("area", as ComfyUI's `common_upscale`) to about `pixels` pixels keeping its
/// aspect ratio, each side rounded (half to even, as Python's `round`) to a multiple of `multiple`.
pub(super) fn scale_to_area(
    image: &Tensor,
    pixels: f64,
    multiple: usize,
) -> Result<Tensor, NodeError> {
    let &[_, h, w, _] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    let scale = (pixels / (w * h) as f64).sqrt();
    let m = multiple as f64;
    let side = |len: usize| ((len as f64 * scale / m).round_ties_even() as usize * multiple).max(1);
    resize(image, side(w), side(h), "area", false)
}

/// The first image of `image`'s batch as `clip`'s vision encoder reads it.
pub(super) fn vision_input(
    clip: &TextEncoder,
    image: &Tensor,
) -> Result<kiln_models::qwen_vl::VisionInput, NodeError> {
    let &[_, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    let first = &image.data()[..h * w * c];
    clip.net.vision_input(first, h, w, c).map_err(node_error)
}

/// `EmptyQwenImageLayeredLatentImage` ("Empty Qwen Image Layered Latent"): zeros `[batch, 16, layers + 1,
/// height / 8, width / 8]`.
pub(super) fn empty_layered_latent() -> Pure {
    Pure::new(
        NodeSpec::new(
            "EmptyQwenImageLayeredLatentImage",
            "Empty Qwen Image Layered Latent",
            "model/latent/qwen",
        )
        .python_module("comfy_extras.nodes_qwen")
        .v3()
        .input(InputDef::int("width", 640, 16, 16384).option("step", 16))
        .input(InputDef::int("height", 640, 16, 16384).option("step", 16))
        .input(InputDef::int("layers", 3, 0, 16384).option("step", 1))
        .input(InputDef::int("batch_size", 1, 1, 4096))
        .output(OutputDef::new("LATENT")),
        |inputs| {
            let size = |name: &str| -> Result<usize, NodeError> {
                usize::try_from(inputs.int(name)?)
                    .map_err(|_| NodeError::new(format!("`{name}` must be 0 or more")))
            };
            let shape = vec![
                size("batch_size")?,
                kiln_models::qwen_image::LATENT_CHANNELS,
                size("layers")? + 1,
                size("height")? / 8,
                size("width")? / 8,
            ];
            let latent = Tensor::full(shape, 0.0);
            Ok(vec![Value::Latent(Latent::new(latent))])
        },
    )
}
