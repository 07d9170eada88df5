//! The KSampler samplers, as ComfyUI's `comfy/k_diffusion/sampling.py` runs them for a flow (`CONST`) model, and
//! those without a `CONST` branch for a discrete-time one too ([`Sampler::runs_discrete_models`]).
//!
//! Every sampler works on x already noise-scaled by the caller ([`super::ModelSampling::noise_scaling`] at the
//! first sigma) and returns the latent at the last sigma, before `inverse_noise_scaling`. The scalar maths on
//! sigmas is f32, like torch's 0-dim f32 sigma tensors, and each elementwise torch op is one rounded f32 op here.

use super::ModelSampling;
use super::cfg_pp;
use super::dpm_solver;
use super::er_sde;
use super::multistep::{self, Ipndm};
use super::sa_solver;
use super::sde::{self, SolverType};
use super::second_order;
use super::seeds::{self, Seeds2};
use super::unipc;
use crate::Result;
use crate::noise::TorchGenerator;

/// The model as the sampler sees it: the denoised estimate x̂₀ for latent `x` at noise level `sigma`, already
/// CFG-combined (the caller runs the model, converts its output with
/// [`super::ModelSampling::calculate_denoised`] and applies CFG).
pub trait Denoiser {
    /// x̂₀ for `x` at `sigma` (same length as `x`).
    fn denoise(&mut self, x: &[f32], sigma: f32) -> Result<Vec<f32>>;

    /// For the CFG++ samplers: x̂₀ and the unconditional prediction alone, which ComfyUI hands them through a
    /// post-CFG hook that also turns its CFG-1 shortcut off (so the unconditional side is always evaluated and
    /// combined, even at CFG 1). An error where there is no unconditional side.
    fn denoise_cfg_pp(&mut self, x: &[f32], sigma: f32) -> Result<(Vec<f32>, Vec<f32>)>;
}

/// What a sampler reports after the model call that starts each step (ComfyUI's sampler callback): for
/// progress, previews and interrupt.
#[derive(Clone, Copy, Debug)]
pub struct Step<'a> {
    /// The step, from 0.
    pub index: usize,
    /// The number of steps (sigmas − 1).
    pub total: usize,
    /// The latent at the start of the step (before this step's update).
    pub x: &'a [f32],
    /// The model's x̂₀ for `x`.
    pub denoised: &'a [f32],
    /// The step's sigma.
    pub sigma: f32,
}

/// A KSampler sampler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Sampler {
    /// First-order Euler (`euler`).
    Euler,
    /// Euler with the unconditional slope (`euler_cfg_pp`).
    EulerCfgPp,
    /// `SamplerEulerCFGpp`'s "alternative" (`sample_euler_pp`): Euler with the slope of x − x̂₀ + x̂₀ᵘ; no
    /// KSampler name.
    EulerPp,
    /// Euler with fresh noise each step, the rectified-flow form ComfyUI uses for flow models
    /// (`euler_ancestral`, η = 1).
    EulerAncestral,
    /// `euler_ancestral` with the unconditional slope, in variance-exploding form (`euler_ancestral_cfg_pp`).
    EulerAncestralCfgPp,
    /// Heun's second-order method, two model calls per step but the last (`heun`).
    Heun,
    /// Heun with a third call where it can, weighted by the sigmas (`heunpp2`).
    Heunpp2,
    /// Deterministic exponential Heun in the half-log-SNR (`exp_heun_2_x0`).
    ExpHeun2X0,
    /// `exp_heun_2_x0` with noise injected, η = 1 (`exp_heun_2_x0_sde`).
    ExpHeun2X0Sde,
    /// DPM-Solver-2: a model call at the log-midpoint (`dpm_2`).
    Dpm2,
    /// DPM-Solver-2 steps with fresh noise, rectified-flow form (`dpm_2_ancestral`).
    Dpm2Ancestral,
    /// Linear multistep, order 4 (`lms`).
    Lms,
    /// DPM-Solver on its own even grid of t = −ln σ between the schedule's ends, orders 3, 2, 1 (`dpm_fast`).
    DpmFast,
    /// DPM-Solver-23 with adaptive steps between the schedule's ends (`dpm_adaptive`).
    DpmAdaptive,
    /// DPM-Solver++(2S) steps with fresh noise, rectified-flow form (`dpmpp_2s_ancestral`).
    Dpmpp2sAncestral,
    /// `dpmpp_2s_ancestral` with CFG++, not in rectified-flow form (`dpmpp_2s_ancestral_cfg_pp`).
    Dpmpp2sAncestralCfgPp,
    /// DPM-Solver++ SDE: a model call at the λ-midpoint, torchsde's Brownian noise (`dpmpp_sde`).
    DpmppSde,
    /// `dpmpp_sde` with the tree on the latent's device; the same on the CPU (`dpmpp_sde_gpu`).
    DpmppSdeGpu,
    /// DPM-Solver++(2M) (`dpmpp_2m`).
    Dpmpp2m,
    /// DPM-Solver++(2M) with CFG++ (`dpmpp_2m_cfg_pp`).
    Dpmpp2mCfgPp,
    /// DPM-Solver++(2M) SDE, midpoint, η = 1, in half-log-SNR for flow models (`dpmpp_2m_sde`).
    Dpmpp2mSde,
    /// `dpmpp_2m_sde` with the tree on the latent's device (`dpmpp_2m_sde_gpu`).
    Dpmpp2mSdeGpu,
    /// DPM-Solver++(2M) SDE with Heun's correction (`dpmpp_2m_sde_heun`).
    Dpmpp2mSdeHeun,
    /// `dpmpp_2m_sde_heun` with the tree on the latent's device (`dpmpp_2m_sde_heun_gpu`).
    Dpmpp2mSdeHeunGpu,
    /// DPM-Solver++(3M) SDE (`dpmpp_3m_sde`).
    Dpmpp3mSde,
    /// `dpmpp_3m_sde` with the tree on the latent's device (`dpmpp_3m_sde_gpu`).
    Dpmpp3mSdeGpu,
    /// The DDPM ancestral step in variance-preserving form, as ComfyUI runs it for any model (`ddpm`).
    Ddpm,
    /// Latent consistency sampling: x̂₀, re-noised to the next sigma (`lcm`).
    Lcm,
    /// Improved pseudo-numerical multistep, Adams–Bashforth up to order 4 (`ipndm`).
    Ipndm,
    /// `ipndm` with coefficients for uneven steps (`ipndm_v`).
    IpndmV,
    /// Diffusion exponential integrator sampler, order 3, coefficients integrated numerically (`deis`).
    Deis,
    /// Second-order exponential multistep, no noise (`res_multistep`).
    ResMultistep,
    /// `res_multistep` with CFG++ (`res_multistep_cfg_pp`).
    ResMultistepCfgPp,
    /// `res_multistep` with fresh noise, η = 1 (`res_multistep_ancestral`).
    ResMultistepAncestral,
    /// Both (`res_multistep_ancestral_cfg_pp`).
    ResMultistepAncestralCfgPp,
    /// Euler corrected by the change of the slope, γ = 2 (`gradient_estimation`).
    GradientEstimation,
    /// `gradient_estimation` with CFG++ (`gradient_estimation_cfg_pp`).
    GradientEstimationCfgPp,
    /// Extended reverse-time SDE solver, three stages (`er_sde`).
    ErSde,
    /// SEEDS-2: two stages in the half-log-SNR with stochastic noise (`seeds_2`).
    Seeds2,
    /// SEEDS-3: three stages (`seeds_3`).
    Seeds3,
    /// The stochastic Adams predictor–corrector (`sa_solver`).
    SaSolver,
    /// `sa_solver` with the corrected state evaluated again (`sa_solver_pece`).
    SaSolverPece,
    /// DDIM, which ComfyUI runs as Euler (with random noise for a masked latent's kept area) (`ddim`).
    Ddim,
    /// UniPC with B(h) = h (`uni_pc`).
    UniPc,
    /// UniPC with B(h) = eʰ − 1 (`uni_pc_bh2`).
    UniPcBh2,
    /// The autoregressive sampler of causal video models (`ar_video`, `SamplerARVideo`'s; not in KSampler's
    /// list): [`super::sample_ar_video`], which the caller runs with the model's cache, not [`sample_with`].
    ArVideo,
}

