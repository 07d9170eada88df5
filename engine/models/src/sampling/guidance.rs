//! How the conditional and unconditional predictions combine: ComfyUI's `cfg_function` with the hooks model
//! patches install in `model_options` — one `sampler_cfg_function` replacing CFG (`RescaleCFG`, `CFGNorm` with
//! `pre_cfg`) and a list of `sampler_post_cfg_function`s applied after it in order (`CFGNorm`, `CFGZeroStar`,
//! `SkipLayerGuidanceDiT`, whose hook asks the caller for one more model pass). The hooks before CFG (`TCFG`,
//! `APG`) are `pre_cfg`'s: the caller runs them first ([`Guidance::before_cfg`]) and combines what they return.
//!
//! Predictions are x̂₀ (ComfyUI's `cond_denoised`), laid out `[B, C, ...]`; each op is the torch op's f32
//! arithmetic, reductions summed in index order (equal up to rounding).

pub use super::pre_cfg::{Apg, PreCfg};

/// A hook that replaces CFG (`set_model_sampler_cfg_function`; a later one replaces an earlier one).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum CfgFunction {
    /// `RescaleCFG`: CFG on the v-prediction, its std rescaled to the conditional's, blended by `multiplier`.
    Rescale {
        /// 1 = fully rescaled.
        multiplier: f32,
    },
    /// `CFGNorm` with `pre_cfg`: the combined noise rescaled per position to the conditional noise's channel
    /// norm (no clamp), blended by `strength`.
    NormPre {
        /// 1 = fully rescaled.
        strength: f32,
    },
    /// `RenormCFG` (Lumina 2's): below `cfg_trunc` (a sigma), CFG whose per-sample norm is capped at the
    /// conditional prediction's times `renorm_cfg` (0: no cap); from it up, the conditional prediction alone.
    Renorm {
        /// The sigma below which CFG applies.
        cfg_trunc: f32,
        /// The cap on the result's norm, relative to the conditional prediction's.
        renorm_cfg: f32,
    },
}

/// A hook applied to the combined x̂₀ (`set_model_sampler_post_cfg_function`; they accumulate, in order).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PostCfg {
    /// `CFGNorm`: the result scaled down per position so its channel norm does not exceed the conditional's,
    /// times `strength`.
    Norm {
        /// Multiplies the result.
        strength: f32,
    },
    /// `CFGZeroStar`: the unconditional prediction projected onto the conditional noise direction.
    ZeroStar,
    /// `Mahiro` ("Positive-Biased Guidance"): the result pulled towards the conditional prediction times the
    /// scale, the more so the less the scaled unconditional prediction agrees with their mean.
    Mahiro,
    /// `SkipLayerGuidanceDiT`: inside its σ range, the conditional prediction of a pass without some blocks is
    /// pushed away from.
    SkipLayer(SkipLayers),
    /// `Epsilon Scaling`: the predicted noise x − x̂₀ divided by `factor`.
    EpsilonScaling {
        /// The divisor (0 taken as 1e-9, as ComfyUI guards it).
        factor: f64,
    },
    /// `TemporalScoreRescaling` (TSR, arXiv 2510.01184): x̂₀ moved towards x/α by the score ratio
    /// r = (snr·v + 1)/(snr·v/k + 1) (`torch.lerp(x/α, x̂₀, r)`), snr and α from the half-log-SNR of σ.
    ScoreRescaling {
        /// `tsr_k` (1: no rescaling).
        k: f64,
        /// `tsr_sigma`².
        variance: f64,
        /// Whether the model's sampling is a flow's (its half-log-SNR −logit σ; else −ln σ): the node's model's,
        /// set again from the sampled model's when a run starts ([`Guidance::sampling_is_flow`]).
        flow: bool,
    },
}

