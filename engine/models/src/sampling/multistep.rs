//! Linear multistep samplers on the Karras slope d = (x − x̂₀)/σ, as `comfy/k_diffusion/sampling.py` runs them:
//! `lms` (coefficients integrated from the sigmas, order 4), `ipndm` (Adams–Bashforth coefficients up to
//! order 4), `ipndm_v` (the same with coefficients for uneven steps) and `gradient_estimation` (Euler plus
//! (γ − 1) times the slope's change, γ = 2). One model call per
//! step; the last step into σ = 0 returns x̂₀.

use super::samplers::{Run, step, to_d};
use crate::Result;

/// The highest order `ipndm` and `ipndm_v` use (their `max_order`).
const MAX_ORDER: usize = 4;

/// Which coefficients.
#[derive(Clone, Copy)]
pub(super) enum Ipndm {
    /// Fixed Adams–Bashforth ones (`ipndm`).
    Fixed,
    /// Ones for the actual step sizes (`ipndm_v`).
    Variable,
}

/// `x + h·(Σ cₖ·dₖ)` with the slopes newest first, summed in ComfyUI's order.
fn combine(x: &[f32], h: f32, coeffs: &[f32], slopes: &[&[f32]]) -> Vec<f32> {
    (0..x.len())
        .map(|j| {
            let mut sum = coeffs[0] * slopes[0][j];
            for (c, d) in coeffs.iter().zip(slopes).skip(1) {
                sum += c * d[j];
            }
            x[j] + h * sum
        })
        .collect()
}

/// `ipndm`'s step at `order` (≥ 2): `x + h·(Σ cₖ·dₖ)/divisor` with the fixed coefficients, newest slope
/// first, in ComfyUI's order of operations.
fn fixed(order: usize, x: &[f32], h: f32, slopes: &[&[f32]]) -> Vec<f32> {
    let (coeffs, divisor): (&[f32], f32) = match order {
        2 => (&[3.0, -1.0], 2.0),
        3 => (&[23.0, -16.0, 5.0], 12.0),
        _ => (&[55.0, -59.0, 37.0, -9.0], 24.0),
    };
    (0..x.len())
        .map(|j| {
            let mut sum = coeffs[0] * slopes[0][j];
            for (c, d) in coeffs.iter().zip(slopes).skip(1) {
                sum += c * d[j];
            }
            x[j] + h * sum / divisor
        })
        .collect()
}

/// `ipndm_v`'s coefficients at `order` (≥ 2) from the step sizes h_n (this one), h_{n−1}, ... (f32, in
/// ComfyUI's order of operations), newest slope first.
fn variable(order: usize, h: &[f32]) -> Vec<f32> {
    let (h0, h1) = (h[0], h[1]);
    let base1 = (2.0 + h0 / h1) / 2.0;
    let base2 = -(h0 / h1) / 2.0;
    if order == 2 {
        return vec![base1, base2];
    }
    let h2 = h[2];
    let temp1 = (1.0 - h0 / (3.0 * (h0 + h1)) * (h0 * (h0 + h1)) / (h1 * (h1 + h2))) / 2.0;
    if order == 3 {
        return vec![base1 + temp1, base2 - (1.0 + h1 / h2) * temp1, temp1 * h1 / h2];
    }
    let h3 = h[3];
    let temp2 = ((1.0 - h0 / (3.0 * (h0 + h1))) / 2.0
        + (1.0 - h0 / (2.0 * (h0 + h1))) * h0 / (6.0 * (h0 + h1 + h2)))
        * (h0 * (h0 + h1) * (h0 + h1 + h2))
        / (h1 * (h1 + h2) * (h1 + h2 + h3));
    let ratio = h1 * (h1 + h2) / (h2 * (h2 + h3));
    vec![
        base1 + temp1 + temp2,
        base2 - (1.0 + h1 / h2) * temp1 - (1.0 + h1 / h2 + ratio) * temp2,
        temp1 * h1 / h2 + (h1 / h2 + ratio * (1.0 + h2 / h3)) * temp2,
        -temp2 * ratio * h1 / h2,
    ]
}

/// `sample_ipndm` / `sample_ipndm_v` with `max_order` 4.
pub(super) fn ipndm(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    kind: Ipndm,
) -> Result<Vec<f32>> {
    // The last slopes, newest first (at most MAX_ORDER − 1).
    let mut history: Vec<Vec<f32>> = Vec::new();
    for i in 0..sigmas.len() - 1 {
        let (t, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, t)?;
        let d = to_d(&x, &denoised, t);
        let order = MAX_ORDER.min(i + 1);
        let h = next - t;
        let x_next = if next == 0.0 {
            denoised
        } else if order == 1 {
            step(&x, &d, h)
        } else {
            let slopes: Vec<&[f32]> =
                std::iter::once(d.as_slice()).chain(history.iter().map(Vec::as_slice)).collect();
            match kind {
                Ipndm::Fixed => fixed(order, &x, h, &slopes[..order]),
                Ipndm::Variable => {
                    // h_n, h_{n−1}, ...: this step's size, then the earlier ones.
                    let sizes: Vec<f32> = std::iter::once(h)
                        .chain((1..order).map(|k| sigmas[i + 1 - k] - sigmas[i - k]))
                        .collect();
                    combine(&x, h, &variable(order, &sizes), &slopes[..order])
                }
            }
        };
        history.insert(0, d);
        history.truncate(MAX_ORDER - 1);
        x = x_next;
    }
    Ok(x)
}

