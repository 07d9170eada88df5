//! The text side of HunyuanVideo's joint sequence: the text features through the token refiner (`txt_in`,
//! ComfyUI's `TokenRefiner`), and in HunyuanVideo 1.5 the glyph text's byT5 features through `byt5_in`
//! (`ByT5Mapper`) and the image's vision states through `vision_in` (Wan's `MLPProj`), each kind marked by its
//! row of `cond_type_embedding` (0 text, 1 byT5, 2 vision).
//!
//! Invariant: the order is ComfyUI's, [vision, byT5, text] (a model without `cond_type_embedding`, 1.0, puts
//! the byT5 tokens after the text).

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::memory::Layer;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::Result;
use crate::latent_tokens::to_batch;

use super::keys::{byt5_names, refiner_block_names, refiner_embedder_names, vision_names};
use super::model::{HunyuanVideo, HunyuanVideoInput, mlp_embedder};

/// ε of the token refiner's LayerNorms (`eps=1e-6`).
const REFINER_EPS: f32 = 1e-6;
/// ε of the byT5 mapper's and the vision projection's LayerNorms (torch's default, 1e-5).
const MAPPER_EPS: f32 = 1e-5;

/// The kinds of text-side token, by their row of `cond_type_embedding`.
#[derive(Debug, Clone, Copy)]
enum CondType {
    Text = 0,
    ByT5 = 1,
    Vision = 2,
}

impl HunyuanVideo {
    /// The text side `[B, Lt, D]` in the compute type: [vision states, byT5 tokens, refined text] of the
    /// inputs given (`t_sinusoid`: the timesteps' sinusoid, which the refiner embeds too).
    pub(super) fn text_tokens<B: Backend>(
        &self,
        b: &B,
        input: &HunyuanVideoInput<'_, B>,
        t_sinusoid: &Tensor<B>,
        batch: usize,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let dt = b.compute_dtype();
        let context = b.cast(input.context, dt)?;
        let mut txt = self.refine(b, &context, t_sinusoid)?;
        drop(context);
        let cond = match cfg.cond_type_embedding {
            true => Some(self.fetch(b, &["cond_type_embedding.weight".to_owned()])?),
            false => None,
        };
        let cond = cond.as_ref();
        txt = typed(b, cond, txt, CondType::Text)?;
        if let (Some(byt5), Some(_)) = (input.byt5, cfg.byt5) {
            let glyphs = self.byt5_mapper(b, &to_batch(b, &b.cast(byt5, dt)?, batch)?)?;
            let glyphs = typed(b, cond, glyphs, CondType::ByT5)?;
            txt = match cond {
                Some(_) => b.concat(&[&glyphs, &txt], 1)?,
                None => b.concat(&[&txt, &glyphs], 1)?,
            };
        }
        if let Some(clip) = input.clip_fea {
            let vision = self.vision_projection(b, &to_batch(b, &b.cast(clip, dt)?, batch)?)?;
            // ComfyUI adds the embedding row without casting it first, then casts the sum.
            let vision = match cond {
                Some(_) => {
                    b.cast(&typed(b, cond, b.cast(&vision, DType::F32)?, CondType::Vision)?, dt)?
                }
                None => vision,
            };
            txt = b.concat(&[&vision, &txt], 1)?;
        }
        Ok(txt)
    }

    /// `TokenRefiner` on the text features `context` `[B, N, C]`: c = t_embedder(E(t)) + c_embedder(mean of the
    /// tokens), x = input_embedder(context), then the refiner blocks, each modulated by c.
    fn refine<B: Backend>(
        &self,
        b: &B,
        context: &Tensor<B>,
        t_sinusoid: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let layer = self.fetch(b, &refiner_embedder_names())?;
        let t = mlp_embedder(b, &layer, 2, t_sinusoid)?;
        let c =
            b.binary(&t, &mlp_embedder(b, &layer, 6, &token_mean(b, context)?)?, BinaryOp::Add)?;
        let mut x = b.linear(context, &layer.weight(0), Some(&layer.weight(1)))?;
        drop(layer);
        let silu_c = b.unary(&c, UnaryOp::Silu)?;
        for i in 0..self.config.refiner_blocks {
            x = self.refiner_block(b, i, &x, &silu_c)?;
        }
        Ok(x)
    }