/// `SkipLayerGuidanceDiT`'s hook: which blocks its extra conditional pass leaves out, when it runs and how its
/// difference is added (`result + (cond − skipped)·scale`, then optionally rescaled to the conditional's std).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SkipLayers {
    /// Bit i set: the pass skips double-stream block i (ComfyUI's `double_block`, Wan's blocks).
    pub double: u64,
    /// Bit i set: the pass skips single-stream block i (ComfyUI's `single_block`).
    pub single: u64,
    /// How strongly the difference is added; 0 turns the hook off.
    pub scale: f32,
    /// The σ range the hook runs in, inclusive: from `start_percent` (the larger σ) to `end_percent`.
    pub sigma_start: f32,
    /// See `sigma_start`.
    pub sigma_end: f32,
    /// `rescaling_scale`: 0 leaves the result's scale; 1 rescales it to the conditional prediction's std.
    pub rescaling: f32,
}

impl SkipLayers {
    /// Whether the hook runs at `sigma` (ComfyUI compares the first sample's σ).
    pub fn active(&self, sigma: f32) -> bool {
        self.scale > 0.0 && sigma >= self.sigma_end && sigma <= self.sigma_start
    }
}

/// `SkipLayerGuidanceDiTSimple`'s hook (ComfyUI's `calc_cond_batch_function`): inside its σ range the
/// unconditional prediction comes from a pass that leaves these blocks out; the conditional one is the model's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UncondSkip {
    /// Bit i set: the pass skips double-stream block i (Wan's blocks).
    pub double: u64,
    /// Bit i set: the pass skips single-stream block i.
    pub single: u64,
    /// The σ range it runs in, inclusive: from `start_percent` (the larger σ) to `end_percent`.
    pub sigma_start: f32,
    /// See `sigma_start`.
    pub sigma_end: f32,
}

impl UncondSkip {
    /// Whether the hook runs at `sigma` (ComfyUI compares the first sample's σ).
    pub fn active(&self, sigma: f32) -> bool {
        sigma >= self.sigma_end && sigma <= self.sigma_start
    }
}

/// The hooks a model carries.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Guidance {
    /// Replaces CFG, when set.
    pub cfg_function: Option<CfgFunction>,
    /// Applied after CFG, in order.
    pub post_cfg: Vec<PostCfg>,
    /// How the unconditional prediction is made, when `SkipLayerGuidanceDiTSimple` set it (the last one
    /// applied: ComfyUI's hook replaces).
    pub uncond_skip: Option<UncondSkip>,
    /// The hooks before CFG (`set_model_sampler_pre_cfg_function`, which appends: `TCFG`, `APG`), in order.
    pub pre_cfg: Vec<PreCfg>,
    /// `CFGOverride`s, in the order applied.
    pub cfg_overrides: Vec<CfgOverride>,
}

/// `CFGOverride`: the guider's CFG scale replaced by `cfg` while σ lies in `sigma_low..=sigma_high`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CfgOverride {
    /// The scale in the range.
    pub cfg: f64,
    /// σ at `end_percent`.
    pub sigma_low: f64,
    /// σ at `start_percent`.
    pub sigma_high: f64,
}

impl Guidance {
    /// The CFG scale at `sigma` for a guider of scale `base`: that of the last override applied whose range
    /// holds σ (ComfyUI's wrappers nest in the order applied, so the innermost, nearest the sampler, sets the
    /// scale last), else `base`.
    pub fn cfg_at(&self, base: f64, sigma: f32) -> f64 {
        let sigma = f64::from(sigma);
        self.cfg_overrides
            .iter()
            .rev()
            .find(|o| o.sigma_low <= sigma && sigma <= o.sigma_high)
            .map_or(base, |o| o.cfg)
    }
}

/// The conditional x̂₀ and the unconditional one (`None`: skipped) that CFG combines.
pub type PredictionPair = (Vec<f32>, Option<Vec<f32>>);

/// One model call's predictions to combine.
#[derive(Clone, Copy, Debug)]
pub struct Predictions<'a> {
    /// The model input x (σ-noised latent).
    pub x: &'a [f32],
    /// The conditional x̂₀.
    pub cond: &'a [f32],
    /// The unconditional x̂₀; `None` when ComfyUI skips it (CFG 1), which its hooks see as zeros.
    pub uncond: Option<&'a [f32]>,
    /// The CFG scale.
    pub cfg: f32,
    /// The noise level.
    pub sigma: f32,
    /// `[B, C, ...]`.
    pub shape: &'a [usize],
}

