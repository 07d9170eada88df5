//! ComfyUI's `ModelSamplingDiscreteFlow` + `CONST`: the flow model's sigma table and how σ mixes noise and
//! latent.

/// The number of entries in the sigma table of `ModelSamplingDiscreteFlow`.
const TIMESTEPS: usize = 1000;
/// The number of entries in the sigma table of `ModelSamplingFlux`.
const FLUX_TIMESTEPS: usize = 10000;

/// How the flow model sampling shifts a time t ∈ (0, 1] to a sigma.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shift {
    /// `time_snr_shift`: s·t / (1 + (s−1)·t) (`ModelSamplingDiscreteFlow`, set by `ModelSamplingAuraFlow` and
    /// `ModelSamplingSD3`).
    Snr,
    /// `flux_time_shift` with μ = shift: e^μ / (e^μ + (1/t − 1)) (`ModelSamplingFlux`, 10000 entries).
    Flux,
}

/// ComfyUI's `ModelSamplingDiscreteFlow` with the `CONST` (rectified flow) parameterisation: x_σ = σ·ε + (1−σ)·x₀.
///
/// `shift` and `multiplier` are Python floats in ComfyUI, kept as f64 here because some expressions use them in
/// double before rounding to f32 (`shift − 1`). `ModelSamplingAuraFlow` (Z-Image's node) sets `multiplier` 1.0,
/// `ModelSamplingSD3` 1000.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSampling {
    shift: f64,
    multiplier: f64,
    kind: Shift,
    sigmas: Vec<f32>,
}

impl FlowSampling {
    /// The model sampling for `shift` and `multiplier`, with its 1000-entry table
    /// σ_j = shift_σ((j+1)/1000) in f32, ascending.
    pub fn new(shift: f64, multiplier: f64) -> Self {
        let mut me = Self { shift, multiplier, kind: Shift::Snr, sigmas: Vec::new() };
        let m = multiplier as f32;
        me.sigmas = (1..=TIMESTEPS)
            .map(|j| me.sigma_of_timestep((j as f32 / TIMESTEPS as f32) * m))
            .collect();
        me
    }

    /// ComfyUI's `ModelSamplingFlux` (+ `CONST`) with μ = `shift` (Flux's default 1.15; `ModelSamplingFlux`
    /// derives it from the image size): 10000 entries σ_j = flux_shift((j+1)/10000), timestep = σ.
    pub fn flux(shift: f64) -> Self {
        let mut me = Self { shift, multiplier: 1.0, kind: Shift::Flux, sigmas: Vec::new() };
        me.sigmas = (1..=FLUX_TIMESTEPS)
            .map(|j| me.sigma_of_timestep(j as f32 / FLUX_TIMESTEPS as f32))
            .collect();
        me
    }

    /// The shift.
    pub fn shift(&self) -> f64 {
        self.shift
    }

    /// The timestep multiplier.
    pub fn multiplier(&self) -> f64 {
        self.multiplier
    }

    /// The sigma table, ascending (`sigmas[999]` = σ_max).
    pub fn sigmas(&self) -> &[f32] {
        &self.sigmas
    }

    /// The smallest sigma of the table (σ(0.001)).
    pub fn sigma_min(&self) -> f32 {
        self.sigmas[0]
    }

    /// The largest sigma of the table (1.0).
    pub fn sigma_max(&self) -> f32 {
        self.sigmas[self.sigmas.len() - 1]
    }

    /// The timestep the model is given for `sigma`: σ·multiplier.
    pub fn timestep(&self, sigma: f32) -> f32 {
        sigma * self.multiplier as f32
    }

    /// The sigma of a timestep: the shifted t = timestep/multiplier, s·t / (1 + (s−1)·t) (or Flux's shift of t),
    /// in f32.
    pub fn sigma_of_timestep(&self, timestep: f32) -> f32 {
        match self.kind {
            Shift::Snr => time_snr_shift(self.shift, timestep / self.multiplier as f32),
            Shift::Flux => flux_time_shift(self.shift, timestep),
        }
    }

