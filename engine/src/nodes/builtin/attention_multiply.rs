//! `UNetTemporalAttentionMultiply` (`comfy_extras.nodes_attention_multiply`): scales the output projections of a
//! UNet's self- and cross-attention (`attn1.to_out.0`, `attn2.to_out.0`; the `time_stack` ones by the temporal
//! factors). The Wan Fun templates apply it to Wan's DiT, whose weights have none of those names, so there, as
//! in ComfyUI, the model passes through unchanged. A model that has such weights is refused while a factor is
//! not 1: Kiln runs no UNet whose weights it would scale.

use std::sync::Arc;

use super::pure::Pure;
use crate::nodes::{InputDef, NodeError, NodeSpec, OutputDef};
use crate::value::Value;

/// The weight-name endings the node scales.
const SCALED: [&str; 4] = [
    "attn1.to_out.0.weight",
    "attn1.to_out.0.bias",
    "attn2.to_out.0.weight",
    "attn2.to_out.0.bias",
];

/// The four factors, in the node's order.
const FACTORS: [&str; 4] =
    ["self_structural", "self_temporal", "cross_structural", "cross_temporal"];

/// `UNetTemporalAttentionMultiply`.
pub(super) fn unet_temporal_attention_multiply() -> Pure {
    let mut spec =
        NodeSpec::new("UNetTemporalAttentionMultiply", "", "experimental/attention_experiments")
            .python_module("comfy_extras.nodes_attention_multiply")
            .v3()
            .experimental()
            .input(InputDef::typed("model", "MODEL"));
    for factor in FACTORS {
        // ComfyUI serialises `advanced` first.
        let input = InputDef::bare(factor, "FLOAT")
            .option("advanced", true)
            .option("default", 1.0)
            .option("min", 0.0)
            .option("max", 10.0)
            .option("step", 0.01);
        spec = spec.input(input);
    }
    let spec = spec.output(OutputDef::new("MODEL"));
    Pure::new(spec, |inputs| {
        let model = inputs.model("model")?;
        let mut scaling = Vec::new();
        for factor in FACTORS {
            if inputs.float(factor)? != 1.0 {
                scaling.push(factor);
            }
        }
        let weights = model.net.weights();
        let scaled = weights.names().find(|name| SCALED.iter().any(|end| name.ends_with(end)));
        if let (Some(name), Some(factor)) = (scaled, scaling.first()) {
            return Err(NodeError::new(format!(
                "UNetTemporalAttentionMultiply would scale UNet attention weights such as `{name}` by \
                 `{factor}`; Kiln does not run UNet models yet"
            )));
        }
        Ok(vec![Value::Model(Arc::clone(model))])
    })
}
