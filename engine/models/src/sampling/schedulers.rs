//! The KSampler schedulers: which sigmas a run of `steps` steps visits (ComfyUI's `comfy/samplers.py`
//! `calculate_sigmas`, and k-diffusion's Karras and exponential schedules).

use super::ModelSampling;
use super::beta::beta_ppf;
use super::samplers::Sampler;

/// A KSampler scheduler: how the sigmas are spaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scheduler {
    /// Evenly spaced entries of the model's sigma table (`simple`).
    Simple,
    /// `normal` with the last timestep dropped (`sgm_uniform`).
    SgmUniform,
    /// Karras et al. (2022): evenly spaced in σ^(1/7) between the table's σ_min and σ_max (`karras`).
    Karras,
    /// Evenly spaced in log σ between the table's σ_min and σ_max (`exponential`).
    Exponential,
    /// Every ⌊len/steps⌋-th entry of the sigma table from the second, with 0 (`ddim_uniform`).
    DdimUniform,
    /// Table entries at the quantiles of a Beta(0.6, 0.6) distribution (`beta`, arXiv 2407.12173).
    Beta,
    /// Evenly spaced timesteps between the table's ends (`normal`).
    Normal,
    /// Linear, then quadratic, in 1 − σ up to a threshold of 0.025, times σ_max (`linear_quadratic`).
    LinearQuadratic,
    /// Evenly spaced in arctan σ between σ_max and σ_min (`kl_optimal`, arXiv 2406.00212).
    KlOptimal,
}

impl Scheduler {
    /// Every scheduler, in the order of ComfyUI's KSampler `scheduler` list.
    pub const ALL: [Scheduler; 9] = [
        Scheduler::Simple,
        Scheduler::SgmUniform,
        Scheduler::Karras,
        Scheduler::Exponential,
        Scheduler::DdimUniform,
        Scheduler::Beta,
        Scheduler::Normal,
        Scheduler::LinearQuadratic,
        Scheduler::KlOptimal,
    ];

    /// ComfyUI's name.
    pub fn name(self) -> &'static str {
        match self {
            Scheduler::Simple => "simple",
            Scheduler::SgmUniform => "sgm_uniform",
            Scheduler::Karras => "karras",
            Scheduler::Exponential => "exponential",
            Scheduler::DdimUniform => "ddim_uniform",
            Scheduler::Beta => "beta",
            Scheduler::Normal => "normal",
            Scheduler::LinearQuadratic => "linear_quadratic",
            Scheduler::KlOptimal => "kl_optimal",
        }
    }

    /// The scheduler ComfyUI calls `name`, if Kiln has it.
    pub fn from_name(name: &str) -> Option<Scheduler> {
        Scheduler::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The `steps + 1` sigmas of a run (descending, ending in 0.0), as ComfyUI's `calculate_sigmas` makes them
    /// for model sampling `ms`. `steps` 0 gives `[0.0]` (ComfyUI's widgets never ask for it).
    pub fn sigmas(self, ms: &ModelSampling, steps: usize) -> Vec<f32> {
        if steps == 0 {
            return vec![0.0];
        }
        match self {
            Scheduler::Simple => simple(ms, steps),
            Scheduler::SgmUniform => normal(ms, steps, true),
            Scheduler::Karras => {
                karras_sigmas(steps, ms.sigma_min().into(), ms.sigma_max().into(), 7.0)
            }
            Scheduler::Exponential => {
                exponential_sigmas(steps, ms.sigma_min().into(), ms.sigma_max().into())
            }
            Scheduler::Beta => beta_sigmas(ms, steps, 0.6, 0.6),
            Scheduler::Normal => normal(ms, steps, false),
            Scheduler::DdimUniform => ddim_uniform(ms, steps),
            Scheduler::LinearQuadratic => linear_quadratic(ms, steps),
            Scheduler::KlOptimal => kl_optimal(steps, ms.sigma_min().into(), ms.sigma_max().into()),
        }
    }
}