impl Sampler {
    /// Every sampler, in the order of ComfyUI's KSampler `sampler_name` list.
    pub const ALL: [Sampler; 44] = [
        Sampler::Euler,
        Sampler::EulerCfgPp,
        Sampler::EulerAncestral,
        Sampler::EulerAncestralCfgPp,
        Sampler::Heun,
        Sampler::Heunpp2,
        Sampler::ExpHeun2X0,
        Sampler::ExpHeun2X0Sde,
        Sampler::Dpm2,
        Sampler::Dpm2Ancestral,
        Sampler::Lms,
        Sampler::DpmFast,
        Sampler::DpmAdaptive,
        Sampler::Dpmpp2sAncestral,
        Sampler::Dpmpp2sAncestralCfgPp,
        Sampler::DpmppSde,
        Sampler::DpmppSdeGpu,
        Sampler::Dpmpp2m,
        Sampler::Dpmpp2mCfgPp,
        Sampler::Dpmpp2mSde,
        Sampler::Dpmpp2mSdeGpu,
        Sampler::Dpmpp2mSdeHeun,
        Sampler::Dpmpp2mSdeHeunGpu,
        Sampler::Dpmpp3mSde,
        Sampler::Dpmpp3mSdeGpu,
        Sampler::Ddpm,
        Sampler::Lcm,
        Sampler::Ipndm,
        Sampler::IpndmV,
        Sampler::Deis,
        Sampler::ResMultistep,
        Sampler::ResMultistepCfgPp,
        Sampler::ResMultistepAncestral,
        Sampler::ResMultistepAncestralCfgPp,
        Sampler::GradientEstimation,
        Sampler::GradientEstimationCfgPp,
        Sampler::ErSde,
        Sampler::Seeds2,
        Sampler::Seeds3,
        Sampler::SaSolver,
        Sampler::SaSolverPece,
        Sampler::Ddim,
        Sampler::UniPc,
        Sampler::UniPcBh2,
    ];

