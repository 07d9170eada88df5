//! [`ClipText`]: the CLIP text tower run over one sequence of ids, giving the final-normed states, the pooled
//! vector and optionally one layer's output (models-flux.md §5.1; ComfyUI's `comfy/clip_model.py`).
//!
//! Invariant: everything runs in f32 whatever the backend's compute type, the embedding rows widened exactly,
//! as ComfyUI runs CLIP (its embeddings come out in f32 and its manual-cast layers cast the weights to the
//! input's type).

use kiln_compute::backend::{AttentionMask, BinaryOp, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{Activation, Config, Layout};
use crate::error::{Error, Result};
use crate::named::embed_f32;

/// The factor of quick-GELU: `x · sigmoid(1.702 x)`.
const QUICK_GELU: f32 = 1.702;

/// A CLIP text tower: its config and its weights under the memory manager (loaded from
/// [`super::load_plan`]).
#[derive(Debug)]
pub struct ClipText {
    /// The hyperparameters.
    pub config: Config,
    /// The weights, by the file's names without prefix.
    pub weights: Model,
}

/// What [`ClipText::encode`] gives, all f32.
#[derive(Clone)]
pub struct ClipOutput<B: Backend> {
    /// The last layer's output through the final LayerNorm `[1, N, hidden]` (ComfyUI's `layer="last"`).
    pub last: Tensor<B>,
    /// The final-normed state at the first EOS `[1, hidden]`, without `text_projection` (Flux's pooled
    /// vector; transformers' `pooler_output`).
    pub pooled: Tensor<B>,
    /// The output of the layer asked for `[1, N, hidden]`, not normed (ComfyUI's `layer="hidden"` with
    /// `layer_norm_hidden_state=False`; [`ClipText::final_norm`] gives the normed form).
    pub hidden: Option<Tensor<B>>,
}

impl<B: Backend> std::fmt::Debug for ClipOutput<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClipOutput")
            .field("last", &self.last.shape())
            .field("pooled", &self.pooled.shape())
            .field("hidden", &self.hidden.as_ref().map(Tensor::shape))
            .finish()
    }
}

impl ClipText {
    /// The encoder made of `weights` (loaded from [`super::load_plan`] of the same config).
    pub fn new(config: Config, weights: Model) -> ClipText {
        ClipText { config, weights }
    }

