//! `unCLIPConditioning` (`nodes.py`): a prompt conditioned on a CLIP vision output's image embeddings, which an
//! SDXL model reads in place of its pooled text vector (SDXL "revision"; `sdxl_adm.rs` makes the vector).

use super::clip_vision::vision_output;
use super::pure::Pure;
use crate::models::Unclip;
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// `unCLIPConditioning`: strength 0 leaves the conditioning as it is; otherwise the embeddings with their
/// strength and noise augmentation are appended to each entry's `unclip`.
pub(super) fn unclip_conditioning_node() -> Pure {
    Pure::new(
        NodeSpec::new("unCLIPConditioning", "unCLIPConditioning", "model/conditioning")
            .input(InputDef::typed("conditioning", "CONDITIONING"))
            .input(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
            .input(InputDef::float("strength", 1.0, -10.0, 10.0).option("step", 0.01))
            .input(InputDef::float("noise_augmentation", 0.0, 0.0, 1.0).option("step", 0.01))
            .output(OutputDef::new("CONDITIONING")),
        |inputs| {
            let conditioning = inputs.conditioning("conditioning")?;
            let strength = inputs.float("strength")?;
            if strength == 0.0 {
                return Ok(vec![Value::Conditioning(conditioning.clone())]);
            }
            let output = vision_output(inputs, "clip_vision_output")?;
            if output.image_embeds.shape().len() != 2 {
                return Err(NodeError::new(format!(
                    "unCLIPConditioning takes a CLIP vision output with pooled image embeddings [B, D]; this \
                     one's are {:?} (a SigLIP tower has none)",
                    output.image_embeds.shape()
                )));
            }
            let unclip = Unclip {
                image_embeds: output.image_embeds.clone(),
                strength,
                noise_augmentation: inputs.float("noise_augmentation")?,
            };
            let conditioning = conditioning.with_extras(|e| e.unclip.push(unclip.clone()));
            Ok::<_, NodeError>(vec![Value::Conditioning(std::sync::Arc::new(conditioning))])
        },
    )
}
