//! SEEDS-2 (`seeds_2`), SEEDS-3 (`seeds_3`) and the exponential Heun samplers built on SEEDS-2 (`exp_heun_2_x0`,
//! `exp_heun_2_x0_sde`), as
//! `comfy/k_diffusion/sampling.py` runs them for a flow model: two model calls a step in the half-log-SNR
//! λ = ln((1 − σ)/σ), the first at λ interpolated by `r`, with stochastic noise injected in two segments when
//! η > 0. A first sigma of 1 (λ = −∞) is moved to `percent_to_sigma(1e-4)` first, as ComfyUI does.

use super::FlowSampling;
use super::flow::{half_log_snr as lambda_of, sigma_of_half_log_snr as sigma_of};
use super::samplers::Run;
use crate::Result;
use crate::noise::TorchGenerator;

/// How the second stage combines the two predictions.
#[derive(Clone, Copy)]
pub(super) enum Solver {
    /// x̂₀ interpolated between the two calls by 1/(2r).
    Phi1,
    /// The φ₂ weighting of the two calls.
    Phi2,
}

/// A SEEDS-2 variant: η (0: no noise), the noise's multiplier, the stage position r (a Python float) and the
/// solver.
#[derive(Clone, Copy)]
pub(super) struct Seeds2 {
    pub(super) eta: f32,
    pub(super) s_noise: f32,
    pub(super) r: f64,
    pub(super) solver: Solver,
}

impl Seeds2 {
    /// `exp_heun_2_x0`: deterministic, r 1, φ₂.
    pub(super) const EXP_HEUN: Seeds2 =
        Seeds2 { eta: 0.0, s_noise: 1.0, r: 1.0, solver: Solver::Phi2 };
    /// `exp_heun_2_x0_sde`: η 1, r 1, φ₂.
    pub(super) const EXP_HEUN_SDE: Seeds2 =
        Seeds2 { eta: 1.0, s_noise: 1.0, r: 1.0, solver: Solver::Phi2 };
}

/// h·φ₂(h) = (eʰ − 1 − h)/h.
fn ei_h_phi_2(h: f32) -> f32 {
    (h.exp_m1() - h) / h
}

/// `sample_seeds_2` with `variant`.
pub(super) fn seeds_2(
    run: &mut Run<'_>,
    ms: &FlowSampling,
    mut x: Vec<f32>,
    sigmas: &[f32],
    variant: Seeds2,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let Seeds2 { eta, s_noise, r: r64, solver } = variant;
    let sigmas = ms.offset_first_sigma(sigmas);
    // Python's 1 / (2r) in f64, and r where it meets the f32 tensors.
    let (fac, r) = ((1.0 / (2.0 * r64)) as f32, r64 as f32);
    let inject = eta > 0.0 && s_noise > 0.0;
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        if next == 0.0 {
            x = denoised;
            continue;
        }
        let (lambda_s, lambda_t) = (lambda_of(sigma), lambda_of(next));
        let h = lambda_t - lambda_s;
        let h_eta = h * (eta + 1.0);
        let lambda_s1 = lerp(lambda_s, lambda_t, r);
        let sigma_s1 = sigma_of(lambda_s1);
        let alpha_s1 = sigma_s1 * lambda_s1.exp();
        let alpha_t = next * lambda_t.exp();

        let c1 = sigma_s1 / sigma * (-r * h * eta).exp();
        let e1 = alpha_s1 * (-r * h_eta).exp_m1();
        let mut x2: Vec<f32> = x.iter().zip(&denoised).map(|(x, d)| c1 * x - e1 * d).collect();
        let mut sde_noise = Vec::new();
        if inject {
            let k = (-(-2.0 * r * h * eta).exp_m1()).sqrt();
            sde_noise = noise.randn(x.len()).into_iter().map(|n| k * n).collect();
            x2.iter_mut().zip(&sde_noise).for_each(|(x, n)| *x += n * sigma_s1 * s_noise);
        }
        let denoised2 = run.denoiser.denoise(&x2, sigma_s1)?;

        let c = next / sigma * (-h * eta).exp();
        x = match solver {
            Solver::Phi1 => {
                let e = alpha_t * (-h_eta).exp_m1();
                // torch.lerp(denoised, denoised_2, fac) with a 0-dim weight.
                x.iter()
                    .zip(denoised.iter().zip(&denoised2))
                    .map(|(x, (&d, &d2))| c * x - e * lerp(d, d2, fac))
                    .collect()
            }
            Solver::Phi2 => {
                let b2 = ei_h_phi_2(-h_eta) / r;
                let b1 = (-h_eta).exp_m1() - b2;
                x.iter()
                    .zip(denoised.iter().zip(&denoised2))
                    .map(|(x, (d, d2))| c * x - alpha_t * (b1 * d + b2 * d2))
                    .collect()
            }
        };
        if inject {
            let segment = (r64 - 1.0) as f32 * h * eta;
            let (scale, k) = (segment.exp(), (-(segment * 2.0).exp_m1()).sqrt());
            let fresh = noise.randn(x.len());
            for ((x, n), f) in x.iter_mut().zip(&sde_noise).zip(fresh) {
                *x += (n * scale + k * f) * next * s_noise;
            }
        }
    }
    Ok(x)
}