    /// Runs `ids` (at most `positions` of them, each below `vocab`; ComfyUI feeds 77: BOS, the prompt's
    /// tokens, EOS and EOS padding) through the tower under a causal mask and no other.
    ///
    /// `hidden_layer` = `Some(k)` also returns the output of layer `k` (0-based, so ComfyUI's `layer_idx=-2`
    /// is `k = layers − 2`; transformers' `hidden_states[k + 1]`).
    ///
    /// The pooled vector is the final-normed state at the first [`Config::eos`] in `ids`, or at the last
    /// position when there is none (ComfyUI takes it at its count of unmasked tokens − 1, which is the same
    /// position for a sequence that starts with BOS).
    pub fn encode<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        hidden_layer: Option<usize>,
    ) -> Result<ClipOutput<B>> {
        let cfg = &self.config;
        self.check(ids, hidden_layer)?;
        let n = ids.len();
        let mut x = {
            let names = [cfg.token_embedding(), cfg.position_embedding()];
            let layer = self.weights.fetch(b, &names)?;
            let tokens = embed_f32(b, &layer.weight(0), ids)?;
            let positions = b.weight_to_tensor(&layer.weight(1), DType::F32)?;
            let positions = b.slice(&positions, 0, 0, n)?;
            b.binary(&tokens, &positions, BinaryOp::Add)?.reshape(&[1, n, cfg.hidden])?
        };
        let mut hidden = None;
        for i in 0..cfg.layers {
            x = self.layer(b, i, &x)?;
            if hidden_layer == Some(i) {
                hidden = Some(x.clone());
            }
        }
        let last = self.final_norm(b, &x)?;
        let at = ids.iter().position(|&id| id == cfg.eos).unwrap_or(n - 1);
        let pooled = b.slice(&last, 1, at, 1)?.reshape(&[1, cfg.hidden])?;
        Ok(ClipOutput { last, pooled, hidden })
    }

    /// `pooled` `[.., hidden]` through `text_projection` (ComfyUI's projected pooled output, f32); an error for a
    /// file without the projection.
    pub fn project_pooled<B: Backend>(&self, b: &B, pooled: &Tensor<B>) -> Result<Tensor<B>> {
        let name = self.config.text_projection();
        if self.weights.info(name).is_none() {
            return Err(Error::Invalid(format!(
                "this {} file has no `{name}` [{h}, {h}], which the projected pooled vector needs (SDXL's and \
                 HiDream's CLIP-G, HiDream's CLIP-L)",
                self.config.variant.name(),
                h = self.config.hidden
            )));
        }
        let layer = self.weights.fetch(b, &[name])?;
        let pooled = b.cast(pooled, DType::F32)?;
        match self.config.layout {
            Layout::Transformers => Ok(b.linear(&pooled, &layer.weight(0), None)?),
            // OpenCLIP's matrix multiplies the pooled vector as it is stored (ComfyUI transposes it into a
            // Linear weight on load: the same products).
            Layout::OpenClip => {
                let projection = b.weight_to_tensor(&layer.weight(0), DType::F32)?;
                Ok(b.matmul(&pooled, &projection, false)?)
            }
        }
    }

    /// `x` `[.., hidden]` through the final LayerNorm (for ComfyUI's `layer_norm_hidden_state=True`, SD1's
    /// CLIP skip, applied to [`ClipOutput::hidden`]).
    pub fn final_norm<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let norm = self.weights.fetch(b, &self.config.final_norm())?;
        let x = b.cast(x, DType::F32)?;
        Ok(b.layer_norm(&x, Some(&norm.weight(0)), Some(&norm.weight(1)), self.config.eps)?)
    }

    /// An error for an empty or too long input, an id outside the vocabulary, or a layer past the last.
    fn check(&self, ids: &[u32], hidden_layer: Option<usize>) -> Result<()> {
        let cfg = &self.config;
        if ids.is_empty() || ids.len() > cfg.positions {
            return Err(Error::Invalid(format!(
                "the CLIP text encoder takes 1 to {} tokens, not {}",
                cfg.positions,
                ids.len()
            )));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= cfg.vocab) {
            return Err(Error::Invalid(format!(
                "token id {id} is outside the CLIP text encoder's vocabulary of {}",
                cfg.vocab
            )));
        }
        match hidden_layer {
            Some(k) if k >= cfg.layers => Err(Error::Invalid(format!(
                "layer {k} asked of a CLIP text encoder with {} layers",
                cfg.layers
            ))),
            _ => Ok(()),
        }
    }

    /// Encoder layer `i` on x `[1, N, hidden]` (f32) under the causal mask ([`encoder_layer`]).
    fn layer<B: Backend>(&self, b: &B, i: usize, x: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let names = cfg.layer_names(i);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let w = self.weights.fetch(b, &names)?;
        let weights: Vec<Weight<'_>> = (0..names.len()).map(|j| w.weight(j)).collect();
        let shape = LayerShape {
            hidden: cfg.hidden,
            heads: cfg.heads,
            head_dim: cfg.head_dim,
            activation: cfg.activation,
            eps: cfg.eps,
        };
        encoder_layer(b, &weights, x, &shape, AttentionMask::Causal)
    }
}

/// A layer's q, k and v projections: three (weight, bias) pairs, or OpenCLIP's one `in_proj` of all three.
enum Qkv<'w, 'a> {
    /// transformers' q_proj, k_proj, v_proj.
    Separate([(&'w Weight<'a>, &'w Weight<'a>); 3]),
    /// OpenCLIP's `in_proj_weight` `[3·hidden, hidden]` and `in_proj_bias`.
    Fused(&'w Weight<'a>, &'w Weight<'a>),
}

