//! Kiln's samplers and schedulers against ComfyUI's own (`scripts/reference/comfy_sampling.py`, which imports
//! ComfyUI at the matched commit): every scheduler of ComfyUI's list Kiln offers gives ComfyUI's sigmas, and
//! every sampler Kiln offers gives ComfyUI's latent through the whole KSAMPLER path (noise scaling, sampler,
//! inverse noise scaling) on a toy guider with CFG 2. Which of ComfyUI's names Kiln lacks is spelled out, so a
//! new one is tested as soon as it is listed.

use kiln_models::Result;
use kiln_models::sampling::{
    AdaptiveSettings, Denoiser, FlowSampling, ModelSampling, SaSolverSettings, Sampler,
    SamplerChoice, SamplerSettings, Scheduler, ksampler_sigmas, sample, sample_with,
};

use crate::common::{assert_close, fixture, read_tensors};

const FIXTURE: &str = "comfy_sampling/comfy_sampling.safetensors";

fn cases() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("comfy_sampling/cases.json")).expect("cases.json");
    serde_json::from_str(&text).expect("JSON")
}

/// The reference's guider: cond x̂₀ = 0.8·x + 0.3·σ, uncond x̂₀ = 0.7·x + 0.1·σ, CFG 2, as torch computes it
/// elementwise in f32.
struct Toy {
    calls: usize,
}

impl Denoiser for Toy {
    fn denoise(&mut self, x: &[f32], sigma: f32) -> Result<Vec<f32>> {
        self.calls += 1;
        Ok(x.iter()
            .map(|&v| {
                let cond = 0.8 * v + 0.3 * sigma;
                let uncond = 0.7 * v + 0.1 * sigma;
                uncond + (cond - uncond) * 2.0
            })
            .collect())
    }

    fn denoise_cfg_pp(&mut self, x: &[f32], sigma: f32) -> Result<(Vec<f32>, Vec<f32>)> {
        let denoised = self.denoise(x, sigma)?;
        Ok((denoised, x.iter().map(|&v| 0.7 * v + 0.1 * sigma).collect()))
    }
}

/// ComfyUI's samplers Kiln does not offer yet.
const NOT_YET: &[&str] = &[];

/// ComfyUI's schedulers Kiln does not offer yet.
const SCHEDULERS_NOT_YET: &[&str] = &[];

/// Samplers whose per-step noise is not ComfyUI's yet.
const NOISE_DIFFERS: &[&str] = &[];

#[test]
fn every_comfyui_sampler_and_scheduler_is_offered_or_listed_as_missing() {
    let cases = cases();
    let names = |key: &str| -> Vec<String> {
        cases[key]
            .as_array()
            .expect(key)
            .iter()
            .map(|v| v.as_str().expect("name").to_owned())
            .collect()
    };
    let offered: Vec<String> =
        names("samplers").into_iter().filter(|n| !NOT_YET.contains(&n.as_str())).collect();
    let kiln: Vec<String> = Sampler::ALL.iter().map(|s| s.name().to_owned()).collect();
    assert_eq!(kiln, offered, "Kiln's samplers are ComfyUI's, in its order, less NOT_YET");
    let offered: Vec<String> = names("schedulers")
        .into_iter()
        .filter(|n| !SCHEDULERS_NOT_YET.contains(&n.as_str()))
        .collect();
    let kiln: Vec<String> = Scheduler::ALL.iter().map(|s| s.name().to_owned()).collect();
    assert_eq!(
        kiln, offered,
        "Kiln's schedulers are ComfyUI's, in its order, less SCHEDULERS_NOT_YET"
    );
}

