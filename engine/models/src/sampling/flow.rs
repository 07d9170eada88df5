//! ComfyUI's `ModelSamplingDiscreteFlow` + `CONST`: the flow model's sigma table and how σ mixes noise and
//! latent.

/// The number of entries in the sigma table.
const TIMESTEPS: usize = 1000;

/// ComfyUI's `ModelSamplingDiscreteFlow` with the `CONST` (rectified flow) parameterisation: x_σ = σ·ε + (1−σ)·x₀.
///
/// `shift` and `multiplier` are Python floats in ComfyUI, kept as f64 here because some expressions use them in
/// double before rounding to f32 (`shift − 1`). `ModelSamplingAuraFlow` (Z-Image's node) sets `multiplier` 1.0,
/// `ModelSamplingSD3` 1000.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSampling {
    shift: f64,
    multiplier: f64,
    sigmas: Vec<f32>,
}

impl FlowSampling {
    /// The model sampling for `shift` and `multiplier`, with its 1000-entry table
    /// σ_j = shift_σ((j+1)/1000) in f32, ascending.
    pub fn new(shift: f64, multiplier: f64) -> Self {
        let mut me = Self { shift, multiplier, sigmas: Vec::new() };
        let m = multiplier as f32;
        me.sigmas = (1..=TIMESTEPS)
            .map(|j| me.sigma_of_timestep((j as f32 / TIMESTEPS as f32) * m))
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
        self.sigmas[TIMESTEPS - 1]
    }

    /// The timestep the model is given for `sigma`: σ·multiplier.
    pub fn timestep(&self, sigma: f32) -> f32 {
        sigma * self.multiplier as f32
    }

    /// The sigma of a timestep: the shifted t = timestep/multiplier, s·t / (1 + (s−1)·t), in f32.
    pub fn sigma_of_timestep(&self, timestep: f32) -> f32 {
        let t = timestep / self.multiplier as f32;
        time_snr_shift(self.shift, t)
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
        if self.shift == 1.0 { t } else { self.shift * t / (1.0 + (self.shift - 1.0) * t) }
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

/// ComfyUI's `time_snr_shift(shift, t)` on an f32 t: the scalar is rounded to f32 as torch does, `shift − 1` is
/// formed in f64 first.
fn time_snr_shift(shift: f64, t: f32) -> f32 {
    if shift == 1.0 {
        return t;
    }
    (shift as f32 * t) / (1.0 + (shift - 1.0) as f32 * t)
}