/// `sample_gradient_estimation` (γ = 2): Euler, plus from the second step (γ − 1)·(d − d_prev)·dt; x̂₀ into
/// σ = 0. With CFG++ the slope is the unconditional one and the Euler step starts from x̂₀
/// (`gradient_estimation_cfg_pp`).
pub(super) fn gradient_estimation(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    cfg_pp: bool,
) -> Result<Vec<f32>> {
    const GAMMA: f32 = 2.0;
    let mut old: Option<Vec<f32>> = None;
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let (denoised, d) = if cfg_pp {
            let (denoised, uncond) = run.first_cfg_pp(i, &x, sigma)?;
            let d = to_d(&x, &uncond, sigma);
            (denoised, d)
        } else {
            let denoised = run.first(i, &x, sigma)?;
            let d = to_d(&x, &denoised, sigma);
            (denoised, d)
        };
        let dt = next - sigma;
        if next == 0.0 {
            x = denoised;
        } else {
            x = if cfg_pp { step(&denoised, &d, next) } else { step(&x, &d, dt) };
            if let Some(old) = &old {
                let d_bar: Vec<f32> =
                    d.iter().zip(old).map(|(d, o)| (GAMMA - 1.0) * (d - o)).collect();
                x = step(&x, &d_bar, dt);
            }
        }
        old = Some(d);
    }
    Ok(x)
}

/// `linear_multistep_coeff`: the integral over [tᵢ, tᵢ₊₁] of the Lagrange basis polynomial of node i − j
/// through the nodes tᵢ, tᵢ₋₁, ..., tᵢ₋ₒᵣ₊₁ (ComfyUI integrates it with scipy's `quad`; Gauss–Legendre with
/// ⌈order/2⌉ points integrates the polynomial of degree order − 1 exactly, here in f64).
fn lms_coeff(order: usize, t: &[f32], i: usize, j: usize) -> f64 {
    let basis = |tau: f64| {
        (0..order).filter(|&k| k != j).fold(1.0, |prod, k| {
            let (tk, tj) = (f64::from(t[i - k]), f64::from(t[i - j]));
            prod * (tau - tk) / (tj - tk)
        })
    };
    let (a, b) = (f64::from(t[i]), f64::from(t[i + 1]));
    let (mid, half) = ((a + b) / 2.0, (b - a) / 2.0);
    gauss_legendre(order.div_ceil(2)).iter().map(|&(x, w)| w * basis(mid + half * x)).sum::<f64>()
        * half
}

/// The `n` nodes and weights of Gauss–Legendre quadrature on [−1, 1] (exact for polynomials of degree < 2n):
/// the roots of Pₙ by Newton's method from Chebyshev guesses.
fn gauss_legendre(n: usize) -> Vec<(f64, f64)> {
    (0..n)
        .map(|k| {
            let mut x = (std::f64::consts::PI * (k as f64 + 0.75) / (n as f64 + 0.5)).cos();
            let mut derivative = 1.0;
            for _ in 0..100 {
                // Pₙ(x) and Pₙ₋₁(x) by the three-term recurrence.
                let (mut p, mut previous) = (1.0, 0.0);
                for j in 1..=n {
                    let j = j as f64;
                    (p, previous) = (((2.0 * j - 1.0) * x * p - (j - 1.0) * previous) / j, p);
                }
                derivative = n as f64 * (x * p - previous) / (x * x - 1.0);
                let dx = p / derivative;
                x -= dx;
                if dx.abs() < 1e-15 {
                    break;
                }
            }
            (x, 2.0 / ((1.0 - x * x) * derivative * derivative))
        })
        .collect()
}

