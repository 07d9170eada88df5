//! The hooks ComfyUI runs on the predictions before CFG (`sampler_pre_cfg_function`, appended in the order the
//! nodes were applied): `TCFG`'s tangential damping of the unconditional prediction, `APG`'s adaptive
//! projected guidance, which rewrites the conditional one so CFG gives its result, and
//! `LatentApplyOperationCFG`'s latent operation on the guidance.
//!
//! Predictions are x̂₀ laid out `[B, C, ...]`; the ops are torch's in f32, reductions accumulated in f64.

use std::sync::{Arc, Mutex};

use super::guidance::{PredictionPair, Predictions, dims};
use super::latent_operation::LatentOperation;
use crate::error::Result;

/// A hook before CFG.
#[derive(Clone, Debug, PartialEq)]
pub enum PreCfg {
    /// `TCFG`: the unconditional prediction keeps only its part along both scores' main direction (skipped
    /// when ComfyUI skips the negative).
    TangentialDamping,
    /// `APG`.
    Apg(Apg),
    /// `LatentApplyOperationCFG`: the conditional prediction becomes `op(cond − uncond) + uncond` (`op(cond)`
    /// when the negative was skipped, and under PerpNegGuider, whose hooks see three predictions).
    LatentOperation(LatentOperation),
}

/// `APG` (Adaptive Projected Guidance, arXiv 2410.02416): the guidance `cond − uncond` (a running average of
/// it with `momentum`), scaled down to a norm of at most `norm_threshold`, its part along the conditional
/// prediction scaled by `eta`; the conditional prediction becomes `(uncond + guidance') + (cond − uncond) / cfg`,
/// which CFG at the run's scale turns into `cond + cfg · guidance'`.
#[derive(Clone, Debug)]
pub struct Apg {
    /// The parallel part's scale (1: CFG's).
    pub eta: f32,
    /// The largest norm the guidance keeps (0: unbounded).
    pub norm_threshold: f32,
    /// The running average's weight of the earlier guidance (0: none).
    pub momentum: f32,
    /// The running average and the last sigma, kept across the model's runs as ComfyUI's closure keeps them
    /// (a sigma above the last starts the average again).
    state: Arc<Mutex<ApgState>>,
}

#[derive(Debug, Default)]
struct ApgState {
    running: Option<Vec<f32>>,
    last_sigma: Option<f32>,
}

impl Apg {
    /// The hook with a fresh running average.
    pub fn new(eta: f32, norm_threshold: f32, momentum: f32) -> Apg {
        Apg { eta, norm_threshold, momentum, state: Arc::default() }
    }
}

// One node's hook is one hook: equal settings and the same running average.
impl PartialEq for Apg {
    fn eq(&self, other: &Self) -> bool {
        (self.eta, self.norm_threshold, self.momentum)
            == (other.eta, other.norm_threshold, other.momentum)
            && Arc::ptr_eq(&self.state, &other.state)
    }
}

/// `hooks` in order on `p`: the conditional and unconditional x̂₀ CFG then combines (`None` for the latter when
/// ComfyUI skipped the negative and no hook made one).
/// `outputs` is how many predictions ComfyUI's `conds_out` holds (2 for CFG, 3 for PerpNeg).
pub(super) fn apply(
    hooks: &[PreCfg],
    p: &Predictions<'_>,
    outputs: usize,
) -> Result<PredictionPair> {
    let mut cond = p.cond.to_vec();
    let mut uncond = p.uncond.map(<[f32]>::to_vec);
    for hook in hooks {
        match hook {
            // TCFG passes when the negative was skipped.
            PreCfg::TangentialDamping => {
                if let Some(u) = &uncond {
                    uncond = Some(tangential_damping(p, &cond, u));
                }
            }
            // APG reads a skipped negative as zeros (ComfyUI's `conds_out` holds them).
            PreCfg::Apg(apg) => {
                let u = uncond.get_or_insert_with(|| vec![0.0; cond.len()]);
                cond = apg.apply(p, &cond, u);
            }
            // ComfyUI's hook works on the guidance only when the guider gave two predictions.
            PreCfg::LatentOperation(op) => {
                cond = match &uncond {
                    Some(u) if outputs == 2 => {
                        let guidance: Vec<f32> = cond.iter().zip(u).map(|(c, u)| c - u).collect();
                        let changed = op.apply(&guidance, p.shape)?;
                        changed.iter().zip(u).map(|(g, u)| g + u).collect()
                    }
                    _ => op.apply(&cond, p.shape)?,
                };
            }
        }
    }
    Ok((cond, uncond))
}

