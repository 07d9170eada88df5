//! The CFG++ samplers (`*_cfg_pp`), as `comfy/k_diffusion/sampling.py` runs them: they step with the guided
//! x̂₀ but take the slope from the unconditional x̂₀ alone, which ComfyUI reads through a post-CFG hook that
//! also turns its CFG-1 shortcut off ([`super::Denoiser::denoise_cfg_pp`]). Also the ancestral step
//! (`get_ancestral_step`) the variance-exploding forms share with `res_multistep_ancestral`.

use super::flow::half_log_snr;
use super::samplers::{Run, step, to_d};
use crate::Result;
use crate::noise::TorchGenerator;

/// `get_ancestral_step`: the sigma to step down to and the noise to add, for η; Python's `min` keeps the
/// first of two values unless the second is smaller (so a NaN loses).
pub(super) fn ancestral_step(from: f32, to: f32, eta: f32) -> (f32, f32) {
    if eta == 0.0 {
        return (to, 0.0);
    }
    // torch squares with one multiply and takes `** 0.5` as a square root.
    let candidate = eta * (to * to * (from * from - to * to) / (from * from)).sqrt();
    let up = if candidate < to { candidate } else { to };
    ((to * to - up * up).sqrt(), up)
}

/// `sample_euler_ancestral_cfg_pp` for a flow model at η and s_noise (`euler_cfg_pp`: both 0, no noise): x̂₀
/// scaled by α_next plus the unconditional slope to the ancestral σ_down; x̂₀ into σ = 0.
pub(super) fn euler_ancestral(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    eta: f32,
    s_noise: f32,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let (denoised, uncond) = run.first_cfg_pp(i, &x, sigma)?;
        if next == 0.0 {
            x = denoised;
            continue;
        }
        let alpha_s = sigma * half_log_snr(sigma).exp();
        let alpha_t = next * half_log_snr(next).exp();
        let scaled: Vec<f32> = uncond.iter().map(|u| alpha_s * u).collect();
        let d = to_d(&x, &scaled, sigma);
        let (down, up) = ancestral_step(sigma / alpha_s, next / alpha_t, eta);
        let down = alpha_t * down;
        x = denoised.iter().zip(&d).map(|(dn, d)| alpha_t * dn + down * d).collect();
        if eta > 0.0 && s_noise > 0.0 {
            let n = noise.randn(x.len());
            x.iter_mut().zip(n).for_each(|(x, n)| *x += alpha_t * n * s_noise * up);
        }
    }
    Ok(x)
}

/// `sample_euler_pp` (`SamplerEulerCFGpp`'s "alternative"): Euler whose slope is that of x − x̂₀ + x̂₀ᵘ (the
/// latent moved by the guidance), down to every sigma, 0 included.
pub(super) fn euler_pp(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let (denoised, uncond) = run.first_cfg_pp(i, &x, sigma)?;
        let moved: Vec<f32> =
            x.iter().zip(&denoised).zip(&uncond).map(|((x, d), u)| x - d + u).collect();
        let d = to_d(&moved, &denoised, sigma);
        x = step(&x, &d, next - sigma);
    }
    Ok(x)
}

/// `sample_dpmpp_2s_ancestral_cfg_pp` (η 1, in −ln σ, not the rectified-flow form): DPM-Solver++(2S) from x
/// moved by the guidance (x + x̂₀ − x̂₀ᵘ) down to σ_down, then fresh noise; the unconditional slope into σ_down 0.
pub(super) fn dpmpp_2s_ancestral(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let t_of = |s: f32| -s.ln();
    let sigma_of = |t: f32| (-t).exp();
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let (denoised, uncond) = run.first_cfg_pp(i, &x, sigma)?;
        let (down, up) = ancestral_step(sigma, next, 1.0);
        if down == 0.0 {
            let d = to_d(&x, &uncond, sigma);
            x = denoised.iter().zip(&d).map(|(dn, d)| dn + d * down).collect();
        } else {
            let (t, t_next) = (t_of(sigma), t_of(down));
            let h = t_next - t;
            let s = t + 0.5 * h;
            let moved: Vec<f32> =
                x.iter().zip(&denoised).zip(&uncond).map(|((x, d), u)| x + (d - u)).collect();
            let (r1, e1) = (sigma_of(s) / sigma_of(t), (-h * 0.5).exp_m1());
            let x2: Vec<f32> = moved.iter().zip(&denoised).map(|(m, d)| r1 * m - e1 * d).collect();
            // ComfyUI's hook has replaced the unconditional prediction with the second call's by now, so
            // the final move pairs the first x̂₀ with the second call's unconditional one.
            let (denoised2, uncond2) = run.denoiser.denoise_cfg_pp(&x2, sigma_of(s))?;
            let (r2, e2) = (sigma_of(t_next) / sigma_of(t), (-h).exp_m1());
            x = x
                .iter()
                .zip(&denoised)
                .zip(&uncond2)
                .zip(&denoised2)
                .map(|(((x, d), u), d2)| r2 * (x + (d - u)) - e2 * d2)
                .collect();
        }
        if next > 0.0 {
            let n = noise.randn(x.len());
            x.iter_mut().zip(n).for_each(|(x, n)| *x += n * up);
        }
    }
    Ok(x)
}

/// `sample_dpmpp_2m_cfg_pp`: DPM-Solver++(2M) whose multistep correction uses the previous unconditional x̂₀.
pub(super) fn dpmpp_2m(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    let t_of = |s: f32| -s.ln();
    let mut old_uncond: Option<Vec<f32>> = None;
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let (denoised, uncond) = run.first_cfg_pp(i, &x, sigma)?;
        let (t, t_next) = (t_of(sigma), t_of(next));
        let h = t_next - t;
        let e = (-h).exp();
        let mix: Vec<f32> = match &old_uncond {
            Some(old) if next != 0.0 => {
                let r = (t - t_of(sigmas[i - 1])) / h;
                let c = (-h).exp_m1() * (1.0 / (2.0 * r));
                uncond
                    .iter()
                    .zip(&denoised)
                    .zip(old)
                    .map(|((u, d), o)| -e * u - c * (d - o))
                    .collect()
            }
            _ => uncond.iter().map(|u| -e * u).collect(),
        };
        x = denoised.iter().zip(&mix).zip(&x).map(|((d, m), x)| d + m + e * x).collect();
        old_uncond = Some(uncond);
    }
    Ok(x)
}
