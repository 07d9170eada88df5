//! Anima's LLM adapter (ComfyUI's `LLMAdapter`, `comfy/ldm/anima/model.py`): the prompt's T5 token ids embedded,
//! run through blocks of self-attention, cross-attention to the text encoder's states and a GELU MLP (RMS-normed
//! before each, q and k RMS-normed per head then rotated, rotate-half, by their own positions), projected and
//! normed; each row weighted by its token's prompt weight and the whole padded with zero rows to 512.

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode, RopeLayout, UnaryOp};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{AdapterConfig, TEXT_ROWS};
use super::model::Anima;
use crate::error::{Error, Result};
use crate::named::{embed_f32, fetch, linear};
use crate::rope::Rope;

/// ε of the adapter's RMS norms.
const EPS: f32 = 1e-6;
/// θ of its RoPE.
const ROPE_THETA: f32 = 10000.0;

impl Anima {
    /// ComfyUI's `Anima.preprocess_text_embeds`: the T5 `ids` of a prompt with their `weights` through the LLM
    /// adapter, attending to the text encoder's `source` states `[1, N, source_dim]`; `[1, max(L, 512), target_dim]`
    /// in the compute type, rows past L zero.
    pub fn adapt<B: Backend>(
        &self,
        b: &B,
        source: &Tensor<B>,
        ids: &[u32],
        weights: &[f32],
    ) -> Result<Tensor<B>> {
        let a = &self.config.adapter;
        if ids.is_empty() || ids.len() != weights.len() {
            return Err(Error::Invalid(format!(
                "Anima's adapter takes a weight per T5 token; got {} tokens and {} weights",
                ids.len(),
                weights.len()
            )));
        }
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= a.vocab) {
            return Err(Error::Invalid(format!(
                "T5 token id {id} is past Anima's adapter's {} embeddings",
                a.vocab
            )));
        }
        let &[1, source_len, source_dim] = source.shape() else {
            return Err(Error::Invalid(format!(
                "Anima's adapter reads one prompt's states [1, N, {}]; got {:?}",
                a.source_dim,
                source.shape()
            )));
        };
        if source_dim != a.source_dim {
            return Err(Error::Invalid(format!(
                "Anima's adapter reads {}-wide text states (Qwen3 0.6B's); these are {source_dim} wide: encode the \
                 prompt with Anima's text encoder",
                a.source_dim
            )));
        }
        let m = &self.weights;
        let dt = b.compute_dtype();
        let n = ids.len();
        let context = b.cast(source, dt)?;
        let mut x = {
            let table = fetch(b, m, &["llm_adapter.embed.weight".to_owned()])?;
            let x = b.cast(&embed_f32(b, &table.weight(0), ids)?, dt)?;
            x.reshape(&[1, n, a.target_dim])?
        };
        if a.in_proj() {
            x = linear(b, m, "llm_adapter.in_proj", &x)?;
        }
        let target_rope = rope(b, n, a.head_dim)?;
        let source_rope = rope(b, source_len, a.head_dim)?;
        for i in 0..a.layers {
            let p = format!("llm_adapter.blocks.{i}");
            let h = self.norm(b, &format!("{p}.norm_self_attn.weight"), &x, EPS)?;
            let h = self.adapter_attention(
                b,
                &format!("{p}.self_attn"),
                &h,
                &h,
                (&target_rope, &target_rope),
            )?;
            x = b.binary(&x, &h, BinaryOp::Add)?;
            let h = self.norm(b, &format!("{p}.norm_cross_attn.weight"), &x, EPS)?;
            let h = self.adapter_attention(
                b,
                &format!("{p}.cross_attn"),
                &h,
                &context,
                (&target_rope, &source_rope),
            )?;
            x = b.binary(&x, &h, BinaryOp::Add)?;
            let h = self.norm(b, &format!("{p}.norm_mlp.weight"), &x, EPS)?;
            let h = linear(b, m, &format!("{p}.mlp.0"), &h)?;
            let h = linear(b, m, &format!("{p}.mlp.2"), &b.unary(&h, UnaryOp::Gelu)?)?;
            x = b.binary(&x, &h, BinaryOp::Add)?;
        }
        let out = linear(b, m, "llm_adapter.out_proj", &x)?;
        let out = self.norm(b, "llm_adapter.norm.weight", &out, EPS)?;
        let weights = b.cast(&b.from_f32(&[1, n, 1], weights, DType::F32)?, dt)?;
        let out = b.binary(&out, &weights, BinaryOp::Mul)?;
        if n < TEXT_ROWS {
            return Ok(b.pad(&out, 1, 0, TEXT_ROWS - n, PadMode::Constant(0.0))?);
        }
        Ok(out)
    }

    /// The adapter's attention `p` (`q_proj`, `k_proj`, `v_proj`, `o_proj`, no biases): queries from `x`, keys and
    /// values from `context`; q and k RMS-normed per head, then rotated by `ropes` (the queries', the keys').
    fn adapter_attention<B: Backend>(
        &self,
        b: &B,
        p: &str,
        x: &Tensor<B>,
        context: &Tensor<B>,
        (q_rope, k_rope): (&Rope<B>, &Rope<B>),
    ) -> Result<Tensor<B>> {
        let a: &AdapterConfig = &self.config.adapter;
        let m = &self.weights;
        let (heads, head_dim) = (a.heads(), a.head_dim);
        let split = |t: Tensor<B>| -> Result<Tensor<B>> {
            let (batch, n) = (t.dim(0)?, t.dim(1)?);
            Ok(t.reshape(&[batch, n, heads, head_dim])?)
        };
        let no_bias = |name: &str, t: &Tensor<B>| -> Result<Tensor<B>> {
            let layer = fetch(b, m, &[format!("{p}.{name}.weight")])?;
            Ok(b.linear(t, &layer.weight(0), None)?)
        };
        let q = split(no_bias("q_proj", x)?)?;
        let k = split(no_bias("k_proj", context)?)?;
        let v = split(no_bias("v_proj", context)?)?;
        let norms = fetch(b, m, &[format!("{p}.q_norm.weight"), format!("{p}.k_norm.weight")])?;
        let q = b.rms_norm(&q, Some(&norms.weight(0)), EPS)?;
        let k = b.rms_norm(&k, Some(&norms.weight(1)), EPS)?;
        drop(norms);
        let q = b.rope(&q, &q_rope.cos, &q_rope.sin, RopeLayout::Half)?;
        let k = b.rope(&k, &k_rope.cos, &k_rope.sin, RopeLayout::Half)?;
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(&v)?);
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (head_dim as f32).sqrt())?;
        let (batch, n) = (o.dim(0)?, o.dim(2)?);
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, a.model_dim])?;
        no_bias("o_proj", &o)
    }
}

/// The adapter's RoPE for positions 0..n on `head_dim`-wide heads (its `RotaryEmbedding`: inverse frequencies
/// and angles in f32, the tables in the compute type, as ComfyUI casts them to the activations').
fn rope<B: Backend>(b: &B, n: usize, head_dim: usize) -> Result<Rope<B>> {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|k| 1.0 / ROPE_THETA.powf((2 * k) as f32 / head_dim as f32)).collect();
    let angles: Vec<f32> =
        (0..n).flat_map(|p| inv_freq.iter().map(move |f| p as f32 * f)).collect();
    Rope::of_angles(b, &angles, half, b.compute_dtype())
}