impl Guidance {
    /// Whether no hook changes how predictions combine (plain CFG; [`Guidance::uncond_skip`] changes only how
    /// the unconditional one is made).
    pub fn is_plain(&self) -> bool {
        self.cfg_function.is_none() && self.post_cfg.is_empty() && self.pre_cfg.is_empty()
    }

    /// Tells the hooks that read the model's sampling whether it is a flow's (`TemporalScoreRescaling`'s
    /// half-log-SNR), as a sampling run starts: ComfyUI's hooks read it then, not when the node ran.
    pub fn sampling_is_flow(&mut self, is_flow: bool) {
        for hook in &mut self.post_cfg {
            if let PostCfg::ScoreRescaling { flow, .. } = hook {
                *flow = is_flow;
            }
        }
    }

    /// ComfyUI's pre-CFG hooks on `p` (`sampler_pre_cfg_function`, which its CFGGuider runs and its
    /// DualCFGGuider does not): the conditional and unconditional x̂₀ to combine, and that the post-CFG hooks
    /// and a CFG++ sampler read; `None` without hooks.
    /// `outputs` is how many predictions the guider hands the hooks (ComfyUI's `conds_out`: 2 for CFG, 3 for
    /// PerpNegGuider's), which `LatentApplyOperationCFG`'s hook reads.
    pub fn before_cfg(
        &self,
        p: &Predictions<'_>,
        outputs: usize,
    ) -> crate::Result<Option<PredictionPair>> {
        if self.pre_cfg.is_empty() {
            return Ok(None);
        }
        super::pre_cfg::apply(&self.pre_cfg, p, outputs).map(Some)
    }

    /// ComfyUI's `cfg_function`: CFG or the replacing hook, then every post-CFG hook. A `SkipLayer` hook is
    /// left out here (it needs a model pass: [`Guidance::combine_with`]).
    pub fn combine(&self, p: Predictions<'_>) -> Vec<f32> {
        self.combine_passes(p, &mut |_| None)
    }

    /// [`Guidance::combine`], with `skipped` making the conditional prediction of the pass a `SkipLayer` hook
    /// asks for. The first error it returns ends the combination.
    pub fn combine_with(
        &self,
        p: Predictions<'_>,
        skipped: &mut dyn FnMut(&SkipLayers) -> Result<Vec<f32>, crate::Error>,
    ) -> Result<Vec<f32>, crate::Error> {
        catching(skipped, |passes| self.combine_passes(p, passes))
    }

    /// The post-CFG hooks alone on `out`, the combination a guider made itself (`PerpNegGuider`'s, which
    /// ComfyUI hands the hooks as `denoised`), with `skipped` as in [`Guidance::combine_with`].
    pub fn after_cfg_with(
        &self,
        p: Predictions<'_>,
        out: Vec<f32>,
        skipped: &mut dyn FnMut(&SkipLayers) -> Result<Vec<f32>, crate::Error>,
    ) -> Result<Vec<f32>, crate::Error> {
        catching(skipped, |passes| self.post_passes(&p, out, passes))
    }

    /// The combination, with `skipped` giving a `SkipLayer` hook's pass (`None`: the hook leaves the result).
    fn combine_passes(
        &self,
        p: Predictions<'_>,
        skipped: &mut dyn FnMut(&SkipLayers) -> Option<Vec<f32>>,
    ) -> Vec<f32> {
        let uncond = &*uncond_or_zeros(&p);
        let out = match self.cfg_function {
            None => p.cond.iter().zip(uncond).map(|(c, u)| u + (c - u) * p.cfg).collect(),
            Some(CfgFunction::Rescale { multiplier }) => rescale_cfg(&p, uncond, multiplier),
            Some(CfgFunction::NormPre { strength }) => norm_pre(&p, uncond, strength),
            Some(CfgFunction::Renorm { cfg_trunc, renorm_cfg }) => {
                renorm_cfg_fn(&p, uncond, cfg_trunc, renorm_cfg)
            }
        };
        self.post_passes(&p, out, skipped)
    }

