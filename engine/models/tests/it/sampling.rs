//! The flow sigma table, the schedulers and the samplers against `scripts/reference/sampling.py`'s values
//! (k-diffusion for karras/exponential and euler/heun/dpmpp_2m, diffusers for flow euler, torch f32 formulas
//! elsewhere), with the toy denoiser x̂₀ = 0.8·x + 0.3·σ.

use kiln_models::Result;
use kiln_models::sampling::{
    Denoiser, FlowSampling, ModelSampling, Sampler, Scheduler, Step, denoise_sigmas,
    exponential_sigmas, extend_intermediate_sigmas, karras_sigmas, laplace_sigmas,
    optimal_steps_sigmas, polyexponential_sigmas, sample, turbo_sigmas, vp_sigmas,
};

use crate::common::{assert_close, fixture, read_tensors};

const FIXTURE: &str = "sampling/sampling.safetensors";

fn cases() -> serde_json::Value {
    let path = fixture("sampling/cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("cases.json")
}

/// The reference script's toy model.
struct Toy {
    calls: usize,
}

impl Denoiser for Toy {
    fn denoise(&mut self, x: &[f32], sigma: f32) -> Result<Vec<f32>> {
        self.calls += 1;
        Ok(x.iter().map(|v| 0.8 * v + 0.3 * sigma).collect())
    }

    fn denoise_cfg_pp(&mut self, _: &[f32], _: f32) -> Result<(Vec<f32>, Vec<f32>)> {
        Err(kiln_models::Error::Invalid("this toy has no unconditional side".into()))
    }
}

#[test]
fn sigma_tables_match() {
    let t = read_tensors(FIXTURE);
    for (key, ms) in [
        ("table/3.0", FlowSampling::new(3.0, 1.0)),
        ("table/1.0", FlowSampling::new(1.0, 1.0)),
        ("table/2.5", FlowSampling::new(2.5, 1.0)),
        ("table/3.0_m1000", FlowSampling::new(3.0, 1000.0)),
    ] {
        assert_eq!(ms.sigmas(), &t[key].1[..], "{key}");
    }
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    assert_eq!(ms.sigma_max(), 1.0);
    assert!((ms.sigma_min() - 0.002_994).abs() < 1e-6);
}

#[test]
fn simple_at_8_steps_shift_3_is_the_documented_list() {
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    let want = [1.0, 0.954_545_4, 0.9, 0.833_333_3, 0.75, 0.642_857_1, 0.5, 0.3, 0.0];
    let got = Scheduler::Simple.sigmas(&ms, 8);
    assert_eq!(got.len(), 9);
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?}");
    }
}

#[test]
fn schedulers_match() {
    let t = read_tensors(FIXTURE);
    let mut inexact = Vec::new();
    for case in cases()["schedules"].as_array().expect("schedules") {
        let key = case["key"].as_str().expect("key");
        let scheduler =
            Scheduler::from_name(case["name"].as_str().expect("name")).expect("scheduler");
        let ms = ModelSampling::from(FlowSampling::new(
            case["shift"].as_f64().expect("shift"),
            case["multiplier"].as_f64().expect("multiplier"),
        ));
        let steps = case["steps"].as_u64().expect("steps") as usize;
        let got = scheduler.sigmas(&ms, steps);
        let want = &t[key].1;
        assert_close(key, &got, want, 1e-6);
        if got != *want {
            inexact.push(key.to_string());
        }
    }
    // Bit-exact except where torch's exp/pow (karras, exponential) rounds an ulp differently from the C library.
    for key in &inexact {
        assert!(key.contains("karras") || key.contains("exponential"), "{key} is not bit-exact");
    }
}

#[test]
fn the_scheduler_nodes_match_k_diffusion_and_comfyui() {
    let t = read_tensors(FIXTURE);
    let mut inexact = Vec::new();
    for case in cases()["node_schedules"].as_array().expect("node schedules") {
        let key = case["key"].as_str().expect("key");
        let steps = case["steps"].as_u64().expect("steps") as usize;
        let f = |name: &str| case[name].as_f64().unwrap_or_else(|| panic!("{key}: {name}"));
        let got = match case["name"].as_str().expect("name") {
            "karras" => karras_sigmas(steps, f("sigma_min"), f("sigma_max"), f("rho")),
            "exponential" => exponential_sigmas(steps, f("sigma_min"), f("sigma_max")),
            "polyexponential" => {
                polyexponential_sigmas(steps, f("sigma_min"), f("sigma_max"), f("rho"))
            }
            "sd_turbo" => turbo_sigmas(
                &FlowSampling::new(f("shift"), f("multiplier")).into(),
                steps,
                f("denoise"),
            ),
            other => panic!("{key}: unknown schedule {other}"),
        };
        let want = &t[key].1;
        assert_close(key, &got, want, 1e-6);
        if got != *want {
            inexact.push(key.to_string());
        }
    }
    // Bit-exact but where torch's exp/pow rounds an ulp differently from the C library.
    for key in &inexact {
        assert!(!key.contains("sd_turbo"), "{key} is not bit-exact");
    }
}

