//! ComfyUI's custom-sampling nodes (`comfy_extras.nodes_custom_sampler`, V3 classes): a sampler, sigmas, noise
//! and a guider made by separate nodes, and `SamplerCustom`/`SamplerCustomAdvanced` running them — the same run
//! `KSampler` makes (`sampler::sample`), each part chosen on its own.

use std::sync::Arc;

use kiln_models::sampling::{
    self, AdaptiveSettings, FlowSampling, SaSolverSettings, Sampler, SamplerChoice, SamplerSettings,
};

use super::pure::Pure;
use super::sampler::{
    Sampled, Sampling, count, latent_in_model_space, sample, sampler, sampler_names, scheduler,
    scheduler_names, starting_noise,
};
use crate::compute::Compute;
use crate::models::{DualCfg, Guider, Noise, PerpNeg};
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::value::{Latent, Value};

/// The module ComfyUI reports for these nodes.
const MODULE: &str = "comfy_extras.nodes_custom_sampler";

/// A V3 node of this module.
fn spec(name: &str, display_name: &str, category: &str) -> NodeSpec {
    NodeSpec::new(name, display_name, category).python_module(MODULE).v3()
}

/// The seed input of `RandomNoise` and `SamplerCustom`: all of u64, with the frontend's control widget.
fn noise_seed() -> InputDef {
    InputDef::int("noise_seed", 0, 0, 0)
        .option("max", u64::MAX)
        .option("control_after_generate", true)
}

/// The `steps` input of the schedulers.
fn steps() -> InputDef {
    InputDef::int("steps", 20, 1, 10000)
}

/// An advanced, unrounded `FLOAT` input of the schedulers and samplers (V3 writes `advanced` first).
fn advanced_float(name: &str, default: f64, max: f64) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .option("advanced", true)
        .option("default", default)
        .option("min", 0.0)
        .option("max", max)
        .option("step", 0.01)
        .option("round", false)
}

/// A `FLOAT` input from 0 to 1 in steps of 0.01 (`denoise`).
fn unit_float(name: &str, default: f64) -> InputDef {
    InputDef::float(name, default, 0.0, 1.0).option("step", 0.01)
}

/// The `cfg` input of the guiders and `SamplerCustom`.
fn cfg(name: &str) -> InputDef {
    InputDef::float(name, 8.0, 0.0, 100.0).option("step", 0.1).option("round", 0.01)
}

/// A `FLOAT` from 0 with a tooltip, then `(default, max)`, step 0.01 (`SamplerLCM`'s noise inputs, Wan Animate
/// 2's strengths).
pub(super) fn tooltipped_scale(name: &str, tooltip: &str, (default, max): (f64, f64)) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .tooltip(tooltip)
        .option("default", default)
        .option("min", 0.0)
        .option("max", max)
        .option("step", 0.01)
}

/// A `GUIDER` of the node's `model`, its positive and CFG scale inputs (named `positive, cfg`), its `negative`,
/// and what a two-scale or Perp-Neg guider adds.
fn guider(
    inputs: &Inputs,
    (positive, cfg): (&str, &str),
    dual: Option<DualCfg>,
    perp_neg: Option<PerpNeg>,
) -> Result<Vec<Value>, NodeError> {
    Ok(vec![Value::Guider(Arc::new(Guider {
        model: inputs.model("model")?.clone(),
        positive: inputs.conditioning(positive)?.clone(),
        negative: Some(inputs.conditioning("negative")?.clone()),
        cfg: inputs.float(cfg)?,
        dual,
        perp_neg,
    }))])
}

/// An unrounded `FLOAT` input from 0 of the sampler nodes (`eta`, `s_noise`), advanced or not (V3 writes
/// `advanced` first).
fn unrounded(name: &str, default: f64, max: f64, advanced: bool) -> InputDef {
    let input = InputDef::bare(name, "FLOAT");
    let input = if advanced { input.option("advanced", true) } else { input };
    input
        .option("default", default)
        .option("min", 0.0)
        .option("max", max)
        .option("step", 0.01)
        .option("round", false)
}

/// `noise_device`: where ComfyUI's SDE sampler nodes keep the Brownian tree (`gpu` picks the `_gpu` sampler;
/// the two are the same on the CPU).
fn noise_device() -> InputDef {
    InputDef::bare("noise_device", "COMBO")
        .option("advanced", true)
        .option("multiselect", false)
        .option("options", vec!["gpu".to_owned(), "cpu".to_owned()])
}

/// The DPM-Solver++ SDE sampler a `SamplerDPMPP_*SDE` node makes: `cpu` or `gpu` (the `_gpu` twin) from its
/// `noise_device`, at its `eta`, `s_noise` and (for `dpmpp_sde`) `r`.
fn sde_sampler(inputs: &Inputs, cpu: Sampler, gpu: Sampler) -> Result<Vec<Value>, NodeError> {
    let sampler = if inputs.string("noise_device")? == "cpu" { cpu } else { gpu };
    let r = if matches!(sampler, Sampler::DpmppSde | Sampler::DpmppSdeGpu) {
        inputs.float("r")?
    } else {
        SamplerSettings::default().r
    };
    let settings = SamplerSettings {
        eta: inputs.float("eta")? as f32,
        s_noise: inputs.float("s_noise")? as f32,
        r,
        ..SamplerSettings::default()
    };
    Ok(vec![Value::Sampler(SamplerChoice { sampler, settings })])
}

/// An advanced fraction of the schedule (0..=1, step 0.001).
pub(super) fn percent(name: &str, default: f64) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .option("advanced", true)
        .option("default", default)
        .option("min", 0.0)
        .option("max", 1.0)
        .option("step", 0.001)
}

/// An advanced solver order (at most 6).
fn order(name: &str, default: i64, min: i64) -> InputDef {
    InputDef::bare(name, "INT")
        .option("advanced", true)
        .option("default", default)
        .option("min", min)
        .option("max", 6)
}

/// An advanced unrounded float with a tooltip (`(default, min, max)`, step 0.01), as V3 declares it.
fn explained(name: &str, tooltip: &str, (default, min, max): (f64, f64, f64)) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .tooltip(tooltip)
        .option("advanced", true)
        .option("default", default)
        .option("min", min)
        .option("max", max)
        .option("step", 0.01)
        .option("round", false)
}

