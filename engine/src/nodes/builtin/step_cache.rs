//! `EasyCache` and `LazyCache` (`comfy_extras.nodes_easycache`): the model with [`StepCache`] set, and the state a
//! sampling run keeps for it. Both estimate how much a call's output would change from how much its input
//! changed (the last measured ratio of the two, over the last output's mean magnitude), add the estimates up,
//! and while the sum stays under the threshold skip the call: its output is its input plus the last output's
//! difference from its input. EasyCache does this per network call and per prompt (a step is decided by the
//! first prompt ComfyUI's batch holds, and the other prompts follow it); LazyCache per guided step, on the
//! guided prediction.
//!
//! Invariant: as ComfyUI, the change is the mean absolute difference over every 8th cell of the last two
//! dimensions of the first prompt's samples (EasyCache) or of the whole batch (LazyCache); the magnitude is the
//! whole output's mean absolute value; arithmetic on them is f32.

use std::collections::HashMap;
use std::sync::Arc;

use super::pure::Pure;
use crate::models::{DiffusionModel, StepCache};
use crate::nodes::{InputDef, NodeSpec, OutputDef};
use crate::value::Value;
use kiln_models::sampling::ModelSampling;

/// Every how many cells of the last two dimensions the change is measured (ComfyUI's `subsample_factor`).
const SUBSAMPLE: usize = 8;

/// The nodes, in ComfyUI's order.
pub(super) fn nodes() -> Vec<Pure> {
    vec![node("EasyCache", false), node("LazyCache", true)]
}

fn node(name: &'static str, lazy: bool) -> Pure {
    let percent = |key: &str, default: f64, tooltip: &str| {
        InputDef::bare(key, "FLOAT")
            .tooltip(tooltip)
            .option("advanced", true)
            .option("default", default)
            .option("min", 0.0)
            .option("max", 1.0)
            .option("step", 0.01)
    };
    let description = if lazy {
        "A homebrew version of EasyCache - even 'easier' version of EasyCache to implement. Overall works worse \
         than EasyCache, but better in some rare cases AND universal compatibility with everything in ComfyUI."
    } else {
        "Native EasyCache implementation."
    };
    let spec = NodeSpec::new(name, name, "advanced/debug")
        .python_module("comfy_extras.nodes_easycache")
        .v3()
        .experimental()
        .description(description)
        .input(InputDef::typed("model", "MODEL").tooltip(&format!("The model to add {name} to.")))
        .input(
            InputDef::bare("reuse_threshold", "FLOAT")
                .tooltip("The threshold for reusing cached steps.")
                .option("advanced", true)
                .option("default", 0.2)
                .option("min", 0.0)
                .option("max", 3.0)
                .option("step", 0.01),
        )
        .input(percent(
            "start_percent",
            0.15,
            &format!("The relative sampling step to begin use of {name}."),
        ))
        .input(percent(
            "end_percent",
            0.95,
            &format!("The relative sampling step to end use of {name}."),
        ))
        .input(
            InputDef::bare("verbose", "BOOLEAN")
                .tooltip("Whether to log verbose information.")
                .option("advanced", true)
                .option("default", false),
        )
        .output(OutputDef::new("MODEL").tooltip(&format!("The model with {name}.")));
    let run = if lazy { with_lazy_cache } else { with_easy_cache };
    Pure::new(spec, run)
}

fn with_easy_cache(inputs: &crate::nodes::Inputs) -> Result<Vec<Value>, crate::nodes::NodeError> {
    with_step_cache(inputs, false)
}

fn with_lazy_cache(inputs: &crate::nodes::Inputs) -> Result<Vec<Value>, crate::nodes::NodeError> {
    with_step_cache(inputs, true)
}

fn with_step_cache(
    inputs: &crate::nodes::Inputs,
    lazy: bool,
) -> Result<Vec<Value>, crate::nodes::NodeError> {
    let model = inputs.model("model")?;
    let cache = StepCache {
        lazy,
        reuse_threshold: inputs.float("reuse_threshold")?,
        start_percent: inputs.float("start_percent")?,
        end_percent: inputs.float("end_percent")?,
        verbose: inputs.bool("verbose")?,
    };
    let patched = DiffusionModel { step_cache: Some(cache), ..model.as_ref().clone() };
    Ok(vec![Value::Model(Arc::new(patched))])
}

