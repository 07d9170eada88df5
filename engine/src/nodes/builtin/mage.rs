//! The Mage-Flow node (`comfy_extras.nodes_mage`): `TextEncodeMageFlowEdit` encodes the instruction and the
//! negative prompt with the reference images (seen by Qwen3-VL and VAE-encoded as reference latents) and makes
//! the empty 128-channel latent at the output size.

use std::sync::Arc;

use super::qwen::vision_input;
use super::qwen3vl_edit::{encode, images, images_input, prompt_inputs};
use super::resize::resize;
use super::vae;
use crate::compute::Compute;
use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// Channels of Mage-Flow's latent (the Mage VAE's, in FLUX.2's latent space).
const CHANNELS: usize = 128;
/// Pixels per latent position, and what the output size is floored to.
const DOWNSCALE: i64 = 16;
/// The output side without an explicit size or a reference image.
const DEFAULT_SIDE: i64 = 1024;
/// The long side the vision tower sees a reference image at, at most (Mage's training preprocessing).
const VISION_SIDE: usize = 384;

/// `TextEncodeMageFlowEdit`: the prompt and the negative prompt (a space when empty) through the text encoder with
/// the reference images (each shown to Qwen3-VL's vision tower with its long side at most 384 pixels, as
/// `Image j: ` slots of Mage-Flow's edit template), the images' VAE encodings at the output size as both prompts'
/// reference latents, and the empty latent `[batch_size, 128, height / 16, width / 16]`. The output sides are
/// `width` and `height` (0: the first image's, or 1024 without one) floored to multiples of 16, at least 16.
pub(super) struct TextEncodeMageFlowEdit {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}
impl TextEncodeMageFlowEdit {
    pub(super) fn new(compute: Arc<Compute>) -> TextEncodeMageFlowEdit {
        let side = |name: &str, tooltip: &str| {
            InputDef::bare(name, "INT")
                .option("tooltip", tooltip)
                .option("default", 0)
                .option("min", 0)
                .option("max", 8192)
                .option("step", 16)
        };
        let spec = NodeSpec::new("TextEncodeMageFlowEdit", "", "model/conditioning/mage")
            .python_module("comfy_extras.nodes_mage")
            .v3()
            .description(
                "Encode an edit instruction with one or more reference images for Mage-Flow-Edit. Reference \
                 latents are resized to the output resolution (width/height, or the first image's size when 0). \
                 Use the latent output for sampling so the sizes always match.",
            );
        let spec = images_input(
            prompt_inputs(spec),
            "Reference image(s) to edit. All references are resized to the output resolution before encoding.",
        )
            .input(side("width", "Output width. 0 = use the first reference image's size."))
            .input(side("height", "Output height. 0 = use the first reference image's size."))
            .input(InputDef::int("batch_size", 1, 1, 4096))
            .optional(InputDef::typed("vae", "VAE"))
            .output(OutputDef::new("CONDITIONING").named("positive"))
            .output(OutputDef::new("CONDITIONING").named("negative"))
            .output(OutputDef::new("LATENT").named("latent"));
        TextEncodeMageFlowEdit { spec: Arc::new(spec), compute }
    }
}

/// The output side: `given`, or (when 0) `reference`'s, floored to a multiple of 16, at least 16.
fn output_side(given: i64, reference: i64) -> i64 {
    let side = if given == 0 { reference } else { given };
    (side / DOWNSCALE * DOWNSCALE).max(DOWNSCALE)
}

/// `image` `[B, H, W, C]` with its long side at most [`VISION_SIDE`] (bicubic, each side rounded half to even, at
/// least 1), as the vision tower sees it.
fn vision_copy(image: &Tensor) -> Result<Tensor, NodeError> {
    let &[_, h, w, _] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected an IMAGE [B, H, W, C], got {:?}",
            image.shape()
        )));
    };
    let long = h.max(w);
    if long <= VISION_SIDE {
        return Ok(image.clone());
    }
    let scale = VISION_SIDE as f64 / long as f64;
    let side = |len: usize| ((len as f64 * scale).round_ties_even() as usize).max(1);
    resize(image, side(w), side(h), "bicubic", false)
}

impl Node for TextEncodeMageFlowEdit {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let images = images(inputs)?;
        let (reference_h, reference_w) = match images.first().map(|image| image.shape()) {
            Some(&[_, h, w, _]) => (h as i64, w as i64),
            _ => (DEFAULT_SIDE, DEFAULT_SIDE),
        };
        let width = output_side(inputs.int("width")?, reference_w);
        let height = output_side(inputs.int("height")?, reference_h);
        let vae = match inputs.get("vae") {
            Some(_) => Some(inputs.vae("vae")?),
            None => None,
        };
        let clip = inputs.clip("clip")?;
        let mut seen = Vec::with_capacity(images.len());
        let mut references = Vec::new();
        for image in &images {
            seen.push(vision_input(clip, &vision_copy(image)?)?);
            if let Some(vae) = vae {
                // Every reference at the output size: Mage's RoPE aligns them with the target by position.
                let (w, h) = (width as usize, height as usize);
                let sized = match image.shape() {
                    &[_, ih, iw, _] if (ih, iw) == (h, w) => (*image).clone(),
                    _ => resize(image, w, h, "bicubic", false)?,
                };
                references.push(vae::encode(&self.compute, vae, &sized, ctx)?);
            }
        }
        let batch = usize::try_from(inputs.int("batch_size")?)
            .map_err(|_| NodeError::new("`batch_size` must be positive"))?;
        let prompt = inputs.string("prompt")?;
        let negative = inputs.string("negative_prompt")?;
        let negative = if negative.is_empty() { " " } else { negative };
        // The negative prompt keeps the images (vision tokens and reference latents): only the text differs.
        let positive = encode(&self.compute, inputs, prompt, &seen, &references)?;
        ctx.check_interrupt()?;
        let negative = encode(&self.compute, inputs, negative, &seen, &references)?;
        let shape =
            vec![batch, CHANNELS, (height / DOWNSCALE) as usize, (width / DOWNSCALE) as usize];
        let latent = Latent::new(Tensor::full(shape, 0.0));
        Ok(NodeResult::values([positive, negative, Value::Latent(latent)]))
    }
}

#[cfg(test)]
mod tests {
    use super::output_side;

    #[test]
    fn output_sides_floor_to_sixteen_and_fall_back() {
        assert_eq!(output_side(0, 1024), 1024);
        assert_eq!(output_side(0, 500), 496);
        assert_eq!(output_side(1000, 500), 992);
        assert_eq!(output_side(8, 1024), 16);
    }
}