/// The sigmas for `denoise` as `BasicScheduler` (and KSampler for most samplers) makes them: the full schedule
/// when denoise > 0.9999, none when denoise ≤ 0 (the sampler then returns its input latent), else the last
/// `steps + 1` sigmas of the schedule for ⌊steps/denoise⌋ steps.
pub fn denoise_sigmas(
    scheduler: Scheduler,
    ms: &ModelSampling,
    steps: usize,
    denoise: f64,
) -> Vec<f32> {
    tail_for_denoise(steps, denoise, |n| scheduler.sigmas(ms, n))
}

/// KSampler's sigmas (ComfyUI `KSampler.set_steps`): [`denoise_sigmas`], except that for the samplers whose
/// penultimate sigma ComfyUI drops (`uni_pc`, `dpm_2`, ...) each schedule is computed one step longer and that
/// sigma dropped.
pub fn ksampler_sigmas(
    scheduler: Scheduler,
    sampler: Sampler,
    ms: &ModelSampling,
    steps: usize,
    denoise: f64,
) -> Vec<f32> {
    tail_for_denoise(steps, denoise, |n| {
        if !sampler.discards_penultimate_sigma() {
            return scheduler.sigmas(ms, n);
        }
        let mut sigmas = scheduler.sigmas(ms, n + 1);
        if sigmas.len() >= 2 {
            let last = sigmas.len() - 1;
            sigmas.remove(last - 1);
        }
        sigmas
    })
}

/// The last `steps + 1` sigmas of `schedule(⌊steps/denoise⌋)`, the whole `schedule(steps)` when denoise >
/// 0.9999, none when denoise ≤ 0.
fn tail_for_denoise(steps: usize, denoise: f64, schedule: impl Fn(usize) -> Vec<f32>) -> Vec<f32> {
    if denoise > 0.9999 {
        return schedule(steps);
    }
    if denoise <= 0.0 {
        return Vec::new();
    }
    let all = schedule((steps as f64 / denoise) as usize);
    let keep = (steps + 1).min(all.len());
    all[all.len() - keep..].to_vec()
}

/// `simple_scheduler`: entry 999 − ⌊k·1000/steps⌋ of the table for k = 0..steps, then 0.
fn simple(ms: &ModelSampling, steps: usize) -> Vec<f32> {
    let table = ms.sigmas();
    let stride = table.len() as f64 / steps as f64;
    let mut sigmas: Vec<f32> =
        (0..steps).map(|k| table[table.len() - 1 - (k as f64 * stride) as usize]).collect();
    sigmas.push(0.0);
    sigmas
}

/// `normal_scheduler`: timesteps evenly spaced from timestep(σ_max) to timestep(σ_min) (`steps` of them, or
/// `steps + 1` with the last dropped for `sgm_uniform`), each mapped back to σ, then 0. (ComfyUI takes one more
/// step instead of appending 0 when σ at the last timestep is 0, which a flow table never has.)
fn normal(ms: &ModelSampling, steps: usize, sgm: bool) -> Vec<f32> {
    let start = ms.timestep(ms.sigma_max());
    let end = ms.timestep(ms.sigma_min());
    let timesteps = if sgm {
        let mut t = linspace(start.into(), end.into(), steps + 1);
        t.pop();
        t
    } else {
        linspace(start.into(), end.into(), steps)
    };
    let mut sigmas: Vec<f32> = timesteps.into_iter().map(|t| ms.sigma_of_timestep(t)).collect();
    sigmas.push(0.0);
    sigmas
}