impl Apg {
    fn apply(&self, p: &Predictions<'_>, cond: &[f32], uncond: &[f32]) -> Vec<f32> {
        let mut guidance: Vec<f32> = cond.iter().zip(uncond).map(|(c, u)| c - u).collect();
        if self.momentum != 0.0 {
            // A poisoned lock is a panic in another run of the model; its average is dropped.
            let mut state = self.state.lock().unwrap_or_else(|e| {
                let mut state = e.into_inner();
                *state = ApgState::default();
                state
            });
            if state.last_sigma.is_some_and(|last| p.sigma > last) {
                state.running = None;
            }
            state.last_sigma = Some(p.sigma);
            let running = match state.running.take() {
                Some(r) if r.len() == guidance.len() => {
                    r.iter().zip(&guidance).map(|(r, g)| self.momentum * r + g).collect()
                }
                _ => guidance,
            };
            state.running = Some(running.clone());
            guidance = running;
        } else if let Ok(mut state) = self.state.lock() {
            state.last_sigma = Some(p.sigma);
        }
        let groups = last_three(p.shape);
        if self.norm_threshold > 0.0 {
            for g in guidance.chunks_exact_mut(groups) {
                let norm = norm(g);
                let scale = (self.norm_threshold / norm).min(1.0);
                g.iter_mut().for_each(|v| *v *= scale);
            }
        }
        let mut out = Vec::with_capacity(cond.len());
        for ((g, c), u) in guidance
            .chunks_exact(groups)
            .zip(cond.chunks_exact(groups))
            .zip(uncond.chunks_exact(groups))
        {
            // `project`: c normalised (F.normalize, eps 1e-12), g's part along it and the rest.
            let length = norm(c).max(1e-12);
            let unit: Vec<f32> = c.iter().map(|v| v / length).collect();
            let along = g.iter().zip(&unit).map(|(a, b)| f64::from(a * b)).sum::<f64>() as f32;
            for j in 0..g.len() {
                let parallel = along * unit[j];
                let orthogonal = g[j] - parallel;
                let modified = orthogonal + self.eta * parallel;
                out.push((u[j] + modified) + (c[j] - u[j]) / p.cfg);
            }
        }
        out
    }
}

/// How many values the last three dimensions of `shape` hold (APG's norms and projections run over them: each
/// sample's channels of an image latent, each channel's frames of a video one).
fn last_three(shape: &[usize]) -> usize {
    shape.iter().rev().take(3).product::<usize>().max(1)
}

/// The 2-norm of `v`, accumulated in f64.
fn norm(v: &[f32]) -> f32 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt() as f32
}

/// `TCFG`'s hook (Tangential Damping CFG, arXiv 2503.18137): per sample, the unconditional score x − uncond
/// keeps only its projection on the first right singular vector of the 2 × N matrix of both scores
/// (`torch.linalg.svd`; found here from the 2 × 2 Gram matrix in f64), and the prediction is x minus that.
fn tangential_damping(p: &Predictions<'_>, cond: &[f32], uncond: &[f32]) -> Vec<f32> {
    let (batch, channels, inner) = dims(p.shape);
    let per = channels * inner;
    let mut out = Vec::with_capacity(uncond.len());
    for b in 0..batch {
        let range = b * per..(b + 1) * per;
        let u: Vec<f64> = range.clone().map(|j| f64::from(p.x[j] - uncond[j])).collect();
        let c: Vec<f64> = range.clone().map(|j| f64::from(p.x[j] - cond[j])).collect();
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let (uu, uc, cc) = (dot(&u, &u), dot(&u, &c), dot(&c, &c));
        // The larger eigenvalue of [[uu, uc], [uc, cc]] and its unit eigenvector (e_u, e_c).
        let lambda = (uu + cc) / 2.0 + (((uu - cc) / 2.0).powi(2) + uc * uc).sqrt();
        let (eu, ec) = if (lambda - uu).abs() >= (lambda - cc).abs() {
            (uc, lambda - uu)
        } else {
            (lambda - cc, uc)
        };
        let length = (eu * eu + ec * ec).sqrt();
        let damped: Vec<f64> = if lambda <= 0.0 || length == 0.0 {
            // Both scores zero: nothing to keep.
            vec![0.0; per]
        } else {
            // v = Aᵀe / √λ; u's part along it: (u·v)v.
            let (eu, ec) = (eu / length, ec / length);
            let v: Vec<f64> =
                u.iter().zip(&c).map(|(a, b)| (eu * a + ec * b) / lambda.sqrt()).collect();
            let along = dot(&u, &v);
            v.iter().map(|x| along * x).collect()
        };
        out.extend(range.zip(damped).map(|(j, d)| p.x[j] - d as f32));
    }
    out
}