/// The ancestral `sampler` at the node's `eta` and `s_noise`.
fn ancestral(inputs: &Inputs, sampler: Sampler) -> Result<Vec<Value>, NodeError> {
    let settings = SamplerSettings {
        eta: inputs.float("eta")? as f32,
        s_noise: inputs.float("s_noise")? as f32,
        ..SamplerSettings::default()
    };
    Ok(vec![Value::Sampler(SamplerChoice { sampler, settings })])
}

/// SIGMAS as a value.
fn sigmas(values: Vec<f32>) -> Value {
    Value::Sigmas(values.into())
}

/// A count input that must be positive in ComfyUI's ranges anyway (`steps`).
fn steps_of(inputs: &Inputs) -> Result<usize, NodeError> {
    count(inputs, "steps")
}

/// An advanced unrounded float in tenths over `(min, max)` (`LaplaceScheduler`'s `mu` and `beta`).
fn tenths(name: &str, default: f64, (min, max): (f64, f64)) -> InputDef {
    InputDef::bare(name, "FLOAT")
        .option("advanced", true)
        .option("default", default)
        .option("min", min)
        .option("max", max)
        .option("step", 0.1)
        .option("round", false)
}

/// The value-building nodes, in ComfyUI's registration order.
pub(super) fn builders() -> Vec<Pure> {
    vec![
        Pure::new(
            spec("BasicScheduler", "", "model/sampling/schedulers")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::v3_combo("scheduler", &scheduler_names()))
                .input(steps())
                .input(unit_float("denoise", 1.0))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let model = inputs.model("model")?;
                let denoise = inputs.float("denoise")?;
                let steps = steps_of(inputs)?;
                // ComfyUI: denoise ≤ 0 is no sigmas at all; below 1, the tail of a longer schedule.
                let values = if denoise <= 0.0 {
                    Vec::new()
                } else {
                    sampling::denoise_sigmas(scheduler(inputs)?, &model.sampling, steps, denoise)
                };
                Ok(vec![sigmas(values)])
            },
        ),
        Pure::new(
            spec("KarrasScheduler", "", "model/sampling/schedulers")
                .input(steps())
                .input(advanced_float("sigma_max", 14.614642, 5000.0))
                .input(advanced_float("sigma_min", 0.0291675, 5000.0))
                .input(advanced_float("rho", 7.0, 100.0))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                Ok(vec![sigmas(sampling::karras_sigmas(
                    steps_of(inputs)?,
                    inputs.float("sigma_min")?,
                    inputs.float("sigma_max")?,
                    inputs.float("rho")?,
                ))])
            },
        ),
        Pure::new(
            spec("ExponentialScheduler", "", "model/sampling/schedulers")
                .input(steps())
                .input(advanced_float("sigma_max", 14.614642, 5000.0))
                .input(advanced_float("sigma_min", 0.0291675, 5000.0))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                Ok(vec![sigmas(sampling::exponential_sigmas(
                    steps_of(inputs)?,
                    inputs.float("sigma_min")?,
                    inputs.float("sigma_max")?,
                ))])
            },
        ),
        Pure::new(
            spec("PolyexponentialScheduler", "", "model/sampling/schedulers")
                .input(steps())
                .input(advanced_float("sigma_max", 14.614642, 5000.0))
                .input(advanced_float("sigma_min", 0.0291675, 5000.0))
                .input(advanced_float("rho", 1.0, 100.0))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                Ok(vec![sigmas(sampling::polyexponential_sigmas(
                    steps_of(inputs)?,
                    inputs.float("sigma_min")?,
                    inputs.float("sigma_max")?,
                    inputs.float("rho")?,
                ))])
            },
        ),
        Pure::new(
            spec("LaplaceScheduler", "", "model/sampling/schedulers")
                .input(steps())
                .input(advanced_float("sigma_max", 14.614642, 5000.0))
                .input(advanced_float("sigma_min", 0.0291675, 5000.0))
                .input(tenths("mu", 0.0, (-10.0, 10.0)))
                .input(tenths("beta", 0.5, (0.0, 10.0)))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                Ok(vec![sigmas(sampling::laplace_sigmas(
                    steps_of(inputs)?,
                    inputs.float("sigma_min")?,
                    inputs.float("sigma_max")?,
                    inputs.float("mu")?,
                    inputs.float("beta")?,
                ))])
            },
        ),
        Pure::new(
            spec("VPScheduler", "", "model/sampling/schedulers")
                .input(steps())
                .input(advanced_float("beta_d", 19.9, 5000.0))
                .input(advanced_float("beta_min", 0.1, 5000.0))
                .input(
                    InputDef::bare("eps_s", "FLOAT")
                        .option("advanced", true)
                        .option("default", 0.001)
                        .option("min", 0.0)
                        .option("max", 1.0)
                        .option("step", 0.0001)
                        .option("round", false),
                )
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                Ok(vec![sigmas(sampling::vp_sigmas(
                    steps_of(inputs)?,
                    inputs.float("beta_d")?,
                    inputs.float("beta_min")?,
                    inputs.float("eps_s")?,
                ))])
            },
        ),
        Pure::new(
            spec("SDTurboScheduler", "", "model/sampling/schedulers")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::int("steps", 1, 1, 10))
                .input(
                    InputDef::bare("denoise", "FLOAT")
                        .option("default", 1.0)
                        .option("min", 0)
                        .option("max", 1.0)
                        .option("step", 0.01),
                )
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let model = inputs.model("model")?;
                Ok(vec![sigmas(sampling::turbo_sigmas(
                    &model.sampling,
                    steps_of(inputs)?,
                    inputs.float("denoise")?,
                ))])
            },
        ),
        Pure::new(
            spec("BetaSamplingScheduler", "", "model/sampling/schedulers")
                .input(InputDef::typed("model", "MODEL"))
                .input(steps())
                .input(advanced_float("alpha", 0.6, 50.0))
                .input(advanced_float("beta", 0.6, 50.0))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let model = inputs.model("model")?;
                Ok(vec![sigmas(sampling::beta_sigmas(
                    &model.sampling,
                    steps_of(inputs)?,
                    inputs.float("alpha")?,
                    inputs.float("beta")?,
                ))])
            },
        ),
        Pure::new(
            NodeSpec::new("Flux2Scheduler", "", "model/sampling/schedulers")
                .python_module("comfy_extras.nodes_flux")
                .v3()
                .input(InputDef::int("steps", 20, 1, 4096))
                .input(InputDef::int("width", 1024, 16, 16384).option("step", 1))
                .input(InputDef::int("height", 1024, 16, 16384).option("step", 1))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let side = |name: &str| -> Result<u64, NodeError> {
                    let v = inputs.int(name)?;
                    u64::try_from(v)
                        .map_err(|_| NodeError::new(format!("`{name}` must be positive")))
                };
                let steps = steps_of(inputs)?;
                Ok(vec![sigmas(sampling::flux2_sigmas(steps, side("width")?, side("height")?))])
            },
        ),
        Pure::new(
            spec("SplitSigmas", "", "model/sampling/sigmas")
                .input(InputDef::typed("sigmas", "SIGMAS"))
                .input(InputDef::int("step", 0, 0, 10000))
                .output(OutputDef::new("SIGMAS").named("high_sigmas"))
                .output(OutputDef::new("SIGMAS").named("low_sigmas")),
            |inputs| {
                let all = inputs.sigmas("sigmas")?;
                let step = count(inputs, "step")?;
                // sigmas[:step + 1] and sigmas[step:], clamped as Python slices are.
                let high = all[..(step + 1).min(all.len())].to_vec();
                let low = all[step.min(all.len())..].to_vec();
                Ok(vec![sigmas(high), sigmas(low)])
            },
        ),
        Pure::new(
            spec("SplitSigmasDenoise", "", "model/sampling/sigmas")
                .input(InputDef::typed("sigmas", "SIGMAS"))
                .input(unit_float("denoise", 1.0))
                .output(OutputDef::new("SIGMAS").named("high_sigmas"))
                .output(OutputDef::new("SIGMAS").named("low_sigmas")),
            |inputs| {
                let all = inputs.sigmas("sigmas")?;
                let (high, low) = split_denoise(all, inputs.float("denoise")?);
                Ok(vec![sigmas(high), sigmas(low)])
            },
        ),
        Pure::new(
            spec("FlipSigmas", "", "model/sampling/sigmas")
                .input(InputDef::typed("sigmas", "SIGMAS"))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let mut flipped = inputs.sigmas("sigmas")?.to_vec();
                flipped.reverse();
                // A schedule starting at 0 would never move: ComfyUI starts it at 1e-4.
                if let Some(first) = flipped.first_mut()
                    && *first == 0.0
                {
                    *first = 0.0001;
                }
                Ok(vec![sigmas(flipped)])
            },
        ),
        Pure::new(
            spec("SetFirstSigma", "", "model/sampling/sigmas")
                .input(InputDef::typed("sigmas", "SIGMAS"))
                .input(
                    InputDef::float("sigma", 136.0, 0.0, 20000.0)
                        .option("step", 0.001)
                        .option("round", false),
                )
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let mut values = inputs.sigmas("sigmas")?.to_vec();
                let Some(first) = values.first_mut() else {
                    return Err(NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        "SetFirstSigma needs at least one sigma, got none",
                    ));
                };
                *first = inputs.float("sigma")? as f32;
                Ok(vec![sigmas(values)])
            },
        ),
        Pure::new(
            spec("ExtendIntermediateSigmas", "", "model/sampling/sigmas")
                .input(InputDef::typed("sigmas", "SIGMAS"))
                .input(InputDef::int("steps", 2, 1, 100))
                .input(
                    InputDef::float("start_at_sigma", -1.0, -1.0, 20000.0)
                        .option("step", 0.01)
                        .option("round", false),
                )
                .input(
                    InputDef::float("end_at_sigma", 12.0, 0.0, 20000.0)
                        .option("step", 0.01)
                        .option("round", false),
                )
                .input(InputDef::v3_combo("spacing", &["linear", "cosine", "sine"]))
                .output(OutputDef::new("SIGMAS"))
                .aliases(&["interpolate sigmas"]),
            |inputs| {
                let spacing = inputs.string("spacing")?;
                let extended = sampling::extend_intermediate_sigmas(
                    inputs.sigmas("sigmas")?,
                    steps_of(inputs)?,
                    inputs.float("start_at_sigma")?,
                    inputs.float("end_at_sigma")?,
                    spacing,
                )
                .ok_or_else(|| {
                    NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!("unknown spacing '{spacing}' (linear, cosine or sine)"),
                    )
                })?;
                Ok(vec![sigmas(extended)])
            },
        ),
        Pure::new(
            spec("SamplingPercentToSigma", "", "model/sampling/sigmas")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::float("sampling_percent", 0.0, 0.0, 1.0).option("step", 0.0001))
                .input(
                    InputDef::bare("return_actual_sigma", "BOOLEAN")
                        .tooltip(
                            "Return the actual sigma value instead of the value used for interval checks.\nThis \
                             only affects results at 0.0 and 1.0.",
                        )
                        .option("default", false),
                )
                .output(OutputDef::new("FLOAT").named("sigma_value")),
            |inputs| {
                let sampling = &inputs.model("model")?.sampling;
                let percent = inputs.float("sampling_percent")?;
                // The schedule's ends where asked for, instead of the values the range checks use there.
                let sigma = match (inputs.bool("return_actual_sigma")?, percent) {
                    (true, 0.0) => f64::from(sampling.sigma_max()),
                    (true, 1.0) => f64::from(sampling.sigma_min()),
                    _ => sampling.percent_to_sigma(percent),
                };
                Ok(vec![Value::Float(sigma)])
            },
        ),
        Pure::new(
            spec("KSamplerSelect", "", "model/sampling/samplers")
                .input(InputDef::v3_combo("sampler_name", &sampler_names()))
                .output(OutputDef::new("SAMPLER")),
            |inputs| Ok(vec![Value::Sampler(sampler(inputs)?.into())]),
        ),
        Pure::new(
            spec("SamplerDPMAdaptative", "", "model/sampling/samplers")
                .input(
                    InputDef::bare("order", "INT")
                        .option("advanced", true)
                        .option("default", 3)
                        .option("min", 2)
                        .option("max", 3),
                )
                .input(unrounded("rtol", 0.05, 100.0, true))
                .input(unrounded("atol", 0.0078, 100.0, true))
                .input(unrounded("h_init", 0.05, 100.0, true))
                .input(unrounded("pcoeff", 0.0, 100.0, true))
                .input(unrounded("icoeff", 1.0, 100.0, true))
                .input(unrounded("dcoeff", 0.0, 100.0, true))
                .input(unrounded("accept_safety", 0.81, 100.0, true))
                .input(unrounded("eta", 0.0, 100.0, true))
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .output(OutputDef::new("SAMPLER")),
            |inputs| {
                let adaptive = AdaptiveSettings {
                    order: count(inputs, "order")?,
                    rtol: inputs.float("rtol")?,
                    atol: inputs.float("atol")?,
                    h_init: inputs.float("h_init")?,
                    pid: [inputs.float("pcoeff")?, inputs.float("icoeff")?, inputs.float("dcoeff")?],
                    accept_safety: inputs.float("accept_safety")?,
                    eta: inputs.float("eta")? as f32,
                    s_noise: inputs.float("s_noise")? as f32,
                };
                let settings = SamplerSettings { adaptive, ..SamplerSettings::default() };
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::DpmAdaptive, settings })])
            },
        ),
        Pure::new(
            spec("SamplerSASolver", "", "model/sampling/samplers")
                .input(InputDef::typed("model", "MODEL"))
                .input(unrounded("eta", 1.0, 10.0, true))
                .input(percent("sde_start_percent", 0.2))
                .input(percent("sde_end_percent", 0.8))
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .input(order("predictor_order", 3, 1))
                .input(order("corrector_order", 4, 0))
                .input(InputDef::bare("use_pece", "BOOLEAN").option("advanced", true))
                .input(InputDef::bare("simple_order_2", "BOOLEAN").option("advanced", true))
                .output(OutputDef::new("SAMPLER"))
                .aliases(&["sde"]),
            |inputs| {
                // The SDE interval as the model's sigmas, as the node computes it from its MODEL.
                let sampling = &inputs.model("model")?.sampling;
                let start = sampling.percent_to_sigma(inputs.float("sde_start_percent")?);
                let end = sampling.percent_to_sigma(inputs.float("sde_end_percent")?);
                let sa_solver = SaSolverSettings {
                    eta: inputs.float("eta")?,
                    sde_sigmas: Some((start, end)),
                    s_noise: inputs.float("s_noise")? as f32,
                    predictor_order: count(inputs, "predictor_order")?,
                    corrector_order: count(inputs, "corrector_order")?,
                    use_pece: inputs.bool("use_pece")?,
                    simple_order_2: inputs.bool("simple_order_2")?,
                };
                let settings = SamplerSettings { sa_solver, ..SamplerSettings::default() };
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::SaSolver, settings })])
            },
        ),
        Pure::new(
            spec("SamplerSEEDS2", "", "model/sampling/samplers")
                .description(
                    "This sampler node can represent multiple samplers:\n\nseeds_2\n- default setting\n\n\
                     exp_heun_2_x0\n- solver_type=phi_2, r=1.0, eta=0.0\n\nexp_heun_2_x0_sde\n- \
                     solver_type=phi_2, r=1.0, eta=1.0, s_noise=1.0",
                )
                .input(InputDef::v3_combo("solver_type", &["phi_1", "phi_2"]))
                .input(explained("eta", "Stochastic strength", (1.0, 0.0, 100.0)))
                .input(explained("s_noise", "SDE noise multiplier", (1.0, 0.0, 100.0)))
                .input(explained(
                    "r",
                    "Relative step size for the intermediate stage (c2 node)",
                    (0.5, 0.01, 1.0),
                ))
                .output(OutputDef::new("SAMPLER"))
                .aliases(&["sde", "exp heun"]),
            |inputs| {
                let settings = SamplerSettings {
                    eta: inputs.float("eta")? as f32,
                    s_noise: inputs.float("s_noise")? as f32,
                    r: inputs.float("r")?,
                    phi_2: inputs.string("solver_type")? == "phi_2",
                    ..SamplerSettings::default()
                };
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::Seeds2, settings })])
            },
        ),
        Pure::new(
            spec("SamplerDPMPP_3M_SDE", "", "model/sampling/samplers")
                .input(unrounded("eta", 1.0, 100.0, true))
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .input(noise_device())
                .output(OutputDef::new("SAMPLER")),
            |inputs| sde_sampler(inputs, Sampler::Dpmpp3mSde, Sampler::Dpmpp3mSdeGpu),
        ),
        Pure::new(
            spec("SamplerDPMPP_2M_SDE", "", "model/sampling/samplers")
                .input(InputDef::v3_combo("solver_type", &["midpoint", "heun"]))
                .input(unrounded("eta", 1.0, 100.0, true))
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .input(noise_device())
                .output(OutputDef::new("SAMPLER")),
            |inputs| match inputs.string("solver_type")? {
                "heun" => sde_sampler(inputs, Sampler::Dpmpp2mSdeHeun, Sampler::Dpmpp2mSdeHeunGpu),
                _ => sde_sampler(inputs, Sampler::Dpmpp2mSde, Sampler::Dpmpp2mSdeGpu),
            },
        ),
        Pure::new(
            spec("SamplerDPMPP_SDE", "", "model/sampling/samplers")
                .input(unrounded("eta", 1.0, 100.0, true))
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .input(unrounded("r", 0.5, 100.0, true))
                .input(noise_device())
                .output(OutputDef::new("SAMPLER")),
            |inputs| sde_sampler(inputs, Sampler::DpmppSde, Sampler::DpmppSdeGpu),
        ),
        Pure::new(
            spec("SamplerDPMPP_2S_Ancestral", "", "model/sampling/samplers")
                .input(unrounded("eta", 1.0, 100.0, false))
                .input(unrounded("s_noise", 1.0, 100.0, false))
                .output(OutputDef::new("SAMPLER")),
            |inputs| ancestral(inputs, Sampler::Dpmpp2sAncestral),
        ),
        Pure::new(
            spec("SamplerEulerAncestral", "", "model/sampling/samplers")
                .input(unrounded("eta", 1.0, 100.0, true))
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .output(OutputDef::new("SAMPLER")),
            |inputs| ancestral(inputs, Sampler::EulerAncestral),
        ),
        Pure::new(
            spec("SamplerEulerAncestralCFGPP", "SamplerEulerAncestralCFG++", "model/sampling/samplers")
                .input(unrounded("eta", 1.0, 1.0, false))
                .input(unrounded("s_noise", 1.0, 10.0, false))
                .output(OutputDef::new("SAMPLER")),
            |inputs| ancestral(inputs, Sampler::EulerAncestralCfgPp),
        ),
        Pure::new(
            NodeSpec::new("SamplerLCM", "", "model/sampling/samplers")
                .python_module("comfy_extras.nodes_advanced_samplers")
                .v3()
                .description(
                    "LCM sampler with tunable per-step noise. s_noise is a multiplier on the model's training \
                     noise scale",
                )
                .input(tooltipped_scale(
                    "s_noise",
                    "Per-step noise multiplier at the first step (1.0 = match training).",
                    (1.0, 64.0),
                ))
                .input(tooltipped_scale(
                    "s_noise_end",
                    "Per-step noise multiplier at the last step. Set equal to s_noise for a constant schedule.",
                    (1.0, 64.0),
                ))
                .input(tooltipped_scale(
                    "noise_clip_std",
                    "Clamp per-step noise to +/- N*std. 0 disables.",
                    (0.0, 10.0),
                ))
                .output(OutputDef::new("SAMPLER")),
            |inputs| {
                let settings = SamplerSettings {
                    lcm_noise: Some((inputs.float("s_noise")?, inputs.float("s_noise_end")?)),
                    noise_clip_std: inputs.float("noise_clip_std")? as f32,
                    ..SamplerSettings::default()
                };
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::Lcm, settings })])
            },
        ),
        Pure::new(
            NodeSpec::new("SamplerEulerCFGpp", "SamplerEulerCFG++", "experimental")
                .python_module("comfy_extras.nodes_advanced_samplers")
                .v3()
                .experimental()
                .input(
                    InputDef::bare("version", "COMBO")
                        .option("advanced", true)
                        .option("multiselect", false)
                        .option("options", vec!["regular".to_owned(), "alternative".to_owned()]),
                )
                .output(OutputDef::new("SAMPLER")),
            |inputs| {
                let sampler = match inputs.string("version")? {
                    "alternative" => Sampler::EulerPp,
                    _ => Sampler::EulerCfgPp,
                };
                Ok(vec![Value::Sampler(sampler.into())])
            },
        ),
        Pure::new(
            spec("SamplerLMS", "", "model/sampling/samplers")
                .input(
                    InputDef::bare("order", "INT")
                        .option("advanced", true)
                        .option("default", 4)
                        .option("min", 1)
                        .option("max", 100),
                )
                .output(OutputDef::new("SAMPLER")),
            |inputs| {
                let order = count(inputs, "order")?;
                let settings = SamplerSettings { order, ..SamplerSettings::default() };
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::Lms, settings })])
            },
        ),
        Pure::new(
            spec("SamplerER_SDE", "", "model/sampling/samplers")
                .input(InputDef::v3_combo("solver_type", &["ER-SDE", "Reverse-time SDE", "ODE"]))
                .input(
                    InputDef::bare("max_stage", "INT")
                        .option("advanced", true)
                        .option("default", 3)
                        .option("min", 1)
                        .option("max", 3),
                )
                .input(
                    InputDef::bare("eta", "FLOAT")
                        .tooltip(
                            "Stochastic strength of SDEs.\nWhen eta=0, they reduce to deterministic ODE.\n\
                             Large eta may cause invalid outputs. If this occurs, try decreasing this value.",
                        )
                        .option("advanced", true)
                        .option("default", 1.0)
                        .option("min", 0.0)
                        .option("max", 10.0)
                        .option("step", 0.01)
                        .option("round", false),
                )
                .input(unrounded("s_noise", 1.0, 100.0, true))
                .output(OutputDef::new("SAMPLER")),
            |inputs| {
                let solver = inputs.string("solver_type")?;
                let settings = SamplerSettings::er_sde(
                    solver,
                    count(inputs, "max_stage")?,
                    inputs.float("eta")? as f32,
                    inputs.float("s_noise")? as f32,
                )
                .ok_or_else(|| {
                    NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!("solver_type `{solver}` is not one of ER-SDE, Reverse-time SDE, ODE"),
                    )
                })?;
                Ok(vec![Value::Sampler(SamplerChoice { sampler: Sampler::ErSde, settings })])
            },
        ),
        Pure::new(
            spec("BasicGuider", "Basic Guider", "model/sampling/guiders")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::typed("conditioning", "CONDITIONING"))
                .output(OutputDef::new("GUIDER")),
            |inputs| {
                Ok(vec![Value::Guider(Arc::new(Guider {
                    model: inputs.model("model")?.clone(),
                    positive: inputs.conditioning("conditioning")?.clone(),
                    negative: None,
                    cfg: 1.0,
                    dual: None,
                    perp_neg: None,
                }))])
            },
        ),
        Pure::new(
            spec("CFGGuider", "CFG Guider", "model/sampling/guiders")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::typed("positive", "CONDITIONING"))
                .input(InputDef::typed("negative", "CONDITIONING"))
                .input(cfg("cfg"))
                .output(OutputDef::new("GUIDER")),
            |inputs| guider(inputs, ("positive", "cfg"), None, None),
        ),
        Pure::new(
            spec("DualCFGGuider", "Dual CFG Guider", "model/sampling/guiders")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::typed("cond1", "CONDITIONING"))
                .input(InputDef::typed("cond2", "CONDITIONING"))
                .input(InputDef::typed("negative", "CONDITIONING"))
                .input(cfg("cfg_conds"))
                .input(cfg("cfg_cond2_negative"))
                .input(InputDef::v3_combo("style", &["regular", "nested"]))
                .output(OutputDef::new("GUIDER"))
                .aliases(&["dual prompt guidance"]),
            |inputs| {
                let dual = DualCfg {
                    middle: inputs.conditioning("cond2")?.clone(),
                    cfg_middle: inputs.float("cfg_cond2_negative")?,
                    nested: inputs.string("style")? == "nested",
                };
                guider(inputs, ("cond1", "cfg_conds"), Some(dual), None)
            },
        ),
        Pure::new(
            NodeSpec::new("PerpNegGuider", "Perp-Neg Guider", "experimental")
                .python_module("comfy_extras.nodes_perpneg")
                .v3()
                .experimental()
                .input(InputDef::typed("model", "MODEL").with_options())
                .input(InputDef::typed("positive", "CONDITIONING").with_options())
                .input(InputDef::typed("negative", "CONDITIONING").with_options())
                .input(InputDef::typed("empty_conditioning", "CONDITIONING").with_options())
                .input(cfg("cfg"))
                .input(
                    InputDef::bare("neg_scale", "FLOAT")
                        .option("advanced", true)
                        .option("default", 1.0)
                        .option("min", 0.0)
                        .option("max", 100.0)
                        .option("step", 0.01),
                )
                .output(OutputDef::new("GUIDER")),
            |inputs| {
                let perp_neg = PerpNeg {
                    empty: inputs.conditioning("empty_conditioning")?.clone(),
                    neg_scale: inputs.float("neg_scale")?,
                };
                guider(inputs, ("positive", "cfg"), None, Some(perp_neg))
            },
        ),
        Pure::new(
            spec("DisableNoise", "", "model/sampling/noise")
                .output(OutputDef::new("NOISE"))
                .aliases(&["zero noise"]),
            |_| Ok(vec![Value::Noise(Noise::Disabled(0))]),
        ),
        Pure::new(
            spec("RandomNoise", "", "model/sampling/noise")
                .input(noise_seed())
                .output(OutputDef::new("NOISE")),
            // The seed widget spans 0..2^64 (carried as its bits).
            |inputs| Ok(vec![Value::Noise(Noise::Random(inputs.int("noise_seed")? as u64))]),
        ),
        Pure::new(
            spec("AddNoise", "", "model/sampling/noise")
                .experimental()
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::typed("noise", "NOISE"))
                .input(InputDef::typed("sigmas", "SIGMAS"))
                .input(InputDef::typed("latent_image", "LATENT"))
                .output(OutputDef::new("LATENT")),
            add_noise,
        ),
        Pure::new(
            spec("ManualSigmas", "", "model/sampling/sigmas")
                .experimental()
                .input(InputDef::string("sigmas", "1, 0.5").option("multiline", false))
                .output(OutputDef::new("SIGMAS"))
                .aliases(&["custom noise schedule", "define sigmas"]),
            |inputs| Ok(vec![sigmas(manual_sigmas(inputs.string("sigmas")?)?)]),
        ),
        Pure::new(
            NodeSpec::new("OptimalStepsScheduler", "", "model/sampling/schedulers")
                .python_module("comfy_extras.nodes_optimalsteps")
                .v3()
                .input(InputDef::v3_combo(
                    "model_type",
                    &sampling::OPTIMAL_STEPS.map(|(name, _)| name),
                ))
                .input(InputDef::int("steps", 20, 3, 1000))
                .input(unit_float("denoise", 1.0))
                .output(OutputDef::new("SIGMAS")),
            |inputs| {
                let family = inputs.string("model_type")?;
                let values =
                    sampling::optimal_steps_sigmas(family, steps_of(inputs)?, inputs.float("denoise")?)
                        .ok_or_else(|| {
                            NodeError::of_kind(
                                ErrorKind::InvalidValue,
                                format!("OptimalStepsScheduler has no noise levels for '{family}'"),
                            )
                        })?;
                Ok(vec![sigmas(values)])
            },
        ),
    ]
}