/// What both caches keep between calls.
#[derive(Debug, Default)]
struct Trend {
    /// The output's change over the input's at the last measured call (`None` before any; 0 after a reset).
    transformation_rate: Option<f32>,
    /// The predicted relative change added up since the network last ran.
    cumulative: f32,
    /// The measured input and output at the last call that ran, subsampled, and the output's mean magnitude.
    x_prev: Option<Vec<f32>>,
    output_prev: Option<Vec<f32>>,
    output_norm: Option<f32>,
    /// The shape the state belongs to (a call of another shape resets it).
    shape: Option<Vec<usize>>,
    /// How many calls (EasyCache: of the first prompt) were skipped.
    skipped: usize,
}

impl Trend {
    /// The input's change since the last call that ran (`None` before any).
    fn input_change(&self, x: &[f32]) -> Option<f32> {
        self.x_prev.as_deref().map(|prev| mean_abs_diff(x, prev))
    }

    /// Adds this call's predicted relative change; whether the call may be skipped (the sum is under
    /// `threshold`), else the sum starts again. `None` when nothing predicts it yet.
    fn predicts_little(
        &mut self,
        input_change: Option<f32>,
        threshold: f64,
        verbose: bool,
        name: &str,
    ) -> Option<bool> {
        let (norm, rate, input) = (self.output_norm?, self.transformation_rate?, input_change?);
        self.cumulative += (rate * input) / norm;
        let little = self.cumulative < threshold as f32;
        if verbose {
            tracing::info!(
                "{name} [verbose] - {} step; cumulative_change_rate: {}, reuse_threshold: {threshold}",
                if little { "skipping" } else { "NOT skipping" },
                self.cumulative
            );
        }
        if !little {
            self.cumulative = 0.0;
        }
        Some(little)
    }

    /// After a call that ran: the ratio of the output's change to the input's, when both were measured.
    fn measure(&mut self, output: &[f32], input_change: Option<f32>) {
        if let (Some(prev), Some(input)) = (self.output_prev.as_deref(), input_change) {
            self.transformation_rate = Some(mean_abs_diff(output, prev) / input);
        }
    }

    /// Keeps a call that ran as the last one.
    fn keep(&mut self, x: Vec<f32>, output: Vec<f32>, whole_output: &[f32]) {
        self.x_prev = Some(x);
        self.output_prev = Some(output);
        self.output_norm = Some(mean_abs(whole_output));
    }

    /// Whether a call of `shape` belongs to the state; a new shape resets it (ComfyUI's `check_metadata`).
    fn same_shape(&mut self, shape: &[usize]) -> bool {
        match &self.shape {
            None => {
                self.shape = Some(shape.to_vec());
                true
            }
            Some(kept) if kept == shape => true,
            Some(_) => {
                tracing::warn!("step cache - tensor shape changed, resetting state");
                *self = Trend { transformation_rate: Some(0.0), ..Trend::default() };
                false
            }
        }
    }
}

/// A sampling run's cache state (made per run from the model's [`StepCache`]).
#[derive(Debug)]
pub(super) struct StepCacheRun {
    settings: StepCache,
    /// The sigmas where skipping may start and where the cache stops, in f32 as ComfyUI compares them.
    start: f32,
    end: f32,
    trend: Trend,
    /// EasyCache: the prompt (its key) whose calls decide, once chosen.
    first: Option<usize>,
    /// EasyCache: whether the deciding prompt skipped this step (the others follow).
    skip_step: bool,
    /// EasyCache: each prompt's last output minus its input; LazyCache: the guided one's, under key 0.
    diffs: HashMap<usize, Vec<f32>>,
    /// LazyCache: the unconditional prediction of the last step that ran (what a CFG++ sampler reads on a
    /// skipped step, as ComfyUI's capture keeps it).
    uncond: Option<Vec<f32>>,
}

impl StepCacheRun {
    /// The state for one run of a model whose sigmas `sampling` gives.
    pub(super) fn new(settings: StepCache, sampling: &ModelSampling) -> StepCacheRun {
        StepCacheRun {
            settings,
            start: sampling.percent_to_sigma(settings.start_percent) as f32,
            end: sampling.percent_to_sigma(settings.end_percent) as f32,
            trend: Trend::default(),
            first: None,
            skip_step: false,
            diffs: HashMap::new(),
            uncond: None,
        }
    }

