//! SA-Solver (`sa_solver`, `sa_solver_pece`), the stochastic Adams predictor–corrector of ComfyUI's
//! `sample_sa_solver` with KSampler's settings: predictor order 3, corrector order 4, the orders lowered near
//! the end, τ = 1 for sigmas between `percent_to_sigma(0.2)` and `percent_to_sigma(0.8)` (0 elsewhere), in the
//! flow model's half-log-SNR λ = −logit(σ), a first sigma of 1 moved to `percent_to_sigma(1e-4)`.
//!
//! The coefficients come from the Lagrange interpolation of the past predictions: ComfyUI solves a small
//! Vandermonde system in f32; Kiln solves it in f64 (closer to the exact coefficients than either f32 solve is to
//! the other). The updates on the latent are f32, one rounding per torch op.

use super::FlowSampling;
use super::flow::half_log_snr as lambda_of;
use super::linalg::solve;
use super::samplers::Run;
use super::samplers::SaSolverSettings;
use crate::Result;
use crate::noise::TorchGenerator;

/// `compute_exponential_coeffs`: (1 + τ²)·∫ₛᵗ e^((1+τ²)(x−t)) xᵖ dx for p < `order`, by parts.
fn exponential_coeffs(s: f64, t: f64, order: usize, tau: f64) -> Vec<f64> {
    let tau_mul = 1.0 + tau * tau;
    let h = t - s;
    let product: Vec<f64> =
        (0..order).map(|p| t.powi(p as i32) - s.powi(p as i32) * (-tau_mul * h).exp()).collect();
    // Row p: Σ_{q ≤ p} (−1)^(p−q) p!/q! / (1+τ²)^(p−q) · product[q].
    (0..order)
        .map(|p| {
            let mut factor = 1.0;
            let mut sum = 0.0;
            for q in (0..=p).rev() {
                sum += factor * product[q];
                factor *= -(q as f64) / tau_mul;
            }
            sum
        })
        .collect()
}

/// `compute_simple_stochastic_adams_b_coeffs` (the simple order-2 scheme, two points), in f32 as torch
/// computes it; `[b₂, b₁]` for the older and the newer prediction.
fn simple_b_coeffs(
    sigma_next: f32,
    lambdas: &[f32],
    (lambda_s, lambda_t): (f32, f32),
    tau: f64,
    corrector: bool,
) -> Vec<f32> {
    let tau_mul = (1.0 + tau * tau) as f32;
    let h = lambda_t - lambda_s;
    let alpha_t = sigma_next * lambda_t.exp();
    let whole = alpha_t * -(-h * tau_mul).exp_m1();
    if corrector {
        let b1 = alpha_t * (0.5 * tau_mul * h);
        vec![whole - b1, b1]
    } else {
        let b2 = alpha_t * (0.5 * tau_mul * (h * h)) / (lambdas[0] - lambda_s);
        vec![b2, whole - b2]
    }
}

/// `compute_stochastic_adams_b_coeffs`: the weights of the past predictions at `lambdas` for a step from
/// `lambda_s` to `lambda_t` ending at `sigma_next`.
fn b_coeffs(sigma_next: f32, lambdas: &[f32], lambda_s: f32, lambda_t: f32, tau: f64) -> Vec<f32> {
    let n = lambdas.len();
    let integrals = exponential_coeffs(f64::from(lambda_s), f64::from(lambda_t), n, tau);
    // The transposed Vandermonde matrix: row j holds λₖʲ.
    let vandermonde: Vec<Vec<f64>> =
        (0..n).map(|j| lambdas.iter().map(|&l| f64::from(l).powi(j as i32)).collect()).collect();
    let lagrange = solve(vandermonde, integrals);
    let alpha_t = sigma_next * lambda_t.exp();
    lagrange.into_iter().map(|l| alpha_t * l as f32).collect()
}

/// Σₖ bₖ·predₖ over the last `b.len()` predictions.
fn combine(preds: &[Vec<f32>], b: &[f32]) -> Vec<f32> {
    let preds = &preds[preds.len() - b.len()..];
    (0..preds[0].len()).map(|i| preds.iter().zip(b).map(|(p, b)| p[i] * b).sum()).collect()
}

