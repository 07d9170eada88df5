//! ComfyUI's `ModelSamplingDiscrete`: the 1000-entry sigma table of a DDPM-trained model (SD's `linear` beta
//! schedule, β from 0.00085 to 0.012), with the parameterisation that says what the network predicts.

use std::borrow::Cow;

use crate::rope::linspace_f64;

/// The number of entries in the sigma table.
const TIMESTEPS: usize = 1000;
/// SD's `linear_start`.
const LINEAR_START: f64 = 0.00085;
/// SD's `linear_end`.
const LINEAR_END: f64 = 0.012;

/// What a discrete-time network predicts, and how the sampler's x reaches it (ComfyUI's model-sampling
/// parameterisations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prediction {
    /// `EPS` (SD 1.x, SDXL): the network reads x / √(σ² + 1) and predicts the noise, x̂₀ = x − σ·ε.
    Eps,
    /// `IMG_TO_IMG` (Lotus): the network reads x unscaled and predicts x̂₀ itself; noise scaling as `EPS`.
    ImageToImage,
}

/// ComfyUI's `ModelSamplingDiscrete` (SD's schedule, σ_data 1) with a [`Prediction`].
#[derive(Clone, Debug, PartialEq)]
pub struct DiscreteSampling {
    prediction: Prediction,
    sigmas: Vec<f32>,
    log_sigmas: Vec<f32>,
}

impl DiscreteSampling {
    /// SD's schedule: β = linspace(√0.00085, √0.012, 1000)² in f64, ᾱ their running product of 1 − β,
    /// σ = √((1 − ᾱ)/ᾱ), kept in f32 with their logs (taken in f64, then rounded).
    pub fn new(prediction: Prediction) -> DiscreteSampling {
        let mut keep = 1.0f64;
        let mut sigmas = Vec::with_capacity(TIMESTEPS);
        let mut log_sigmas = Vec::with_capacity(TIMESTEPS);
        for root in linspace_f64(LINEAR_START.sqrt(), LINEAR_END.sqrt(), TIMESTEPS) {
            keep *= 1.0 - root * root;
            let sigma = ((1.0 - keep) / keep).sqrt();
            sigmas.push(sigma as f32);
            log_sigmas.push(sigma.ln() as f32);
        }
        DiscreteSampling { prediction, sigmas, log_sigmas }
    }

    /// The parameterisation.
    pub fn prediction(&self) -> Prediction {
        self.prediction
    }

    /// The sigma table, ascending.
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// The timestep of `sigma`: the index of the table entry nearest in log σ (the first on a tie), as
    /// ComfyUI's `timestep` returns it.
    pub fn timestep(&self, sigma: f32) -> f32 {
        let log_sigma = sigma.ln();
        let mut best = (0, f32::INFINITY);
        for (i, &l) in self.log_sigmas.iter().enumerate() {
            let d = (log_sigma - l).abs();
            if d < best.1 {
                best = (i, d);
            }
        }
        best.0 as f32
    }

    /// The sigma of a (fractional) timestep: log σ interpolated linearly between the neighbouring entries,
    /// the timestep clamped to the table.
    pub fn sigma_of_timestep(&self, timestep: f32) -> f32 {
        let t = timestep.clamp(0.0, (TIMESTEPS - 1) as f32);
        let (low, high) = (t.floor() as usize, t.ceil() as usize);
        let w = t.fract();
        ((1.0 - w) * self.log_sigmas[low] + w * self.log_sigmas[high]).exp()
    }

    /// ComfyUI's `percent_to_sigma`: 999999999.9 at 0, 0 at 1, else the sigma of timestep (1 − percent)·999.
    pub fn percent_to_sigma(&self, percent: f64) -> f64 {
        if percent <= 0.0 {
            return 999_999_999.9;
        }
        if percent >= 1.0 {
            return 0.0;
        }
        f64::from(self.sigma_of_timestep(((1.0 - percent) * 999.0) as f32))
    }

    /// `EPS.noise_scaling`: σ·noise + latent, or √(1 + σ²)·noise + latent when sampling starts at the largest
    /// sigma (`max_denoise`).
    pub fn noise_scaling(
        &self,
        sigma: f32,
        noise: &[f32],
        latent: &[f32],
        max_denoise: bool,
    ) -> Vec<f32> {
        let scale = if max_denoise { (1.0 + sigma * sigma).sqrt() } else { sigma };
        noise.iter().zip(latent).map(|(n, l)| n * scale + l).collect()
    }

    /// What the network reads of the sampler's `x` at `sigma` (`calculate_input`): for [`Prediction::Eps`]
    /// x / √(σ² + 1), the divisor rounded in f32 as torch's 0-dim tensor is; x itself otherwise.
    pub fn calculate_input<'x>(&self, sigma: f32, x: &'x [f32]) -> Cow<'x, [f32]> {
        match self.prediction {
            Prediction::Eps => {
                let divisor = (sigma * sigma + 1.0).sqrt();
                Cow::Owned(x.iter().map(|v| v / divisor).collect())
            }
            Prediction::ImageToImage => Cow::Borrowed(x),
        }
    }

    /// x̂₀ from the network's output for the sampler's `x`: x − σ·ε for [`Prediction::Eps`], the output itself
    /// for [`Prediction::ImageToImage`].
    pub fn calculate_denoised(&self, sigma: f32, x: &[f32], model_out: &[f32]) -> Vec<f32> {
        match self.prediction {
            Prediction::Eps => x.iter().zip(model_out).map(|(x, e)| x - e * sigma).collect(),
            Prediction::ImageToImage => model_out.to_vec(),
        }
    }
}
