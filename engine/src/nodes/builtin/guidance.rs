//! The model patches that change how predictions combine: `CFGNorm` and `CFGZeroStar`
//! (`comfy_extras.nodes_cfg`, V3), `RescaleCFG` (`comfy_extras.nodes_model_advanced`, V1),
//! `RenormCFG` (`comfy_extras.nodes_lumina2`, V3), `Epsilon Scaling` and `TemporalScoreRescaling`
//! (`comfy_extras.nodes_eps`, V3, after CFG), `SkipLayerGuidanceDiT` and `SkipLayerGuidanceDiTSimple`
//! (`comfy_extras.nodes_slg`, V3), `Mahiro`
//! (`comfy_extras.nodes_mahiro`, V3), `TCFG` (`comfy_extras.nodes_tcfg`, V3, before CFG) and `APG`
//! (`comfy_extras.nodes_apg`, V3, before CFG). Each returns a
//! copy of the model with a hook set, as ComfyUI's `set_model_sampler_cfg_function` (replacing) and
//! `set_model_sampler_post_cfg_function` (appending) do; the sampler applies them
//! (`kiln_models::sampling::guidance`).

use std::sync::Arc;

use kiln_models::sampling::guidance::{
    Apg, CfgFunction, CfgOverride, PostCfg, PreCfg, SkipLayers, UncondSkip,
};

use super::custom_sampling::percent;