/// `sample_sa_solver` at `set` (with `use_pece`, the corrected state evaluated again).
pub(super) fn sa_solver(
    run: &mut Run<'_>,
    ms: &FlowSampling,
    x: Vec<f32>,
    sigmas: &[f32],
    set: &SaSolverSettings,
    noise_sampler: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let sigmas = ms.offset_first_sigma(sigmas);
    let lambdas: Vec<f32> = sigmas.iter().map(|&s| lambda_of(s)).collect();
    // The SDE interval (`get_tau_interval_func`): τ = η between the two sigmas, else 0 (an ODE step).
    let (start, end) =
        set.sde_sigmas.unwrap_or((ms.percent_to_sigma(0.2), ms.percent_to_sigma(0.8)));
    let tau_of = |sigma: f32| {
        if set.eta > 0.0 && (end..=start).contains(&f64::from(sigma)) { set.eta } else { 0.0 }
    };
    let (pece, s_noise) = (set.use_pece, set.s_noise);
    let (predictor_order, corrector_order) = (set.predictor_order, set.corrector_order);
    let coeffs =
        |sigma_next: f32, points: &[f32], (ls, lt): (f32, f32), tau: f64, corrector: bool| {
            if set.simple_order_2 && points.len() == 2 {
                simple_b_coeffs(sigma_next, points, (ls, lt), tau, corrector)
            } else {
                b_coeffs(sigma_next, points, ls, lt, tau)
            }
        };
    let n = sigmas.len();
    let lower_order_to_end = sigmas[n - 1] == 0.0;
    let (mut x, mut x_pred) = (x.clone(), x);
    let (mut h, mut tau) = (0.0f32, 0.0f64);
    let mut noise: Option<Vec<f32>> = None;
    let mut preds: Vec<Vec<f32>> = Vec::new();
    for i in 0..n - 1 {
        let mut denoised = run.first(i, &x_pred, sigmas[i])?;
        preds.push(denoised.clone());
        if preds.len() > predictor_order.max(corrector_order) {
            preds.remove(0);
        }
        let mut predictor = predictor_order.min(preds.len());
        let mut corrector = if i == 0 || (sigmas[i + 1] == 0.0 && !pece) {
            0
        } else {
            corrector_order.min(preds.len())
        };
        if lower_order_to_end {
            predictor = predictor.min(n - 2 - i);
            corrector = corrector.min(n - 1 - i);
        }
        if corrector == 0 {
            x.clone_from(&x_pred);
        } else {
            let points = &lambdas[i + 1 - corrector..=i];
            let b = coeffs(sigmas[i], points, (lambdas[i - 1], lambdas[i]), tau, true);
            let correction = combine(&preds, &b);
            let a = sigmas[i] / sigmas[i - 1] * (-(tau * tau) as f32 * h).exp();
            x = x.iter().zip(&correction).map(|(x, c)| a * x + c).collect();
            if let Some(noise) = noise.as_ref().filter(|_| tau > 0.0 && s_noise > 0.0) {
                x = x.iter().zip(noise).map(|(x, n)| x + n).collect();
            }
            if pece {
                denoised = run.denoiser.denoise(&x, sigmas[i])?;
                *preds.last_mut().expect("this step's prediction") = denoised.clone();
            }
        }
        if sigmas[i + 1] == 0.0 {
            x_pred = denoised;
            continue;
        }
        tau = tau_of(sigmas[i + 1]);
        let points = &lambdas[i + 1 - predictor..=i];
        let b = coeffs(sigmas[i + 1], points, (lambdas[i], lambdas[i + 1]), tau, false);
        let prediction = combine(&preds, &b);
        h = lambdas[i + 1] - lambdas[i];
        let a = sigmas[i + 1] / sigmas[i] * (-(tau * tau) as f32 * h).exp();
        x_pred = x.iter().zip(&prediction).map(|(x, p)| a * x + p).collect();
        if tau > 0.0 && s_noise > 0.0 {
            let scale = (-((-2.0 * tau * tau) as f32 * h).exp_m1()).sqrt();
            let drawn = noise_sampler.randn(x.len());
            let n: Vec<f32> = drawn.iter().map(|r| r * sigmas[i + 1] * scale * s_noise).collect();
            x_pred = x_pred.iter().zip(&n).map(|(x, n)| x + n).collect();
            noise = Some(n);
        }
    }
    Ok(x_pred)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponential_coeffs_integrate_by_parts() {
        // τ = 0, p = 0: 1 − e^(−h); p = 1: t − s·e^(−h) − (1 − e^(−h)).
        let (s, t) = (0.5f64, 1.25f64);
        let c = exponential_coeffs(s, t, 2, 0.0);
        let e = (-(t - s)).exp();
        assert!((c[0] - (1.0 - e)).abs() < 1e-15);
        assert!((c[1] - (t - s * e - (1.0 - e))).abs() < 1e-15);
    }
}
