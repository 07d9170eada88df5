//! The sampler's model calls on context windows (`ContextWindowsManual`, ComfyUI's `IndexListContextHandler`):
//! which step a call belongs to, the frames of a tensor a window reads, and the fusion of the windows' outputs
//! into the whole latent's.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::models::context_windows::{ContextWindows, Fuse, Window, relative_bias};

/// One sampling run's context windows: the settings, the run's sigmas (a call's step is the first sigma its
/// own matches) and the step of the last call.
pub(super) struct WindowRun {
    pub(super) windows: Arc<ContextWindows>,
    sigmas: Vec<f32>,
    step: AtomicUsize,
}

impl WindowRun {
    /// The windows of a run over `sigmas`.
    pub(super) fn new(windows: Arc<ContextWindows>, sigmas: &[f32]) -> WindowRun {
        WindowRun { windows, sigmas: sigmas.to_vec(), step: AtomicUsize::new(0) }
    }

    /// The step of a call at `sigma`: the first of the run's sigmas within 1e-8 + 1e-4·|σ| of it (torch's
    /// `isclose`), or the last call's step for a sigma between steps (a multi-stage sampler's).
    pub(super) fn step_at(&self, sigma: f32) -> usize {
        let close = |s: f32| (s - sigma).abs() <= 1e-8 + 1e-4 * sigma.abs();
        match self.sigmas.iter().position(|&s| close(s)) {
            Some(step) => {
                self.step.store(step, Ordering::Relaxed);
                step
            }
            None => self.step.load(Ordering::Relaxed),
        }
    }

    /// The windows of a call at `sigma` over a latent of `shape`, or `None` when the latent is not longer
    /// than a window (one plain call).
    pub(super) fn windows_of(
        &self,
        shape: &[usize],
        sigma: f32,
    ) -> Result<Option<Vec<Window>>, String> {
        let dim = self.windows.dim;
        let Some(&frames) = shape.get(dim) else {
            return Err(format!(
                "context windows cut dimension {dim}, which a latent of {shape:?} does not have: set dim to the \
                 frames' (2 for a video latent [B, C, T, H, W])"
            ));
        };
        if !self.windows.applies(frames) {
            return Ok(None);
        }
        self.windows.windows(frames, self.step_at(sigma)).map(Some)
    }
}

/// The frames `indices` of `values` (of `shape`) along `dim`, then those positions of `retain` inside the
/// result set back to the whole's frame of the same index (ComfyUI's `get_tensor` with a retain list).
pub(super) fn gather_frames(
    values: &[f32],
    shape: &[usize],
    dim: usize,
    indices: &[usize],
    retain: &[usize],
) -> (Vec<usize>, Vec<f32>) {
    let frames = shape[dim];
    let outer: usize = shape[..dim].iter().product();
    let inner: usize = shape[dim + 1..].iter().product();
    let mut sources = indices.to_vec();
    for &r in retain {
        if r < sources.len() && r < frames {
            sources[r] = r;
        }
    }
    let mut out = Vec::with_capacity(outer * sources.len() * inner);
    for o in 0..outer {
        for &f in &sources {
            out.extend_from_slice(&values[(o * frames + f) * inner..][..inner]);
        }
    }
    let mut out_shape = shape.to_vec();
    out_shape[dim] = sources.len();
    (out_shape, out)
}

/// The whole latent's output gathered from its windows' (ComfyUI's `combine_context_window_results` and the
/// final division).
pub(super) struct Fusion {
    shape: Vec<usize>,
    dim: usize,
    fuse: Fuse,
    sum: Vec<f32>,
    /// Per frame: the weights added (pyramid, flat, overlap-linear) or the bias gathered (relative).
    weight: Vec<f64>,
}

impl Fusion {
    /// An empty fusion of outputs of `shape`.
    pub(super) fn new(shape: &[usize], windows: &ContextWindows) -> Fusion {
        let frames = shape[windows.dim];
        Fusion {
            shape: shape.to_vec(),
            dim: windows.dim,
            fuse: windows.fuse,
            sum: vec![0.0; shape.iter().product()],
            weight: vec![0.0; frames],
        }
    }

