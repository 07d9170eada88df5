//! UniPC (`uni_pc`, `uni_pc_bh2`) as ComfyUI's `comfy/extra_samplers/uni_pc.py` runs it: the multistep
//! predictor-corrector of UniPC with B(h) = h (bh1) or eʰ − 1 (bh2), in data prediction, on the variance-preserving
//! view of k-diffusion's sigmas (`SigmaConvert`: α = 1/√(1+σ²), std = σ/√(1+σ²)), order min(3, sigmas − 2), lower
//! orders for the first and last steps, no corrector after the last step.
//!
//! ComfyUI's quirks are kept, since its images are the reference: a last sigma of 0 becomes 0.001 in the
//! caller's sigmas too (Python's `sigmas[:]` is a view), so the caller's inverse noise scaling divides by
//! 1 − 0.001; the model runs on the VE input x·√(1+σ²) and its x̂₀ is turned into noise and back. Scalars are f32
//! as torch's 0-dim tensors are; the small linear systems are solved by LU with partial pivoting in f32, as
//! LAPACK's `sgesv` does (equal up to rounding).

use super::linalg::solve;
use super::samplers::{Run, Step};
use crate::Result;

/// Which UniPC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Variant {
    /// B(h) = h (`uni_pc`).
    Bh1,
    /// B(h) = eʰ − 1 (`uni_pc_bh2`).
    Bh2,
}

/// `SigmaConvert.marginal_log_mean_coeff`: ½·ln(1/(σ² + 1)).
fn log_mean_coeff(sigma: f32) -> f32 {
    0.5 * (1.0 / (sigma * sigma + 1.0)).ln()
}

/// α(σ) = exp(log_mean_coeff).
fn alpha(sigma: f32) -> f32 {
    log_mean_coeff(sigma).exp()
}

/// std(σ) = √(1 − exp(2·log_mean_coeff)).
fn std(sigma: f32) -> f32 {
    (1.0 - (2.0 * log_mean_coeff(sigma)).exp()).sqrt()
}

/// λ(σ) = log_mean_coeff − ½·ln(1 − exp(2·log_mean_coeff)).
fn lambda(sigma: f32) -> f32 {
    let c = log_mean_coeff(sigma);
    c - 0.5 * (1.0 - (2.0 * c).exp()).ln()
}

/// The model as UniPC calls it: the data prediction at `t` for the normalised state `x`, through ComfyUI's
/// `predict_eps_sigma` (the model sees x·√(σ² + 1)) and `data_prediction_fn`.
fn data_prediction(run: &mut Run<'_>, x: &[f32], t: f32) -> Result<Vec<f32>> {
    let up = (t * t + 1.0).sqrt();
    let input: Vec<f32> = x.iter().map(|v| v * up).collect();
    let denoised = run.denoiser.denoise(&input, t)?;
    let (alpha_t, std_t) = (alpha(t), std(t));
    Ok(x.iter()
        .zip(input.iter().zip(&denoised))
        .map(|(&x, (&i, &d))| {
            let eps = (i - d) / t;
            (x - std_t * eps) / alpha_t
        })
        .collect())
}

/// The model's past data predictions (`models[i]` at `times[i]`, oldest first), ComfyUI's `model_prev_list`
/// and `t_prev_list`.
struct History {
    models: Vec<Vec<f32>>,
    times: Vec<f32>,
}