    /// Every post-CFG hook on `out`, in order (a skipped negative read as zeros).
    fn post_passes(
        &self,
        p: &Predictions<'_>,
        mut out: Vec<f32>,
        skipped: &mut dyn FnMut(&SkipLayers) -> Option<Vec<f32>>,
    ) -> Vec<f32> {
        let uncond = &*uncond_or_zeros(p);
        let p = *p;
        for hook in &self.post_cfg {
            out = match *hook {
                PostCfg::Norm { strength } => cfg_norm(&p, &out, strength),
                PostCfg::ZeroStar => zero_star(&p, uncond, &out),
                PostCfg::Mahiro => mahiro(&p, uncond, &out),
                PostCfg::SkipLayer(layers) if layers.active(p.sigma) => match skipped(&layers) {
                    Some(pass) => skip_layer(&p, &out, &pass, &layers),
                    None => out,
                },
                PostCfg::SkipLayer(_) => out,
                PostCfg::EpsilonScaling { factor } => epsilon_scaling(&p, &out, factor),
                PostCfg::ScoreRescaling { k, variance, flow } => {
                    score_rescaling(&p, out, (k, variance), flow)
                }
            };
        }
        out
    }
}

/// `RenormCFG`'s hook on x̂₀ (its `cond_eps` are the x̂₀ ComfyUI hands it): CFG, each sample scaled down to the
/// conditional's norm times `renorm_cfg` when it reaches that, below `cfg_trunc`; the conditional prediction
/// above. The hook returns `x − result` and `cfg_function` takes that from x again, as here.
fn renorm_cfg_fn(p: &Predictions<'_>, uncond: &[f32], cfg_trunc: f32, renorm_cfg: f32) -> Vec<f32> {
    let (batch, channels, inner) = dims(p.shape);
    let per = channels * inner;
    let norm =
        |v: &[f32]| v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt() as f32;
    let mut out = Vec::with_capacity(p.cond.len());
    for b in 0..batch {
        let range = b * per..(b + 1) * per;
        let cond = &p.cond[range.clone()];
        let mut half: Vec<f32> = if p.sigma < cfg_trunc {
            cond.iter().zip(&uncond[range.clone()]).map(|(c, u)| u + p.cfg * (c - u)).collect()
        } else {
            cond.to_vec()
        };
        if p.sigma < cfg_trunc && renorm_cfg > 0.0 {
            let max_norm = norm(cond) * renorm_cfg;
            let new_norm = norm(&half);
            if new_norm >= max_norm {
                let scale = max_norm / new_norm;
                half.iter_mut().for_each(|v| *v *= scale);
            }
        }
        out.extend(p.x[range].iter().zip(half).map(|(x, h)| x - (x - h)));
    }
    out
}

/// `Epsilon Scaling`'s hook: `x − (x − out)/factor`.
fn epsilon_scaling(p: &Predictions<'_>, out: &[f32], factor: f64) -> Vec<f32> {
    let factor = if factor == 0.0 { 1e-9 } else { factor } as f32;
    p.x.iter().zip(out).map(|(x, d)| x - (x - d) / factor).collect()
}

/// `TemporalScoreRescaling`'s hook, as ComfyUI's: nothing at k = 1, σ = 0 or an SNR of 0; else
/// `lerp(x/α, out, r)` in torch's form (from the nearer end).
fn score_rescaling(
    p: &Predictions<'_>,
    out: Vec<f32>,
    (k, variance): (f64, f64),
    flow: bool,
) -> Vec<f32> {
    let sigma = p.sigma;
    if k == 1.0 || sigma == 0.0 {
        return out;
    }
    let half_log_snr = if flow { super::flow::half_log_snr(sigma) } else { -sigma.ln() };
    let snr = (2.0 * half_log_snr).exp();
    if snr == 0.0 {
        return out;
    }
    let (k, variance) = (k as f32, variance as f32);
    let r =
        if snr == f32::INFINITY { k } else { (snr * variance + 1.0) / (snr * variance / k + 1.0) };
    let alpha = sigma * half_log_snr.exp();
    // torch's vectorised `lerp`: one fused multiply-add from the nearer end.
    p.x.iter()
        .zip(out)
        .map(|(x, end)| {
            let start = x / alpha;
            if r.abs() < 0.5 {
                r.mul_add(end - start, start)
            } else {
                (r - 1.0).mul_add(end - start, end)
            }
        })
        .collect()
}