    /// Adds `window`'s output `out` (its own frames only, the anchor's dropped), weighed per frame as
    /// `windows` says.
    pub(super) fn add(&mut self, windows: &ContextWindows, window: &Window, out: &[f32]) {
        let frames = self.shape[self.dim];
        let outer: usize = self.shape[..self.dim].iter().product();
        let inner: usize = self.shape[self.dim + 1..].iter().product();
        let n = window.frames.len();
        let weights = windows.weights(&window.frames, frames);
        for (pos, &idx) in window.frames.iter().enumerate() {
            let (keep, add) = match self.fuse {
                Fuse::Relative => {
                    let bias = relative_bias(&window.frames, idx);
                    let total = self.weight[idx];
                    self.weight[idx] = total + bias;
                    ((total / (total + bias)) as f32, (bias / (total + bias)) as f32)
                }
                _ => {
                    // Summed in f32, as ComfyUI's counts are.
                    self.weight[idx] = f64::from(self.weight[idx] as f32 + weights[pos]);
                    (1.0, weights[pos])
                }
            };
            // keep is 1 for the weighted sums: d · 1 is d exactly.
            for o in 0..outer {
                let dst = &mut self.sum[(o * frames + idx) * inner..][..inner];
                let src = &out[(o * n + pos) * inner..][..inner];
                dst.iter_mut().zip(src).for_each(|(d, s)| *d = *d * keep + s * add);
            }
        }
    }

    /// The fused output: the weighted sums divided by the weights (the relative fuse's running averages as
    /// they are).
    pub(super) fn finish(mut self) -> Vec<f32> {
        if self.fuse == Fuse::Relative {
            return self.sum;
        }
        let frames = self.shape[self.dim];
        let inner: usize = self.shape[self.dim + 1..].iter().product();
        for (i, chunk) in self.sum.chunks_exact_mut(inner).enumerate() {
            let w = self.weight[i % frames] as f32;
            chunk.iter_mut().for_each(|v| *v /= w);
        }
        self.sum
    }
}

/// A window's output `out` of `shape` (its read frames along `dim`) without the anchor's frame.
pub(super) fn without_anchor(
    out: Vec<f32>,
    shape: &[usize],
    dim: usize,
    window: &Window,
) -> Vec<f32> {
    if window.anchor.is_none() {
        return out;
    }
    let read = shape[dim];
    let keep: Vec<usize> = (1..read).collect();
    gather_frames(&out, shape, dim, &keep, &[]).1
}

#[cfg(test)]
/// Samples `model` with CFGGuider (cfg 2, euler) as `scripts/reference/wan_windows.py` does for the fixture
/// `io` (its contexts, noise seed 11, sigmas and a zero latent of the noise's shape), with `extras` on both sides,
/// plain and in [`wan_windows`], and checks ComfyUI's `out.plain` and `out.windows` within 1e-4.
pub(super) fn check_wan_windows(
    path: &std::path::Path,
    io: &std::collections::BTreeMap<String, crate::tensor::Tensor>,
    extras: &crate::models::CondExtras,
) {
    check_wan_windows_apart(path, io, extras, extras);
}

/// [`check_wan_windows`] with `positive` riding with the positive prompt and `negative` with the negative.
#[cfg(test)]
pub(super) fn check_wan_windows_apart(
    path: &std::path::Path,
    io: &std::collections::BTreeMap<String, crate::tensor::Tensor>,
    positive: &crate::models::CondExtras,
    negative: &crate::models::CondExtras,
) {
    use std::sync::Arc;

    use crate::models::{Cond, Conditioning, DiffusionModel, load};

    let dir = path.parent().expect("the model's folder");
    let env = crate::models::ModelEnv::cpu(dir);
    let model = load::load_diffusion_model(&env, path, None, &mut |_, _| {}).expect("load");
    let side = |name: &str, extras: &crate::models::CondExtras| Conditioning {
        entries: vec![Cond { cond: io[name].clone(), pooled: None, extras: extras.clone() }],
    };
    let (positive, negative) =
        (side("context.positive", positive), side("context.negative", negative));
    for (case, windows) in
        [("plain", None), ("windows", Some(Arc::new(crate::fixtures::wan_windows())))]
    {
        let model = DiffusionModel { context_windows: windows, ..model.clone() };
        let got = sample_as_fixture(&env, &model, (&positive, &negative), io);
        let want = &io[&format!("out.{case}")];
        assert_eq!(got.shape(), want.shape(), "{case}");
        crate::fixtures::assert_relative(case, got.data(), want.data(), 1e-4);
    }
}