/// `sample_lms` at `order` (4 for KSampler's): x + Σⱼ cⱼ·d_{i−j} with the linear multistep coefficients of the
/// last slopes; x̂₀ into σ = 0.
pub(super) fn lms(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    max_order: usize,
) -> Result<Vec<f32>> {
    // The last slopes, newest first.
    let mut slopes: Vec<Vec<f32>> = Vec::new();
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        slopes.insert(0, to_d(&x, &denoised, sigma));
        slopes.truncate(max_order);
        if next == 0.0 {
            x = denoised;
            continue;
        }
        let order = (i + 1).min(max_order);
        let coeffs: Vec<f32> = (0..order).map(|j| lms_coeff(order, sigmas, i, j) as f32).collect();
        // Python's sum: 0 + c₀·d₀ + c₁·d₁ + ..., then added to x.
        x = (0..x.len())
            .map(|e| {
                let sum = coeffs.iter().zip(&slopes).fold(0.0f32, |s, (c, d)| s + c * d[e]);
                x[e] + sum
            })
            .collect();
    }
    Ok(x)
}

/// The highest order `deis` uses (its `max_order`).
const DEIS_ORDER: usize = 3;

/// The integration points of DEIS's `tab` coefficients (its `N`).
const DEIS_POINTS: usize = 10_000;

/// DEIS's variance-preserving time of each sigma (`edm2t`, with its ε 1e-3, σ_min 0.002, σ_max 80) and the
/// schedule's β₀ and β₁, in f32 as torch computes them.
fn deis_times(sigmas: &[f32]) -> (Vec<f32>, f32, f32) {
    let (eps, sigma_min, sigma_max) = (1e-3f32, 0.002f32, 80f32);
    let log_max = (sigma_max * sigma_max + 1.0).ln();
    let beta_d = 2.0 * ((sigma_min * sigma_min + 1.0).ln() / eps - log_max) / (eps - 1.0);
    let beta_min = log_max - 0.5 * beta_d;
    let times = sigmas
        .iter()
        .map(|&s| {
            ((beta_min * beta_min + 2.0 * beta_d * (s * s + 1.0).ln()).sqrt() - beta_min) / beta_d
        })
        .collect();
    (times, beta_min, beta_d + beta_min)
}

/// DEIS's `tab` coefficients of step `i` at `order` (≥ 2): for each of the last `order` times, the integral
/// over [tᵢ, tᵢ₊₁] of −½·(d ln α/dτ)/√(α(1 − α)) times that time's Lagrange basis polynomial, as a Riemann sum
/// over `DEIS_POINTS` points of an f32 linspace (summed in f64).
fn deis_coeffs(t: &[f32], i: usize, order: usize, beta_0: f32, beta_1: f32) -> Vec<f32> {
    let (start, end) = (t[i], t[i + 1]);
    let dtau = (end - start) / DEIS_POINTS as f32;
    let step = (end - start) / (DEIS_POINTS - 1) as f32;
    let half = DEIS_POINTS / 2;
    let taus: Vec<f32> = (0..DEIS_POINTS)
        .map(|k| {
            if k < half {
                step.mul_add(k as f32, start)
            } else {
                (-step).mul_add((DEIS_POINTS - k - 1) as f32, end)
            }
        })
        .collect();
    let integrand: Vec<f32> = taus
        .iter()
        .map(|&tau| {
            let alpha = (-0.5 * tau.powi(2) * (beta_1 - beta_0) - tau * beta_0).exp();
            let d_log_alpha = -0.5 * (beta_1 - beta_0) * 2.0 * tau - beta_0;
            -0.5 * d_log_alpha / (alpha * (1.0 - alpha)).sqrt()
        })
        .collect();
    let prev: Vec<f32> = (0..order).map(|k| t[i - k]).collect();
    (0..order)
        .map(|j| {
            let sum: f64 = taus
                .iter()
                .zip(&integrand)
                .map(|(&tau, &g)| {
                    let poly = (0..order)
                        .filter(|&k| k != j)
                        .fold(1.0f32, |p, k| p * ((tau - prev[k]) / (prev[j] - prev[k])));
                    f64::from(g * poly)
                })
                .sum();
            sum as f32 * dtau
        })
        .collect()
}

/// `sample_deis` (max order 3, `tab` mode): Euler on the first step and into σ = 0, else x plus DEIS's
/// coefficients times this and the previous slopes.
pub(super) fn deis(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    let (times, beta_0, beta_1) = deis_times(sigmas);
    let mut history: Vec<Vec<f32>> = Vec::new();
    for i in 0..sigmas.len() - 1 {
        let (t, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, t)?;
        let d = to_d(&x, &denoised, t);
        let order = if next <= 0.0 { 1 } else { DEIS_ORDER.min(i + 1) };
        x = if order == 1 {
            step(&x, &d, next - t)
        } else {
            let coeffs = deis_coeffs(&times, i, order, beta_0, beta_1);
            let slopes: Vec<&[f32]> =
                std::iter::once(d.as_slice()).chain(history.iter().map(Vec::as_slice)).collect();
            (0..x.len())
                .map(|e| coeffs.iter().zip(&slopes).fold(x[e], |acc, (c, s)| acc + c * s[e]))
                .collect()
        };
        history.insert(0, d);
        history.truncate(DEIS_ORDER - 1);
    }
    Ok(x)
}
