//! Sampling as ComfyUI does it (flow models, and the discrete-time Lotus): the model sampling object (sigma
//! table, noise scaling), the schedulers that pick the sigmas, and the samplers that step a latent through them.
//!
//! - [`ModelSampling`]: a model's sampling object, [`FlowSampling`] (ComfyUI's `ModelSamplingDiscreteFlow` with
//!   the `CONST` parameterisation, what `ModelSamplingAuraFlow` installs for Z-Image) or [`DiscreteSampling`]
//!   (`ModelSamplingDiscrete`, SD's schedule: Lotus).
//! - [`Scheduler`]: the KSampler schedulers Kiln offers, and [`denoise_sigmas`] for `denoise < 1`.
//! - [`Sampler`] and [`sample`]: the KSampler samplers, driving a [`Denoiser`].
//! - [`sample_ar_video`]: the `ar_video` sampler of causal video models, driving a [`BlockDenoiser`] a block of
//!   frames at a time.
//! - [`guidance`]: how conditional and unconditional predictions combine (CFG and the hooks model patches set).
//!
//! Arithmetic follows ComfyUI's torch code on the CPU in f32 (the sigma tensors and latents are f32 there),
//! operation by operation, so results match ComfyUI's to the last bit or within an ulp where torch's scalar
//! `log`/`exp` may round differently from the C library's.

mod ar_video;
mod beta;
mod cfg_pp;
mod discrete;
mod dpm_solver;
mod er_sde;
mod flow;
pub mod guidance;
pub mod latent_operation;
mod linalg;
mod model_sampling;
mod multistep;
mod pre_cfg;
mod sa_solver;
mod samplers;
mod schedulers;
mod sde;
mod second_order;
mod seeds;
mod unipc;

pub use ar_video::{ArVideo, BlockDenoiser, sample_ar_video};
pub use discrete::{DiscreteSampling, Prediction};
pub use flow::FlowSampling;
pub use model_sampling::ModelSampling;
pub use samplers::{
    AdaptiveSettings, Denoiser, ErSdeScaler, SaSolverSettings, Sampler, SamplerChoice,
    SamplerSettings, Step, sample, sample_with,
};
pub use schedulers::{
    OPTIMAL_STEPS, Scheduler, beta_sigmas, denoise_sigmas, exponential_sigmas,
    extend_intermediate_sigmas, flux2_sigmas, karras_sigmas, ksampler_sigmas, laplace_sigmas,
    optimal_steps_sigmas, polyexponential_sigmas, turbo_sigmas, vp_sigmas,
};
