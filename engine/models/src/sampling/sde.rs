//! The DPM-Solver++ SDE samplers (`dpmpp_sde`, `dpmpp_2m_sde`, `dpmpp_2m_sde_heun`, `dpmpp_3m_sde` and their
//! `_gpu` twins, which differ only in where the tree lives), as `comfy/k_diffusion/sampling.py` runs them at the
//! settings' η, s_noise and r (KSampler's: 1, 1, ½) in the half-log-SNR ([`Snr`]): for a flow (`CONST`) model
//! λ = −logit(σ) with a first sigma of 1 moved to `percent_to_sigma(1e-4)`, for a discrete-time one λ = −ln σ;
//! with noise from torchsde's Brownian tree over the schedule's sigmas ([`crate::brownian::BrownianNoise`], seeded
//! with the sampler's seed).

use super::FlowSampling;
use super::cfg_pp::ancestral_step;
use super::flow;
use super::samplers::{Run, SamplerSettings};
use crate::Result;
use crate::brownian::BrownianNoise;

/// How the samplers turn a model's σ into the half-log-SNR λ = log(α/σ) and back (ComfyUI's
/// `sigma_to_half_log_snr`, `half_log_snr_to_sigma`, `offset_first_sigma_for_snr`).
#[derive(Debug, Clone, Copy)]
pub(super) enum Snr<'a> {
    /// A flow (`CONST`) model: λ = −logit(σ); a first sigma of 1 or more moved just below it.
    Flow(&'a FlowSampling),
    /// A discrete-time (ε or v) model: λ = −ln σ.
    Discrete,
}

impl Snr<'_> {
    /// λ of `sigma`, in f32 as torch computes it.
    fn lambda(self, sigma: f32) -> f32 {
        match self {
            Snr::Flow(_) => flow::half_log_snr(sigma),
            Snr::Discrete => -sigma.ln(),
        }
    }

    /// σ of `lambda`, in f32 as torch computes it.
    fn sigma(self, lambda: f32) -> f32 {
        match self {
            Snr::Flow(_) => flow::sigma_of_half_log_snr(lambda),
            Snr::Discrete => (-lambda).exp(),
        }
    }

    /// The sigmas the sampler steps through.
    fn offset_first_sigma(self, sigmas: &[f32]) -> Vec<f32> {
        match self {
            Snr::Flow(ms) => ms.offset_first_sigma(sigmas),
            Snr::Discrete => sigmas.to_vec(),
        }
    }
}

/// The Brownian noise for `sigmas` (the schedule as given, before the first sigma is moved) and the sigmas
/// the sampler steps through.
fn setup(snr: Snr<'_>, sigmas: &[f32], seed: u64, size: usize) -> (BrownianNoise, Vec<f32>) {
    let sigma_min = sigmas.iter().copied().filter(|&s| s > 0.0).fold(f32::INFINITY, f32::min);
    let sigma_max = sigmas.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let noise = BrownianNoise::new(sigma_min, sigma_max, seed, size);
    (noise, snr.offset_first_sigma(sigmas))
}

/// `x + n · f₀ · f₁ · …` (the noise times 0-dim factors in order, rounded as torch's separate products are).
fn add_noise(x: &[f32], n: &[f32], factors: &[f32]) -> Vec<f32> {
    x.iter().zip(n).map(|(x, n)| x + factors.iter().fold(*n, |v, f| v * f)).collect()
}

/// Whether a step adds noise (and asks the tree for it): η > 0 and s_noise > 0.
fn noisy(set: &SamplerSettings) -> bool {
    set.eta > 0.0 && set.s_noise > 0.0
}