#[test]
fn schedulers_give_comfyuis_sigmas() {
    let t = read_tensors(FIXTURE);
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    for case in cases()["schedules"].as_array().expect("schedules") {
        let key = case["key"].as_str().expect("key");
        let Some(scheduler) = Scheduler::from_name(case["name"].as_str().expect("name")) else {
            continue;
        };
        let steps = case["steps"].as_u64().expect("steps") as usize;
        let sampling = match case["flux_shift"].as_f64() {
            Some(mu) => FlowSampling::flux(mu).into(),
            None => ms.clone(),
        };
        let got = scheduler.sigmas(&sampling, steps);
        let want = &t[key].1;
        // kl_optimal at one step is NaN in ComfyUI (0/0) and in Kiln: the same places, the rest compared.
        let nan = |v: &[f32]| v.iter().map(|x| x.is_nan()).collect::<Vec<_>>();
        assert_eq!(nan(&got), nan(want), "{key}: NaN places");
        let finite =
            |v: &[f32]| v.iter().map(|&x| if x.is_nan() { 0.0 } else { x }).collect::<Vec<_>>();
        assert_close(key, &finite(&got), &finite(want), 1e-6);
    }
}

#[test]
fn samplers_give_comfyuis_latents() {
    let t = read_tensors(FIXTURE);
    let cases = cases();
    let seed = cases["seed"].as_u64().expect("seed");
    let noise = &t["noise"].1;
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    let mut checked = 0;
    for case in cases["runs"].as_array().expect("runs") {
        let name = case["sampler"].as_str().expect("sampler");
        let Some(sampler) = Sampler::from_name(name) else { continue };
        if NOISE_DIFFERS.contains(&name) {
            continue;
        }
        let key = case["key"].as_str().expect("key");
        let mut sigmas = t[case["sigmas"].as_str().expect("sigmas")].1.clone();
        // KSampler's sigmas for this sampler, as Kiln's KSampler makes them.
        let steps = case["steps"].as_u64().expect("steps") as usize;
        assert_eq!(
            ksampler_sigmas(Scheduler::Simple, sampler, &ms, steps, 1.0),
            sigmas,
            "{key}: sigmas"
        );
        let zeros = vec![0.0; noise.len()];
        let x = ms.noise_scaling(&sigmas, noise, &zeros);
        let mut toy = Toy { calls: 0 };
        let out = sample(sampler, &ms, &mut toy, x, &mut sigmas, seed, &mut |_| Ok(()))
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        // The sigmas as the sampler left them (UniPC's last 0 is 0.001 afterwards, as in ComfyUI).
        assert_eq!(sigmas, t[case["sigmas_after"].as_str().expect("after")].1, "{key}: after");
        let out = ms.inverse_noise_scaling(sigmas[sigmas.len() - 1], &out);
        assert_close(key, &out, &t[key].1, 1e-4);
        assert_eq!(toy.calls as u64, case["model_calls"].as_u64().expect("calls"), "{key}: calls");
        checked += 1;
    }
    assert_eq!(checked, 44 * 4, "every ComfyUI sampler at every step count");
}

#[test]
fn cfg_hooks_combine_predictions_as_comfyuis_patch_nodes_do() {
    use kiln_models::sampling::guidance::{CfgFunction, Guidance, PostCfg, Predictions};
    let t = read_tensors(FIXTURE);
    let cases = cases();
    let shape: Vec<usize> = cases["shape"]
        .as_array()
        .expect("shape")
        .iter()
        .map(|v| v.as_u64().expect("dim") as usize)
        .collect();
    let (x, cond, uncond) = (&t["guidance/x"].1, &t["guidance/cond"].1, &t["guidance/uncond"].1);
    for case in cases["guidance"].as_array().expect("guidance") {
        let key = case["key"].as_str().expect("key");
        let mut guidance = Guidance::default();
        for hook in case["hooks"].as_array().expect("hooks") {
            let value = hook[1].as_f64().unwrap_or(0.0) as f32;
            match hook[0].as_str().expect("kind") {
                "norm" => guidance.post_cfg.push(PostCfg::Norm { strength: value }),
                "zero_star" => guidance.post_cfg.push(PostCfg::ZeroStar),
                "norm_pre" => {
                    guidance.cfg_function = Some(CfgFunction::NormPre { strength: value })
                }
                "rescale" => {
                    guidance.cfg_function = Some(CfgFunction::Rescale { multiplier: value })
                }
                other => panic!("{key}: unknown hook {other}"),
            }
        }
        let skipped = case["uncond_skipped"].as_bool().expect("skipped");
        let got = guidance.combine(Predictions {
            x,
            cond,
            uncond: (!skipped).then_some(uncond.as_slice()),
            cfg: case["cfg"].as_f64().expect("cfg") as f32,
            sigma: case["sigma"].as_f64().expect("sigma") as f32,
            shape: &shape,
        });
        assert_close(key, &got, &t[key].1, 1e-5);
    }
}

