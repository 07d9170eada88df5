//! [`ErnieImage`]: the DiT's forward pass (ComfyUI's `ErnieImageModel.forward`), reading one layer's weights at
//! a time through [`Model::fetch`].
//!
//! The RoPE is comfy-kitchen's split-half rotation as `ErnieImageEmbedND3` lays out its table: a head's features
//! pair as (j, j + hd/2) (rotate-half), but the first of a pair is turned by angle `a[j/2]` and the second by
//! `a[hd/4 + j/2]`, `a` the token's hd/2 angles (the axes' concatenated). That is not one rotation per pair, so it
//! runs as two of the backend's rotate-half RoPEs, one with each table, the first half of the features taken from
//! the first and the second half from the second.

use kiln_compute::backend::{AttentionMask, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{Config, EPS, ROPE_THETA, layer_names};
use crate::RopeOptions;
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::to_batch;
use crate::named::{fetch, linear, weight_and_bias};
use crate::rope::Rope;

/// A loaded ERNIE-Image DiT: its config and weights (under ComfyUI's names, from [`super::load_plan`]).
pub struct ErnieImage {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// Where a weight sits in a layer's fetch (see `config::LAYER`).
mod slot {
    pub(super) const SA_LN: usize = 0;
    pub(super) const TO_Q: usize = 1;
    pub(super) const TO_K: usize = 2;
    pub(super) const TO_V: usize = 3;
    pub(super) const NORM_Q: usize = 4;
    pub(super) const NORM_K: usize = 5;
    pub(super) const TO_OUT: usize = 6;
    pub(super) const MLP_LN: usize = 7;
    pub(super) const GATE: usize = 8;
    pub(super) const UP: usize = 9;
    pub(super) const DOWN: usize = 10;
}

/// The split-half RoPE's two tables (see the module doc): `top` turns the first half of a head's features,
/// `bottom` the second.
struct SplitRope<B: Backend> {
    top: Rope<B>,
    bottom: Rope<B>,
}

impl<B: Backend> SplitRope<B> {
    /// The tables for every token's `angles` (`pairs` = hd/2 a token, the axes' concatenated), as `f32`.
    fn of_angles(b: &B, angles: &[f64], pairs: usize) -> Result<SplitRope<B>> {
        let quarter = pairs / 2;
        let (mut top, mut bottom) =
            (Vec::with_capacity(angles.len()), Vec::with_capacity(angles.len()));
        for token in angles.chunks_exact(pairs) {
            top.extend((0..pairs).map(|j| token[j / 2]));
            bottom.extend((0..pairs).map(|j| token[quarter + j / 2]));
        }
        let table = |angles: &[f64]| -> Result<Rope<B>> {
            let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
            let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
            Rope::upload(b, &cos, &sin, pairs, DType::F32)
        };
        Ok(SplitRope { top: table(&top)?, bottom: table(&bottom)? })
    }

    /// `x` `[B, N, H, hd]` turned: the first hd/2 features by `top`, the last hd/2 by `bottom`.
    fn apply(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let half = x.dim(3)? / 2;
        let top = b.rope(x, &self.top.cos, &self.top.sin, RopeLayout::Half)?;
        let bottom = b.rope(x, &self.bottom.cos, &self.bottom.sin, RopeLayout::Half)?;
        let top = b.slice(&top, -1, 0, half)?;
        let bottom = b.slice(&bottom, -1, half, half)?;
        Ok(b.concat(&[&top, &bottom], -1)?)
    }
}

/// The checked input's sizes.
struct Sizes {
    batch: usize,
    h: usize,
    w: usize,
}

impl ErnieImage {
    /// The DiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> ErnieImage {
        ErnieImage { config, weights }
    }

    /// ComfyUI's model output (the flow velocity: denoised = x − out · σ) for latents `x` `[B, channels, H, W]`
    /// in model space (any float dtype), `timesteps` (one per sample: σ · 1000, what ComfyUI's model sampling
    /// passes) and `context` `[1 or B, N > 0, text_dim]`: f32 in `x`'s shape, computed in `b.compute_dtype()`.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        self.forward_with_rope(b, x, timesteps, context, &RopeOptions::default())
    }

    /// [`ErnieImage::forward`] with `ScaleROPE`'s options (ComfyUI's `rope_options`), which move the image
    /// tokens' positions only: the index axis to N + shift t (t's scale is not read), rows and columns to
    /// `shift + i · scale`. The text tokens stay at (i, 0, 0).
    pub fn forward_with_rope<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        rope: &RopeOptions,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let Sizes { batch, h, w } = self.check_inputs(x, timesteps, context)?;
        let dt = b.compute_dtype();
        let (c, tokens) = (cfg.channels, h * w);

        // The 1×1 patch embedding as a Linear over each position's channels, row-major.
        let img = {
            let latent = b.cast(x, dt)?.reshape(&[batch, c, tokens])?;
            let patches = b.permute(&latent, &[0, 2, 1])?;
            let layer = fetch(b, &self.weights, &weight_and_bias("x_embedder.proj"))?;
            let weight = layer.weight(0).reshape(&[cfg.hidden, c])?;
            b.linear(&patches, &weight, Some(&layer.weight(1)))?
        };
        let txt = self.text(b, context, batch)?;
        let text_len = txt.dim(1)?;
        let mut hidden = b.concat(&[&img, &txt], 1)?;
        drop((img, txt));
        let rope = self.rope(b, h, w, text_len, rope)?;

        let temb = self.time_embedding(b, timesteps)?;
        let m = linear(b, &self.weights, "adaLN_modulation.1", &b.unary(&temb, UnaryOp::Silu)?)?;
        let mods = Modulation::sets(b, &m, cfg.hidden, 2)?;
        drop(m);
        for i in 0..cfg.layers {
            hidden = self.layer(b, i, &hidden, &mods, &rope)?;
        }

        // The image tokens: LayerNorm (no affine) · (1 + scale) + shift of final_norm.linear(temb), then
        // final_linear, back to [B, channels, H, W].
        let img = b.slice(&hidden, 1, 0, tokens)?;
        drop(hidden);
        let d = cfg.hidden;
        let scale_shift = linear(b, &self.weights, "final_norm.linear", &temb)?;
        let (scale, shift) = (b.slice(&scale_shift, -1, 0, d)?, b.slice(&scale_shift, -1, d, d)?);
        let y = b.modulate(&b.layer_norm(&img, None, None, EPS)?, &scale, Some(&shift))?;
        let y = linear(b, &self.weights, "final_linear", &y)?;
        let out = b.permute(&y, &[0, 2, 1])?.reshape(&[batch, c, h, w])?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// Checks the input shapes.
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
    ) -> Result<Sizes> {
        let c = self.config.channels;
        let &[batch, channels, h, w] = x.shape() else {
            return Err(Error::Invalid(format!(
                "ERNIE-Image latents must be [B, {c}, H, W], got {:?}",
                x.shape()
            )));
        };
        if channels != c || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "ERNIE-Image takes non-empty latents of {c} channels, got {:?}",
                x.shape()
            )));
        }
        if timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for an ERNIE-Image batch of {batch}",
                timesteps.len()
            )));
        }
        let width = self.config.text_dim;
        match *context.shape() {
            [cb, n, cw] if (cb == 1 || cb == batch) && n > 0 && cw == width => {}
            [_, _, cw] if cw != width => {
                return Err(Error::Invalid(format!(
                    "ERNIE-Image reads {width} features a text token, this conditioning has {cw}: encode the \
                     prompt with its text encoder (Ministral 3 3B)"
                )));
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "ERNIE-Image conditioning must be [1 or {batch}, N > 0, {width}], got {other:?}"
                )));
            }
        }
        Ok(Sizes { batch, h, w })
    }

    /// The text tokens `[B, N, hidden]`: `context` repeated to the batch, through `text_proj` where the file has
    /// one.
    fn text<B: Backend>(&self, b: &B, context: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
        let context = b.cast(&to_batch(b, context, batch)?, b.compute_dtype())?;
        if !self.config.text_proj {
            return Ok(context);
        }
        let layer = fetch(b, &self.weights, &["text_proj.weight".to_owned()])?;
        Ok(b.linear(&context, &layer.weight(0), None)?)
    }

    /// The RoPE tables of the joint sequence, image tokens first: image token (r, c) at (N + shift t, y_r, x_c)
    /// (rows and columns as `rope` places them, in f32 as ComfyUI's linspace gives them), text token i at
    /// (i, 0, 0); angles `position · θ^(−2k/d)` per axis in f64, stored as f32.
    fn rope<B: Backend>(
        &self,
        b: &B,
        h: usize,
        w: usize,
        text_len: usize,
        rope: &RopeOptions,
    ) -> Result<SplitRope<B>> {
        let axes = self.config.axes;
        // ComfyUI adds the index to a float32 tensor: it is rounded to f32.
        let index = f64::from((text_len as f64 + rope.shift[0]) as f32);
        let rows: Vec<f64> = rope.positions(1, 0.0, h).collect();
        let cols: Vec<f64> = rope.positions(2, 0.0, w).collect();
        let mut positions: Vec<[f64; 3]> =
            rows.iter().flat_map(|&r| cols.iter().map(move |&c| [index, r, c])).collect();
        positions.extend((0..text_len).map(|i| [i as f64, 0.0, 0.0]));
        let freqs: Vec<(usize, f64)> = axes
            .iter()
            .enumerate()
            .flat_map(|(a, &d)| {
                (0..d / 2).map(move |k| (a, 1.0 / ROPE_THETA.powf((2 * k) as f64 / d as f64)))
            })
            .collect();
        let angles: Vec<f64> =
            positions.iter().flat_map(|p| freqs.iter().map(move |&(a, f)| p[a] * f)).collect();
        SplitRope::of_angles(b, &angles, freqs.len())
    }

    /// `temb` `[B, hidden]` for `timesteps` (σ · 1000): the sinusoid `hidden` wide (sin half first, f32) in the
    /// compute type through `time_embedding` (Linear, SiLU, Linear).
    fn time_embedding<B: Backend>(&self, b: &B, timesteps: &[f32]) -> Result<Tensor<B>> {
        let (m, d) = (&self.weights, self.config.hidden);
        let half = d / 2;
        let cos_sin = crate::timestep::sinusoid(timesteps.iter().copied(), half, 1.0);
        let sin_cos: Vec<f32> = cos_sin
            .chunks_exact(d)
            .flat_map(|row| row[half..].iter().chain(&row[..half]).copied())
            .collect();
        let emb = b.from_f32(&[timesteps.len(), d], &sin_cos, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let hidden = b.unary(&linear(b, m, "time_embedding.linear_1", &emb)?, UnaryOp::Silu)?;
        linear(b, m, "time_embedding.linear_2", &hidden)
    }

    /// Layer `i` on the joint tokens: `x + gate · attn(RMSNorm(x) · (1 + scale) + shift)`, then likewise the MLP,
    /// with the modulations every layer shares.
    fn layer<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        mods: &[Modulation<B>],
        rope: &SplitRope<B>,
    ) -> Result<Tensor<B>> {
        let layer = fetch(b, &self.weights, &layer_names(i))?;
        let normed = |x: &Tensor<B>, slot: usize, m: &Modulation<B>| -> Result<Tensor<B>> {
            let n = b.rms_norm(x, Some(&layer.weight(slot)), EPS)?;
            Ok(b.modulate(&n, &m.scale, Some(&m.shift))?)
        };
        let a = self.attention(b, &layer, &normed(x, slot::SA_LN, &mods[0])?, rope)?;
        let x = mods[0].gated_add(b, x, &a)?;
        let y = mlp(b, &layer, &normed(&x, slot::MLP_LN, &mods[1])?)?;
        mods[1].gated_add(b, &x, &y)
    }

    /// A layer's attention on `x` `[B, N, hidden]`: bias-free q, k, v projections, per-head RMS norms of q and k,
    /// the split-half RoPE, unmasked attention, the bias-free output projection.
    fn attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        x: &Tensor<B>,
        rope: &SplitRope<B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, n) = (x.dim(0)?, x.dim(1)?);
        let project = |slot: usize| -> Result<Tensor<B>> {
            Ok(b.linear(x, &layer.weight(slot), None)?.reshape(&[
                batch,
                n,
                cfg.heads,
                cfg.head_dim,
            ])?)
        };
        let norm = |t: Tensor<B>, slot: usize| -> Result<Tensor<B>> {
            Ok(b.rms_norm(&t, Some(&layer.weight(slot)), EPS)?)
        };
        let q = rope.apply(b, &norm(project(slot::TO_Q)?, slot::NORM_Q)?)?;
        let k = rope.apply(b, &norm(project(slot::TO_K)?, slot::NORM_K)?)?;
        let v = project(slot::TO_V)?;
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(&v)?);
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let o = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, cfg.hidden])?;
        Ok(b.linear(&o, &layer.weight(slot::TO_OUT), None)?)
    }
}