/// `torch.lerp(a, b, w)` for a scalar weight: from `a` below ½, from `b` at ½ and above (ATen's
/// `is_lerp_weight_small` is `|w| < ½`).
pub(super) fn lerp(a: f32, b: f32, w: f32) -> f32 {
    if w < 0.5 { a + w * (b - a) } else { b - (b - a) * (1.0 - w) }
}

/// `sample_seeds_3` (η 1, r₁ ⅓, r₂ ⅔): three model calls a step at λ interpolated by r₁ and r₂, the noise
/// injected in three segments.
pub(super) fn seeds_3(
    run: &mut Run<'_>,
    ms: &FlowSampling,
    mut x: Vec<f32>,
    sigmas: &[f32],
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    // Python's 1/3 and 2/3 (and 2/3 ÷ 1/3 = 2), each rounded to f32 where they meet the f32 tensors.
    let (r1, r2) = ((1.0f64 / 3.0) as f32, (2.0f64 / 3.0) as f32);
    let eta = 1.0f32;
    let sigmas = ms.offset_first_sigma(sigmas);
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        if next == 0.0 {
            x = denoised;
            continue;
        }
        let (lambda_s, lambda_t) = (lambda_of(sigma), lambda_of(next));
        let h = lambda_t - lambda_s;
        let h_eta = h * (eta + 1.0);
        let (lambda_1, lambda_2) = (lerp(lambda_s, lambda_t, r1), lerp(lambda_s, lambda_t, r2));
        let (sigma_1, sigma_2) = (sigma_of(lambda_1), sigma_of(lambda_2));
        let (alpha_1, alpha_2) = (sigma_1 * lambda_1.exp(), sigma_2 * lambda_2.exp());
        let alpha_t = next * lambda_t.exp();
        // The noise segments: e^(−2·r·h·η) scaled parts, carried from stage to stage.
        let fresh = |noise: &mut TorchGenerator, segment: f32, len: usize| -> Vec<f32> {
            let k = (-(segment * 2.0).exp_m1()).sqrt();
            noise.randn(len).into_iter().map(|n| k * n).collect()
        };

        // Stage 1.
        let c = sigma_1 / sigma * (-r1 * h * eta).exp();
        let e = alpha_1 * (-r1 * h_eta).exp_m1();
        let mut x2: Vec<f32> = x.iter().zip(&denoised).map(|(x, d)| c * x - e * d).collect();
        let mut sde = fresh(noise, -r1 * h * eta, x.len());
        x2.iter_mut().zip(&sde).for_each(|(x, n)| *x += n * sigma_1);
        let denoised2 = run.denoiser.denoise(&x2, sigma_1)?;

        // Stage 2.
        let a32 = 2.0 * ei_h_phi_2(-r2 * h_eta);
        let a31 = (-r2 * h_eta).exp_m1() - a32;
        let c = sigma_2 / sigma * (-r2 * h * eta).exp();
        let mut x3: Vec<f32> = x
            .iter()
            .zip(denoised.iter().zip(&denoised2))
            .map(|(x, (d, d2))| c * x - alpha_2 * (a31 * d + a32 * d2))
            .collect();
        let segment = (r1 - r2) * h * eta;
        let more = fresh(noise, segment, x.len());
        let scale = segment.exp();
        sde.iter_mut().zip(&more).for_each(|(n, m)| *n = *n * scale + m);
        x3.iter_mut().zip(&sde).for_each(|(x, n)| *x += n * sigma_2);
        let denoised3 = run.denoiser.denoise(&x3, sigma_2)?;

        // Stage 3.
        let b3 = ei_h_phi_2(-h_eta) / r2;
        let b1 = (-h_eta).exp_m1() - b3;
        let c = next / sigma * (-h * eta).exp();
        x = x
            .iter()
            .zip(denoised.iter().zip(&denoised3))
            .map(|(x, (d, d3))| c * x - alpha_t * (b1 * d + b3 * d3))
            .collect();
        let segment = (r2 - 1.0) * h * eta;
        let more = fresh(noise, segment, x.len());
        let scale = segment.exp();
        for ((x, n), m) in x.iter_mut().zip(&sde).zip(&more) {
            *x += (n * scale + m) * next;
        }
    }
    Ok(x)
}
