//! The custom-sampling values: `GUIDER` (a model with its conditioning and how the predictions combine) and
//! `NOISE` (where a sampler's starting noise comes from), as ComfyUI's `SamplerCustomAdvanced` takes them.

use std::sync::Arc;

use super::{Conditioning, DiffusionModel};

/// `GUIDER`: what the sampler's denoiser is (ComfyUI's `CFGGuider` and its subclasses).
#[derive(Clone)]
pub struct Guider {
    /// The model.
    pub model: Arc<DiffusionModel>,
    /// The conditioning the prediction follows.
    pub positive: Arc<Conditioning>,
    /// The conditioning CFG pushes away from; `None` for `BasicGuider` (the positive alone).
    pub negative: Option<Arc<Conditioning>>,
    /// The CFG scale (1.0 evaluates the positive alone).
    pub cfg: f64,
    /// `DualCFGGuider`'s second conditioning; `None` for the one-scale guiders.
    pub dual: Option<DualCfg>,
    /// `PerpNegGuider`'s empty prompt and scale; `None` for the other guiders.
    pub perp_neg: Option<PerpNeg>,
}

/// `PerpNegGuider`'s third conditioning and its scale: CFG runs from the empty prompt's prediction, and only
/// the part of the negative's direction perpendicular to the positive's is pushed away from, times `neg_scale`.
#[derive(Clone)]
pub struct PerpNeg {
    /// The empty prompt (`empty_conditioning`).
    pub empty: Arc<Conditioning>,
    /// How strongly the perpendicular negative is pushed away from.
    pub neg_scale: f64,
}

/// `DualCFGGuider`'s middle conditioning (`cond2`) and how it combines: the guider's `positive` is `cond1`,
/// its `cfg` the scale from `cond2` to `cond1` (`cfg_conds`).
#[derive(Clone)]
pub struct DualCfg {
    /// `cond2`.
    pub middle: Arc<Conditioning>,
    /// `cfg_cond2_negative`: the scale from the negative to `cond2`.
    pub cfg_middle: f64,
    /// The `nested` style: CFG of `cond1` over `cond2` first, then scaled away from the negative.
    pub nested: bool,
}

impl std::fmt::Debug for Guider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Guider({:?}, cfg {})", self.model, self.cfg)
    }
}

// A guider compares by identity, as the models in it do.
impl PartialEq for Guider {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}

/// `NOISE`: the sampler's starting noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Noise {
    /// torch's CPU `randn` for the latent's shape from this seed (`RandomNoise`); the seed also drives the
    /// samplers' per-step noise.
    Random(u64),
    /// Zeros: the latent is taken as already noisy. The seed still drives the samplers' per-step noise:
    /// `DisableNoise` carries 0, `KSamplerAdvanced` and `SamplerCustom` with noise off carry their seed input.
    Disabled(u64),
}

impl Noise {
    /// The seed the samplers' per-step noise starts from (ComfyUI passes `noise.seed`).
    pub fn seed(self) -> u64 {
        match self {
            Noise::Random(seed) => seed,
            Noise::Disabled(seed) => seed,
        }
    }
}