/// The Mahiro node's post-CFG hook and TCFG's pre-CFG one (`scripts/reference/comfy_guidance_hooks.py`): two
/// samples (Mahiro's similarity averaged over both, TCFG damping each alone); Mahiro at CFG 1 with the negative
/// skipped and after CFGZeroStar; TCFG once, twice and before Mahiro.
#[test]
fn mahiro_and_tcfg_hooks_combine_as_comfyuis_nodes_do() {
    use kiln_models::sampling::guidance::{Guidance, PostCfg, PreCfg};
    let t = read_tensors("comfy_sampling/guidance_hooks.safetensors");
    let (x, cond, uncond) = (&t["x"].1, &t["cond"].1, &t["uncond"].1);
    let shape = t["x"].0.clone();
    for (key, hooks, damping, cfg, skipped) in [
        ("out.3.5", vec![PostCfg::Mahiro], 0, 3.5, false),
        ("out.1.0", vec![PostCfg::Mahiro], 0, 1.0, true),
        ("out.zero_star.3.5", vec![PostCfg::ZeroStar, PostCfg::Mahiro], 0, 3.5, false),
        ("tcfg.3.5", vec![], 1, 3.5, false),
        ("tcfg.twice.3.5", vec![], 2, 3.5, false),
        ("tcfg.mahiro.3.5", vec![PostCfg::Mahiro], 1, 3.5, false),
    ] {
        let pre_cfg = vec![PreCfg::TangentialDamping; damping];
        let guidance = Guidance { post_cfg: hooks, pre_cfg, ..Guidance::default() };
        let got =
            guided(&guidance, (x, cond, (!skipped).then_some(uncond.as_slice())), cfg, 0.7, &shape);
        assert_close(key, &got, &t[key].1, 1e-5);
    }
}

/// What the sampler does with `guidance` (its pre-CFG hooks, then CFG and the post-CFG hooks) on the
/// predictions `x`, `cond`, `uncond` (`None`: the negative skipped).
fn guided(
    guidance: &kiln_models::sampling::guidance::Guidance,
    (x, cond, uncond): (&[f32], &[f32], Option<&[f32]>),
    cfg: f32,
    sigma: f32,
    shape: &[usize],
) -> Vec<f32> {
    use kiln_models::sampling::guidance::Predictions;
    let before = Predictions { x, cond, uncond, cfg, sigma, shape };
    match guidance.before_cfg(&before, 2).expect("the hooks run") {
        Some((cond, uncond)) => {
            guidance.combine(Predictions { cond: &cond, uncond: uncond.as_deref(), ..before })
        }
        None => guidance.combine(before),
    }
}