    /// ComfyUI's `percent_to_sigma` (0 → 1.0, 1 → 0.0, else the shifted 1 − percent, in f64).
    pub fn percent_to_sigma(&self, percent: f64) -> f64 {
        if percent <= 0.0 {
            return 1.0;
        }
        if percent >= 1.0 {
            return 0.0;
        }
        let t = 1.0 - percent;
        match self.kind {
            Shift::Snr if self.shift == 1.0 => t,
            Shift::Snr => self.shift * t / (1.0 + (self.shift - 1.0) * t),
            // Python floats throughout, as `flux_time_shift` on a float.
            Shift::Flux => self.shift.exp() / (self.shift.exp() + (1.0 / t - 1.0)),
        }
    }

    /// The sigmas with a first sigma of 1 (λ = −∞) moved to `percent_to_sigma(1e-4)`, as ComfyUI's
    /// `offset_first_sigma_for_snr` does before the samplers that work in the half-log-SNR.
    pub fn offset_first_sigma(&self, sigmas: &[f32]) -> Vec<f32> {
        let mut sigmas = sigmas.to_vec();
        if sigmas.len() > 1 && sigmas[0] >= 1.0 {
            sigmas[0] = self.percent_to_sigma(1e-4) as f32;
        }
        sigmas
    }

    /// The sampler's starting latent: σ·noise + (1−σ)·latent, elementwise (`noise` and `latent` of equal length).
    pub fn noise_scaling(&self, sigma: f32, noise: &[f32], latent: &[f32]) -> Vec<f32> {
        let keep = 1.0 - sigma;
        noise.iter().zip(latent).map(|(n, l)| sigma * n + keep * l).collect()
    }

    /// Undoes [`FlowSampling::noise_scaling`] on the sampler's output at the last sigma: x / (1−σ) (identity for
    /// σ = 0).
    pub fn inverse_noise_scaling(&self, sigma: f32, x: &[f32]) -> Vec<f32> {
        let keep = 1.0 - sigma;
        x.iter().map(|v| v / keep).collect()
    }

    /// The denoised estimate x̂₀ = x − σ·out from the model's output (a velocity, ComfyUI's sign).
    pub fn calculate_denoised(&self, sigma: f32, x: &[f32], model_out: &[f32]) -> Vec<f32> {
        x.iter().zip(model_out).map(|(x, o)| x - o * sigma).collect()
    }
}

/// ComfyUI's `flux_time_shift(μ, 1.0, t)` on an f32 t, as torch evaluates it: 1/t and e^μ/(…) are reciprocals
/// (times the scalar), e^μ is rounded to f32 where it meets the tensor, `** 1.0` leaves the value as is.
fn flux_time_shift(mu: f64, t: f32) -> f32 {
    let e = mu.exp() as f32;
    let denominator = e + (1.0 / t - 1.0);
    (1.0 / denominator) * e
}

/// ComfyUI's `time_snr_shift(shift, t)` on an f32 t: the scalar is rounded to f32 as torch does, `shift − 1` is
/// formed in f64 first.
fn time_snr_shift(shift: f64, t: f32) -> f32 {
    if shift == 1.0 {
        return t;
    }
    (shift as f32 * t) / (1.0 + (shift - 1.0) as f32 * t)
}

/// The flow model's half-log-SNR λ = ln((1 − σ)/σ) = −logit(σ), as torch's f32 `logit` computes it.
pub(super) fn half_log_snr(sigma: f32) -> f32 {
    -(sigma / (1.0 - sigma)).ln()
}

/// σ of a half-log-SNR, `sigmoid(−λ)` as torch computes it.
pub(super) fn sigma_of_half_log_snr(lambda: f32) -> f32 {
    1.0 / (1.0 + lambda.exp())
}