    /// ComfyUI's name.
    pub fn name(self) -> &'static str {
        match self {
            Sampler::Euler => "euler",
            Sampler::EulerCfgPp => "euler_cfg_pp",
            Sampler::EulerPp => "euler_cfg_pp (alternative)",
            Sampler::EulerAncestral => "euler_ancestral",
            Sampler::EulerAncestralCfgPp => "euler_ancestral_cfg_pp",
            Sampler::Heun => "heun",
            Sampler::Heunpp2 => "heunpp2",
            Sampler::ExpHeun2X0 => "exp_heun_2_x0",
            Sampler::ExpHeun2X0Sde => "exp_heun_2_x0_sde",
            Sampler::Dpm2 => "dpm_2",
            Sampler::Dpm2Ancestral => "dpm_2_ancestral",
            Sampler::Lms => "lms",
            Sampler::DpmFast => "dpm_fast",
            Sampler::DpmAdaptive => "dpm_adaptive",
            Sampler::Dpmpp2sAncestral => "dpmpp_2s_ancestral",
            Sampler::Dpmpp2sAncestralCfgPp => "dpmpp_2s_ancestral_cfg_pp",
            Sampler::DpmppSde => "dpmpp_sde",
            Sampler::DpmppSdeGpu => "dpmpp_sde_gpu",
            Sampler::Dpmpp2m => "dpmpp_2m",
            Sampler::Dpmpp2mCfgPp => "dpmpp_2m_cfg_pp",
            Sampler::Dpmpp2mSde => "dpmpp_2m_sde",
            Sampler::Dpmpp2mSdeGpu => "dpmpp_2m_sde_gpu",
            Sampler::Dpmpp2mSdeHeun => "dpmpp_2m_sde_heun",
            Sampler::Dpmpp2mSdeHeunGpu => "dpmpp_2m_sde_heun_gpu",
            Sampler::Dpmpp3mSde => "dpmpp_3m_sde",
            Sampler::Dpmpp3mSdeGpu => "dpmpp_3m_sde_gpu",
            Sampler::Ddpm => "ddpm",
            Sampler::Lcm => "lcm",
            Sampler::Ipndm => "ipndm",
            Sampler::IpndmV => "ipndm_v",
            Sampler::Deis => "deis",
            Sampler::ResMultistep => "res_multistep",
            Sampler::ResMultistepCfgPp => "res_multistep_cfg_pp",
            Sampler::ResMultistepAncestral => "res_multistep_ancestral",
            Sampler::ResMultistepAncestralCfgPp => "res_multistep_ancestral_cfg_pp",
            Sampler::GradientEstimation => "gradient_estimation",
            Sampler::GradientEstimationCfgPp => "gradient_estimation_cfg_pp",
            Sampler::ErSde => "er_sde",
            Sampler::Seeds2 => "seeds_2",
            Sampler::Seeds3 => "seeds_3",
            Sampler::SaSolver => "sa_solver",
            Sampler::SaSolverPece => "sa_solver_pece",
            Sampler::Ddim => "ddim",
            Sampler::UniPc => "uni_pc",
            Sampler::UniPcBh2 => "uni_pc_bh2",
            Sampler::ArVideo => "ar_video",
        }
    }

    /// Whether KSampler computes one more step and drops the penultimate sigma for this sampler (ComfyUI's
    /// `DISCARD_PENULTIMATE_SIGMA_SAMPLERS`).
    pub fn discards_penultimate_sigma(self) -> bool {
        matches!(self, Sampler::Dpm2 | Sampler::Dpm2Ancestral | Sampler::UniPc | Sampler::UniPcBh2)
    }

    /// Whether Kiln runs this sampler on a model with discrete-time sampling (Lotus): those whose ComfyUI code has
    /// no `CONST` branch (it reads only sigmas and x̂₀, or the model's own noise scaling). The others Kiln has
    /// in their flow form only: the ancestral samplers ComfyUI switches to their `_RF` form for flow models, and
    /// those that read a flow model's half-log-SNR (the SEEDS, ER-SDE, SA-Solver and exponential-Heun samplers,
    /// `euler_cfg_pp` and `euler_ancestral_cfg_pp`); the DPM-Solver++ SDE samplers take either's half-log-SNR.
    pub fn runs_discrete_models(self) -> bool {
        matches!(
            self,
            Sampler::Euler
                | Sampler::EulerAncestral
                | Sampler::EulerPp
                | Sampler::Ddim
                | Sampler::Heun
                | Sampler::Heunpp2
                | Sampler::Dpm2
                | Sampler::Lms
                | Sampler::DpmFast
                | Sampler::DpmAdaptive
                | Sampler::Dpmpp2m
                | Sampler::Dpmpp2mCfgPp
                | Sampler::Dpmpp2sAncestralCfgPp
                | Sampler::Ddpm
                | Sampler::Lcm
                | Sampler::Ipndm
                | Sampler::IpndmV
                | Sampler::Deis
                | Sampler::ResMultistep
                | Sampler::ResMultistepCfgPp
                | Sampler::ResMultistepAncestral
                | Sampler::ResMultistepAncestralCfgPp
                | Sampler::GradientEstimation
                | Sampler::GradientEstimationCfgPp
                | Sampler::UniPc
                | Sampler::UniPcBh2
                | Sampler::DpmppSde
                | Sampler::DpmppSdeGpu
                | Sampler::Dpmpp2mSde
                | Sampler::Dpmpp2mSdeGpu
                | Sampler::Dpmpp2mSdeHeun
                | Sampler::Dpmpp2mSdeHeunGpu
                | Sampler::Dpmpp3mSde
                | Sampler::Dpmpp3mSdeGpu
        )
    }

    /// The sampler ComfyUI calls `name`, if Kiln has it.
    pub fn from_name(name: &str) -> Option<Sampler> {
        Sampler::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// What the parameterised sampler nodes set beside the sampler (ComfyUI's `ksampler(name, extra_options)`:
/// `SamplerEulerAncestral`, `SamplerLMS`, `SamplerER_SDE`, ...); KSampler's samplers run with the defaults. A
/// sampler reads the settings it has and ignores the others.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerSettings {
    /// The ancestral samplers' η: how much of each step is fresh noise (1).
    pub eta: f32,
    /// The fresh noise's multiplier (1).
    pub s_noise: f32,
    /// `lms`'s order (4).
    pub order: usize,
    /// `er_sde`'s noise scaler (ER-SDE's own).
    pub er_sde_scaler: ErSdeScaler,
    /// `er_sde`'s stages (3).
    pub max_stage: usize,
    /// `dpmpp_sde`'s midpoint in λ and `seeds_2`'s stage (½), a Python float.
    pub r: f64,
    /// `seeds_2` combines its stages with φ₂ rather than φ₁ (`SamplerSEEDS2`'s `solver_type`; no).
    pub phi_2: bool,
    /// `dpm_adaptive`'s step-size control (`SamplerDPMAdaptative`).
    pub adaptive: AdaptiveSettings,
    /// SA-Solver's (`SamplerSASolver`).
    pub sa_solver: SaSolverSettings,
    /// `ar_video`'s latent frames per block (`SamplerARVideo`'s `num_frame_per_block`: 1).
    pub frames_per_block: usize,
    /// `lcm`'s noise multipliers at the first and the last step, linear between (`SamplerLCM`'s `s_noise`,
    /// `s_noise_end`, Python floats); `None`: `s_noise` throughout.
    pub lcm_noise: Option<(f64, f64)>,
    /// `lcm`'s clamp of each step's noise at this many of its standard deviations (`SamplerLCM`'s
    /// `noise_clip_std`; 0: none).
    pub noise_clip_std: f32,
}