use crate::nodes::{Context, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::value::Value;

/// Which hook a node sets.
#[derive(Clone, Copy)]
enum Hook {
    /// `CFGNorm`: post-CFG, or with `pre_cfg` the CFG function.
    Norm,
    /// `CFGZeroStar`: post-CFG.
    ZeroStar,
    /// `Mahiro`: post-CFG.
    Mahiro,
    /// `TCFG`: pre-CFG, on the unconditional prediction.
    TangentialDamping,
    /// `APG`: pre-CFG, rewriting the conditional prediction.
    Apg,
    /// `RescaleCFG`: the CFG function.
    Rescale,
    /// `RenormCFG`: the CFG function.
    Renorm,
    /// `Epsilon Scaling`: post-CFG.
    EpsilonScaling,
    /// `TemporalScoreRescaling`: post-CFG.
    ScoreRescaling,
    /// `SkipLayerGuidanceDiT`: post-CFG, with a model pass leaving some blocks out.
    SkipLayers,
    /// `SkipLayerGuidanceDiTSimple`: the unconditional prediction from a pass leaving some blocks out.
    SkipLayersUncond,
    /// `CFGOverride`: another CFG scale over a σ range.
    Override,
}

/// A node that returns its model with a CFG hook set.
pub(super) struct CfgPatch {
    spec: Arc<NodeSpec>,
    hook: Hook,
}

/// The patch nodes, in ComfyUI's registration order within their modules.
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
        CfgPatch {
            spec: Arc::new(
                NodeSpec::new("CFGOverride", "CFG Override", "model/sampling/guiders")
                    .python_module("comfy_extras.nodes_custom_sampler")
                    .v3()
                    .description(
                        "Override cfg to a fixed value over a [start, end] percent (sigma) range. With multiple \
                         overrides, the one nearest the sampler wins on overlap.",
                    )
                    .input(InputDef::typed("model", "MODEL").with_options())
                    .input(
                        InputDef::float("cfg", 1.0, 0.0, 100.0)
                            .option("step", 0.1)
                            .option("round", 0.01),
                    )
                    .input(InputDef::float("start_percent", 0.0, 0.0, 1.0).option("step", 0.001))
                    .input(InputDef::float("end_percent", 1.0, 0.0, 1.0).option("step", 0.001))
                    .output(OutputDef::new("MODEL")),
            ),
            hook: Hook::Override,
        },
        CfgPatch { spec: Arc::new(skip_layer_guidance_spec()), hook: Hook::SkipLayers },
        CfgPatch { spec: Arc::new(skip_layer_guidance_simple_spec()), hook: Hook::SkipLayersUncond },
        CfgPatch {
            spec: Arc::new(
                NodeSpec::new("Mahiro", "Positive-Biased Guidance", "experimental")
                    .python_module("comfy_extras.nodes_mahiro")
                    .v3()
                    .experimental()
                    .description(
                        "Modify the guidance to scale more on the 'direction' of the positive prompt rather \
                         than the difference between the negative prompt.",
                    )
                    .input(InputDef::typed("model", "MODEL"))
                    .output(OutputDef::new("MODEL").named("patched_model"))
                    .aliases(&[
                        "mahiro",
                        "mahiro cfg",
                        "similarity-adaptive guidance",
                        "positive-biased cfg",
                    ]),
            ),
            hook: Hook::Mahiro,
        },
        CfgPatch {
            spec: Arc::new(
                NodeSpec::new("TCFG", "Tangential Damping CFG", "advanced/guidance")
                    .python_module("comfy_extras.nodes_tcfg")
                    .v3()
                    .description(
                        "TCFG \u{2013} Tangential Damping CFG (2503.18137)\n\nRefine the uncond (negative) to \
                         align with the cond (positive) for improving quality.",
                    )
                    .input(InputDef::typed("model", "MODEL"))
                    .output(OutputDef::new("MODEL").named("patched_model")),
            ),
            hook: Hook::TangentialDamping,
        },
        CfgPatch { spec: Arc::new(apg_spec()), hook: Hook::Apg },
        CfgPatch {
            spec: Arc::new(
                NodeSpec::new("RenormCFG", "", "model/patch")
                    .python_module("comfy_extras.nodes_lumina2")
                    .v3()
                    .input(InputDef::typed("model", "MODEL").with_options())
                    .input(
                        InputDef::bare("cfg_trunc", "FLOAT")
                            .option("advanced", true)
                            .option("default", 100)
                            .option("min", 0.0)
                            .option("max", 100.0)
                            .option("step", 0.01),
                    )
                    .input(
                        InputDef::bare("renorm_cfg", "FLOAT")
                            .option("advanced", true)
                            .option("default", 1.0)
                            .option("min", 0.0)
                            .option("max", 100.0)
                            .option("step", 0.01),
                    )
                    .output(OutputDef::new("MODEL")),
            ),
            hook: Hook::Renorm,
        },
        CfgPatch { spec: Arc::new(epsilon_scaling_spec()), hook: Hook::EpsilonScaling },
        CfgPatch { spec: Arc::new(score_rescaling_spec()), hook: Hook::ScoreRescaling },
    ]
}

/// A `FLOAT` of `comfy_extras.nodes_eps` (a number widget, advanced): its tooltip, if any, then
/// `(default, min, max, step)`.
fn eps_setting(name: &str, tooltip: Option<&str>, [default, min, max, step]: [f64; 4]) -> InputDef {
    let input = InputDef::bare(name, "FLOAT");
    let input = match tooltip {
        Some(text) => input.tooltip(text),
        None => input,
    };
    input
        .option("advanced", true)
        .option("default", default)
        .option("min", min)
        .option("max", max)
        .option("step", step)
        .option("display", "number")
}

/// `Epsilon Scaling`'s declaration.
fn epsilon_scaling_spec() -> NodeSpec {
    NodeSpec::new("Epsilon Scaling", "", "model/patch/unet")
        .python_module("comfy_extras.nodes_eps")
        .v3()
        .input(InputDef::typed("model", "MODEL").with_options())
        .input(eps_setting("scaling_factor", None, [1.005, 0.5, 1.5, 0.001]))
        .output(OutputDef::new("MODEL"))
}