/// The unconditional prediction, or zeros where ComfyUI skipped it (what its hooks then read).
fn uncond_or_zeros<'p>(p: &Predictions<'p>) -> std::borrow::Cow<'p, [f32]> {
    match p.uncond {
        Some(u) => std::borrow::Cow::Borrowed(u),
        None => std::borrow::Cow::Owned(vec![0.0; p.cond.len()]),
    }
}

/// `run` with a `SkipLayer` pass maker that records the first error `skipped` returns (the hook then leaves the
/// result), and that error afterwards.
fn catching(
    skipped: &mut dyn FnMut(&SkipLayers) -> Result<Vec<f32>, crate::Error>,
    run: impl FnOnce(&mut dyn FnMut(&SkipLayers) -> Option<Vec<f32>>) -> Vec<f32>,
) -> Result<Vec<f32>, crate::Error> {
    let mut failed = None;
    let out = run(&mut |layers| match skipped(layers) {
        Ok(pass) => Some(pass),
        Err(e) => {
            failed.get_or_insert(e);
            None
        }
    });
    match failed {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// `SkipLayerGuidanceDiT`'s hook: `out + (cond − skipped)·scale`, then with `rescaling` the result scaled
/// towards the conditional prediction's std over the whole batch (torch's unbiased `std()`).
fn skip_layer(p: &Predictions<'_>, out: &[f32], skipped: &[f32], layers: &SkipLayers) -> Vec<f32> {
    let mut result: Vec<f32> =
        out.iter().zip(p.cond).zip(skipped).map(|((o, c), s)| o + (c - s) * layers.scale).collect();
    if layers.rescaling != 0.0 {
        let factor = std(p.cond) / std(&result);
        let factor = layers.rescaling * factor + (1.0 - layers.rescaling);
        result.iter_mut().for_each(|v| *v *= factor);
    }
    result
}

/// The unbiased standard deviation of `v` (torch's `std()`), accumulated in f64.
pub(super) fn std(v: &[f32]) -> f32 {
    let n = v.len() as f64;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
    let var = v.iter().map(|&x| (f64::from(x) - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    var.sqrt() as f32
}

/// The batch size, the channel count and the positions per channel of `shape`.
pub(super) fn dims(shape: &[usize]) -> (usize, usize, usize) {
    let batch = shape.first().copied().unwrap_or(1);
    let channels = shape.get(1).copied().unwrap_or(1);
    let inner = shape.iter().skip(2).product::<usize>();
    (batch, channels, inner)
}

/// The 2-norm over channels at every position of `v` `[B, C, ...]` (`torch.norm(v, dim=1)`), as `[B, ...]`.
pub(super) fn channel_norms(v: &[f32], shape: &[usize]) -> Vec<f32> {
    let (batch, channels, inner) = dims(shape);
    let mut norms = vec![0.0f32; batch * inner];
    for b in 0..batch {
        for i in 0..inner {
            let sum = (0..channels).fold(0.0f32, |s, c| {
                let e = v[(b * channels + c) * inner + i];
                s + e * e
            });
            norms[b * inner + i] = sum.sqrt();
        }
    }
    norms
}

/// `v` with every element scaled by its position's factor (`[B, ...]`).
fn scale_positions(v: &[f32], shape: &[usize], factor: impl Fn(usize) -> f32) -> Vec<f32> {
    let (_, channels, inner) = dims(shape);
    v.iter()
        .enumerate()
        .map(|(j, e)| {
            let (b, i) = (j / (channels * inner), j % inner);
            e * factor(b * inner + i)
        })
        .collect()
}

/// `CFGNorm`'s post-CFG hook: `denoised · clamp(‖cond‖ / (‖denoised‖ + 1e-8), 0, 1) · strength`.
fn cfg_norm(p: &Predictions<'_>, denoised: &[f32], strength: f32) -> Vec<f32> {
    let cond_norm = channel_norms(p.cond, p.shape);
    let pred_norm = channel_norms(denoised, p.shape);
    let scaled = scale_positions(denoised, p.shape, |k| {
        (cond_norm[k] / (pred_norm[k] + 1e-8)).clamp(0.0, 1.0)
    });
    scaled.into_iter().map(|v| v * strength).collect()
}

/// `CFGNorm`'s pre-CFG hook: on the noises (x − x̂₀), CFG rescaled per position to the conditional's norm.
fn norm_pre(p: &Predictions<'_>, uncond: &[f32], strength: f32) -> Vec<f32> {
    let cond: Vec<f32> = p.x.iter().zip(p.cond).map(|(x, c)| x - c).collect();
    let uncond: Vec<f32> = p.x.iter().zip(uncond).map(|(x, u)| x - u).collect();
    let comb: Vec<f32> = cond.iter().zip(&uncond).map(|(c, u)| u + p.cfg * (c - u)).collect();
    let cond_norm = channel_norms(&cond, p.shape);
    let comb_norm = channel_norms(&comb, p.shape);
    let rescaled = scale_positions(&comb, p.shape, |k| {
        if comb_norm[k] > 0.0 { cond_norm[k] / comb_norm[k].max(1e-12) } else { 1.0 }
    });
    let rescaled: Vec<f32> = if strength == 1.0 {
        rescaled
    } else {
        rescaled.iter().zip(&comb).map(|(r, c)| strength * r + (1.0 - strength) * c).collect()
    };
    p.x.iter().zip(rescaled).map(|(x, r)| x - r).collect()
}

/// `CFGZeroStar`'s hook: `out + u·(α − 1) + cfg·u·(1 − α)` with α the projection of the conditional noise on
/// the unconditional one, per sample.
fn zero_star(p: &Predictions<'_>, uncond: &[f32], out: &[f32]) -> Vec<f32> {
    let (batch, channels, inner) = dims(p.shape);
    let per = channels * inner;
    let mut result = Vec::with_capacity(out.len());
    for b in 0..batch {
        let range = b * per..(b + 1) * per;
        let (mut dot, mut squared) = (0.0f32, 0.0f32);
        for j in range.clone() {
            let (pos, neg) = (p.x[j] - p.cond[j], p.x[j] - uncond[j]);
            dot += pos * neg;
            squared += neg * neg;
        }
        let alpha = dot / (squared + 1e-8);
        for j in range {
            let u = uncond[j];
            result.push(out[j] + u * (alpha - 1.0) + p.cfg * u * (1.0 - alpha));
        }
    }
    result
}

/// `Mahiro`'s hook: with leap = cond·scale and merge = (leap + out)/2, the cosine similarity over channels of
/// the signed square roots of uncond·scale and merge (torch's `cosine_similarity`: each vector divided by its
/// norm, at least 1e-8), averaged over the batch's positions, sets s = 2·(sim + 1); the result is
/// (s·out + (4 − s)·leap)/4.
fn mahiro(p: &Predictions<'_>, uncond: &[f32], out: &[f32]) -> Vec<f32> {
    let (batch, channels, inner) = dims(p.shape);
    let signed_root = |v: f32| {
        v.abs().sqrt()
            * if v > 0.0 {
                1.0
            } else if v < 0.0 {
                -1.0
            } else {
                0.0
            }
    };
    let leap: Vec<f32> = p.cond.iter().map(|c| c * p.cfg).collect();
    let u: Vec<f32> = uncond.iter().map(|v| signed_root(v * p.cfg)).collect();
    let m: Vec<f32> = leap.iter().zip(out).map(|(l, o)| signed_root((l + o) / 2.0)).collect();
    let (u_norms, m_norms) = (channel_norms(&u, p.shape), channel_norms(&m, p.shape));
    let mut total = 0.0f32;
    for b in 0..batch {
        for i in 0..inner {
            let at = b * inner + i;
            let (un, mn) = (u_norms[at].max(1e-8), m_norms[at].max(1e-8));
            total += (0..channels)
                .map(|c| {
                    let j = (b * channels + c) * inner + i;
                    (u[j] / un) * (m[j] / mn)
                })
                .sum::<f32>();
        }
    }
    let sim = total / (batch * inner).max(1) as f32;
    let scale = 2.0 * (sim + 1.0);
    out.iter().zip(&leap).map(|(o, l)| (scale * o + (4.0 - scale) * l) / 4.0).collect()
}

/// `RescaleCFG`'s hook: CFG on the v-predictions, rescaled to the conditional's std over each sample (torch's
/// unbiased std), blended, and turned back into x̂₀.
fn rescale_cfg(p: &Predictions<'_>, uncond: &[f32], multiplier: f32) -> Vec<f32> {
    let sigma = p.sigma;
    let up = (sigma * sigma + 1.0).sqrt();
    // `args["cond"]` is the noise x − x̂₀; ComfyUI turns it into the v-prediction.
    let v = |pred: &[f32]| -> Vec<f32> {
        p.x.iter()
            .zip(pred)
            .map(|(&x_orig, &d)| {
                let x = x_orig / (sigma * sigma + 1.0);
                let noise = x_orig - d;
                ((x - (x_orig - noise)) * up) / sigma
            })
            .collect()
    };
    let (cond, uncond) = (v(p.cond), v(uncond));
    let x_cfg: Vec<f32> = cond.iter().zip(&uncond).map(|(c, u)| u + p.cfg * (c - u)).collect();
    let (batch, channels, inner) = dims(p.shape);
    let per = channels * inner;
    let std = |values: &[f32]| -> f32 {
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>()
            / (values.len().max(2) - 1) as f32;
        var.sqrt()
    };
    let mut out = Vec::with_capacity(x_cfg.len());
    for b in 0..batch {
        let range = b * per..(b + 1) * per;
        let ratio = std(&cond[range.clone()]) / std(&x_cfg[range.clone()]);
        for j in range {
            let rescaled = x_cfg[j] * ratio;
            let final_ = multiplier * rescaled + (1.0 - multiplier) * x_cfg[j];
            let x = p.x[j] / (sigma * sigma + 1.0);
            // The hook returns a noise; `cfg_function` takes it from the input.
            let returned = p.x[j] - (x - final_ * sigma / up);
            out.push(p.x[j] - returned);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(scale: f32, rescaling: f32) -> SkipLayers {
        SkipLayers { double: 1, single: 0, scale, sigma_start: 0.9, sigma_end: 0.1, rescaling }
    }

    #[test]
    fn skip_layer_guidance_adds_the_difference_inside_its_range_and_rescales() {
        let (x, cond, uncond) = ([0.0f32; 4], [1.0f32, 2.0, 3.0, 4.0], [0.0f32; 4]);
        let p = |sigma| Predictions {
            x: &x,
            cond: &cond,
            uncond: Some(&uncond),
            cfg: 1.0,
            sigma,
            shape: &[1, 4],
        };
        let skipped = [0.5f32, 1.5, 2.5, 3.5];
        let hooked = |l: SkipLayers| Guidance {
            post_cfg: vec![PostCfg::SkipLayer(l)],
            ..Guidance::default()
        };
        let pass = &mut |_: &SkipLayers| -> Result<Vec<f32>, crate::Error> { Ok(skipped.to_vec()) };
        // CFG 1 gives cond; the hook adds (cond − skipped)·2 = 1.
        let out = hooked(layers(2.0, 0.0)).combine_with(p(0.5), pass).unwrap();
        assert_eq!(out, [2.0, 3.0, 4.0, 5.0]);
        // Outside the σ range, or without a pass (`combine`), the hook leaves the result.
        assert_eq!(hooked(layers(2.0, 0.0)).combine_with(p(0.95), pass).unwrap(), cond);
        assert_eq!(hooked(layers(2.0, 0.0)).combine(p(0.5)), cond);
        // Full rescaling brings the std back to the conditional's: a shift by 1 keeps it, so the factor is 1.
        let out = hooked(layers(2.0, 1.0)).combine_with(p(0.5), pass).unwrap();
        assert!(out.iter().zip([2.0, 3.0, 4.0, 5.0]).all(|(a, b)| (a - b).abs() < 1e-6), "{out:?}");
        // A failing pass is the combination's error.
        let failing = &mut |_: &SkipLayers| -> Result<Vec<f32>, crate::Error> {
            Err(crate::Error::Invalid("no pass".to_owned()))
        };
        assert!(hooked(layers(2.0, 0.0)).combine_with(p(0.5), failing).is_err());
    }
}