/// SA-Solver's settings (`SamplerSASolver`; KSampler's `sa_solver` and `sa_solver_pece` are the defaults, the
/// latter with `use_pece`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SaSolverSettings {
    /// τ inside the SDE interval (0: an ODE throughout).
    pub eta: f64,
    /// The SDE interval as sigmas `(start, end)`, start ≥ end; `None`: the model's `percent_to_sigma` of 0.2
    /// and 0.8.
    pub sde_sigmas: Option<(f64, f64)>,
    /// The noise's multiplier.
    pub s_noise: f32,
    /// Past predictions the predictor uses (3).
    pub predictor_order: usize,
    /// Past predictions the corrector uses (4; 0: no corrector).
    pub corrector_order: usize,
    /// Evaluate the corrected state again (PECE).
    pub use_pece: bool,
    /// The simple order-2 coefficients where two points are used.
    pub simple_order_2: bool,
}

impl Default for SaSolverSettings {
    fn default() -> SaSolverSettings {
        SaSolverSettings {
            eta: 1.0,
            sde_sigmas: None,
            s_noise: 1.0,
            predictor_order: 3,
            corrector_order: 4,
            use_pece: false,
            simple_order_2: false,
        }
    }
}

/// `dpm_adaptive`'s settings, Python floats as `SamplerDPMAdaptative` passes them (KSampler's are the
/// defaults, with η 0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaptiveSettings {
    /// 2 (DPM-Solver-12) or 3 (DPM-Solver-23).
    pub order: usize,
    /// Relative tolerance.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// The first step in t.
    pub h_init: f64,
    /// The controller's proportional, integral and derivative coefficients.
    pub pid: [f64; 3],
    /// The error factor a step needs to be accepted.
    pub accept_safety: f64,
    /// Ancestral noise (0: none).
    pub eta: f32,
    /// The noise's multiplier.
    pub s_noise: f32,
}

impl Default for AdaptiveSettings {
    fn default() -> AdaptiveSettings {
        AdaptiveSettings {
            order: 3,
            rtol: 0.05,
            atol: 0.0078,
            h_init: 0.05,
            pid: [0.0, 1.0, 0.0],
            accept_safety: 0.81,
            eta: 0.0,
            s_noise: 1.0,
        }
    }
}

impl Default for SamplerSettings {
    fn default() -> SamplerSettings {
        SamplerSettings {
            eta: 1.0,
            s_noise: 1.0,
            order: 4,
            er_sde_scaler: ErSdeScaler::ErSde { eta: 1.0 },
            max_stage: 3,
            r: 0.5,
            phi_2: false,
            adaptive: AdaptiveSettings::default(),
            sa_solver: SaSolverSettings::default(),
            frames_per_block: 1,
            lcm_noise: None,
            noise_clip_std: 0.0,
        }
    }
}

/// The noise scaler ψ(λ) of `er_sde` (`SamplerER_SDE`'s `solver_type`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ErSdeScaler {
    /// λ·(e^(λ^0.3) + 10)^η.
    ErSde {
        /// The exponent.
        eta: f32,
    },
    /// λ^(η + 1).
    ReverseTime {
        /// The exponent less one.
        eta: f32,
    },
    /// λ (no noise).
    Ode,
}

impl SamplerSettings {
    /// `SamplerER_SDE`'s settings: the scaler its `solver_type` names at η (ODE, and no noise, when the type
    /// is `ODE` or η is 0), `max_stage` and `s_noise`; `None` for a type ComfyUI does not have.
    pub fn er_sde(
        solver_type: &str,
        max_stage: usize,
        eta: f32,
        s_noise: f32,
    ) -> Option<SamplerSettings> {
        let (scaler, s_noise) = match solver_type {
            "ODE" => (ErSdeScaler::Ode, 0.0),
            "ER-SDE" | "Reverse-time SDE" if eta == 0.0 => (ErSdeScaler::Ode, 0.0),
            "ER-SDE" => (ErSdeScaler::ErSde { eta }, s_noise),
            "Reverse-time SDE" => (ErSdeScaler::ReverseTime { eta }, s_noise),
            _ => return None,
        };
        Some(SamplerSettings {
            er_sde_scaler: scaler,
            max_stage,
            s_noise,
            ..SamplerSettings::default()
        })
    }
}