/// `model` sampled as `scripts/reference/wan_windows.py` samples: CFGGuider at cfg 2 with `prompts` (positive,
/// negative), euler over the fixture `io`'s sigmas, seed 11, from a zero latent of its noise's shape.
#[cfg(test)]
pub(super) fn sample_as_fixture(
    env: &crate::models::ModelEnv,
    model: &crate::models::DiffusionModel,
    sides: (&crate::models::Conditioning, &crate::models::Conditioning),
    io: &std::collections::BTreeMap<String, crate::tensor::Tensor>,
) -> crate::tensor::Tensor {
    sample_as_fixture_at(env, model, sides, io, 2.0)
}

/// [`sample_as_fixture`] at CFG `cfg`.
#[cfg(test)]
pub(super) fn sample_as_fixture_at(
    env: &crate::models::ModelEnv,
    model: &crate::models::DiffusionModel,
    (positive, negative): (&crate::models::Conditioning, &crate::models::Conditioning),
    io: &std::collections::BTreeMap<String, crate::tensor::Tensor>,
    cfg: f64,
) -> crate::tensor::Tensor {
    let latent =
        crate::value::Latent::new(crate::tensor::Tensor::full(io["noise"].shape().to_vec(), 0.0));
    let job = super::sampler::Sampling {
        model,
        positive,
        negative: Some(negative),
        cfg,
        dual: None,
        perp_neg: None,
        sampler: kiln_models::sampling::Sampler::Euler.into(),
        sigmas: io["sigmas"].data(),
        noise: crate::models::Noise::Random(11),
        latent: &latent,
    };
    let ctx = crate::fixtures::quiet_context(&std::env::temp_dir());
    super::sampler::sample(&env.compute, job, &ctx).expect("sample").samples
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::context_windows::Schedule;

    /// Each fuse method on `wan_animate2.py`'s record of ComfyUI's `combine_context_window_results`: three
    /// windows of a 7-frame latent, window w's output at position p being (w + 1)·10 + p.
    #[test]
    fn windows_fuse_as_comfyuis_do() {
        let reference: serde_json::Value =
            serde_json::from_str(&crate::fixtures::text("context_windows/context_windows.json"))
                .unwrap();
        let case = &reference["relative"];
        let list = |v: &serde_json::Value| -> Vec<f64> {
            v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
        };
        let windows: Vec<Window> = case["windows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| Window {
                frames: list(w).into_iter().map(|i| i as usize).collect(),
                anchor: None,
            })
            .collect();
        for (name, fuse) in [
            ("relative", Fuse::Relative),
            ("pyramid", Fuse::Pyramid),
            ("flat", Fuse::Flat),
            ("overlap-linear", Fuse::OverlapLinear),
        ] {
            let settings = ContextWindows {
                schedule: Schedule::StaticStandard,
                fuse,
                length: 4,
                overlap: 2,
                stride: 1,
                closed_loop: false,
                dim: 2,
                freenoise: false,
                cond_retain: Vec::new(),
                split_conds: false,
                latent_retain: Vec::new(),
                causal_fix: false,
            };
            let mut fusion = Fusion::new(&[1, 1, 7], &settings);
            for (w, out) in windows.iter().zip(case["sub_outputs"].as_array().unwrap()) {
                let out: Vec<f32> = list(out).into_iter().map(|v| v as f32).collect();
                fusion.add(&settings, w, &out);
            }
            let want: Vec<f32> = list(&case[name]).into_iter().map(|v| v as f32).collect();
            crate::fixtures::assert_within(name, &fusion.finish(), &want, 1e-5);
        }
    }

    #[test]
    fn a_retained_position_reads_the_wholes_frame() {
        // [1, 5, 1]: frame f holds f.
        let values: Vec<f32> = (0..5).map(|f| f as f32).collect();
        let (shape, out) = gather_frames(&values, &[1, 5, 1], 1, &[1, 3, 4], &[0]);
        assert_eq!(shape, vec![1, 3, 1]);
        assert_eq!(out, vec![0.0, 3.0, 4.0]);
    }
}
