//! ER-SDE-Solver-3 (`er_sde`), as `comfy/k_diffusion/sampling.py` runs it for a flow model: up to three stages
//! in λ = σ/α with the default noise scaler λ·(e^(λ^0.3) + 10), whose integrals are 200-point sums, and fresh
//! noise each step. A first sigma of 1 is moved to `percent_to_sigma(1e-4)` first, as ComfyUI does.

use super::FlowSampling;
use super::samplers::{ErSdeScaler, Run, SamplerSettings};
use crate::Result;
use crate::noise::TorchGenerator;

/// The integrals' points.
const POINTS: usize = 200;

impl ErSdeScaler {
    /// ψ(λ) in f32 (`SamplerER_SDE`'s scalers; ComfyUI's default is ER-SDE's at η 1, where `** 1` is exact).
    fn scale(self, x: f32) -> f32 {
        match self {
            ErSdeScaler::ErSde { eta } => x * (x.powf(0.3).exp() + 10.0).powf(eta),
            ErSdeScaler::ReverseTime { eta } => x.powf(eta + 1.0),
            ErSdeScaler::Ode => x,
        }
    }
}

/// `sample_er_sde` with the settings' noise scaler, `max_stage` and `s_noise` (no noise at 0).
pub(super) fn er_sde(
    run: &mut Run<'_>,
    ms: &FlowSampling,
    mut x: Vec<f32>,
    sigmas: &[f32],
    settings: &SamplerSettings,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let noise_scaler = |v: f32| settings.er_sde_scaler.scale(v);
    let sigmas = ms.offset_first_sigma(sigmas);
    // λ = exp(−(−logit σ)) = σ/(1 − σ), as torch computes it.
    let lambdas: Vec<f32> = sigmas.iter().map(|&s| (-(-(s / (1.0 - s)).ln())).exp()).collect();
    let mut old: Option<Vec<f32>> = None;
    let mut old_d: Option<Vec<f32>> = None;
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let stage = (i + 1).min(settings.max_stage);
        if next == 0.0 {
            x = denoised.clone();
        } else {
            let (lambda_s, lambda_t) = (lambdas[i], lambdas[i + 1]);
            let alpha_s = sigma / lambda_s;
            let alpha_t = next / lambda_t;
            let r_alpha = alpha_t / alpha_s;
            let r = noise_scaler(lambda_t) / noise_scaler(lambda_s);
            let (a, b) = (r_alpha * r, alpha_t * (1.0 - r));
            x = x.iter().zip(&denoised).map(|(x, d)| a * x + b * d).collect();
            if stage >= 2
                && let Some(prev) = &old
            {
                let dt = lambda_t - lambda_s;
                let step = -dt / POINTS as f32;
                let positions: Vec<f32> = (0..POINTS).map(|k| lambda_t + k as f32 * step).collect();
                let scaled: Vec<f32> = positions.iter().map(|&p| noise_scaler(p)).collect();
                let s = scaled.iter().map(|v| 1.0 / v).sum::<f32>() * step;
                let gap = lambda_s - lambdas[i - 1];
                let d: Vec<f32> = denoised.iter().zip(prev).map(|(d, o)| (d - o) / gap).collect();
                let c = alpha_t * (dt + s * noise_scaler(lambda_t));
                x.iter_mut().zip(&d).for_each(|(x, d)| *x += c * d);
                if stage >= 3
                    && let Some(prev_d) = &old_d
                {
                    let s_u =
                        positions.iter().zip(&scaled).map(|(p, v)| (p - lambda_s) / v).sum::<f32>()
                            * step;
                    let gap = (lambda_s - lambdas[i - 2]) / 2.0;
                    let c = alpha_t * (dt.powf(2.0) / 2.0 + s_u * noise_scaler(lambda_t));
                    for ((x, d), o) in x.iter_mut().zip(&d).zip(prev_d) {
                        *x += c * ((d - o) / gap);
                    }
                }
                old_d = Some(d);
            }
            if settings.s_noise > 0.0 {
                let coeff = (lambda_t.powf(2.0) - lambda_s.powf(2.0) * r.powf(2.0)).sqrt();
                let coeff = if coeff.is_nan() { 0.0 } else { coeff };
                let n = noise.randn(x.len());
                let s_noise = settings.s_noise;
                x.iter_mut().zip(n).for_each(|(x, n)| *x += alpha_t * n * s_noise * coeff);
            }
        }
        old = Some(denoised);
    }
    Ok(x)
}