/// `AddNoise`: the latent noised as a sampler would start from it, at the span of `sigmas` (|σ₀ − σ_last|, or σ₀
/// alone), and taken back to the VAE's space: a latent with content is moved into the model's space first (an
/// empty one stays zeros); values that are not finite become 0. No sigmas: the latent as it is.
fn add_noise(inputs: &Inputs) -> Result<Vec<Value>, NodeError> {
    let latent = inputs.latent("latent_image")?;
    let sigmas = inputs.sigmas("sigmas")?;
    let (Some(&first), Some(&last)) = (sigmas.first(), sigmas.last()) else {
        return Ok(vec![Value::Latent(latent.clone())]);
    };
    let model = inputs.model("model")?;
    let shape = latent.samples.shape();
    let noise = starting_noise(inputs.noise("noise")?, shape, latent.batch_index.as_deref())?;
    let scale = if sigmas.len() > 1 { (first - last).abs() } else { first };
    let start = latent_in_model_space(&model.latent, &latent.samples);
    let noisy = model.sampling.noise_at(scale, &noise, &start);
    let out: Vec<f32> = model
        .latent
        .process_out(&noisy, shape)
        .into_iter()
        .map(|v| if v.is_finite() { v } else { 0.0 })
        .collect();
    let samples = crate::tensor::Tensor::new(shape.to_vec(), out)
        .map_err(|e| NodeError::new(e.to_string()))?;
    Ok(vec![Value::Latent(latent.with_samples(samples))])
}

