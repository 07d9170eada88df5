//! What the Qwen3-VL edit nodes (`TextEncodeMageFlowEdit`, `TextEncodeBooguEdit`) share: their `clip`, `prompt`
//! and `negative_prompt` inputs, the `images` they grow, reading those images, and encoding a prompt with images
//! and reference latents.

use std::sync::Arc;

use kiln_models::family::{EditPrompt, PromptTokens};
use kiln_models::qwen_vl::VisionInput;

use super::conditioning::Encode;
use crate::compute::Compute;
use crate::models::Conditioning;
use crate::models::device::on_device;
use crate::nodes::error::node_error;
use crate::nodes::{InputDef, Inputs, NodeError, NodeSpec};
use crate::tensor::Tensor;
use crate::value::Value;

/// The names the nodes grow their `images` under (`image_1` … `image_16`).
const IMAGE_NAMES: [&str; 16] = [
    "image_1", "image_2", "image_3", "image_4", "image_5", "image_6", "image_7", "image_8",
    "image_9", "image_10", "image_11", "image_12", "image_13", "image_14", "image_15", "image_16",
];

/// `spec` with the nodes' first inputs: `clip`, `prompt` and the advanced `negative_prompt`.
pub(super) fn prompt_inputs(spec: NodeSpec) -> NodeSpec {
    let prompt = |def: InputDef| def.option("multiline", true).option("dynamicPrompts", true);
    spec.input(InputDef::typed("clip", "CLIP"))
        .input(prompt(InputDef::typed("prompt", "STRING")))
        .input(prompt(InputDef::typed("negative_prompt", "STRING").option("advanced", true)))
}

/// `spec` with the `images` input the nodes grow ([`IMAGE_NAMES`], none required), described by `tooltip`.
pub(super) fn images_input(spec: NodeSpec, tooltip: &str) -> NodeSpec {
    spec.described_autogrow("images", tooltip, InputDef::typed("image", "IMAGE"), &IMAGE_NAMES, 0)
}

/// The images connected to the node's `images`, in the order of their names.
pub(super) fn images(inputs: &Inputs) -> Result<Vec<&Tensor>, NodeError> {
    let mut images = Vec::new();
    for name in IMAGE_NAMES {
        let key = format!("images.{name}");
        if inputs.get(&key).is_some() {
            images.push(inputs.image(&key)?);
        }
    }
    Ok(images)
}

/// The conditioning of `text` through the node's `clip` with `images` (the vision tower's inputs, laid out by
/// the encoder's tokenizer: [`EditPrompt::Numbered`]; none: the plain prompt), `references` set as its reference
/// latents.
pub(super) fn encode(
    compute: &Compute,
    inputs: &Inputs,
    text: &str,
    images: &[VisionInput],
    references: &[Tensor],
) -> Result<Value, NodeError> {
    let clip = inputs.clip("clip")?;
    let tokens = if images.is_empty() {
        clip.net.tokenize_with(text, clip.t5_options)
    } else {
        let edit = EditPrompt::Numbered { images: images.len() };
        clip.net.tokenize_edit(text, edit).map(PromptTokens::Ids)
    };
    let tokens = tokens.map_err(node_error)?;
    let mut cond = on_device(compute.device(), Encode { clip, tokens: &tokens, images })
        .map_err(node_error)?;
    cond.extras.reference_latents = references.to_vec();
    Ok(Value::Conditioning(Arc::new(Conditioning { entries: vec![cond] })))
}
