//! The model patches that change how predictions combine: `CFGNorm` and `CFGZeroStar`
//! (`comfy_extras.nodes_cfg`, V3) and `RescaleCFG` (`comfy_extras.nodes_model_advanced`, V1). Each returns a
//! copy of the model with a hook set, as ComfyUI's `set_model_sampler_cfg_function` (replacing) and
//! `set_model_sampler_post_cfg_function` (appending) do; the sampler applies them
//! (`kiln_models::sampling::guidance`).

use std::sync::Arc;

use kiln_models::sampling::guidance::{CfgFunction, PostCfg};

use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::value::Value;

/// Which hook a node sets.
#[derive(Clone, Copy)]
enum Hook {
    /// `CFGNorm`: post-CFG, or with `pre_cfg` the CFG function.
    Norm,
    /// `CFGZeroStar`: post-CFG.
    ZeroStar,
    /// `RescaleCFG`: the CFG function.
    Rescale,
}

/// A node that returns its model with a CFG hook set.
pub(super) struct CfgPatch {
    spec: Arc<NodeSpec>,
    hook: Hook,
}

/// The three patch nodes, in ComfyUI's registration order within their modules.
pub(super) fn nodes() -> Vec<CfgPatch> {
    let cfg_node = |name: &str| {
        NodeSpec::new(name, "", "advanced/guidance")
            .python_module("comfy_extras.nodes_cfg")
            .v3()
            .input(InputDef::typed("model", "MODEL"))
    };
    vec![
        CfgPatch {
            spec: Arc::new(
                cfg_node("CFGZeroStar").output(OutputDef::new("MODEL").named("patched_model")),
            ),
            hook: Hook::ZeroStar,
        },
        CfgPatch {
            spec: Arc::new(
                cfg_node("CFGNorm")
                    .experimental()
                    .input(InputDef::float("strength", 1.0, 0.0, 100.0).option("step", 0.01))
                    .optional(
                        InputDef::bare("pre_cfg", "BOOLEAN")
                            .tooltip(
                                "If true, rescale the combined noise BEFORE the sampler's CFG combine, \
                                 without clamping (can amplify). Matches the norm-scaled CFG used by \
                                 models like Lens. Default false keeps the original post-CFG x0-space \
                                 attenuate-only behavior.",
                            )
                            .option("default", false),
                    )
                    .output(OutputDef::new("MODEL").named("patched_model")),
            ),
            hook: Hook::Norm,
        },
        CfgPatch {
            spec: Arc::new(
                NodeSpec::new("RescaleCFG", "RescaleCFG", "model/patch")
                    .python_module("comfy_extras.nodes_model_advanced")
                    .input(InputDef::typed("model", "MODEL"))
                    .input(InputDef::float("multiplier", 0.7, 0.0, 1.0).option("step", 0.01))
                    .output(OutputDef::new("MODEL")),
            ),
            hook: Hook::Rescale,
        },
    ]
}

impl Node for CfgPatch {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let mut guidance = model.guidance.clone();
        match self.hook {
            Hook::ZeroStar => guidance.post_cfg.push(PostCfg::ZeroStar),
            Hook::Norm => {
                let strength = inputs.float("strength")? as f32;
                let pre_cfg = inputs.has("pre_cfg") && inputs.bool("pre_cfg")?;
                if pre_cfg {
                    guidance.cfg_function = Some(CfgFunction::NormPre { strength });
                } else {
                    guidance.post_cfg.push(PostCfg::Norm { strength });
                }
            }
            Hook::Rescale => {
                let multiplier = inputs.float("multiplier")? as f32;
                guidance.cfg_function = Some(CfgFunction::Rescale { multiplier });
            }
        }
        Ok(NodeResult::values([Value::Model(Arc::new(model.with_guidance(guidance)))]))
    }
}