/// `SplitSigmasDenoise`: the last round(steps·denoise) steps as the low part, the rest as the high part,
/// sharing the sigma where they meet (Python's slices `[:-n]` and `[-(n + 1):]`, `[:-0]` being empty).
fn split_denoise(all: &[f32], denoise: f64) -> (Vec<f32>, Vec<f32>) {
    let steps = all.len().saturating_sub(1);
    let low_steps = (steps as f64 * denoise).round_ties_even() as usize;
    let high = if low_steps == 0 { Vec::new() } else { all[..all.len() - low_steps].to_vec() };
    let low = all[all.len() - (low_steps + 1).min(all.len())..].to_vec();
    (high, low)
}

/// The numbers in `text` as ComfyUI's `ManualSigmas` finds them: every match of `[-+]?(?:\d*\.*\d+)`, each read
/// as a Python float.
fn manual_sigmas(text: &str) -> Result<Vec<f32>, NodeError> {
    let bytes = text.as_bytes();
    let digits = |from: usize| bytes[from..].iter().take_while(|b| b.is_ascii_digit()).count();
    let mut values = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let signed = matches!(bytes[i], b'-' | b'+');
        let body = i + usize::from(signed);
        let lead = digits(body);
        let dots = bytes[body + lead..].iter().take_while(|&&b| b == b'.').count();
        let tail = digits(body + lead + dots);
        let end = if dots > 0 && tail > 0 {
            Some(body + lead + dots + tail)
        } else if lead > 0 {
            Some(body + lead)
        } else {
            None
        };
        let Some(end) = end else {
            i += 1;
            continue;
        };
        let number = &text[i..end];
        let value: f64 = number.parse().map_err(|_| {
            NodeError::of_kind(
                ErrorKind::InvalidValue,
                format!("could not convert string to float: '{number}'"),
            )
        })?;
        values.push(value as f32);
        i = end;
    }
    Ok(values)
}

