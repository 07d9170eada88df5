//! The Boogu-Image node (`comfy_extras.nodes_boogu`): `TextEncodeBooguEdit` encodes an edit instruction with its
//! reference images (seen by Qwen3-VL) and sets their VAE encodings as both prompts' reference latents.

use std::sync::Arc;

use super::qwen::{scale_to_area, vision_input};
use super::qwen3vl_edit::{encode, images, images_input, prompt_inputs};
use super::vae;
use crate::compute::Compute;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};

/// Pixels the vision tower sees a reference image at (the reference pipeline's 384², `max_vlm_input_pil_pixels`).
const VISION_PIXELS: f64 = 384.0 * 384.0;
/// Pixels a reference image is VAE-encoded at, each side a multiple of 16 (the VAE's 8 times the DiT's patch 2).
const REFERENCE_PIXELS: f64 = 1024.0 * 1024.0;

/// `TextEncodeBooguEdit`: the instruction with the images (each scaled to about 384² pixels, "area") as the
/// positive prompt, the negative prompt without them (Boogu's "drop" template when it is empty), and both
/// carrying the images' VAE encodings (each scaled to about 1024² pixels, sides multiples of 16) as reference
/// latents: under CFG they cancel (the identity kept) while the vision tokens, in the positive alone, carry the
/// instruction.
pub(super) struct TextEncodeBooguEdit {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl TextEncodeBooguEdit {
    pub(super) fn new(compute: Arc<Compute>) -> TextEncodeBooguEdit {
        let spec = NodeSpec::new("TextEncodeBooguEdit", "", "model/conditioning/boogu")
            .python_module("comfy_extras.nodes_boogu")
            .v3();
        let spec = prompt_inputs(spec).input(InputDef::typed("vae", "VAE"));
        let spec = images_input(
            spec,
            "Reference image(s) to edit. Boogu focuses on one reference per sample; more are allowed.",
        )
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"));
        TextEncodeBooguEdit { spec: Arc::new(spec), compute }
    }
}

impl Node for TextEncodeBooguEdit {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let vae = inputs.vae("vae")?;
        let mut seen = Vec::new();
        let mut references = Vec::new();
        for image in images(inputs)? {
            seen.push(vision_input(clip, &scale_to_area(image, VISION_PIXELS, 1)?)?);
            let reference = scale_to_area(image, REFERENCE_PIXELS, 16)?;
            references.push(vae::encode(&self.compute, vae, &reference, ctx)?);
        }
        let compute = &self.compute;
        let positive = encode(compute, inputs, inputs.string("prompt")?, &seen, &references)?;
        ctx.check_interrupt()?;
        let negative =
            encode(compute, inputs, inputs.string("negative_prompt")?, &[], &references)?;
        Ok(NodeResult::values([positive, negative]))
    }
}
