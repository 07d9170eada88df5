//! DPM-Solver with its own time steps, `dpm_fast` and `dpm_adaptive`, as k-diffusion's `DPMSolver` runs them in
//! ComfyUI: only the schedule's first and last non-zero sigmas are used, t = −ln σ, and the model is read as
//! ε = (x − x̂₀)/σ. Both run at η = 0 (KSampler's), so no noise is added. Scalars are f32 as torch's 0-dim
//! tensors are; a Python float meeting one is rounded to f32 first.

use super::cfg_pp::ancestral_step;
use super::samplers::{AdaptiveSettings, Run};
use crate::Result;
use crate::noise::TorchGenerator;

/// σ of a DPM-Solver time.
fn sigma(t: f32) -> f32 {
    (-t).exp()
}

/// The model's ε at time `t`, `(x − x̂₀)/σ(t)`; `first` reports it as step `index`'s first call.
fn eps(run: &mut Run<'_>, x: &[f32], t: f32, first: Option<usize>) -> Result<Vec<f32>> {
    let s = sigma(t);
    let denoised = match first {
        Some(index) => run.first(index, x, s)?,
        None => run.denoiser.denoise(x, s)?,
    };
    Ok(x.iter().zip(&denoised).map(|(x, d)| (x - d) / s).collect())
}

/// `x − a·e`.
fn sub(x: &[f32], a: f32, e: &[f32]) -> Vec<f32> {
    x.iter().zip(e).map(|(x, e)| x - a * e).collect()
}

/// `x − a·e − b·(f − e)`, each product rounded as torch's separate ops round them.
fn sub2(x: &[f32], a: f32, e: &[f32], b: f32, f: &[f32]) -> Vec<f32> {
    x.iter().zip(e).zip(f).map(|((x, e), f)| (x - a * e) - b * (f - e)).collect()
}

/// The model evaluations a step shares between its solvers (k-diffusion's `eps_cache`).
#[derive(Default)]
struct Cache {
    eps: Option<Vec<f32>>,
    eps_r1: Option<Vec<f32>>,
}

/// `dpm_solver_1_step` from `x` at `t` to `t_next` with the cached ε at `t`.
fn step1(cache: &Cache, x: &[f32], (t, t_next): (f32, f32)) -> Vec<f32> {
    let e = cache.eps.as_deref().expect("ε at t is evaluated first");
    sub(x, sigma(t_next) * (t_next - t).exp_m1(), e)
}

/// `dpm_solver_2_step` from `x` at `t` to `t_next` with the midpoint at `r1`.
fn step2(
    run: &mut Run<'_>,
    cache: &mut Cache,
    x: &[f32],
    (t, t_next): (f32, f32),
    r1: f64,
) -> Result<Vec<f32>> {
    let h = t_next - t;
    let e = cache.eps.clone().expect("ε at t is evaluated first");
    let rh = r1 as f32 * h;
    let s1 = t + rh;
    let u1 = sub(x, sigma(s1) * rh.exp_m1(), &e);
    let e1 = match &cache.eps_r1 {
        Some(e1) => e1.clone(),
        None => eps(run, &u1, s1, None)?,
    };
    cache.eps_r1 = Some(e1.clone());
    let a = sigma(t_next) * h.exp_m1();
    let b = sigma(t_next) / (2.0 * r1) as f32 * h.exp_m1();
    Ok(sub2(x, a, &e, b, &e1))
}

/// `dpm_solver_3_step` from `x` at `t` to `t_next` (r1 = ⅓, r2 = ⅔).
fn step3(
    run: &mut Run<'_>,
    cache: &mut Cache,
    x: &[f32],
    (t, t_next): (f32, f32),
) -> Result<Vec<f32>> {
    let (r1, r2) = (1.0f64 / 3.0, 2.0f64 / 3.0);
    let h = t_next - t;
    let e = cache.eps.clone().expect("ε at t is evaluated first");
    let r1h = r1 as f32 * h;
    let r2h = r2 as f32 * h;
    let (s1, s2) = (t + r1h, t + r2h);
    let e1 = match &cache.eps_r1 {
        Some(e1) => e1.clone(),
        None => {
            let u1 = sub(x, sigma(s1) * r1h.exp_m1(), &e);
            eps(run, &u1, s1, None)?
        }
    };
    cache.eps_r1 = Some(e1.clone());
    let a2 = sigma(s2) * r2h.exp_m1();
    let b2 = sigma(s2) * (r2 / r1) as f32 * (r2h.exp_m1() / r2h - 1.0);
    let u2 = sub2(x, a2, &e, b2, &e1);
    let e2 = eps(run, &u2, s2, None)?;
    let a = sigma(t_next) * h.exp_m1();
    let b = sigma(t_next) / r2 as f32 * (h.exp_m1() / h - 1.0);
    Ok(sub2(x, a, &e, b, &e2))
}

/// The first and last non-zero sigmas of the schedule, as times: KSampler's `dpm_fast` and `dpm_adaptive`
/// take σ_max = σ₀ and σ_min = the last sigma, or the one before a last 0.
fn span(sigmas: &[f32]) -> (f32, f32) {
    let last = sigmas[sigmas.len() - 1];
    let sigma_min = if last == 0.0 { sigmas[sigmas.len() - 2] } else { last };
    (-sigmas[0].ln(), -sigma_min.ln())
}