/// `sample_dpmpp_sde`: a model call at λ_s + r·h, both halves ancestral.
pub(super) fn dpmpp_sde(
    run: &mut Run<'_>,
    snr: Snr<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    seed: u64,
    set: &SamplerSettings,
) -> Result<Vec<f32>> {
    let (mut noise, sigmas) = setup(snr, sigmas, seed, x.len());
    let (r, eta, s_noise) = (set.r as f32, set.eta, set.s_noise);
    // Python's 1 / (2r) in f64, each use rounded to f32.
    let fac = 1.0 / (2.0 * set.r);
    let (keep, take) = ((1.0 - fac) as f32, fac as f32);
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        if next == 0.0 {
            x = denoised;
            continue;
        }
        let (lambda_s, lambda_t) = (snr.lambda(sigma), snr.lambda(next));
        let h = lambda_t - lambda_s;
        let lambda_s_1 = lambda_s + r * h;
        let sigma_s_1 = snr.sigma(lambda_s_1);
        let alpha_s = sigma * lambda_s.exp();
        let alpha_s_1 = sigma_s_1 * lambda_s_1.exp();
        let alpha_t = next * lambda_t.exp();

        let (down, up) = ancestral_step((-lambda_s).exp(), (-lambda_s_1).exp(), eta);
        let h_ = -down.ln() - lambda_s;
        let a = alpha_s_1 / alpha_s * (-h_).exp();
        let b = alpha_s_1 * (-h_).exp_m1();
        let x_2: Vec<f32> = x.iter().zip(&denoised).map(|(x, d)| a * x - b * d).collect();
        let x_2 = if noisy(set) {
            add_noise(&x_2, &noise.sample(sigma, sigma_s_1), &[alpha_s_1, s_noise, up])
        } else {
            x_2
        };
        let denoised_2 = run.denoiser.denoise(&x_2, sigma_s_1)?;

        let (down, up) = ancestral_step((-lambda_s).exp(), (-lambda_t).exp(), eta);
        let h_ = -down.ln() - lambda_s;
        let a = alpha_t / alpha_s * (-h_).exp();
        let b = alpha_t * (-h_).exp_m1();
        let denoised_d: Vec<f32> =
            denoised.iter().zip(&denoised_2).map(|(d, d2)| keep * d + take * d2).collect();
        x = x.iter().zip(&denoised_d).map(|(x, d)| a * x - b * d).collect();
        if noisy(set) {
            x = add_noise(&x, &noise.sample(sigma, next), &[alpha_t, s_noise, up]);
        }
    }
    Ok(x)
}

/// What the multistep SDE steps share (`dpmpp_2m_sde`, `dpmpp_3m_sde`): the λ-step h, h·(η + 1) and α_t.
struct Multistep {
    h: f32,
    h_eta: f32,
    alpha_t: f32,
}

impl Multistep {
    /// The step from `sigma` to `next` (> 0) at `eta`, and x moved by its first-order update
    /// `σ_next/σ · e^(−hη) · x + α_t · (1 − e^(−h(η+1))) · x̂₀`.
    fn first_order(
        snr: Snr<'_>,
        x: &[f32],
        denoised: &[f32],
        (sigma, next): (f32, f32),
        eta: f32,
    ) -> (Vec<f32>, Multistep) {
        let (lambda_s, lambda_t) = (snr.lambda(sigma), snr.lambda(next));
        let h = lambda_t - lambda_s;
        let h_eta = h * (eta + 1.0);
        let alpha_t = next * lambda_t.exp();
        let a = next / sigma * (-h * eta).exp();
        let b = alpha_t * -(-h_eta).exp_m1();
        let x = x.iter().zip(denoised).map(|(x, d)| a * x + b * d).collect();
        (x, Multistep { h, h_eta, alpha_t })
    }

    /// `x` plus the step's Brownian noise, `√(1 − e^(−2hη)) · σ_next · s_noise` times unit noise, when the
    /// settings add noise (else `x`, and the tree is not asked).
    fn add_noise(
        &self,
        x: Vec<f32>,
        noise: &mut BrownianNoise,
        (sigma, next): (f32, f32),
        set: &SamplerSettings,
    ) -> Vec<f32> {
        if !noisy(set) {
            return x;
        }
        let amp = (-(-2.0 * self.h * set.eta).exp_m1()).sqrt();
        add_noise(&x, &noise.sample(sigma, next), &[next, amp, set.s_noise])
    }
}