    fn name(&self) -> &'static str {
        if self.settings.lazy { "LazyCache" } else { "EasyCache" }
    }

    /// Whether `sigma` is where the cache has stopped: not above its end (ComfyUI's `is_past_end_timestep`).
    fn past_end(&self, sigma: f32) -> bool {
        sigma.partial_cmp(&self.end) != Some(std::cmp::Ordering::Greater)
    }

    /// A new model evaluation begins (ComfyUI's `calc_cond_batch` wrapper): no prompt has skipped it yet.
    pub(super) fn begin_evaluation(&mut self) {
        self.skip_step = false;
    }

    /// EasyCache's network call: `x` `[B, ...]` (of `shape`) the latent the call sees, its batch split evenly
    /// among the prompts `keys` (in the call's order), `first` the key ComfyUI's batch would hold first, `run`
    /// the network. Returns its output, or the cached prediction (then with `true`).
    pub(super) fn network_call<E>(
        &mut self,
        (sigma, shape, x): (f32, &[usize], &[f32]),
        (keys, first): (&[usize], usize),
        run: impl FnOnce() -> Result<Vec<f32>, E>,
    ) -> Result<(Vec<f32>, bool), E> {
        if self.past_end(sigma) {
            return Ok((run()?, false));
        }
        let mut has_first = self.first.is_some_and(|f| keys.contains(&f));
        let mut input_change = None;
        if sigma <= self.start {
            if !self.trend.same_shape(&shape[1..]) {
                self.first = None;
                self.skip_step = false;
                self.diffs.clear();
            }
            let cached = keys.iter().all(|k| self.diffs.contains_key(k));
            if self.skip_step && cached {
                return Ok((self.apply(x, keys), true));
            }
            if self.first.is_none() {
                self.first = Some(first);
                has_first = keys.contains(&first);
            }
            if has_first {
                let sub = self.first_subsampled(x, shape, keys);
                input_change = self.trend.input_change(&sub);
                let (threshold, verbose, name) =
                    (self.settings.reuse_threshold, self.settings.verbose, self.name());
                if self.trend.predicts_little(input_change, threshold, verbose, name) == Some(true)
                    && cached
                {
                    self.skip_step = true;
                    return Ok((self.apply(x, keys), true));
                }
            }
        }
        let output = run()?;
        if has_first && self.trend.output_norm.is_some() {
            let sub = self.first_subsampled(&output, shape, keys);
            self.trend.measure(&sub, input_change);
        }
        let per_key = x.len() / keys.len().max(1);
        for (i, key) in keys.iter().enumerate() {
            let part = i * per_key..(i + 1) * per_key;
            let diff = output[part.clone()].iter().zip(&x[part]).map(|(o, x)| o - x).collect();
            self.diffs.insert(*key, diff);
        }
        if has_first {
            let (sub_x, sub_out) = (
                self.first_subsampled(x, shape, keys),
                self.first_subsampled(&output, shape, keys),
            );
            self.trend.keep(sub_x, sub_out, &output);
        }
        Ok((output, false))
    }

    /// `x` plus each prompt's cached difference (a skipped call).
    fn apply(&mut self, x: &[f32], keys: &[usize]) -> Vec<f32> {
        if self.first.is_some_and(|f| keys.contains(&f)) {
            self.trend.skipped += 1;
        }
        let per_key = x.len() / keys.len().max(1);
        let mut out = x.to_vec();
        for (i, key) in keys.iter().enumerate() {
            let part = &mut out[i * per_key..(i + 1) * per_key];
            part.iter_mut().zip(&self.diffs[key]).for_each(|(v, d)| *v += d);
        }
        out
    }

    /// The first prompt's samples of `values` (of `shape`, split among `keys`), subsampled.
    fn first_subsampled(&self, values: &[f32], shape: &[usize], keys: &[usize]) -> Vec<f32> {
        let index = self.first.and_then(|f| keys.iter().position(|k| *k == f)).unwrap_or(0);
        let per_key = values.len() / keys.len().max(1);
        let mut part_shape = shape.to_vec();
        part_shape[0] /= keys.len().max(1);
        subsample(&values[index * per_key..(index + 1) * per_key], &part_shape)
    }

    /// LazyCache's guided step: `x` (of `shape`) the latent, `run` the guided prediction (with the unconditional
    /// prediction a CFG++ sampler reads). Returns it, or the cached prediction.
    pub(super) fn guided_step<E>(
        &mut self,
        (sigma, shape, x): (f32, &[usize], &[f32]),
        run: impl FnOnce() -> Result<(Vec<f32>, Option<Vec<f32>>), E>,
    ) -> Result<(Vec<f32>, Option<Vec<f32>>), E> {
        if self.past_end(sigma) {
            return run();
        }
        let mut input_change = None;
        if sigma <= self.start {
            if !self.trend.same_shape(shape) {
                self.diffs.clear();
            }
            if self.trend.x_prev.is_some() {
                input_change = self.trend.input_change(&subsample(x, shape));
                let (threshold, verbose, name) =
                    (self.settings.reuse_threshold, self.settings.verbose, self.name());
                if self.trend.predicts_little(input_change, threshold, verbose, name) == Some(true)
                {
                    self.trend.skipped += 1;
                    let diff = &self.diffs[&0];
                    let out = x.iter().zip(diff).map(|(x, d)| x + d).collect();
                    return Ok((out, self.uncond.clone()));
                }
            }
        }
        let (output, uncond) = run()?;
        if self.trend.output_norm.is_some() {
            self.trend.measure(&subsample(&output, shape), input_change);
        }
        self.diffs.insert(0, output.iter().zip(x).map(|(o, x)| o - x).collect());
        self.trend.keep(subsample(x, shape), subsample(&output, shape), &output);
        self.uncond.clone_from(&uncond);
        Ok((output, uncond))
    }

    /// Logs how many steps the run skipped (ComfyUI's closing line).
    pub(super) fn report(&self, total_steps: usize) {
        let skipped = self.trend.skipped;
        let ran = total_steps.saturating_sub(skipped);
        let speedup = if ran == 0 { 1.0 } else { total_steps as f64 / ran as f64 };
        tracing::info!(
            "{} - skipped {skipped}/{total_steps} steps ({speedup:.2}x speedup).",
            self.name()
        );
    }
}