/// RenormCFG's CFG function (`scripts/reference/comfy_guidance_hooks.py`'s `renorm.safetensors`): capped, under
/// the cap, without a cap, and above `cfg_trunc` (the conditional prediction alone).
#[test]
fn renorm_cfg_combines_as_comfyuis_node_does() {
    use kiln_models::sampling::guidance::{CfgFunction, Guidance};
    let t = read_tensors("comfy_sampling/renorm.safetensors");
    let (x, cond, uncond) = (&t["x"].1, &t["cond"].1, &t["uncond"].1);
    let shape = t["x"].0.clone();
    for (case, cfg_trunc, renorm_cfg) in [
        ("capped", 100.0, 1.0),
        ("loose", 100.0, 2.5),
        ("off", 100.0, 0.0),
        ("truncated", 0.5, 1.0),
    ] {
        let guidance = Guidance {
            cfg_function: Some(CfgFunction::Renorm { cfg_trunc, renorm_cfg }),
            ..Guidance::default()
        };
        let got = guided(&guidance, (x, cond, Some(uncond.as_slice())), 3.5, 0.7, &shape);
        let key = format!("renorm.{case}");
        assert_close(&key, &got, &t[&key].1, 1e-6);
    }
}

/// The post-CFG hooks of `nodes_eps` (`scripts/reference/comfy_guidance_hooks.py`'s `eps.safetensors`): Epsilon
/// Scaling, and TemporalScoreRescaling on a flow model (σ 1: an SNR of 0, nothing) and on a discrete one.
#[test]
fn epsilon_scaling_and_tsr_combine_as_comfyuis_nodes_do() {
    use kiln_models::sampling::guidance::{Guidance, PostCfg};
    let t = read_tensors("comfy_sampling/eps.safetensors");
    let (x, cond, uncond) = (&t["x"].1, &t["cond"].1, &t["uncond"].1);
    let shape = t["x"].0.clone();
    let with = |hook| Guidance { post_cfg: vec![hook], ..Guidance::default() };
    let cases = [
        ("epsilon.1.005", PostCfg::EpsilonScaling { factor: 1.005 }, 0.7),
        ("epsilon.0.8", PostCfg::EpsilonScaling { factor: 0.8 }, 0.7),
        ("tsr.0.95.1.0.0.7", PostCfg::ScoreRescaling { k: 0.95, variance: 1.0, flow: true }, 0.7),
        ("tsr.2.0.0.5.0.3", PostCfg::ScoreRescaling { k: 2.0, variance: 0.25, flow: true }, 0.3),
        ("tsr.0.95.1.0.1.0", PostCfg::ScoreRescaling { k: 0.95, variance: 1.0, flow: true }, 1.0),
        (
            "tsr_eps.0.9.1.5.2.5",
            PostCfg::ScoreRescaling { k: 0.9, variance: 2.25, flow: false },
            2.5,
        ),
    ];
    for (key, hook, sigma) in cases {
        let got = guided(&with(hook), (x, cond, Some(uncond.as_slice())), 3.5, sigma, &shape);
        assert_close(key, &got, &t[key].1, 1e-5);
    }
    // The node's model was discrete; the run's is a flow (ModelSamplingSD3 after TSR): the run's counts.
    let mut late = with(PostCfg::ScoreRescaling { k: 0.95, variance: 1.0, flow: false });
    late.sampling_is_flow(true);
    let got = guided(&late, (x, cond, Some(uncond.as_slice())), 3.5, 0.7, &shape);
    assert_close("late", &got, &t["tsr.0.95.1.0.0.7"].1, 1e-5);
}