/// ComfyUI's own schedule nodes that need no model, and `SamplingPercentToSigma` on a flow model's sampling
/// (`scripts/reference/comfy_schedules.py`).
#[test]
fn laplace_vp_optimal_steps_and_extended_schedules_match_comfyuis_nodes() {
    let t = read_tensors("comfy_sampling/schedules.safetensors");
    let path = fixture("comfy_sampling/schedules.json");
    let cases: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schedules.json"))
            .expect("JSON");
    for case in cases["schedules"].as_array().expect("schedules") {
        let key = case["key"].as_str().expect("key");
        let f = |name: &str| case[name].as_f64().unwrap_or_else(|| panic!("{key}: {name}"));
        let steps = f("steps") as usize;
        let got = match case["node"].as_str().expect("node") {
            "LaplaceScheduler" => {
                laplace_sigmas(steps, f("sigma_min"), f("sigma_max"), f("mu"), f("beta"))
            }
            "VPScheduler" => vp_sigmas(steps, f("beta_d"), f("beta_min"), f("eps_s")),
            "OptimalStepsScheduler" => {
                let family = case["model_type"].as_str().expect("model_type");
                optimal_steps_sigmas(family, steps, f("denoise")).expect("a family with levels")
            }
            "ExtendIntermediateSigmas" => {
                let spacing = case["spacing"].as_str().expect("spacing");
                let (start, end) = (f("start_at_sigma"), f("end_at_sigma"));
                extend_intermediate_sigmas(&t["extend.base"].1, steps, start, end, spacing)
                    .expect("a spacing")
            }
            other => panic!("{key}: unknown node {other}"),
        };
        let want = &t[key].1;
        assert_eq!(got.len(), want.len(), "{key}: {got:?} vs {want:?}");
        // torch's exp, log and trigonometry may round an ulp differently from the C library's.
        assert_close(key, &got, want, 1e-6);
    }
    assert_eq!(optimal_steps_sigmas("SDXL", 20, 1.0), None);
    assert_eq!(extend_intermediate_sigmas(&[1.0, 0.0], 2, -1.0, 0.0, "cubic"), None);
    for case in cases["percent_to_sigma"].as_array().expect("percent values") {
        let f = |name: &str| case[name].as_f64().expect(name);
        let sampling = ModelSampling::from(FlowSampling::new(f("shift"), 1000.0));
        let percent = f("sampling_percent");
        let got = match (case["return_actual_sigma"].as_bool().expect("flag"), percent) {
            (true, 0.0) => f64::from(sampling.sigma_max()),
            (true, 1.0) => f64::from(sampling.sigma_min()),
            _ => sampling.percent_to_sigma(percent),
        };
        let want = f("sigma");
        assert!((got - want).abs() <= 1e-7 * want.abs().max(1e-3), "{case}: {got}");
    }
}

#[test]
fn denoise_keeps_the_tail_of_a_longer_schedule() {
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    let full = Scheduler::Simple.sigmas(&ms, 16);
    assert_eq!(denoise_sigmas(Scheduler::Simple, &ms, 8, 0.5), full[8..].to_vec());
    assert_eq!(denoise_sigmas(Scheduler::Simple, &ms, 8, 1.0), Scheduler::Simple.sigmas(&ms, 8));
    assert!(denoise_sigmas(Scheduler::Simple, &ms, 8, 0.0).is_empty());
    // int(8 / 0.3) = 26 steps, the last 9 sigmas.
    let s26 = Scheduler::Normal.sigmas(&ms, 26);
    assert_eq!(denoise_sigmas(Scheduler::Normal, &ms, 8, 0.3), s26[18..].to_vec());
}