/// A sampler with its settings: what a `SAMPLER` link carries.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplerChoice {
    /// The method.
    pub sampler: Sampler,
    /// Its settings.
    pub settings: SamplerSettings,
}

impl From<Sampler> for SamplerChoice {
    fn from(sampler: Sampler) -> SamplerChoice {
        SamplerChoice { sampler, settings: SamplerSettings::default() }
    }
}

/// Runs `sampler` from `x` through `sigmas` (descending, usually ending in 0) and returns the final latent.
///
/// `x` is already noise-scaled (see [`ModelSampling::noise_scaling`]); the result is
/// before [`ModelSampling::inverse_noise_scaling`]. `ms` is the model sampling (`dpmpp_2m_sde` moves a first sigma
/// of 1 to `percent_to_sigma(1e-4)`; `lcm` re-noises with its noise scaling). `on_step` is called once per step
/// after the step's first model call; an error from it (an interrupt) stops sampling and is returned.
///
/// Per-step noise (`euler_ancestral`, `lcm`, ...) comes from a [`TorchGenerator`] seeded with `seed + 1`:
/// ComfyUI's default noise sampler adds 1 when the latent is on the CPU, and Kiln matches ComfyUI running on the
/// CPU. The DPM-Solver++ SDE samplers draw theirs from torchsde's Brownian tree seeded with `seed`
/// ([`crate::brownian`]). Fewer than two sigmas return `x` unchanged.
///
/// `sigmas` is mutable as ComfyUI's tensor is: UniPC turns a last sigma of 0 into 0.001, and the caller's inverse
/// noise scaling then uses that (read the last sigma after sampling).
pub fn sample(
    sampler: Sampler,
    ms: &ModelSampling,
    denoiser: &mut dyn Denoiser,
    x: Vec<f32>,
    sigmas: &mut [f32],
    seed: u64,
    on_step: &mut dyn FnMut(Step<'_>) -> Result<()>,
) -> Result<Vec<f32>> {
    sample_with(sampler.into(), ms, denoiser, x, sigmas, seed, on_step)
}

/// [`sample`] with the settings a sampler node gave (`choice.settings`).
pub fn sample_with(
    choice: SamplerChoice,
    ms: &ModelSampling,
    denoiser: &mut dyn Denoiser,
    x: Vec<f32>,
    sigmas: &mut [f32],
    seed: u64,
    on_step: &mut dyn FnMut(Step<'_>) -> Result<()>,
) -> Result<Vec<f32>> {
    if sigmas.len() < 2 {
        return Ok(x);
    }
    let SamplerChoice { sampler, settings: set } = choice;
    if ms.flow().is_none() && !sampler.runs_discrete_models() {
        return Err(refuse_discrete(sampler));
    }
    let flow = || ms.flow().ok_or_else(|| refuse_discrete(sampler));
    let snr = match ms.flow() {
        Some(flow) => sde::Snr::Flow(flow),
        None => sde::Snr::Discrete,
    };
    let mut run = Run { denoiser, on_step, total: sigmas.len() - 1 };
    let noise = || TorchGenerator::new(seed.wrapping_add(1));
    match sampler {
        Sampler::Euler => euler(&mut run, x, sigmas),
        Sampler::EulerCfgPp => cfg_pp::euler_ancestral(&mut run, x, sigmas, 0.0, 0.0, &mut noise()),
        Sampler::EulerPp => cfg_pp::euler_pp(&mut run, x, sigmas),
        Sampler::EulerAncestral if ms.flow().is_none() => {
            euler_ancestral(&mut run, x, sigmas, set.eta, set.s_noise, &mut noise())
        }
        Sampler::EulerAncestral => {
            euler_ancestral_rf(&mut run, x, sigmas, set.eta, set.s_noise, &mut noise())
        }
        Sampler::EulerAncestralCfgPp => {
            cfg_pp::euler_ancestral(&mut run, x, sigmas, set.eta, set.s_noise, &mut noise())
        }
        Sampler::Heun => heun(&mut run, x, sigmas),
        Sampler::Heunpp2 => second_order::heunpp2(&mut run, x, sigmas),
        Sampler::ExpHeun2X0 => {
            seeds::seeds_2(&mut run, flow()?, x, sigmas, Seeds2::EXP_HEUN, &mut noise())
        }
        Sampler::ExpHeun2X0Sde => {
            seeds::seeds_2(&mut run, flow()?, x, sigmas, Seeds2::EXP_HEUN_SDE, &mut noise())
        }
        Sampler::Dpm2 => second_order::dpm_2(&mut run, x, sigmas),
        Sampler::Dpm2Ancestral => second_order::dpm_2_ancestral(&mut run, x, sigmas, &mut noise()),
        Sampler::Lms => multistep::lms(&mut run, x, sigmas, set.order),
        Sampler::DpmFast => dpm_solver::dpm_fast(&mut run, x, sigmas),
        Sampler::DpmAdaptive => {
            dpm_solver::dpm_adaptive(&mut run, x, sigmas, &set.adaptive, &mut noise())
        }
        Sampler::Dpmpp2sAncestral => {
            let (eta, s_noise) = (set.eta, set.s_noise);
            second_order::dpmpp_2s_ancestral(&mut run, x, sigmas, eta, s_noise, &mut noise())
        }
        Sampler::Dpmpp2sAncestralCfgPp => {
            cfg_pp::dpmpp_2s_ancestral(&mut run, x, sigmas, &mut noise())
        }
        Sampler::Dpmpp2m => dpmpp_2m(&mut run, x, sigmas),
        Sampler::Dpmpp2mCfgPp => cfg_pp::dpmpp_2m(&mut run, x, sigmas),
        Sampler::DpmppSde | Sampler::DpmppSdeGpu => {
            sde::dpmpp_sde(&mut run, snr, x, sigmas, seed, &set)
        }
        Sampler::Dpmpp2mSde | Sampler::Dpmpp2mSdeGpu => {
            sde::dpmpp_2m_sde(&mut run, snr, x, sigmas, (seed, &set), SolverType::Midpoint)
        }
        Sampler::Dpmpp2mSdeHeun | Sampler::Dpmpp2mSdeHeunGpu => {
            sde::dpmpp_2m_sde(&mut run, snr, x, sigmas, (seed, &set), SolverType::Heun)
        }
        Sampler::Dpmpp3mSde | Sampler::Dpmpp3mSdeGpu => {
            sde::dpmpp_3m_sde(&mut run, snr, x, sigmas, seed, &set)
        }
        Sampler::Ddpm => ddpm(&mut run, x, sigmas, &mut noise()),
        Sampler::Lcm => lcm(&mut run, ms, x, sigmas, &set, &mut noise()),
        Sampler::Ipndm => multistep::ipndm(&mut run, x, sigmas, Ipndm::Fixed),
        Sampler::IpndmV => multistep::ipndm(&mut run, x, sigmas, Ipndm::Variable),
        Sampler::Deis => multistep::deis(&mut run, x, sigmas),
        Sampler::ResMultistep => res_multistep(&mut run, x, sigmas, 0.0, false, &mut noise()),
        Sampler::ResMultistepCfgPp => res_multistep(&mut run, x, sigmas, 0.0, true, &mut noise()),
        Sampler::ResMultistepAncestral => {
            res_multistep(&mut run, x, sigmas, 1.0, false, &mut noise())
        }
        Sampler::ResMultistepAncestralCfgPp => {
            res_multistep(&mut run, x, sigmas, 1.0, true, &mut noise())
        }
        Sampler::GradientEstimation => multistep::gradient_estimation(&mut run, x, sigmas, false),
        Sampler::GradientEstimationCfgPp => {
            multistep::gradient_estimation(&mut run, x, sigmas, true)
        }
        Sampler::ErSde => er_sde::er_sde(&mut run, flow()?, x, sigmas, &set, &mut noise()),
        Sampler::Seeds2 => {
            let solver = if set.phi_2 { seeds::Solver::Phi2 } else { seeds::Solver::Phi1 };
            let variant = Seeds2 { eta: set.eta, s_noise: set.s_noise, r: set.r, solver };
            seeds::seeds_2(&mut run, flow()?, x, sigmas, variant, &mut noise())
        }
        Sampler::Seeds3 => seeds::seeds_3(&mut run, flow()?, x, sigmas, &mut noise()),
        Sampler::SaSolver => {
            sa_solver::sa_solver(&mut run, flow()?, x, sigmas, &set.sa_solver, &mut noise())
        }
        Sampler::SaSolverPece => {
            let pece = SaSolverSettings { use_pece: true, ..set.sa_solver };
            sa_solver::sa_solver(&mut run, flow()?, x, sigmas, &pece, &mut noise())
        }
        Sampler::Ddim => euler(&mut run, x, sigmas),
        Sampler::UniPc => unipc::sample(&mut run, unipc::Variant::Bh1, x, sigmas),
        Sampler::UniPcBh2 => unipc::sample(&mut run, unipc::Variant::Bh2, x, sigmas),
        Sampler::ArVideo => Err(crate::Error::Invalid(
            "the ar_video sampler runs a causal video model a block of frames at a time (sample_ar_video), \
             not through sample_with"
                .to_owned(),
        )),
    }
}

/// The error for `sampler` on a discrete-time model, naming the samplers that run one.
fn refuse_discrete(sampler: Sampler) -> crate::Error {
    let names: Vec<&str> =
        Sampler::ALL.iter().filter(|s| s.runs_discrete_models()).map(|s| s.name()).collect();
    crate::Error::Invalid(format!(
        "Kiln runs the {} sampler on flow models only; for a model with discrete-time sampling (SDXL, Lotus) choose \
         one of {}",
        sampler.name(),
        names.join(", ")
    ))
}

/// The model and the callback, for one run.
pub(super) struct Run<'r> {
    pub(super) denoiser: &'r mut dyn Denoiser,
    pub(super) on_step: &'r mut dyn FnMut(Step<'_>) -> Result<()>,
    pub(super) total: usize,
}

