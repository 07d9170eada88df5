//! FLUX.1 Redux (`flux1-redux-dev`, ComfyUI's `StyleModelLoader`): [`ReduxConfig`] detected from a file's
//! shapes, and [`Redux`], which turns a SigLIP tower's `last_hidden_state` into tokens of the FLUX.1 DiT's text
//! width (`comfy/ldm/flux/redux.py`'s `ReduxImageEncoder`: `redux_down(silu(redux_up(x)))`).
//!
//! Invariant: the widths come from the shapes (the release's are SigLIP's 1152 in, 3 × 4096 inside, T5-XXL's
//! 4096 out; ComfyUI builds those and refuses others), and it runs in f32, as ComfyUI runs it on the f32
//! vision output.

use kiln_compute::backend::UnaryOp;
use kiln_compute::memory::{LoadPlan, Model};
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::qwen3::{check_shape, dims};

/// The first linear layer's weight `[hidden, input]`.
const UP_WEIGHT: &str = "redux_up.weight";
/// Its bias.
const UP_BIAS: &str = "redux_up.bias";
/// The second linear layer's weight `[output, hidden]` (the key ComfyUI recognises a Redux file by).
const DOWN_WEIGHT: &str = "redux_down.weight";
/// Its bias.
const DOWN_BIAS: &str = "redux_down.bias";
/// The key of the SD1.x T2I style adapter, the other style model ComfyUI loads.
const STYLE_ADAPTER_MARKER: &str = "style_embedding";

/// A Redux image encoder's widths (the release: 1152 → 12288 → 4096).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduxConfig {
    /// The vision tower's width it takes.
    pub input: usize,
    /// The inner width.
    pub hidden: usize,
    /// The DiT's text width it gives.
    pub output: usize,
}

impl ReduxConfig {
    /// Every weight with its shape, in load order (what `kiln model synth` writes).
    pub fn expected(&self) -> Vec<(String, Vec<usize>)> {
        vec![
            (UP_WEIGHT.to_owned(), vec![self.hidden, self.input]),
            (UP_BIAS.to_owned(), vec![self.hidden]),
            (DOWN_WEIGHT.to_owned(), vec![self.output, self.hidden]),
            (DOWN_BIAS.to_owned(), vec![self.output]),
        ]
    }
}

/// The Redux config of a style model file (`None` when it has no `redux_down.weight`); the T2I style adapter
/// ComfyUI also loads, and a Redux file with missing tensors or disagreeing shapes, are
/// [`crate::Error::Unsupported`].
pub fn detect_redux(h: &Header) -> Result<Option<ReduxConfig>> {
    if h.has(STYLE_ADAPTER_MARKER) {
        return Err(h.unsupported(
            "an SD1.x T2I style adapter (`style_embedding`), which Kiln does not run: FLUX.1 Redux is the style \
             model it runs",
        ));
    }
    if !h.has(DOWN_WEIGHT) && !h.unsupported_dtypes().any(|(n, _)| n == DOWN_WEIGHT) {
        return Ok(None);
    }
    let [hidden, input] = dims(h, UP_WEIGHT)?;
    let [output, _] = dims(h, DOWN_WEIGHT)?;
    let config = ReduxConfig { input, hidden, output };
    for (name, want) in config.expected() {
        check_shape(h, &name, &want)?;
    }
    Ok(Some(config))
}

/// What to load: the two layers, under the file's names.
pub fn redux_load_plan(h: &Header, config: &ReduxConfig) -> LoadPlan {
    h.plan_by_name(config.expected().into_iter().map(|(name, _)| name))
}

/// A loaded Redux image encoder.
#[derive(Debug)]
pub struct Redux {
    /// The widths.
    pub config: ReduxConfig,
    /// The weights.
    pub weights: Model,
}

impl Redux {
    /// The encoder made of `weights` (loaded from [`redux_load_plan`] of the same config).
    pub fn new(config: ReduxConfig, weights: Model) -> Redux {
        Redux { config, weights }
    }

    /// `x` `[B, N, input]` (a SigLIP tower's `last_hidden_state`) → `[B, N, output]` in f32.
    pub fn encode<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let width = x.shape().last().copied().unwrap_or(0);
        if width != self.config.input {
            return Err(Error::Invalid(format!(
                "the Redux model takes a vision output {} wide (SigLIP's), not {width} wide",
                self.config.input
            )));
        }
        let w = self.weights.fetch(b, &[UP_WEIGHT, UP_BIAS, DOWN_WEIGHT, DOWN_BIAS])?;
        let x = b.cast(x, DType::F32)?;
        let h = b.linear(&x, &w.weight(0), Some(&w.weight(1)))?;
        let h = b.unary(&h, UnaryOp::Silu)?;
        Ok(b.linear(&h, &w.weight(2), Some(&w.weight(3)))?)
    }
}