#[test]
fn samplers_match() {
    let t = read_tensors(FIXTURE);
    let cases = cases();
    let seed = cases["seed"].as_u64().expect("seed");
    let x0 = t["x0"].1.clone();
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    for case in cases["runs"].as_array().expect("runs") {
        let key = case["key"].as_str().expect("key");
        let sampler =
            Sampler::from_name(case["sampler"].as_str().expect("sampler")).expect("sampler");
        let steps = case["steps"].as_u64().expect("steps") as usize;
        let sigmas = Scheduler::Simple.sigmas(&ms, steps);
        let mut toy = Toy { calls: 0 };
        let mut reported = Vec::new();
        let mut on_step = |s: Step<'_>| {
            assert_eq!(s.total, steps);
            reported.push((s.index, s.sigma));
            Ok(())
        };
        let got =
            sample(sampler, &ms, &mut toy, x0.clone(), &mut sigmas.clone(), seed, &mut on_step)
                .expect("sample");
        assert_close(key, &got, &t[key].1, 1e-4);
        assert_eq!(
            reported.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..steps).collect::<Vec<_>>(),
            "{key}"
        );
        let calls = if sampler == Sampler::Heun { 2 * steps - 1 } else { steps };
        assert_eq!(toy.calls, calls, "{key}");
    }
}

#[test]
fn an_error_from_on_step_stops_sampling() {
    let ms = ModelSampling::from(FlowSampling::new(3.0, 1.0));
    let sigmas = Scheduler::Simple.sigmas(&ms, 8);
    let mut toy = Toy { calls: 0 };
    let mut on_step = |s: Step<'_>| {
        if s.index == 2 { Err(kiln_models::Error::Invalid("interrupted".into())) } else { Ok(()) }
    };
    let err =
        sample(Sampler::Euler, &ms, &mut toy, vec![0.5; 32], &mut sigmas.clone(), 0, &mut on_step)
            .expect_err("interrupted");
    assert!(err.to_string().contains("interrupted"));
    assert_eq!(toy.calls, 3);
}

#[test]
fn names_follow_comfyui_order() {
    let names: Vec<_> = Sampler::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "euler",
            "euler_cfg_pp",
            "euler_ancestral",
            "euler_ancestral_cfg_pp",
            "heun",
            "heunpp2",
            "exp_heun_2_x0",
            "exp_heun_2_x0_sde",
            "dpm_2",
            "dpm_2_ancestral",
            "lms",
            "dpm_fast",
            "dpm_adaptive",
            "dpmpp_2s_ancestral",
            "dpmpp_2s_ancestral_cfg_pp",
            "dpmpp_sde",
            "dpmpp_sde_gpu",
            "dpmpp_2m",
            "dpmpp_2m_cfg_pp",
            "dpmpp_2m_sde",
            "dpmpp_2m_sde_gpu",
            "dpmpp_2m_sde_heun",
            "dpmpp_2m_sde_heun_gpu",
            "dpmpp_3m_sde",
            "dpmpp_3m_sde_gpu",
            "ddpm",
            "lcm",
            "ipndm",
            "ipndm_v",
            "deis",
            "res_multistep",
            "res_multistep_cfg_pp",
            "res_multistep_ancestral",
            "res_multistep_ancestral_cfg_pp",
            "gradient_estimation",
            "gradient_estimation_cfg_pp",
            "er_sde",
            "seeds_2",
            "seeds_3",
            "sa_solver",
            "sa_solver_pece",
            "ddim",
            "uni_pc",
            "uni_pc_bh2"
        ]
    );
    let names: Vec<_> = Scheduler::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "simple",
            "sgm_uniform",
            "karras",
            "exponential",
            "ddim_uniform",
            "beta",
            "normal",
            "linear_quadratic",
            "kl_optimal"
        ]
    );
    for s in Sampler::ALL {
        assert_eq!(Sampler::from_name(s.name()), Some(s));
    }
    for s in Scheduler::ALL {
        assert_eq!(Scheduler::from_name(s.name()), Some(s));
    }
    assert_eq!(Sampler::from_name("ar_video"), None);
}

#[test]
fn flow_noise_scaling_round_trips() {
    let ms = FlowSampling::new(3.0, 1.0);
    let noise = [0.5f32, -1.0];
    let latent = [2.0f32, 4.0];
    assert_eq!(ms.noise_scaling(1.0, &noise, &latent), noise.to_vec());
    assert_eq!(
        ms.noise_scaling(0.25, &noise, &latent),
        vec![0.25 * 0.5 + 0.75 * 2.0, -0.25 + 0.75 * 4.0]
    );
    assert_eq!(ms.inverse_noise_scaling(0.0, &latent), latent.to_vec());
    assert_eq!(ms.calculate_denoised(0.5, &latent, &noise), vec![2.0 - 0.25, 4.0 + 0.5]);
    assert_eq!(ms.timestep(0.5), 0.5);
    assert_eq!(ms.percent_to_sigma(0.0), 1.0);
    assert_eq!(ms.percent_to_sigma(1.0), 0.0);
}