/// `TemporalScoreRescaling`'s declaration.
fn score_rescaling_spec() -> NodeSpec {
    NodeSpec::new("TemporalScoreRescaling", "TSR - Temporal Score Rescaling", "model/patch/unet")
        .python_module("comfy_extras.nodes_eps")
        .v3()
        .description(
            "[Post-CFG Function]\nTSR - Temporal Score Rescaling (2510.01184)\n\nRescaling the model's score or \
             noise to steer the sampling diversity.\n",
        )
        .input(InputDef::typed("model", "MODEL").with_options())
        .input(eps_setting(
            "tsr_k",
            Some(
                "Controls the rescaling strength.\nLower k produces more detailed results; higher k produces \
                 smoother results in image generation. Setting k = 1 disables rescaling.",
            ),
            [0.95, 0.01, 100.0, 0.001],
        ))
        .input(eps_setting(
            "tsr_sigma",
            Some("Controls how early rescaling takes effect.\nLarger values take effect earlier."),
            [1.0, 0.01, 100.0, 0.001],
        ))
        .output(OutputDef::new("MODEL").named("patched_model"))
}

/// `APG`'s declaration.
fn apg_spec() -> NodeSpec {
    let setting = |name: &str, tooltip: &str, [default, min, max, step]: [f64; 4]| {
        InputDef::bare(name, "FLOAT")
            .tooltip(tooltip)
            .option("advanced", true)
            .option("default", default)
            .option("min", min)
            .option("max", max)
            .option("step", step)
    };
    NodeSpec::new("APG", "Adaptive Projected Guidance", "model/sampling/custom")
        .python_module("comfy_extras.nodes_apg")
        .v3()
        .input(InputDef::typed("model", "MODEL").with_options())
        .input(setting(
            "eta",
            "Controls the scale of the parallel guidance vector. Default CFG behavior at a setting of 1.",
            [1.0, -10.0, 10.0, 0.01],
        ))
        .input(setting(
            "norm_threshold",
            "Normalize guidance vector to this value, normalization disable at a setting of 0.",
            [5.0, 0.0, 50.0, 0.1],
        ))
        .input(setting(
            "momentum",
            "Controls a running average of guidance during diffusion, disabled at a setting of 0.",
            [0.0, -5.0, 1.0, 0.01],
        ))
        .output(OutputDef::new("MODEL"))
}

/// The block-list input of the skip-layer nodes (ComfyUI serialises `advanced` first).
fn layers(name: &str) -> InputDef {
    InputDef::bare(name, "STRING")
        .option("advanced", true)
        .option("default", "7, 8, 9")
        .option("multiline", false)
}

/// `SkipLayerGuidanceDiTSimple`'s declaration.
fn skip_layer_guidance_simple_spec() -> NodeSpec {
    NodeSpec::new("SkipLayerGuidanceDiTSimple", "", "advanced/guidance")
        .python_module("comfy_extras.nodes_slg")
        .v3()
        .experimental()
        .description(
            "Simple version of the SkipLayerGuidanceDiT node that only modifies the uncond pass.",
        )
        .input(InputDef::typed("model", "MODEL"))
        .input(layers("double_layers"))
        .input(layers("single_layers"))
        .input(percent("start_percent", 0.0))
        .input(percent("end_percent", 1.0))
        .output(OutputDef::new("MODEL"))
}

/// `SkipLayerGuidanceDiT`'s declaration.
fn skip_layer_guidance_spec() -> NodeSpec {
    NodeSpec::new("SkipLayerGuidanceDiT", "", "advanced/guidance")
        .python_module("comfy_extras.nodes_slg")
        .v3()
        .experimental()
        .description(
            "Generic version of SkipLayerGuidance node that can be used on every DiT model.",
        )
        .input(InputDef::typed("model", "MODEL"))
        .input(layers("double_layers"))
        .input(layers("single_layers"))
        .input(InputDef::float("scale", 3.0, 0.0, 10.0).option("step", 0.1))
        .input(percent("start_percent", 0.01))
        .input(percent("end_percent", 0.15))
        .input(InputDef::float("rescaling_scale", 0.0, 0.0, 10.0).option("step", 0.01))
        .output(OutputDef::new("MODEL"))
}