impl Run<'_> {
    /// The step's first model call, reported.
    pub(super) fn first(&mut self, index: usize, x: &[f32], sigma: f32) -> Result<Vec<f32>> {
        let denoised = self.denoiser.denoise(x, sigma)?;
        (self.on_step)(Step { index, total: self.total, x, denoised: &denoised, sigma })?;
        Ok(denoised)
    }

    /// The step's first model call for a CFG++ sampler (x̂₀ and the unconditional x̂₀), reported.
    pub(super) fn first_cfg_pp(
        &mut self,
        index: usize,
        x: &[f32],
        sigma: f32,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let (denoised, uncond) = self.denoiser.denoise_cfg_pp(x, sigma)?;
        (self.on_step)(Step { index, total: self.total, x, denoised: &denoised, sigma })?;
        Ok((denoised, uncond))
    }
}

/// (x − x̂₀)/σ, k-diffusion's `to_d`.
pub(super) fn to_d(x: &[f32], denoised: &[f32], sigma: f32) -> Vec<f32> {
    x.iter().zip(denoised).map(|(x, d)| (x - d) / sigma).collect()
}

/// x + d·dt.
pub(super) fn step(x: &[f32], d: &[f32], dt: f32) -> Vec<f32> {
    x.iter().zip(d).map(|(x, d)| x + d * dt).collect()
}