/// The LATENT outputs of a custom sampler, each a copy of the input latent: the result, and the last x̂₀ (the
/// result again when no step ran).
fn outputs(input: &Latent, sampled: Sampled) -> NodeResult {
    let denoised = sampled.denoised.unwrap_or_else(|| sampled.samples.clone());
    NodeResult::values([
        Value::Latent(super::sampler::sampled_latent(input, sampled.samples)),
        Value::Latent(super::sampler::sampled_latent(input, denoised)),
    ])
}

/// `SamplerCustom`: a model, CFG and conditioning, with a sampler and sigmas from other nodes.
pub(super) struct SamplerCustom {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl SamplerCustom {
    pub(super) fn new(compute: Arc<Compute>) -> SamplerCustom {
        let spec = spec("SamplerCustom", "", "model/sampling/custom")
            .input(InputDef::typed("model", "MODEL"))
            .input(
                InputDef::bare("add_noise", "BOOLEAN")
                    .option("advanced", true)
                    .option("default", true),
            )
            .input(noise_seed())
            .input(cfg("cfg"))
            .input(InputDef::typed("positive", "CONDITIONING"))
            .input(InputDef::typed("negative", "CONDITIONING"))
            .input(InputDef::typed("sampler", "SAMPLER"))
            .input(InputDef::typed("sigmas", "SIGMAS"))
            .input(InputDef::typed("latent_image", "LATENT"))
            .output(OutputDef::new("LATENT").named("output"))
            .output(OutputDef::new("LATENT").named("denoised_output"));
        SamplerCustom { spec: Arc::new(spec), compute }
    }
}

impl Node for SamplerCustom {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let seed = inputs.int("noise_seed")? as u64;
        let noise =
            if inputs.bool("add_noise")? { Noise::Random(seed) } else { Noise::Disabled(seed) };
        let job = Sampling {
            model: inputs.model("model")?,
            positive: inputs.conditioning("positive")?,
            negative: Some(inputs.conditioning("negative")?),
            cfg: inputs.float("cfg")?,
            dual: None,
            perp_neg: None,
            sampler: inputs.sampler("sampler")?,
            sigmas: inputs.sigmas("sigmas")?,
            noise,
            latent: inputs.latent("latent_image")?,
        };
        let input = job.latent;
        Ok(outputs(input, sample(&self.compute, job, ctx)?))
    }
}