/// The APG node's pre-CFG hook (`scripts/reference/comfy_guidance_hooks.py`'s `apg.safetensors`): per sample of
/// an image latent and per channel of a video one, with and without a norm threshold, with the negative skipped,
/// beside TCFG in both orders, and its running average over a run's steps, started again by a higher sigma.
#[test]
fn apg_hook_guides_as_comfyuis_node_does() {
    use kiln_models::sampling::guidance::{Apg, Guidance, PreCfg};
    let t = read_tensors("comfy_sampling/apg.safetensors");
    let (x, cond, uncond) = (&t["x"].1, &t["cond"].1, &t["uncond"].1);
    let shape = t["x"].0.clone();
    let with = |hooks: Vec<PreCfg>| Guidance { pre_cfg: hooks, ..Guidance::default() };
    let apg = |eta, threshold, momentum| PreCfg::Apg(Apg::new(eta, threshold, momentum));
    let cases = [
        ("apg.default", vec![apg(1.0, 5.0, 0.0)], 3.5, false),
        ("apg.eta", vec![apg(0.3, 0.0, 0.0)], 3.5, false),
        ("apg.skipped", vec![apg(1.0, 5.0, 0.0)], 1.0, true),
        ("apg.tcfg", vec![PreCfg::TangentialDamping, apg(1.0, 5.0, 0.0)], 3.5, false),
        ("apg.then_tcfg", vec![apg(1.0, 5.0, 0.0), PreCfg::TangentialDamping], 3.5, false),
    ];
    for (key, hooks, cfg, skipped) in cases {
        let uncond = (!skipped).then_some(uncond.as_slice());
        let got = guided(&with(hooks), (x, cond, uncond), cfg, 0.7, &shape);
        assert_close(key, &got, &t[key].1, 1e-5);
    }
    let video = |k: &str| &t[&format!("video.{k}")].1;
    let got = guided(
        &with(vec![apg(1.0, 2.0, 0.0)]),
        (video("x"), video("cond"), Some(video("uncond"))),
        3.5,
        0.7,
        &t["video.x"].0,
    );
    assert_close("apg.video", &got, &t["apg.video"].1, 1e-5);
    // One node's hook keeps its average from step to step.
    let momentum = with(vec![apg(1.0, 5.0, 0.5)]);
    for (i, sigma) in [0.9, 0.7, 0.5, 0.95].into_iter().enumerate() {
        let step = |k: &str| &t[&format!("step{i}.{k}")].1;
        let got = guided(&momentum, (x, step("cond"), Some(step("uncond"))), 3.5, sigma, &shape);
        let key = format!("apg.momentum.{i}");
        assert_close(&key, &got, &t[&key].1, 1e-5);
    }
}

#[test]
fn flux2_scheduler_gives_comfyuis_sigmas_bit_for_bit() {
    let path = crate::common::fixture("comfy_sampling/flux2_scheduler.json");
    let text = std::fs::read_to_string(&path).expect("the Flux2Scheduler fixture");
    let cases: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    for case in cases.as_array().expect("cases") {
        let n = |k: &str| case[k].as_u64().expect(k);
        let got: Vec<u32> =
            kiln_models::sampling::flux2_sigmas(n("steps") as usize, n("width"), n("height"))
                .iter()
                .map(|s| s.to_bits())
                .collect();
        let want: Vec<u32> = case["sigma_bits"]
            .as_array()
            .expect("bits")
            .iter()
            .map(|b| b.as_u64().expect("bits") as u32)
            .collect();
        assert_eq!(got, want, "{case}");
    }
}