/// `beta_scheduler`: table entries at round(ppf(1 − k/steps)·999), repeats dropped, then 0.
pub fn beta_sigmas(ms: &ModelSampling, steps: usize, alpha: f64, beta: f64) -> Vec<f32> {
    let table = ms.sigmas();
    let total = (table.len() - 1) as f64;
    let step = 1.0 / steps as f64;
    let mut sigmas = Vec::with_capacity(steps + 1);
    let mut last = -1.0;
    for k in 0..steps {
        let q = 1.0 - k as f64 * step;
        let t = (beta_ppf(q, alpha, beta) * total).round_ties_even();
        if t != last {
            sigmas.push(table[t as usize]);
        }
        last = t;
    }
    sigmas.push(0.0);
    sigmas
}

/// k-diffusion's `get_sigmas_karras` (`KarrasScheduler`; ρ = 7 for the `karras` scheduler) on f64 ends: the ramp
/// is f32, the ends' 1/ρ powers f64 rounded to f32 where they meet the ramp, the ρ power f32; then 0.
pub fn karras_sigmas(steps: usize, sigma_min: f64, sigma_max: f64, rho: f64) -> Vec<f32> {
    let min_inv = sigma_min.powf(1.0 / rho);
    let max_inv = sigma_max.powf(1.0 / rho);
    let span = (min_inv - max_inv) as f32;
    let mut sigmas: Vec<f32> = linspace(0.0, 1.0, steps)
        .into_iter()
        .map(|r| (max_inv as f32 + r * span).powf(rho as f32))
        .collect();
    sigmas.push(0.0);
    sigmas
}

/// k-diffusion's `get_sigmas_exponential` (`ExponentialScheduler`): exp of an f32 linspace from ln σ_max to
/// ln σ_min, then 0.
pub fn exponential_sigmas(steps: usize, sigma_min: f64, sigma_max: f64) -> Vec<f32> {
    let mut sigmas: Vec<f32> =
        linspace(sigma_max.ln(), sigma_min.ln(), steps).into_iter().map(f32::exp).collect();
    sigmas.push(0.0);
    sigmas
}

/// k-diffusion's `get_sigmas_polyexponential` (`PolyexponentialScheduler`): an f32 ramp from 1 to 0 raised to ρ,
/// scaled to span ln σ_min..ln σ_max (the f64 span and ln σ_min rounded to f32 where they meet the ramp), exp
/// in f32; then 0.
pub fn polyexponential_sigmas(steps: usize, sigma_min: f64, sigma_max: f64, rho: f64) -> Vec<f32> {
    let span = (sigma_max.ln() - sigma_min.ln()) as f32;
    let base = sigma_min.ln() as f32;
    let mut sigmas: Vec<f32> = linspace(1.0, 0.0, steps)
        .into_iter()
        .map(|r| (r.powf(rho as f32) * span + base).exp())
        .collect();
    sigmas.push(0.0);
    sigmas
}

/// `SDTurboScheduler`: `steps` of the timesteps 999, 899, ..., 99, starting `10 − ⌊10·denoise⌋` in, each
/// through the model sampling's `sigma`, then 0.
pub fn turbo_sigmas(ms: &ModelSampling, steps: usize, denoise: f64) -> Vec<f32> {
    let start = 10usize.saturating_sub((10.0 * denoise) as usize);
    let mut sigmas: Vec<f32> = (0..10)
        .rev()
        .map(|k| ms.sigma_of_timestep(((k + 1) * 100 - 1) as f32))
        .skip(start)
        .take(steps)
        .collect();
    sigmas.push(0.0);
    sigmas
}

/// `ddim_scheduler`: table entries 1, 1 + ⌊len/steps⌋, ... (the table has no 0 at index 1 for a flow model, so
/// a 0 is put first), reversed.
fn ddim_uniform(ms: &ModelSampling, steps: usize) -> Vec<f32> {
    let table = ms.sigmas();
    let (mut steps, mut sigmas) = (steps, vec![0.0f32]);
    if table.len() > 1 && table[1].abs() <= 1e-5 {
        steps += 1;
        sigmas.clear();
    }
    let stride = (table.len() / steps).max(1);
    sigmas.extend(table.iter().skip(1).step_by(stride));
    sigmas.reverse();
    sigmas
}