/// `SamplerCustomAdvanced`: noise, guider, sampler and sigmas all from other nodes.
pub(super) struct SamplerCustomAdvanced {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl SamplerCustomAdvanced {
    pub(super) fn new(compute: Arc<Compute>) -> SamplerCustomAdvanced {
        let spec = spec("SamplerCustomAdvanced", "", "model/sampling/custom")
            .input(InputDef::typed("noise", "NOISE"))
            .input(InputDef::typed("guider", "GUIDER"))
            .input(InputDef::typed("sampler", "SAMPLER"))
            .input(InputDef::typed("sigmas", "SIGMAS"))
            .input(InputDef::typed("latent_image", "LATENT"))
            .output(OutputDef::new("LATENT").named("output"))
            .output(OutputDef::new("LATENT").named("denoised_output"));
        SamplerCustomAdvanced { spec: Arc::new(spec), compute }
    }
}

impl Node for SamplerCustomAdvanced {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let guider = inputs.guider("guider")?;
        let job = Sampling {
            model: &guider.model,
            positive: &guider.positive,
            negative: guider.negative.as_deref(),
            cfg: guider.cfg,
            dual: guider.dual.as_ref(),
            perp_neg: guider.perp_neg.as_ref(),
            sampler: inputs.sampler("sampler")?,
            sigmas: inputs.sigmas("sigmas")?,
            noise: inputs.noise("noise")?,
            latent: inputs.latent("latent_image")?,
        };
        let input = job.latent;
        Ok(outputs(input, sample(&self.compute, job, ctx)?))
    }
}