    /// `TokenRefinerBlock` `i` on `x` `[B, N, D]` with `silu_c` = SiLU(c): (gate₁, gate₂) =
    /// adaLN_modulation(SiLU(c)); x + gate₁·proj(attention(qkv(norm1(x)))), then x + gate₂·mlp(norm2(x)) (a SiLU
    /// MLP). No RoPE, no q/k norms.
    fn refiner_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        silu_c: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let d = self.config.hidden;
        let layer = self.fetch(b, &refiner_block_names(i))?;
        let w = |k: usize| layer.weight(k);
        let m = b.linear(silu_c, &w(12), Some(&w(13)))?;
        let gate = |k: usize| -> Result<Tensor<B>> {
            let g = b.slice(&m, -1, k * d, d)?;
            Ok(g.reshape(&[g.dim(0)?, 1, d])?)
        };
        let h = b.layer_norm(x, Some(&w(0)), Some(&w(1)), REFINER_EPS)?;
        let qkv = b.linear(&h, &w(2), Some(&w(3)))?;
        let attn = self.attention(b, self.split_qkv(b, &qkv, None)?, None)?;
        let a = b.linear(&attn, &w(4), Some(&w(5)))?;
        let x = b.binary(x, &b.binary(&a, &gate(0)?, BinaryOp::Mul)?, BinaryOp::Add)?;
        let h = b.layer_norm(&x, Some(&w(6)), Some(&w(7)), REFINER_EPS)?;
        let h = b.unary(&b.linear(&h, &w(8), Some(&w(9)))?, UnaryOp::Silu)?;
        let f = b.linear(&h, &w(10), Some(&w(11)))?;
        Ok(b.binary(&x, &b.binary(&f, &gate(1)?, BinaryOp::Mul)?, BinaryOp::Add)?)
    }

    /// `ByT5Mapper` on the glyph features `[B, M, in]`: fc3(GELU(fc2(GELU(fc1(LayerNorm(x)))))) → `[B, M, D]`.
    fn byt5_mapper<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let layer = self.fetch(b, &byt5_names())?;
        let w = |k: usize| layer.weight(k);
        let x = b.layer_norm(x, Some(&w(0)), Some(&w(1)), MAPPER_EPS)?;
        let x = b.unary(&b.linear(&x, &w(2), Some(&w(3)))?, UnaryOp::Gelu)?;
        let x = b.unary(&b.linear(&x, &w(4), Some(&w(5)))?, UnaryOp::Gelu)?;
        Ok(b.linear(&x, &w(6), Some(&w(7)))?)
    }

    /// `vision_in` (Wan's `MLPProj`) on the vision states `[B, V, vision_dim]`: LayerNorm, Linear, GELU, Linear,
    /// LayerNorm → `[B, V, D]`.
    fn vision_projection<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let layer = self.fetch(b, &vision_names())?;
        let w = |k: usize| layer.weight(k);
        let x = b.layer_norm(x, Some(&w(0)), Some(&w(1)), MAPPER_EPS)?;
        let x = b.unary(&b.linear(&x, &w(2), Some(&w(3)))?, UnaryOp::Gelu)?;
        let x = b.linear(&x, &w(4), Some(&w(5)))?;
        Ok(b.layer_norm(&x, Some(&w(6)), Some(&w(7)), MAPPER_EPS)?)
    }
}

/// `x` plus the row of `cond_type_embedding` (the fetched `cond`) for `kind`, cast to x's type; `x` alone for a
/// model without the embedding.
fn typed<B: Backend>(
    b: &B,
    cond: Option<&Layer<'_>>,
    x: Tensor<B>,
    kind: CondType,
) -> Result<Tensor<B>> {
    let Some(cond) = cond else { return Ok(x) };
    let row = b.weight_to_tensor(&cond.weight(0).rows(kind as usize, 1)?, x.dtype())?;
    Ok(b.binary(&x, &row, BinaryOp::Add)?)
}

/// The mean over the tokens of `x` `[B, N, C]` → `[B, C]` (ComfyUI's `x.sum(dim=1) / N`; for f16 it sums and
/// divides in f32, then casts back).
fn token_mean<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let &[batch, n, c] = x.shape() else {
        return Err(crate::error::Error::Invalid(format!(
            "text features {:?} are not [B, N, C]",
            x.shape()
        )));
    };
    let dt = x.dtype();
    let work = if dt == DType::F16 { DType::F32 } else { dt };
    let ones = b.full(&[batch, 1, n], 1.0, work)?;
    let sum = b.matmul(&ones, &b.cast(x, work)?, false)?.reshape(&[batch, c])?;
    let mean = b.binary(&sum, &b.full(&[1], n as f32, work)?, BinaryOp::Div)?;
    Ok(b.cast(&mean, dt)?)
}