/// The block indices in `text` (every run of digits, as ComfyUI's `re.findall(r'\d+')`) as a bit set.
fn block_set(text: &str, input: &str) -> Result<u64, NodeError> {
    let mut set = 0u64;
    for digits in text.split(|c: char| !c.is_ascii_digit()).filter(|d| !d.is_empty()) {
        let block: u32 = digits.parse().unwrap_or(u32::MAX);
        if block >= 64 {
            return Err(NodeError::new(format!(
                "`{input}` names block {digits}; no model Kiln runs has more than 64 blocks"
            )));
        }
        set |= 1 << block;
    }
    Ok(set)
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
            Hook::Mahiro => guidance.post_cfg.push(PostCfg::Mahiro),
            Hook::TangentialDamping => guidance.pre_cfg.push(PreCfg::TangentialDamping),
            Hook::Apg => {
                let [eta, threshold, momentum] = ["eta", "norm_threshold", "momentum"]
                    .map(|k| inputs.float(k).map(|v| v as f32));
                guidance.pre_cfg.push(PreCfg::Apg(Apg::new(eta?, threshold?, momentum?)));
            }
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
            Hook::EpsilonScaling => {
                let factor = inputs.float("scaling_factor")?;
                guidance.post_cfg.push(PostCfg::EpsilonScaling { factor });
            }
            Hook::ScoreRescaling => {
                let (k, sigma) = (inputs.float("tsr_k")?, inputs.float("tsr_sigma")?);
                let flow = model.sampling.flow().is_some();
                guidance.post_cfg.push(PostCfg::ScoreRescaling {
                    k,
                    variance: sigma * sigma,
                    flow,
                });
            }
            Hook::Renorm => {
                let cfg_trunc = inputs.float("cfg_trunc")? as f32;
                let renorm_cfg = inputs.float("renorm_cfg")? as f32;
                guidance.cfg_function = Some(CfgFunction::Renorm { cfg_trunc, renorm_cfg });
            }
            Hook::SkipLayers => {
                let double = block_set(inputs.string("double_layers")?, "double_layers")?;
                let single = block_set(inputs.string("single_layers")?, "single_layers")?;
                if double == 0 && single == 0 {
                    return Ok(NodeResult::values([Value::Model(Arc::clone(model))]));
                }
                let sampling = &model.sampling;
                guidance.post_cfg.push(PostCfg::SkipLayer(SkipLayers {
                    double,
                    single,
                    scale: inputs.float("scale")? as f32,
                    sigma_start: sampling.percent_to_sigma(inputs.float("start_percent")?) as f32,
                    sigma_end: sampling.percent_to_sigma(inputs.float("end_percent")?) as f32,
                    rescaling: inputs.float("rescaling_scale")? as f32,
                }));
            }
            Hook::Override => {
                let sampling = &model.sampling;
                guidance.cfg_overrides.push(CfgOverride {
                    cfg: inputs.float("cfg")?,
                    sigma_low: sampling.percent_to_sigma(inputs.float("end_percent")?),
                    sigma_high: sampling.percent_to_sigma(inputs.float("start_percent")?),
                });
            }
            Hook::SkipLayersUncond => {
                let double = block_set(inputs.string("double_layers")?, "double_layers")?;
                let single = block_set(inputs.string("single_layers")?, "single_layers")?;
                if double == 0 && single == 0 {
                    return Ok(NodeResult::values([Value::Model(Arc::clone(model))]));
                }
                let sampling = &model.sampling;
                guidance.uncond_skip = Some(UncondSkip {
                    double,
                    single,
                    sigma_start: sampling.percent_to_sigma(inputs.float("start_percent")?) as f32,
                    sigma_end: sampling.percent_to_sigma(inputs.float("end_percent")?) as f32,
                });
            }
        }
        Ok(NodeResult::values([Value::Model(Arc::new(model.with_guidance(guidance)))]))
    }
}
