//! [`ModelSampling`]: the model sampling object a loaded model carries (ComfyUI's `model_sampling`), flow or
//! discrete, and what the schedulers and the sampler loop ask of it.

use std::borrow::Cow;

use super::discrete::DiscreteSampling;
use super::flow::FlowSampling;

/// A model's sampling: how σ maps to its timestep and how noise, latent and its output combine.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSampling {
    /// A flow model's (`ModelSamplingDiscreteFlow`/`ModelSamplingFlux` + `CONST`).
    Flow(FlowSampling),
    /// A DDPM-trained model's (`ModelSamplingDiscrete`: Lotus).
    Discrete(DiscreteSampling),
}

impl From<FlowSampling> for ModelSampling {
    fn from(flow: FlowSampling) -> ModelSampling {
        ModelSampling::Flow(flow)
    }
}

impl From<DiscreteSampling> for ModelSampling {
    fn from(discrete: DiscreteSampling) -> ModelSampling {
        ModelSampling::Discrete(discrete)
    }
}

impl ModelSampling {
    /// The flow sampling, for the samplers and nodes that work in a flow model's terms; `None` for a discrete
    /// model.
    pub fn flow(&self) -> Option<&FlowSampling> {
        match self {
            ModelSampling::Flow(flow) => Some(flow),
            ModelSampling::Discrete(_) => None,
        }
    }

    /// The sigma table, ascending.
    pub fn sigmas(&self) -> &[f32] {
        match self {
            ModelSampling::Flow(flow) => flow.sigmas(),
            ModelSampling::Discrete(discrete) => discrete.sigmas(),
        }
    }

    /// The smallest sigma of the table.
    pub fn sigma_min(&self) -> f32 {
        self.sigmas()[0]
    }

    /// The largest sigma of the table.
    pub fn sigma_max(&self) -> f32 {
        self.sigmas()[self.sigmas().len() - 1]
    }

    /// The timestep the model is given for `sigma`.
    pub fn timestep(&self, sigma: f32) -> f32 {
        match self {
            ModelSampling::Flow(flow) => flow.timestep(sigma),
            ModelSampling::Discrete(discrete) => discrete.timestep(sigma),
        }
    }

    /// The sigma of a timestep.
    pub fn sigma_of_timestep(&self, timestep: f32) -> f32 {
        match self {
            ModelSampling::Flow(flow) => flow.sigma_of_timestep(timestep),
            ModelSampling::Discrete(discrete) => discrete.sigma_of_timestep(timestep),
        }
    }

    /// ComfyUI's `percent_to_sigma`.
    pub fn percent_to_sigma(&self, percent: f64) -> f64 {
        match self {
            ModelSampling::Flow(flow) => flow.percent_to_sigma(percent),
            ModelSampling::Discrete(discrete) => discrete.percent_to_sigma(percent),
        }
    }

    /// Whether `sigma` lies in the part of sampling from `start` to `end` percent: ComfyUI's range checks
    /// (ControlNets' `timestep_range`, conditioning's `timestep_start` / `timestep_end`) compare it in f32 with
    /// each end's `percent_to_sigma` and leave it out only above the start's or below the end's.
    pub fn in_percent_range(&self, (start, end): (f64, f64), sigma: f32) -> bool {
        let (start, end) = (self.percent_to_sigma(start) as f32, self.percent_to_sigma(end) as f32);
        !(sigma > start || sigma < end)
    }

    /// Whether a run over `sigmas` starts at the table's largest sigma or above (ComfyUI's `max_denoise`:
    /// within a relative 1e-5 of it, or greater).
    pub fn max_denoise(&self, sigmas: &[f32]) -> bool {
        let (max, first) =
            (f64::from(self.sigma_max()), sigmas.first().map_or(0.0, |&s| f64::from(s)));
        (first - max).abs() <= 1e-5 * first.abs().max(max.abs()) || first > max
    }

    /// The sampler's starting latent from `noise` and `latent` at σ₀ = `sigmas[0]` (with `max_denoise` when the
    /// run starts at the table's largest sigma).
    pub fn noise_scaling(&self, sigmas: &[f32], noise: &[f32], latent: &[f32]) -> Vec<f32> {
        let sigma = sigmas.first().copied().unwrap_or(0.0);
        self.scale_noise(sigma, noise, latent, self.max_denoise(sigmas))
    }

    /// `noise_scaling` at `sigma` inside a run (a re-noise, an inpainting's kept area): never `max_denoise`.
    pub fn noise_at(&self, sigma: f32, noise: &[f32], latent: &[f32]) -> Vec<f32> {
        self.scale_noise(sigma, noise, latent, false)
    }

    /// The model's `noise_scaling` at `sigma`.
    fn scale_noise(
        &self,
        sigma: f32,
        noise: &[f32],
        latent: &[f32],
        max_denoise: bool,
    ) -> Vec<f32> {
        match self {
            ModelSampling::Flow(flow) => flow.noise_scaling(sigma, noise, latent),
            ModelSampling::Discrete(discrete) => {
                discrete.noise_scaling(sigma, noise, latent, max_denoise)
            }
        }
    }

    /// Undoes the noise scaling on the sampler's output at the last sigma.
    pub fn inverse_noise_scaling(&self, sigma: f32, x: &[f32]) -> Vec<f32> {
        match self {
            ModelSampling::Flow(flow) => flow.inverse_noise_scaling(sigma, x),
            ModelSampling::Discrete(_) => x.to_vec(),
        }
    }

    /// What the network reads of the sampler's `x` at `sigma` (ComfyUI's `calculate_input`): x itself for a
    /// flow model, scaled for an `EPS` one ([`DiscreteSampling::calculate_input`]).
    pub fn calculate_input<'x>(&self, sigma: f32, x: &'x [f32]) -> Cow<'x, [f32]> {
        match self {
            ModelSampling::Flow(_) => Cow::Borrowed(x),
            ModelSampling::Discrete(discrete) => discrete.calculate_input(sigma, x),
        }
    }

    /// x̂₀ from the model's output at `sigma` for input `x`.
    pub fn calculate_denoised(&self, sigma: f32, x: &[f32], model_out: &[f32]) -> Vec<f32> {
        match self {
            ModelSampling::Flow(flow) => flow.calculate_denoised(sigma, x, model_out),
            ModelSampling::Discrete(discrete) => discrete.calculate_denoised(sigma, x, model_out),
        }
    }
}