/// One step of `multistep_uni_pc_bh_update` from `history` to `t` at `order`: the new state, and the model's
/// value there when the corrector ran.
fn update(
    run: &mut Run<'_>,
    variant: Variant,
    x: &[f32],
    history: &History,
    (t, order, use_corrector): (f32, usize, bool),
) -> Result<(Vec<f32>, Option<Vec<f32>>)> {
    let (models, times) = (&history.models, &history.times);
    let last = times.len() - 1;
    let (t_prev_0, model_prev_0) = (times[last], &models[last]);
    let (lambda_prev_0, lambda_t) = (lambda(t_prev_0), lambda(t));
    let (sigma_prev_0, sigma_t) = (std(t_prev_0), std(t));
    let alpha_t = log_mean_coeff(t).exp();
    let h = lambda_t - lambda_prev_0;

    let mut rks = Vec::with_capacity(order);
    let mut d1s: Vec<Vec<f32>> = Vec::with_capacity(order);
    for i in 1..order {
        let (t_prev_i, model_prev_i) = (times[last - i], &models[last - i]);
        let rk = (lambda(t_prev_i) - lambda_prev_0) / h;
        rks.push(rk);
        d1s.push(model_prev_i.iter().zip(model_prev_0).map(|(m, m0)| (m - m0) / rk).collect());
    }
    rks.push(1.0);

    let hh = -h;
    let h_phi_1 = hh.exp_m1();
    let mut h_phi_k = h_phi_1 / hh - 1.0;
    let mut factorial = 1.0f32;
    let b_h = match variant {
        Variant::Bh1 => hh,
        Variant::Bh2 => hh.exp_m1(),
    };
    let mut r = Vec::with_capacity(order);
    let mut b = Vec::with_capacity(order);
    for i in 1..=order {
        r.push(rks.iter().map(|rk| rk.powi(i as i32 - 1)).collect::<Vec<f32>>());
        b.push(h_phi_k * factorial / b_h);
        factorial *= (i + 1) as f32;
        h_phi_k = h_phi_k / hh - 1.0 / factorial;
    }

    let rhos_p = if d1s.is_empty() {
        Vec::new()
    } else if order == 2 {
        vec![0.5]
    } else {
        let sub: Vec<Vec<f32>> =
            r[..order - 1].iter().map(|row| row[..order - 1].to_vec()).collect();
        solve(sub, b[..order - 1].to_vec())
    };
    let rhos_c = match (use_corrector, order) {
        (false, _) => Vec::new(),
        (true, 1) => vec![0.5],
        (true, _) => solve(r.clone(), b.clone()),
    };

    let ratio = sigma_t / sigma_prev_0;
    let coeff = alpha_t * h_phi_1;
    let x_t_: Vec<f32> = x.iter().zip(model_prev_0).map(|(x, m)| ratio * x - coeff * m).collect();
    let scale = alpha_t * b_h;
    // Σₖ D1s[k]·ρ[k], in k order (torch.tensordot over the k dimension).
    let weighted = |rhos: &[f32], i: usize| -> f32 {
        d1s.iter().zip(rhos).fold(0.0f32, |acc, (d, rho)| acc + d[i] * rho)
    };
    let x_t: Vec<f32> = if d1s.is_empty() {
        // `pred_res = 0`: a zero times the scale, subtracted.
        x_t_.iter().map(|v| v - scale * 0.0).collect()
    } else {
        (0..x.len()).map(|i| x_t_[i] - scale * weighted(&rhos_p, i)).collect()
    };
    if !use_corrector {
        return Ok((x_t, None));
    }
    let model_t = data_prediction(run, &x_t, t)?;
    let rho_last = rhos_c[rhos_c.len() - 1];
    let corrected = (0..x.len())
        .map(|i| {
            let corr = if d1s.is_empty() { 0.0 } else { weighted(&rhos_c[..rhos_c.len() - 1], i) };
            let d1_t = model_t[i] - model_prev_0[i];
            x_t_[i] - scale * (corr + rho_last * d1_t)
        })
        .collect();
    Ok((corrected, Some(model_t)))
}

/// `sample_unipc`: `x` is the noise-scaled latent at `sigmas[0]`; returns the latent at the last sigma, which a
/// last 0 has become 0.001 (see the module docs).
pub(crate) fn sample(
    run: &mut Run<'_>,
    variant: Variant,
    x: Vec<f32>,
    sigmas: &mut [f32],
) -> Result<Vec<f32>> {
    let last = sigmas.len() - 1;
    if sigmas[last] == 0.0 {
        sigmas[last] = 0.001;
    }
    let timesteps: Vec<f32> = sigmas.to_vec();
    let first_scale = (1.0 + timesteps[0] * timesteps[0]).sqrt();
    let mut x: Vec<f32> = x.iter().map(|v| v / first_scale).collect();
    let order = timesteps.len().saturating_sub(2).min(3);
    let steps = timesteps.len() - 1;
    let mut history = History {
        models: Vec::with_capacity(order.max(1)),
        times: Vec::with_capacity(order.max(1)),
    };
    for step_index in 0..steps {
        if step_index == 0 {
            history.models.push(data_prediction(run, &x, timesteps[0])?);
            history.times.push(timesteps[0]);
        } else if step_index < order {
            let t = timesteps[step_index];
            let (next, model) = update(run, variant, &x, &history, (t, step_index, true))?;
            x = next;
            let model = match model {
                Some(m) => m,
                None => data_prediction(run, &x, t)?,
            };
            history.models.push(model);
            history.times.push(t);
        } else {
            let extra = usize::from(step_index == steps - 1);
            for (step, &t) in timesteps.iter().enumerate().skip(step_index).take(1 + extra) {
                let step_order = order.min(steps + 1 - step);
                let use_corrector = step != steps;
                let (next, model) =
                    update(run, variant, &x, &history, (t, step_order, use_corrector))?;
                x = next;
                // Shift the history by one (order − 1 moves, as Python assigns); the newest entry is
                // replaced unless this was the last step.
                for i in 0..order.saturating_sub(1) {
                    history.times[i] = history.times[i + 1];
                    history.models[i] = history.models[i + 1].clone();
                }
                let newest = history.times.len() - 1;
                history.times[newest] = t;
                if step < steps {
                    history.models[newest] = match model {
                        Some(m) => m,
                        None => data_prediction(run, &x, t)?,
                    };
                }
            }
        }
        let denoised = &history.models[history.models.len() - 1];
        (run.on_step)(Step {
            index: step_index,
            total: run.total,
            x: &x,
            denoised,
            sigma: timesteps[step_index],
        })?;
    }
    let end = alpha(timesteps[steps]);
    Ok(x.iter().map(|v| v / end).collect())
}