/// The sampler a parameterised sampler node of the fixture makes, as Kiln's node makes it.
fn node_choice(node: &str, inputs: &serde_json::Value) -> SamplerChoice {
    let f = |k: &str| inputs[k].as_f64().expect(k) as f32;
    let ancestral = |sampler| SamplerChoice {
        sampler,
        settings: SamplerSettings {
            eta: f("eta"),
            s_noise: f("s_noise"),
            ..SamplerSettings::default()
        },
    };
    match node {
        "SamplerEulerAncestral" => ancestral(Sampler::EulerAncestral),
        "SamplerEulerAncestralCFGPP" => ancestral(Sampler::EulerAncestralCfgPp),
        "SamplerLCM" => SamplerChoice {
            sampler: Sampler::Lcm,
            settings: SamplerSettings {
                lcm_noise: Some((
                    inputs["s_noise"].as_f64().expect("s_noise"),
                    inputs["s_noise_end"].as_f64().expect("s_noise_end"),
                )),
                noise_clip_std: f("noise_clip_std"),
                ..SamplerSettings::default()
            },
        },
        "SamplerEulerCFGpp" => match inputs["version"].as_str() {
            Some("alternative") => Sampler::EulerPp.into(),
            _ => Sampler::EulerCfgPp.into(),
        },
        "SamplerDPMPP_2S_Ancestral" => ancestral(Sampler::Dpmpp2sAncestral),
        "SamplerLMS" => SamplerChoice {
            sampler: Sampler::Lms,
            settings: SamplerSettings {
                order: inputs["order"].as_u64().expect("order") as usize,
                ..SamplerSettings::default()
            },
        },
        "SamplerER_SDE" => SamplerChoice {
            sampler: Sampler::ErSde,
            settings: SamplerSettings::er_sde(
                inputs["solver_type"].as_str().expect("type"),
                inputs["max_stage"].as_u64().expect("stage") as usize,
                f("eta"),
                f("s_noise"),
            )
            .expect("a solver type"),
        },
        "SamplerDPMPP_SDE" | "SamplerDPMPP_2M_SDE" | "SamplerDPMPP_3M_SDE" => {
            let cpu = inputs["noise_device"] == "cpu";
            let sampler = match (node, inputs["solver_type"].as_str(), cpu) {
                ("SamplerDPMPP_SDE", _, true) => Sampler::DpmppSde,
                ("SamplerDPMPP_SDE", _, false) => Sampler::DpmppSdeGpu,
                ("SamplerDPMPP_2M_SDE", Some("heun"), true) => Sampler::Dpmpp2mSdeHeun,
                ("SamplerDPMPP_2M_SDE", Some("heun"), false) => Sampler::Dpmpp2mSdeHeunGpu,
                ("SamplerDPMPP_2M_SDE", _, true) => Sampler::Dpmpp2mSde,
                ("SamplerDPMPP_2M_SDE", _, false) => Sampler::Dpmpp2mSdeGpu,
                (_, _, true) => Sampler::Dpmpp3mSde,
                (_, _, false) => Sampler::Dpmpp3mSdeGpu,
            };
            let r = inputs["r"].as_f64().unwrap_or(0.5);
            let settings = SamplerSettings {
                eta: f("eta"),
                s_noise: f("s_noise"),
                r,
                ..SamplerSettings::default()
            };
            SamplerChoice { sampler, settings }
        }
        "SamplerSEEDS2" => SamplerChoice {
            sampler: Sampler::Seeds2,
            settings: SamplerSettings {
                eta: f("eta"),
                s_noise: f("s_noise"),
                r: inputs["r"].as_f64().expect("r"),
                phi_2: inputs["solver_type"] == "phi_2",
                ..SamplerSettings::default()
            },
        },
        "SamplerDPMAdaptative" => {
            let g = |k: &str| inputs[k].as_f64().expect(k);
            let adaptive = AdaptiveSettings {
                order: inputs["order"].as_u64().expect("order") as usize,
                rtol: g("rtol"),
                atol: g("atol"),
                h_init: g("h_init"),
                pid: [g("pcoeff"), g("icoeff"), g("dcoeff")],
                accept_safety: g("accept_safety"),
                eta: f("eta"),
                s_noise: f("s_noise"),
            };
            let settings = SamplerSettings { adaptive, ..SamplerSettings::default() };
            SamplerChoice { sampler: Sampler::DpmAdaptive, settings }
        }
        "SamplerSASolver" => {
            // The node's SDE interval in sigmas, from the toy's model sampling.
            let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
            let g = |k: &str| inputs[k].as_f64().expect(k);
            let n = |k: &str| inputs[k].as_u64().expect(k) as usize;
            let sa_solver = SaSolverSettings {
                eta: g("eta"),
                sde_sigmas: Some((
                    ms.percent_to_sigma(g("sde_start_percent")),
                    ms.percent_to_sigma(g("sde_end_percent")),
                )),
                s_noise: f("s_noise"),
                predictor_order: n("predictor_order"),
                corrector_order: n("corrector_order"),
                use_pece: inputs["use_pece"] == true,
                simple_order_2: inputs["simple_order_2"] == true,
            };
            let settings = SamplerSettings { sa_solver, ..SamplerSettings::default() };
            SamplerChoice { sampler: Sampler::SaSolver, settings }
        }
        other => panic!("no case for {other}"),
    }
}