/// The second-order correction of `dpmpp_2m_sde`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SolverType {
    /// `midpoint` (`dpmpp_2m_sde`).
    Midpoint,
    /// `heun` (`dpmpp_2m_sde_heun`).
    Heun,
}

/// `sample_dpmpp_2m_sde` with `solver`.
pub(super) fn dpmpp_2m_sde(
    run: &mut Run<'_>,
    snr: Snr<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    (seed, set): (u64, &SamplerSettings),
    solver: SolverType,
) -> Result<Vec<f32>> {
    let (mut noise, sigmas) = setup(snr, sigmas, seed, x.len());
    let mut old: Option<Vec<f32>> = None;
    let (mut h, mut h_last) = (0.0f32, 0.0f32);
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        if next == 0.0 {
            x.clone_from(&denoised);
        } else {
            let (moved, step) = Multistep::first_order(snr, &x, &denoised, (sigma, next), set.eta);
            x = moved;
            let Multistep { h_eta, alpha_t, .. } = step;
            h = step.h;
            let neg_em1 = -(-h_eta).exp_m1();
            if let Some(old) = &old {
                let r = h_last / h;
                let c = match solver {
                    SolverType::Heun => alpha_t * (neg_em1 / -h_eta + 1.0) * (1.0 / r),
                    SolverType::Midpoint => 0.5 * alpha_t * neg_em1 * (1.0 / r),
                };
                x = x.iter().zip(&denoised).zip(old).map(|((x, d), o)| x + c * (d - o)).collect();
            }
            x = step.add_noise(x, &mut noise, (sigma, next), set);
        }
        old = Some(denoised);
        h_last = h;
    }
    Ok(x)
}

/// `sample_dpmpp_3m_sde`: third order from the third step, second order on the second.
pub(super) fn dpmpp_3m_sde(
    run: &mut Run<'_>,
    snr: Snr<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    seed: u64,
    set: &SamplerSettings,
) -> Result<Vec<f32>> {
    let (mut noise, sigmas) = setup(snr, sigmas, seed, x.len());
    let (mut denoised_1, mut denoised_2): (Option<Vec<f32>>, Option<Vec<f32>>) = (None, None);
    let (mut h, mut h_1, mut h_2): (Option<f32>, Option<f32>, Option<f32>) = (None, None, None);
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        if next == 0.0 {
            x.clone_from(&denoised);
        } else {
            let (moved, multistep) =
                Multistep::first_order(snr, &x, &denoised, (sigma, next), set.eta);
            x = moved;
            let Multistep { h: step, h_eta, alpha_t } = multistep;
            h = Some(step);
            let phi_2 = (-h_eta).exp_m1() / h_eta + 1.0;
            match (h_1, h_2, &denoised_1, &denoised_2) {
                (Some(h1), Some(h2), Some(d1s), Some(d2s)) => {
                    let (r0, r1) = (h1 / step, h2 / step);
                    let phi_3 = phi_2 / h_eta - 0.5;
                    let (c1, c2) = (alpha_t * phi_2, alpha_t * phi_3);
                    x = x
                        .iter()
                        .zip(&denoised)
                        .zip(d1s.iter().zip(d2s))
                        .map(|((x, d), (d1, d2))| {
                            let d1_0 = (d - d1) / r0;
                            let d1_1 = (d1 - d2) / r1;
                            let first = d1_0 + (d1_0 - d1_1) * r0 / (r0 + r1);
                            let second = (d1_0 - d1_1) / (r0 + r1);
                            x + c1 * first - c2 * second
                        })
                        .collect();
                }
                (Some(h1), _, Some(d1s), _) => {
                    let r = h1 / step;
                    let c = alpha_t * phi_2;
                    x = x
                        .iter()
                        .zip(&denoised)
                        .zip(d1s)
                        .map(|((x, d), d1)| x + c * ((d - d1) / r))
                        .collect();
                }
                _ => {}
            }
            x = multistep.add_noise(x, &mut noise, (sigma, next), set);
        }
        denoised_2 = denoised_1.take();
        denoised_1 = Some(denoised);
        h_2 = h_1;
        h_1 = h;
    }
    Ok(x)
}