/// `linear_quadratic_schedule` (threshold 0.025, half the steps linear): in f64 as Python computes it, then
/// f32 times σ_max.
fn linear_quadratic(ms: &ModelSampling, steps: usize) -> Vec<f32> {
    let schedule: Vec<f64> = if steps == 1 {
        vec![1.0, 0.0]
    } else {
        const THRESHOLD: f64 = 0.025;
        let linear_steps = steps / 2;
        let (n, l) = (steps as f64, linear_steps as f64);
        let step_diff = l - THRESHOLD * n;
        let quadratic_steps = n - l;
        let quadratic = step_diff / (l * quadratic_steps.powi(2));
        let linear = THRESHOLD / l - 2.0 * step_diff / quadratic_steps.powi(2);
        let constant = quadratic * l.powi(2);
        (0..linear_steps)
            .map(|i| i as f64 * THRESHOLD / l)
            .chain((linear_steps..steps).map(|i| {
                let i = i as f64;
                quadratic * i.powi(2) + linear * i + constant
            }))
            .chain(std::iter::once(1.0))
            .map(|x| 1.0 - x)
            .collect()
    };
    let max = ms.sigma_max();
    schedule.into_iter().map(|x| x as f32 * max).collect()
}

/// `kl_optimal_scheduler`: tan of (i/(n − 1))·atan σ_min + (1 − i/(n − 1))·atan σ_max in f32 (the arctangents
/// f64, rounded where they meet the f32 ramp), then 0. One step divides 0 by 0 and gives NaN, as ComfyUI's does.
fn kl_optimal(steps: usize, sigma_min: f64, sigma_max: f64) -> Vec<f32> {
    let (low, high) = (sigma_min.atan() as f32, sigma_max.atan() as f32);
    let last = (steps as f32) - 1.0;
    let mut sigmas: Vec<f32> = (0..steps)
        .map(|i| {
            let t = i as f32 / last;
            (t * low + (1.0 - t) * high).tan()
        })
        .collect();
    sigmas.push(0.0);
    sigmas
}

/// `Flux2Scheduler`: Flux.2's empirical time shift for an image of `width` × `height` pixels (one token per
/// 16 × 16), as ComfyUI's `get_schedule`: μ from the token count and the steps (f64), then over an f32
/// `linspace(1, 0, steps + 1)` the shift `e^μ / (e^μ + (1/t − 1))` in f32 (e^μ rounded to f32; the division
/// as torch's `scalar / tensor` does it, a reciprocal times the scalar).
pub fn flux2_sigmas(steps: usize, width: u64, height: u64) -> Vec<f32> {
    let tokens = (width as f64 * height as f64 / 256.0).round_ties_even();
    let mu = flux2_mu(tokens, steps as f64);
    let e = mu.exp() as f32;
    linspace(1.0, 0.0, steps + 1).into_iter().map(|t| (1.0 / (e + (1.0 / t - 1.0))) * e).collect()
}

/// ComfyUI's `compute_empirical_mu`: μ linear in the token count, interpolated between its 10- and 200-step
/// fits by the step count (the 200-step fit alone past 4300 tokens).
fn flux2_mu(tokens: f64, steps: f64) -> f64 {
    let (a1, b1) = (8.73809524e-05, 1.89833333);
    let (a2, b2) = (0.00016927, 0.45666666);
    let m200 = a2 * tokens + b2;
    if tokens > 4300.0 {
        return m200;
    }
    let m10 = a1 * tokens + b1;
    let a = (m200 - m10) / 190.0;
    let b = m200 - 200.0 * a;
    a * steps + b
}