/// A layer's MLP: `linear_fc2(up_proj(x) · gelu(gate_proj(x)))` (erf GELU), all bias-free.
fn mlp<B: Backend>(b: &B, layer: &Layer<'_>, x: &Tensor<B>) -> Result<Tensor<B>> {
    let gate = b.linear(x, &layer.weight(slot::GATE), None)?;
    let up = b.linear(x, &layer.weight(slot::UP), None)?;
    let hidden = b.gated(&gate, &up, UnaryOp::Gelu)?;
    Ok(b.linear(&hidden, &layer.weight(slot::DOWN), None)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_tables_take_each_half_of_the_angles() {
        let b = kiln_compute::backend::cpu::Cpu::new(1 << 20);
        // One token, hd 8: angles a0..a3; top turns features 0..4 by a0 a0 a1 a1, bottom 4..8 by a2 a2 a3 a3.
        let angles = [0.1, 0.2, 0.3, 0.4];
        let rope = SplitRope::of_angles(&b, &angles, 4).expect("tables");
        let cos = |t: &Tensor<kiln_compute::backend::cpu::Cpu>| b.to_f32(t).expect("read");
        let want = |idx: [usize; 4]| idx.map(|i| f64::cos(angles[i]) as f32).to_vec();
        assert_eq!(cos(&rope.top.cos), want([0, 0, 1, 1]));
        assert_eq!(cos(&rope.bottom.cos), want([2, 2, 3, 3]));
    }
}
