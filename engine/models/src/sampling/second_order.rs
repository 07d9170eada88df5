//! The second-order single-step samplers beyond Heun: `heunpp2`, `dpm_2`, `dpm_2_ancestral` and
//! `dpmpp_2s_ancestral`, as `comfy/k_diffusion/sampling.py` runs them for a flow (`CONST`) model (the ancestral
//! ones in their rectified-flow form, `_RF`, with η = 1 and s_noise = 1).

use super::samplers::{Run, step, to_d};
use crate::Result;
use crate::noise::TorchGenerator;

/// `sample_heunpp2` without churn: Euler into the last sigma, Heun into the one before, otherwise a third model
/// call at the sigma after next and the three slopes weighted by σ_{i+1}/(3σ₀), σ_{i+2}/(3σ₀) and the rest.
pub(super) fn heunpp2(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    let end = sigmas[sigmas.len() - 1];
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let d = to_d(&x, &denoised, sigma);
        let dt = next - sigma;
        if next == end {
            x = step(&x, &d, dt);
            continue;
        }
        let x2 = step(&x, &d, dt);
        let d2 = to_d(&x2, &run.denoiser.denoise(&x2, next)?, next);
        let after = sigmas[i + 2];
        let d_prime: Vec<f32> = if after == end {
            let w2 = next / (2.0 * sigmas[0]);
            let w1 = 1.0 - w2;
            d.iter().zip(&d2).map(|(a, b)| a * w1 + b * w2).collect()
        } else {
            let x3 = step(&x2, &d2, after - next);
            let d3 = to_d(&x3, &run.denoiser.denoise(&x3, after)?, after);
            let w = 3.0 * sigmas[0];
            let (w2, w3) = (next / w, after / w);
            let w1 = 1.0 - w2 - w3;
            d.iter().zip(&d2).zip(&d3).map(|((a, b), c)| w1 * a + w2 * b + w3 * c).collect()
        };
        x = step(&x, &d_prime, dt);
    }
    Ok(x)
}

/// The geometric midpoint of two sigmas: `exp(lerp(ln a, ln b, ½))` with torch's f32 `lerp`, which at weight ½
/// takes its second form, `b − (b − a)·½`.
fn log_midpoint(a: f32, b: f32) -> f32 {
    super::seeds::lerp(a.ln(), b.ln(), 0.5).exp()
}

/// One DPM-Solver-2 step from `x` at `sigma` with slope `d` down to `to`: a model call at the midpoint.
fn dpm2_step(run: &mut Run<'_>, x: &[f32], d: &[f32], sigma: f32, to: f32) -> Result<Vec<f32>> {
    let mid = log_midpoint(sigma, to);
    let x2 = step(x, d, mid - sigma);
    let d2 = to_d(&x2, &run.denoiser.denoise(&x2, mid)?, mid);
    Ok(step(x, &d2, to - sigma))
}

/// `sample_dpm_2` without churn: Euler into a last sigma of 0, DPM-Solver-2 otherwise.
pub(super) fn dpm_2(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let d = to_d(&x, &denoised, sigma);
        x = if next == 0.0 {
            step(&x, &d, next - sigma)
        } else {
            dpm2_step(run, &x, &d, sigma, next)?
        };
    }
    Ok(x)
}

/// The rectified-flow ancestral step at η from `sigma` to `next`: the sigma to step down to, the factor the
/// latent is rescaled by (α_{next}/α_down) and the noise's coefficient.
fn rf_ancestral(sigma: f32, next: f32, eta: f32) -> (f32, f32, f32) {
    let downstep_ratio = 1.0 + (next / sigma - 1.0) * eta;
    let down = next * downstep_ratio;
    let (alpha_next, alpha_down) = (1.0 - next, 1.0 - down);
    let renoise =
        (next * next - down * down * (alpha_next * alpha_next) / (alpha_down * alpha_down)).sqrt();
    (down, alpha_next / alpha_down, renoise)
}

/// `x·scale + noise·s_noise·renoise` with fresh noise from the run's generator.
fn renoise(
    x: &[f32],
    scale: f32,
    s_noise: f32,
    renoise: f32,
    noise: &mut TorchGenerator,
) -> Vec<f32> {
    let n = noise.randn(x.len());
    x.iter().zip(n).map(|(x, n)| scale * x + n * s_noise * renoise).collect()
}

/// `sample_dpm_2_ancestral_RF`: DPM-Solver-2 down to σ_down, then rescaled and re-noised to the next sigma
/// (Euler, no noise, when σ_down is 0).
pub(super) fn dpm_2_ancestral(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let (down, scale, coeff) = rf_ancestral(sigma, next, 1.0);
        let d = to_d(&x, &denoised, sigma);
        if down == 0.0 {
            x = step(&x, &d, down - sigma);
        } else {
            x = dpm2_step(run, &x, &d, sigma, down)?;
            x = renoise(&x, scale, 1.0, coeff, noise);
        }
    }
    Ok(x)
}

/// `sample_dpmpp_2s_ancestral_RF` at η and s_noise: DPM-Solver++(2S) in the flow's half-log-SNR
/// λ = ln((1 − σ)/σ) down to σ_down (its midpoint in λ; 0.9999 when σ is 1), then rescaled and re-noised
/// (unless η is 0); Euler into a last sigma of 0.
pub(super) fn dpmpp_2s_ancestral(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    eta: f32,
    s_noise: f32,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let lambda = |s: f32| ((1.0 - s) / s).ln();
    let sigma_of = |l: f32| 1.0 / (l.exp() + 1.0);
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let (down, scale, coeff) = rf_ancestral(sigma, next, eta);
        if next == 0.0 {
            let d = to_d(&x, &denoised, sigma);
            x = step(&x, &d, down - sigma);
            continue;
        }
        let sigma_s = if sigma == 1.0 {
            0.9999
        } else {
            let (t, t_down) = (lambda(sigma), lambda(down));
            sigma_of(t + 0.5 * (t_down - t))
        };
        let ratio = sigma_s / sigma;
        let u: Vec<f32> =
            x.iter().zip(&denoised).map(|(x, d)| ratio * x + (1.0 - ratio) * d).collect();
        let d_i = run.denoiser.denoise(&u, sigma_s)?;
        let ratio = down / sigma;
        x = x.iter().zip(&d_i).map(|(x, d)| ratio * x + (1.0 - ratio) * d).collect();
        if eta > 0.0 {
            x = renoise(&x, scale, s_noise, coeff, noise);
        }
    }
    Ok(x)
}