/// `sample_dpm_fast`: as many model calls as steps, in steps of order 3 on an even grid of t, the last of
/// order `nfe mod 3` (or 2 then 1).
pub(super) fn dpm_fast(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    let nfe = sigmas.len() - 1;
    let (t_start, t_end) = span(sigmas);
    let m = nfe / 3 + 1;
    let ts: Vec<f32> = crate::rope::linspace(t_start, t_end, m + 1).collect();
    let orders: Vec<usize> = if nfe.is_multiple_of(3) {
        std::iter::repeat_n(3, m - 2).chain([2, 1]).collect()
    } else {
        std::iter::repeat_n(3, m - 1).chain([nfe % 3]).collect()
    };
    for (i, order) in orders.into_iter().enumerate() {
        let (t, t_next) = (ts[i], ts[i + 1]);
        let mut cache = Cache { eps: Some(eps(run, &x, t, Some(i))?), eps_r1: None };
        x = match order {
            1 => step1(&cache, &x, (t, t_next)),
            2 => step2(run, &mut cache, &x, (t, t_next), 0.5)?,
            _ => step3(run, &mut cache, &x, (t, t_next))?,
        };
    }
    Ok(x)
}

/// k-diffusion's `PIDStepSizeController`, in f64 as Python computes it.
struct Pid {
    h: f64,
    b1: f64,
    b2: f64,
    b3: f64,
    accept_safety: f64,
    errs: Option<[f64; 3]>,
}

impl Pid {
    /// The controller from h₀, the (p, i, d) coefficients and the order they are divided by.
    fn new(h: f64, [p, i, d]: [f64; 3], order: f64, accept_safety: f64) -> Pid {
        let (b1, b2, b3) = ((p + i + d) / order, -(p + 2.0 * d) / order, d / order);
        Pid { h, b1, b2, b3, accept_safety, errs: None }
    }

    /// Proposes the next step from this one's error; whether to accept this one.
    fn propose(&mut self, error: f32) -> bool {
        let inv = 1.0 / (f64::from(error) + 1e-8);
        let errs = self.errs.get_or_insert([inv; 3]);
        errs[0] = inv;
        let factor = errs[0].powf(self.b1) * errs[1].powf(self.b2) * errs[2].powf(self.b3);
        let factor = 1.0 + (factor - 1.0).atan();
        let accept = factor >= self.accept_safety;
        if accept {
            errs[2] = errs[1];
            errs[1] = errs[0];
        }
        self.h *= factor;
        accept
    }
}

/// `sample_dpm_adaptive` at `set` (KSampler's: order 3, rtol 0.05, atol 0.0078, h₀ 0.05, η 0): each attempt
/// takes a lower- and a higher-order step (order + 1 ... order model calls) and the controller accepts it or
/// shrinks the step by their difference, until t reaches the end. With η > 0 each accepted step is
/// ancestral, its noise drawn from `noise` (the draw happens on every accepted step, as ComfyUI's does).
pub(super) fn dpm_adaptive(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    set: &AdaptiveSettings,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let (t_start, t_end) = span(sigmas);
    let (atol, rtol) = (set.atol as f32, set.rtol as f32);
    let pid_order = if set.eta > 0.0 { 1.5 } else { set.order as f64 };
    let mut pid = Pid::new(set.h_init.abs(), set.pid, pid_order, set.accept_safety);
    let mut s = t_start;
    let mut x_prev = x.clone();
    let mut attempt = 0;
    let n = x.len();
    let scale = (n as f64).sqrt() as f32;
    while s < t_end - 1e-5f32 {
        let t = t_end.min(s + pid.h as f32);
        let (t_, su) = if set.eta > 0.0 {
            let (down, _) = ancestral_step(sigma(s), sigma(t), set.eta);
            let t_ = t_end.min(-down.ln());
            (t_, (sigma(t) * sigma(t) - sigma(t_) * sigma(t_)).sqrt())
        } else {
            (t, 0.0)
        };
        let mut cache = Cache { eps: Some(eps(run, &x, s, Some(attempt))?), eps_r1: None };
        let (low, high) = if set.order == 2 {
            let low = step1(&cache, &x, (s, t_));
            (low, step2(run, &mut cache, &x, (s, t_), 0.5)?)
        } else {
            let low = step2(run, &mut cache, &x, (s, t_), 1.0 / 3.0)?;
            (low, step3(run, &mut cache, &x, (s, t_))?)
        };
        let sum: f32 = low
            .iter()
            .zip(&high)
            .zip(&x_prev)
            .map(|((l, h), p)| {
                let delta = atol.max(rtol * l.abs().max(p.abs()));
                let r = (l - h) / delta;
                r * r
            })
            .sum();
        let error = sum.sqrt() / scale;
        if pid.propose(error) {
            x_prev = low;
            let drawn = noise.randn(n);
            x = high.iter().zip(&drawn).map(|(h, z)| h + su * set.s_noise * z).collect();
            s = t;
        }
        attempt += 1;
    }
    Ok(x)
}