/// a·x + b·y.
fn mix(a: f32, x: &[f32], b: f32, y: &[f32]) -> Vec<f32> {
    x.iter().zip(y).map(|(x, y)| a * x + b * y).collect()
}

/// −ln σ (k-diffusion's `t_fn`).
fn t_of(sigma: f32) -> f32 {
    -sigma.ln()
}

/// torch.nan_to_num: NaN → 0, ±∞ → the largest finite values.
fn nan_to_num(v: f32) -> f32 {
    if v.is_nan() {
        0.0
    } else if v == f32::INFINITY {
        f32::MAX
    } else if v == f32::NEG_INFINITY {
        f32::MIN
    } else {
        v
    }
}

fn euler(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let sigma = sigmas[i];
        let denoised = run.first(i, &x, sigma)?;
        let d = to_d(&x, &denoised, sigma);
        x = step(&x, &d, sigmas[i + 1] - sigma);
    }
    Ok(x)
}

fn heun(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let d = to_d(&x, &denoised, sigma);
        let dt = next - sigma;
        if next == 0.0 {
            x = step(&x, &d, dt);
        } else {
            let x2 = step(&x, &d, dt);
            let denoised2 = run.denoiser.denoise(&x2, next)?;
            let d2 = to_d(&x2, &denoised2, next);
            let d_prime: Vec<f32> = d.iter().zip(&d2).map(|(a, b)| (a + b) / 2.0).collect();
            x = step(&x, &d_prime, dt);
        }
    }
    Ok(x)
}

/// `sample_euler_ancestral` for a discrete-time model at η and s_noise: an Euler step to the ancestral σ_down,
/// then fresh noise at σ_up; x̂₀ itself where σ_down is 0.
fn euler_ancestral(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    eta: f32,
    s_noise: f32,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let sigma = sigmas[i];
        let denoised = run.first(i, &x, sigma)?;
        let (down, up) = cfg_pp::ancestral_step(sigma, sigmas[i + 1], eta);
        if down == 0.0 {
            x = denoised;
            continue;
        }
        let d = to_d(&x, &denoised, sigma);
        let n = noise.randn(x.len());
        x = x
            .iter()
            .zip(&d)
            .zip(&n)
            .map(|((x, d), n)| x + d * (down - sigma) + n * s_noise * up)
            .collect();
    }
    Ok(x)
}

/// `sample_euler_ancestral_RF` at η and s_noise (1 and 1 for KSampler's `euler_ancestral`).
fn euler_ancestral_rf(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    eta: f32,
    s_noise: f32,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        if next == 0.0 {
            x = denoised;
            continue;
        }
        let downstep_ratio = 1.0 + (next / sigma - 1.0) * eta;
        let sigma_down = next * downstep_ratio;
        let alpha_next = 1.0 - next;
        let alpha_down = 1.0 - sigma_down;
        let renoise = (next * next
            - sigma_down * sigma_down * (alpha_next * alpha_next) / (alpha_down * alpha_down))
            .sqrt();
        let ratio = sigma_down / sigma;
        x = mix(ratio, &x, 1.0 - ratio, &denoised);
        if eta > 0.0 {
            let n = noise.randn(x.len());
            let scale = alpha_next / alpha_down;
            x = x.iter().zip(&n).map(|(x, n)| scale * x + n * s_noise * renoise).collect();
        }
    }
    Ok(x)
}

fn dpmpp_2m(run: &mut Run<'_>, mut x: Vec<f32>, sigmas: &[f32]) -> Result<Vec<f32>> {
    let mut old: Option<Vec<f32>> = None;
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let (t, t_next) = (t_of(sigma), t_of(next));
        let h = t_next - t;
        let ratio = (-t_next).exp() / (-t).exp();
        let e = (-h).exp_m1();
        x = match &old {
            Some(old) if next != 0.0 => {
                let h_last = t - t_of(sigmas[i - 1]);
                let r = h_last / h;
                let c = 1.0 / (2.0 * r);
                let dd: Vec<f32> =
                    denoised.iter().zip(old).map(|(d, o)| (1.0 + c) * d - c * o).collect();
                x.iter().zip(&dd).map(|(x, d)| ratio * x - e * d).collect()
            }
            _ => x.iter().zip(&denoised).map(|(x, d)| ratio * x - e * d).collect(),
        };
        old = Some(denoised);
    }
    Ok(x)
}