/// The widths and choices of one CLIP encoder layer, shared by the text and vision towers.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LayerShape {
    /// Hidden width.
    pub(crate) hidden: usize,
    /// Attention heads.
    pub(crate) heads: usize,
    /// Width of one head.
    pub(crate) head_dim: usize,
    /// The MLP activation.
    pub(crate) activation: Activation,
    /// LayerNorm ε.
    pub(crate) eps: f32,
}

/// One CLIP encoder layer (ComfyUI's `CLIPLayer`, the text and the vision towers' alike) on x `[B, N, hidden]`
/// (f32): pre-norm self-attention under `mask`, then the pre-norm MLP, each added back to the residual. `w`
/// holds the layer's 16 weights in [`super::Config::layer_names`] order, or OpenCLIP's 12 (q, k and v as one
/// `in_proj`).
pub(crate) fn encoder_layer<B: Backend>(
    b: &B,
    w: &[Weight<'_>],
    x: &Tensor<B>,
    shape: &LayerShape,
    mask: AttentionMask,
) -> Result<Tensor<B>> {
    let (ln1_w, ln1_b, qkv, rest) = match w {
        [ln1_w, ln1_b, q_w, q_b, k_w, k_b, v_w, v_b, rest @ ..] if rest.len() == 8 => {
            (ln1_w, ln1_b, Qkv::Separate([(q_w, q_b), (k_w, k_b), (v_w, v_b)]), rest)
        }
        [ln1_w, ln1_b, in_w, in_b, rest @ ..] if rest.len() == 8 => {
            (ln1_w, ln1_b, Qkv::Fused(in_w, in_b), rest)
        }
        _ => return Err(Error::Invalid(format!("{} weights for a CLIP layer", w.len()))),
    };
    let [o_w, o_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b] = rest else {
        return Err(Error::Invalid(format!("{} weights for a CLIP layer", w.len())));
    };
    let (batch, n) = (x.dim(0)?, x.dim(1)?);
    let h = b.layer_norm(x, Some(ln1_w), Some(ln1_b), shape.eps)?;
    let to_heads = |t: &Tensor<B>| -> Result<Tensor<B>> {
        let t = t.reshape(&[batch, n, shape.heads, shape.head_dim])?;
        Ok(b.permute(&t, &[0, 2, 1, 3])?)
    };
    let (q, k, v) = match qkv {
        Qkv::Separate(projections) => {
            let [q, k, v] = projections.map(|(w, bias)| b.linear(&h, w, Some(bias)));
            (to_heads(&q?)?, to_heads(&k?)?, to_heads(&v?)?)
        }
        Qkv::Fused(w, bias) => {
            // `in_proj` rows are q's, k's, v's: the same products as three projections.
            let all = b.linear(&h, w, Some(bias))?.reshape(&[batch, n, 3, shape.hidden])?;
            let part = |i| -> Result<Tensor<B>> { to_heads(&b.slice(&all, 2, i, 1)?) };
            (part(0)?, part(1)?, part(2)?)
        }
    };
    let scale = 1.0 / (shape.head_dim as f32).sqrt();
    let a = b.attention(&q, &k, &v, mask, scale)?;
    let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[batch, n, shape.hidden])?;
    let x = b.binary(x, &b.linear(&a, o_w, Some(o_b))?, BinaryOp::Add)?;

    let h = b.layer_norm(&x, Some(ln2_w), Some(ln2_b), shape.eps)?;
    let h = b.linear(&h, fc1_w, Some(fc1_b))?;
    let h = match shape.activation {
        // sigmoid(1.702 x) · x: the gated op is unary(Sigmoid) and the product in one pass.
        Activation::QuickGelu => b.gated(&b.affine(&h, QUICK_GELU, 0.0)?, &h, UnaryOp::Sigmoid)?,
        Activation::Gelu => b.unary(&h, UnaryOp::Gelu)?,
        Activation::GeluTanh => b.unary(&h, UnaryOp::GeluTanh)?,
    };
    Ok(b.binary(&x, &b.linear(&h, fc2_w, Some(fc2_b))?, BinaryOp::Add)?)
}