/// Every [`SUBSAMPLE`]th cell of the last two dimensions of `values` (of `shape`).
fn subsample(values: &[f32], shape: &[usize]) -> Vec<f32> {
    let n = shape.len();
    let (h, w) = (shape[n - 2], shape[n - 1]);
    let mut out = Vec::with_capacity(values.len() / (SUBSAMPLE * SUBSAMPLE) + 1);
    for plane in values.chunks_exact((h * w).max(1)) {
        for y in (0..h).step_by(SUBSAMPLE) {
            for x in (0..w).step_by(SUBSAMPLE) {
                out.push(plane[y * w + x]);
            }
        }
    }
    out
}

/// The mean of |a − b| (summed in f64, as torch's CPU mean accumulates, then f32).
fn mean_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a.iter().zip(b).map(|(a, b)| f64::from((a - b).abs())).sum();
    (sum / a.len().max(1) as f64) as f32
}

/// The mean of |a|.
fn mean_abs(a: &[f32]) -> f32 {
    let sum: f64 = a.iter().map(|v| f64::from(v.abs())).sum();
    (sum / a.len().max(1) as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::{Cond, Conditioning};

    /// `scripts/reference/step_cache.py`: ComfyUI's CFGGuider over 12 euler steps on the tiny Wan model, with
    /// EasyCache (prompts batched, apart, and the positive alone) and LazyCache at threshold 1, each skipping
    /// some of its network calls.
    #[test]
    fn caches_skip_the_steps_comfyuis_skip() {
        let io = crate::fixtures::tensors("step_cache/io.safetensors");
        let dir = std::env::temp_dir().join(format!("kiln-step-cache-{}", std::process::id()));
        let (env, model) = crate::fixtures::tiny_wan_t2v_model(&dir);
        let prompt = |name: &str| Conditioning { entries: vec![Cond::new(io[name].clone(), None)] };
        let positive = prompt("positive");
        let cache = |lazy| StepCache {
            lazy,
            reuse_threshold: 1.0,
            start_percent: 0.15,
            end_percent: 0.95,
            verbose: false,
        };
        let cases = [
            ("plain", None, "negative", 2.0),
            ("easy", Some(cache(false)), "negative", 2.0),
            ("easy_apart", Some(cache(false)), "negative.long", 2.0),
            ("easy_cfg1", Some(cache(false)), "negative", 1.0),
            ("lazy", Some(cache(true)), "negative", 2.0),
        ];
        for (case, step_cache, negative, cfg) in cases {
            let model = DiffusionModel { step_cache, ..model.clone() };
            let negative = prompt(negative);
            let got = super::super::windowed::sample_as_fixture_at(
                &env,
                &model,
                (&positive, &negative),
                &io,
                cfg,
            );
            let want = &io[&format!("{case}.out")];
            crate::fixtures::assert_relative(case, got.data(), want.data(), 1e-4);
            if case != "plain" && cfg == 2.0 {
                // Skipping changes the result: a cache that never skipped would not pass.
                let plain = io["plain.out"].data();
                let gap =
                    want.data().iter().zip(plain).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(gap > 1e-2, "{case}: ComfyUI's cached run is the plain one");
            }
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn subsampling_takes_every_eighth_cell_of_the_last_two_dimensions() {
        let values: Vec<f32> = (0..2 * 9 * 17).map(|v| v as f32).collect();
        let got = subsample(&values, &[2, 9, 17]);
        // Rows 0 and 8, columns 0, 8 and 16, in each of the two planes.
        let want = [0, 8, 16, 136, 144, 152].map(|i| i as f32);
        let second = want.map(|v| v + 153.0);
        assert_eq!(got, [want, second].concat());
    }
}