#[test]
fn sampler_nodes_settings_give_comfyuis_latents() {
    let t = read_tensors("comfy_sampling/sampler_nodes.safetensors");
    let text = std::fs::read_to_string(fixture("comfy_sampling/sampler_nodes.json")).expect("json");
    let seed = cases()["seed"].as_u64().expect("seed");
    let cases: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let noise = &read_tensors(FIXTURE)["noise"].1;
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    let cases = cases.as_array().expect("cases");
    assert!(cases.len() >= 20);
    for case in cases {
        let key = case["key"].as_str().expect("key");
        let choice = node_choice(case["node"].as_str().expect("node"), &case["inputs"]);
        let steps = case["steps"].as_u64().expect("steps") as usize;
        let mut sigmas = Scheduler::Simple.sigmas(&ms, steps);
        let x = ms.noise_scaling(&sigmas, noise, &vec![0.0; noise.len()]);
        let mut toy = Toy { calls: 0 };
        let out = sample_with(choice, &ms, &mut toy, x, &mut sigmas, seed, &mut |_| Ok(()))
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        let out = ms.inverse_noise_scaling(sigmas[sigmas.len() - 1], &out);
        assert_close(key, &out, &t[key].1, 1e-4);
        assert_eq!(toy.calls as u64, case["model_calls"].as_u64().expect("calls"), "{key}: calls");
    }
}

/// The DPM-Solver++ SDE samplers on a discrete-time ε model (`scripts/reference/discrete_sde.py`: ComfyUI's
/// `ModelSamplingDiscrete` at SD's schedule, the same toy guider and seed): λ = −ln σ, no first sigma moved,
/// the Brownian tree over the schedule's sigmas.
#[test]
fn sde_samplers_on_a_discrete_model_give_comfyuis_latents() {
    use kiln_models::sampling::{DiscreteSampling, Prediction};
    let t = read_tensors("comfy_sampling/discrete_sde.safetensors");
    let text = std::fs::read_to_string(fixture("comfy_sampling/discrete_sde.json")).expect("json");
    let cases: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let seed = cases["seed"].as_u64().expect("seed");
    let noise = &t["noise"].1;
    let ms = ModelSampling::from(DiscreteSampling::new(Prediction::Eps));
    let mut checked = 0;
    for case in cases["runs"].as_array().expect("runs") {
        let key = case["key"].as_str().expect("key");
        let sampler = Sampler::from_name(case["sampler"].as_str().expect("sampler")).expect(key);
        assert!(sampler.runs_discrete_models(), "{key}");
        let scheduler =
            Scheduler::from_name(case["scheduler"].as_str().expect("scheduler")).expect(key);
        let steps = case["steps"].as_u64().expect("steps") as usize;
        let mut sigmas = t[&format!("sigmas/{key}")].1.clone();
        assert_close(&format!("{key}: sigmas"), &scheduler.sigmas(&ms, steps), &sigmas, 1e-6);
        let zeros = vec![0.0; noise.len()];
        let x = ms.noise_scaling(&sigmas, noise, &zeros);
        let mut toy = Toy { calls: 0 };
        let out = sample(sampler, &ms, &mut toy, x, &mut sigmas, seed, &mut |_| Ok(()))
            .unwrap_or_else(|e| panic!("{key}: {e}"));
        let out = ms.inverse_noise_scaling(sigmas[sigmas.len() - 1], &out);
        assert_close(key, &out, &t[&format!("run/{key}")].1, 1e-4);
        assert_eq!(toy.calls as u64, case["model_calls"].as_u64().expect("calls"), "{key}: calls");
        checked += 1;
    }
    assert_eq!(checked, 8 * 2 * 4);
}