/// `ModelSamplingSD3`: the model with another flow shift and SD3's timestep multiplier (1000).
pub(super) struct ModelSamplingSd3(Arc<NodeSpec>);

impl ModelSamplingSd3 {
    pub(super) fn new() -> ModelSamplingSd3 {
        ModelSamplingSd3(Arc::new(
            NodeSpec::new("ModelSamplingSD3", "ModelSamplingSD3", "model/patch/stable diffusion")
                .python_module("comfy_extras.nodes_model_advanced")
                .input(InputDef::typed("model", "MODEL"))
                .input(InputDef::float("shift", 3.0, 0.0, 100.0).option("step", 0.01))
                .output(OutputDef::new("MODEL")),
        ))
    }
}

impl Node for ModelSamplingSd3 {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let patched = model.with_sampling(FlowSampling::new(inputs.float("shift")?, 1000.0));
        Ok(NodeResult::values([Value::Model(Arc::new(patched))]))
    }
}

/// `ModelSamplingFlux`: the model with Flux's exponential time shift, μ interpolated linearly in the image's
/// token count from `base_shift` at 256 tokens to `max_shift` at 4096.
pub(super) struct ModelSamplingFlux(Arc<NodeSpec>);

impl ModelSamplingFlux {
    pub(super) fn new() -> ModelSamplingFlux {
        let shift = |name: &str, default: f64| {
            InputDef::float(name, default, 0.0, 100.0).option("step", 0.01).option("advanced", true)
        };
        let side = |name: &str| InputDef::int(name, 1024, 16, 16384).option("step", 8);
        ModelSamplingFlux(Arc::new(
            NodeSpec::new("ModelSamplingFlux", "ModelSamplingFlux", "model/patch/flux")
                .python_module("comfy_extras.nodes_model_advanced")
                .input(InputDef::typed("model", "MODEL"))
                .input(shift("max_shift", 1.15))
                .input(shift("base_shift", 0.5))
                .input(side("width"))
                .input(side("height"))
                .output(OutputDef::new("MODEL")),
        ))
    }
}

/// ComfyUI's μ for an image of `width` × `height` (Python floats): linear in its 2×2 patches of 8× latents.
fn flux_shift(max_shift: f64, base_shift: f64, width: i64, height: i64) -> f64 {
    let (x1, x2) = (256.0, 4096.0);
    let mm = (max_shift - base_shift) / (x2 - x1);
    let b = base_shift - mm * x1;
    (width * height) as f64 / (8.0 * 8.0 * 2.0 * 2.0) * mm + b
}