/// k-diffusion's `get_sigmas_laplace` (`LaplaceScheduler`, Tiankai et al. 2024): n sigmas (no final zero)
/// exp(μ − β·sign(½ − x)·ln(1 − 2|½ − x| + 10⁻⁵)) over an f32 linspace x of [0, 1], clamped to [σ_min, σ_max],
/// each operation in f32 as torch runs it.
pub fn laplace_sigmas(
    steps: usize,
    sigma_min: f64,
    sigma_max: f64,
    mu: f64,
    beta: f64,
) -> Vec<f32> {
    let (mu, beta, min, max) = (mu as f32, beta as f32, sigma_min as f32, sigma_max as f32);
    linspace(0.0, 1.0, steps)
        .into_iter()
        .map(|x| {
            let d = 0.5 - x;
            let sign = if d > 0.0 {
                1.0
            } else if d < 0.0 {
                -1.0
            } else {
                0.0
            };
            let log = (1.0 - 2.0 * d.abs() + 1e-5f32).ln();
            let lambda = mu - beta * sign * log;
            lambda.exp().max(min).min(max)
        })
        .collect()
}

/// k-diffusion's `get_sigmas_vp` (`VPScheduler`, the continuous VP schedule): √expm1(β_d·t²/2 + β_min·t) over
/// an f32 linspace t from 1 to ε_s, then 0.
pub fn vp_sigmas(steps: usize, beta_d: f64, beta_min: f64, eps_s: f64) -> Vec<f32> {
    let (beta_d, beta_min) = (beta_d as f32, beta_min as f32);
    let mut sigmas: Vec<f32> = linspace(1.0, eps_s, steps)
        .into_iter()
        .map(|t| (beta_d * t.powi(2) / 2.0 + beta_min * t).exp_m1().sqrt())
        .collect();
    sigmas.push(0.0);
    sigmas
}

/// The model families of `OptimalStepsScheduler` and their searched noise levels (Pei et al., "Optimal
/// Stepsize for Diffusion Sampling"; the tables ComfyUI's `nodes_optimalsteps` ships).
pub const OPTIMAL_STEPS: [(&str, &[f64]); 3] = [
    (
        "FLUX",
        &[0.9968, 0.9886, 0.9819, 0.975, 0.966, 0.9471, 0.9158, 0.8287, 0.5512, 0.2808, 0.001],
    ),
    (
        "Wan",
        &[
            1.0, 0.997, 0.995, 0.993, 0.991, 0.989, 0.987, 0.985, 0.98, 0.975, 0.973, 0.968, 0.96,
            0.946, 0.927, 0.902, 0.864, 0.776, 0.539, 0.208, 0.001,
        ],
    ),
    (
        "Chroma",
        &[
            0.992, 0.99, 0.988, 0.985, 0.982, 0.978, 0.973, 0.968, 0.961, 0.953, 0.943, 0.931,
            0.917, 0.9, 0.881, 0.858, 0.832, 0.802, 0.769, 0.731, 0.69, 0.646, 0.599, 0.55, 0.501,
            0.451, 0.402, 0.355, 0.311, 0.27, 0.232, 0.199, 0.169, 0.143, 0.12, 0.101, 0.084, 0.07,
            0.058, 0.048, 0.001,
        ],
    ),
];

/// `OptimalStepsScheduler`: the family's noise levels, log-linearly interpolated (in f64, as numpy) to
/// `steps` + 1 where the table has another length; with `denoise` < 1 the last round(steps·denoise) + 1 of them;
/// the final one 0. `None` for a family without a table; no sigmas at `denoise` ≤ 0.
pub fn optimal_steps_sigmas(family: &str, steps: usize, denoise: f64) -> Option<Vec<f32>> {
    let (_, levels) = OPTIMAL_STEPS.iter().find(|(name, _)| *name == family)?;
    if denoise <= 0.0 {
        return Some(Vec::new());
    }
    let total =
        if denoise < 1.0 { (steps as f64 * denoise).round_ties_even() as usize } else { steps };
    let mut sigmas =
        if steps + 1 == levels.len() { levels.to_vec() } else { loglinear(levels, steps + 1) };
    let keep = (total + 1).min(sigmas.len());
    let mut tail: Vec<f32> =
        sigmas.split_off(sigmas.len() - keep).iter().map(|&s| s as f32).collect();
    if let Some(last) = tail.last_mut() {
        *last = 0.0;
    }
    Some(tail)
}