/// `sample_lcm` (s_noise = 1): x̂₀, then the flow noise scaling to the next sigma with fresh noise.
fn lcm(
    run: &mut Run<'_>,
    ms: &ModelSampling,
    mut x: Vec<f32>,
    sigmas: &[f32],
    set: &SamplerSettings,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let steps = sigmas.len() - 1;
    // `SamplerLCM`'s schedule of noise multipliers, in Python floats.
    let (start, end) = set.lcm_noise.unwrap_or((f64::from(set.s_noise), f64::from(set.s_noise)));
    for i in 0..steps {
        let denoised = run.first(i, &x, sigmas[i])?;
        x = denoised;
        let next = sigmas[i + 1];
        if next > 0.0 {
            let mut n = noise.randn(x.len());
            if set.noise_clip_std > 0.0 {
                let limit = set.noise_clip_std * super::guidance::std(&n);
                n.iter_mut().for_each(|v| *v = v.max(-limit).min(limit));
            }
            let t = if steps > 1 { i as f64 / (steps - 1) as f64 } else { 0.0 };
            let scale = start + (end - start) * t;
            if scale != 1.0 {
                n.iter_mut().for_each(|v| *v *= scale as f32);
            }
            x = ms.noise_at(next, &n, &x);
        }
    }
    Ok(x)
}

/// `sample_ddpm` (ComfyUI's `generic_step_sampler` with `DDPMSampler_step`): x scaled to variance-preserving
/// form by 1/√(1 + σ²), the DDPM posterior mean from ε = (x − x̂₀)/σ plus fresh noise where the next sigma is
/// above 0, scaled back by √(1 + σ_next²). Each scalar is a 0-dim f32 tensor op, as there.
fn ddpm(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    for i in 0..sigmas.len() - 1 {
        let (sigma, next) = (sigmas[i], sigmas[i + 1]);
        let denoised = run.first(i, &x, sigma)?;
        let eps = to_d(&x, &denoised, sigma);
        let scale = (1.0 + sigma.powf(2.0)).sqrt();
        let alpha_cumprod = 1.0 / (sigma * sigma + 1.0);
        let alpha_cumprod_prev = 1.0 / (next * next + 1.0);
        let alpha = alpha_cumprod / alpha_cumprod_prev;
        let (a, b) = ((1.0 / alpha).sqrt(), (1.0 - alpha_cumprod).sqrt());
        let mut mu: Vec<f32> =
            x.iter().zip(&eps).map(|(x, e)| a * (x / scale - (1.0 - alpha) * e / b)).collect();
        if next > 0.0 {
            let c = ((1.0 - alpha) * (1.0 - alpha_cumprod_prev) / (1.0 - alpha_cumprod)).sqrt();
            let n = noise.randn(mu.len());
            mu.iter_mut().zip(n).for_each(|(m, n)| *m += c * n);
            let back = (1.0 + next.powf(2.0)).sqrt();
            mu.iter_mut().for_each(|m| *m *= back);
        }
        x = mu;
    }
    Ok(x)
}

/// `res_multistep` at η (0 for `res_multistep`, 1 for `res_multistep_ancestral`), with CFG++ or not: Euler on
/// the first step and into σ_down 0, else the second-order exponential multistep update from this and the
/// previous step's x̂₀ (the unconditional ones with CFG++, after moving x by the guidance); then fresh noise
/// σ_up.
fn res_multistep(
    run: &mut Run<'_>,
    mut x: Vec<f32>,
    sigmas: &[f32],
    eta: f32,
    cfg_pp: bool,
    noise: &mut TorchGenerator,
) -> Result<Vec<f32>> {
    let mut old: Option<(Vec<f32>, f32)> = None;
    for i in 0..sigmas.len() - 1 {
        let sigma = sigmas[i];
        let (denoised, uncond) = if cfg_pp {
            run.first_cfg_pp(i, &x, sigma)?
        } else {
            let denoised = run.first(i, &x, sigma)?;
            (denoised.clone(), denoised)
        };
        let (down, up) = cfg_pp::ancestral_step(sigma, sigmas[i + 1], eta);
        x = match &old {
            Some((old, old_down)) if down != 0.0 => {
                let (t, t_old, t_next, t_prev) =
                    (t_of(sigma), t_of(*old_down), t_of(down), t_of(sigmas[i - 1]));
                let h = t_next - t;
                let c2 = (t_prev - t_old) / h;
                let phi1 = (-h).exp_m1() / -h;
                let phi2 = (phi1 - 1.0) / -h;
                let b1 = nan_to_num(phi1 - phi2 / c2);
                let b2 = nan_to_num(phi2 / c2);
                let e = (-h).exp();
                let moved: Vec<f32> = if cfg_pp {
                    x.iter().zip(&denoised).zip(&uncond).map(|((x, d), u)| x + (d - u)).collect()
                } else {
                    x
                };
                moved
                    .iter()
                    .zip(&uncond)
                    .zip(old)
                    .map(|((x, d), o)| e * x + h * (b1 * d + b2 * o))
                    .collect()
            }
            _ if cfg_pp => {
                let d = to_d(&x, &uncond, sigma);
                denoised.iter().zip(&d).map(|(dn, d)| dn + d * down).collect()
            }
            _ => {
                let d = to_d(&x, &denoised, sigma);
                step(&x, &d, down - sigma)
            }
        };
        if up > 0.0 {
            let n = noise.randn(x.len());
            x.iter_mut().zip(n).for_each(|(x, n)| *x += n * up);
        }
        // The unconditional x̂₀ with CFG++ (`uncond` is the guided one without).
        old = Some((uncond, down));
    }
    Ok(x)
}