impl Node for ModelSamplingFlux {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let model = inputs.model("model")?;
        let shift = flux_shift(
            inputs.float("max_shift")?,
            inputs.float("base_shift")?,
            inputs.int("width")?,
            inputs.int("height")?,
        );
        let patched = model.with_sampling(FlowSampling::flux(shift));
        Ok(NodeResult::values([Value::Model(Arc::new(patched))]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ComfyUI's PerpNegGuider on the tiny Wan model through SamplerCustomAdvanced
    /// (`scripts/reference/perp_neg.py`): both scales, the negative skipped at `neg_scale` 0, the empty prompt too
    /// at cfg 1, and with TCFG before and Mahiro after the combination.
    #[test]
    fn perp_neg_guider_samples_as_comfyuis() {
        use kiln_models::sampling::guidance::{PostCfg, PreCfg};
        let io = crate::fixtures::tensors("perp_neg/io.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-perp-neg-{}", std::process::id()));
        let (env, model) = crate::fixtures::tiny_wan_t2v_model(&dir);
        let prompt = |name: &str| {
            let entries = vec![crate::models::Cond::new(io[name].clone(), None)];
            Value::Conditioning(Arc::new(crate::models::Conditioning { entries }))
        };
        let mut hooked = model.clone();
        hooked.guidance.pre_cfg.push(PreCfg::TangentialDamping);
        hooked.guidance.post_cfg.push(PostCfg::Mahiro);
        let guider_node =
            builders().into_iter().find(|n| n.spec().name == "PerpNegGuider").expect("the node");
        let sampler_node = SamplerCustomAdvanced::new(env.compute.clone());
        for (case, model, cfg, neg_scale) in [
            ("plain", &model, 4.0, 1.0),
            ("no_negative", &model, 4.0, 0.0),
            ("alone", &model, 1.0, 0.0),
            ("hooks", &hooked, 4.0, 1.5),
        ] {
            let guider = crate::fixtures::node_outputs(
                &guider_node,
                vec![
                    ("model", Value::Model(Arc::new(model.clone()))),
                    ("positive", prompt("positive")),
                    ("negative", prompt("negative")),
                    ("empty_conditioning", prompt("empty")),
                    ("cfg", Value::Float(cfg)),
                    ("neg_scale", Value::Float(neg_scale)),
                ],
            )
            .expect("a guider");
            let zeros = crate::tensor::Tensor::full(io["noise"].shape().to_vec(), 0.0);
            let inputs = vec![
                ("noise", Value::Noise(Noise::Random(11))),
                ("guider", guider[0].clone()),
                ("sampler", Value::Sampler(kiln_models::sampling::Sampler::Euler.into())),
                ("sigmas", Value::Sigmas(io["sigmas"].data().to_vec().into())),
                ("latent_image", Value::Latent(Latent::new(zeros))),
            ];
            let out = crate::fixtures::node_outputs(&sampler_node, inputs).expect("samples");
            let Value::Latent(got) = &out[0] else { panic!("a latent") };
            let want = &io[&format!("out.{case}")];
            crate::fixtures::assert_relative(case, got.samples.data(), want.data(), 1e-4);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    /// ComfyUI's AddNoise on a Wan 2.1 model's sampling and latent format (`scripts/reference/add_noise.py`):
    /// noise for samples 3 and 7 of a batch, scaled by the span of all, the last two or the first sigma; an
    /// empty latent kept at zeros before the noise; no noise at all.
    #[test]
    fn add_noise_noises_the_latent_as_comfyui() {
        let io = crate::fixtures::tensors("add_noise/io.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-add-noise-{}", std::process::id()));
        let (_, model) = crate::fixtures::tiny_wan_t2v_model(&dir);
        let model = Value::Model(std::sync::Arc::new(model));
        let sigmas = io["sigmas"].data().to_vec();
        let indexed = |t: &crate::tensor::Tensor| {
            Value::Latent(Latent { batch_index: Some(vec![3, 7]), ..Latent::new(t.clone()) })
        };
        let zeros = crate::tensor::Tensor::full(io["latent"].shape().to_vec(), 0.0);
        for (case, noise, sigmas, latent) in [
            ("span", Noise::Random(11), &sigmas[..], &io["latent"]),
            ("tail", Noise::Random(11), &sigmas[3..], &io["latent"]),
            ("one", Noise::Random(11), &sigmas[..1], &io["latent"]),
            ("empty", Noise::Random(11), &sigmas[..], &zeros),
            ("disabled", Noise::Disabled(0), &sigmas[..], &io["latent"]),
        ] {
            let inputs = vec![
                ("model", model.clone()),
                ("noise", Value::Noise(noise)),
                ("sigmas", Value::Sigmas(sigmas.to_vec().into())),
                ("latent_image", indexed(latent)),
            ];
            let node =
                builders().into_iter().find(|n| n.spec().name == "AddNoise").expect("AddNoise");
            let out = crate::fixtures::node_outputs(&node, inputs).expect("runs");
            let Value::Latent(got) = &out[0] else { panic!("a latent") };
            let want = &io[&format!("out.{case}")];
            crate::fixtures::assert_relative(case, got.samples.data(), want.data(), 1e-5);
            assert_eq!(
                got.batch_index,
                Some(vec![3, 7]),
                "{case}: the rest of the latent rides on"
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn flux_shift_is_base_at_256_tokens_and_max_at_4096() {
        assert!((flux_shift(1.15, 0.5, 256, 256) - 0.5).abs() < 1e-12);
        assert!((flux_shift(1.15, 0.5, 1024, 1024) - 1.15).abs() < 1e-12);
    }

    #[test]
    fn manual_sigmas_reads_numbers_as_comfyuis_pattern_finds_them() {
        assert_eq!(manual_sigmas("1, 0.5").unwrap(), vec![1.0, 0.5]);
        assert_eq!(manual_sigmas("[0.9,.3 -2 +4.]").unwrap(), vec![0.9, 0.3, -2.0, 4.0]);
        assert_eq!(manual_sigmas("1e-3").unwrap(), vec![1.0, -3.0]);
        assert_eq!(manual_sigmas("no numbers").unwrap(), Vec::<f32>::new());
        let error = manual_sigmas("1..5").unwrap_err();
        assert!(error.to_string().contains("'1..5'"), "{error}");
    }

    #[test]
    fn split_sigmas_denoise_keeps_the_last_steps_as_comfyui_slices() {
        let all = [1.0, 0.75, 0.5, 0.25, 0.0];
        assert_eq!(split_denoise(&all, 0.5), (vec![1.0, 0.75, 0.5], vec![0.5, 0.25, 0.0]));
        assert_eq!(split_denoise(&all, 1.0), (vec![1.0], all.to_vec()));
        // round(4 · 0.1) = 0: `[:-0]` is empty in Python, the low part the last sigma alone.
        assert_eq!(split_denoise(&all, 0.1), (vec![], vec![0.0]));
    }
}