/// The OptimalSteps reference's `loglinear_interp`: a decreasing table resampled to `n` values, linear in
/// log σ over evenly spaced positions (numpy's `linspace` and `interp` in f64).
fn loglinear(levels: &[f64], n: usize) -> Vec<f64> {
    let np_linspace = |count: usize| -> Vec<f64> {
        if count == 1 {
            return vec![0.0];
        }
        let step = 1.0 / (count - 1) as f64;
        let mut xs: Vec<f64> = (0..count).map(|i| i as f64 * step).collect();
        xs[count - 1] = 1.0;
        xs
    };
    let xs = np_linspace(levels.len());
    let ys: Vec<f64> = levels.iter().rev().map(|l| l.ln()).collect();
    let mut out: Vec<f64> = np_linspace(n)
        .into_iter()
        .map(|x| {
            // numpy's `interp`: the segment xs[j] <= x < xs[j + 1], the last value at or past the end.
            let j = xs.partition_point(|&v| v <= x).saturating_sub(1);
            if j + 1 >= xs.len() {
                return ys[ys.len() - 1].exp();
            }
            if x == xs[j] {
                return ys[j].exp();
            }
            let slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j]);
            (slope * (x - xs[j]) + ys[j]).exp()
        })
        .collect();
    out.reverse();
    out
}

/// `ExtendIntermediateSigmas`: after each sigma in [`end`, `start`] (`start` < 0: no upper bound), `steps` − 1
/// more between it and the next, spaced by `spacing` (`linear`, `cosine`: sin(x·π/2), `sine`: 1 − cos(x·π/2))
/// over an f32 linspace, in f32. `None` for another spacing.
pub fn extend_intermediate_sigmas(
    sigmas: &[f32],
    steps: usize,
    start: f64,
    end: f64,
    spacing: &str,
) -> Option<Vec<f32>> {
    let shape: fn(f32) -> f32 = match spacing {
        "linear" => |x| x,
        "cosine" => |x| (x * std::f32::consts::PI / 2.0).sin(),
        "sine" => |x| 1.0 - (x * std::f32::consts::PI / 2.0).cos(),
        _ => return None,
    };
    // torch.linspace(0, 1, steps + 1)[1:-1]: the points strictly between.
    let grid = linspace(0.0, 1.0, steps + 1);
    let spaced: Vec<f32> =
        grid[1..grid.len().saturating_sub(1).max(1)].iter().map(|&x| shape(x)).collect();
    let (start, end) = (if start < 0.0 { f32::INFINITY } else { start as f32 }, end as f32);
    let mut out = Vec::with_capacity(sigmas.len() * steps);
    for pair in sigmas.windows(2) {
        let (current, next) = (pair[0], pair[1]);
        out.push(current);
        if end <= current && current <= start {
            out.extend(spaced.iter().map(|&s| s * (next - current) + current));
        }
    }
    out.extend(sigmas.last());
    Some(out)
}

/// `torch.linspace(start, end, n)` in f32 on the CPU: step = (end − start)/(n − 1) in f32; the first half counts
/// up from `start`, the second half down from `end`, each value one fused multiply-add as torch's build computes
/// it (checked bit for bit against torch 2.15 for n up to 200).
fn linspace(start: f64, end: f64, n: usize) -> Vec<f32> {
    let (start, end) = (start as f32, end as f32);
    if n == 1 {
        return vec![start];
    }
    let step = (end - start) / (n - 1) as f32;
    let halfway = n / 2;
    (0..n)
        .map(|i| {
            if i < halfway {
                step.mul_add(i as f32, start)
            } else {
                (-step).mul_add((n - i - 1) as f32, end)
            }
        })
        .collect()
}
