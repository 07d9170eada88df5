//! [`OmniGen2`]: the DiT's forward pass in ComfyUI's order, reading one block's weights at a time through
//! [`Model::fetch`].
//!
//! The caption is embedded and refined alone (no modulation); the image's and each reference's patches have
//! their own embedders, the references marked by `image_index_embedding[j]`, and are refined apart (noise and
//! reference-image refiners, modulated); the joint blocks then run over [caption, references, image], and the
//! last image tokens are un-patchified. Every block is Lumina's: RMSNorm-zero modulation (`1 + scale`, tanh
//! gates), per-head q/k RMSNorm, interleaved 3-axis RoPE, grouped-query attention and a SwiGLU.

use std::sync::Arc;

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, MemoryManager, Model};
use kiln_compute::{Backend, DType, Tensor};

use crate::adaln::ScaleGates;
use crate::error::{Error, Result};
use crate::header::Header;
use crate::rope::Rope;

use super::config::{Config, detect};
use super::keys::{GROUPS, block_names, load_plan, modulated};
use super::rope::{self, Grid};

/// ε of the attention's per-head q/k RMSNorms (ComfyUI's `Attention(eps=1e-5)`, whatever `norm_eps`).
const QK_NORM_EPS: f32 = 1e-5;
/// ε of the output LayerNorm (`LuminaLayerNormContinuous`, no affine).
const NORM_OUT_EPS: f32 = 1e-6;

/// An OmniGen2 DiT: its config and its weights (ComfyUI names, no prefix) under the memory manager.
pub struct OmniGen2 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// The token runs of the joint sequence: caption, references (all together), image.
#[derive(Clone, Copy)]
struct Runs {
    caption: usize,
    references: usize,
    image: usize,
}

impl OmniGen2 {
    /// A model from its config and loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> OmniGen2 {
        OmniGen2 { config, weights }
    }

    /// Detects the model in `h` and loads it: [`crate::Error::Unsupported`] if `h` is no OmniGen2 DiT.
    pub fn load(
        manager: &Arc<MemoryManager>,
        h: &Header,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<OmniGen2> {
        let config = detect(h)?.ok_or_else(|| {
            h.unsupported(
                "not an OmniGen2 diffusion model (no `time_caption_embed.timestep_embedder.linear_1.bias` with \
                 `ref_image_patch_embedder.weight`)",
            )
        })?;
        let weights = manager.load(&load_plan(h, &config), progress)?;
        Ok(OmniGen2::new(config, weights))
    }

    /// ComfyUI's model output for latents `x` `[B, C, h, w]` (any float dtype), model timesteps `timesteps` (one
    /// per sample, σ·multiplier; the network sees 1 − t), caption features `context` `[B, N, text_feat_dim]` (all
    /// N tokens attended) and reference latents `references` (each `[1, C, h_j, w_j]`, or `[B, ..]`, in model
    /// space; a batch of 1 is repeated over the batch): −output, f32 `[B, C, h, w]`. Computes in
    /// `b.compute_dtype()`; odd sides (the references' too) are padded circularly to the patch and the output
    /// cropped back.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        references: &[Tensor<B>],
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, h, w) = self.check_inputs(x, timesteps, context, references)?;
        let dt = b.compute_dtype();
        let p = cfg.patch_size;
        let x = pad_to_patch(b, &b.cast(x, dt)?, p)?;
        let (hp, wp) = (x.dim(2)?, x.dim(3)?);
        let references = references
            .iter()
            .map(|r| pad_to_patch(b, &b.cast(r, dt)?, p))
            .collect::<Result<Vec<_>>>()?;

        let temb = self.time_embedding(b, timesteps)?;
        let cap = self.caption(b, &b.cast(context, dt)?)?;
        let img = self.image(b, &x)?;
        let refs = self.references(b, &references, batch)?;
        let grids: Vec<Grid> =
            references.iter().map(|r| Ok((r.dim(2)? / p, r.dim(3)? / p))).collect::<Result<_>>()?;
        let runs = Runs {
            caption: cap.dim(1)?,
            references: grids.iter().map(|(r, c)| r * c).sum(),
            image: img.dim(1)?,
        };
        let positions = rope::positions(runs.caption, &grids, (hp / p, wp / p));
        let (cos, sin) = rope::tables(&positions, cfg.axes_dims, cfg.rope_theta);
        let rope = Rope::upload(b, &cos, &sin, cfg.head_dim / 2, DType::F32)?;

        let mut joint = self.refine(b, cap, refs, img, &rope, runs, &temb)?;
        for i in 0..cfg.layers {
            joint = self.block(b, GROUPS[0], i, &joint, &rope, Some(&temb))?;
        }
        // The output layer is per token: only the image's (the last ones) are needed.
        let tokens = b.slice(&joint, 1, runs.caption + runs.references, runs.image)?;
        drop(joint);
        let y = self.norm_out(b, &tokens, &temb)?;
        let mut out = b.unpatchify(&y, p, cfg.in_channels, hp, wp)?;
        if hp > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if wp > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        debug_assert_eq!(out.shape(), [batch, cfg.in_channels, h, w]);
        let out = b.unary(&out, UnaryOp::Neg)?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// The refiners: the caption alone (unmodulated), the image and the references (modulated by `temb`) each
    /// with its part of the joint `rope`; then the joint sequence [caption, references, image].
    #[allow(clippy::too_many_arguments)]
    fn refine<B: Backend>(
        &self,
        b: &B,
        mut cap: Tensor<B>,
        refs: Option<Tensor<B>>,
        mut img: Tensor<B>,
        rope: &Rope<B>,
        runs: Runs,
        temb: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let part = |start, len| -> Result<Rope<B>> {
            Ok(Rope {
                cos: b.slice(&rope.cos, 0, start, len)?,
                sin: b.slice(&rope.sin, 0, start, len)?,
            })
        };
        let [_, noise, ref_refiner, context_refiner] = GROUPS;
        let cap_rope = part(0, runs.caption)?;
        for i in 0..self.config.refiners {
            cap = self.block(b, context_refiner, i, &cap, &cap_rope, None)?;
        }
        let img_rope = part(runs.caption + runs.references, runs.image)?;
        for i in 0..self.config.refiners {
            img = self.block(b, noise, i, &img, &img_rope, Some(temb))?;
        }
        let Some(mut refs) = refs else {
            return Ok(b.concat(&[&cap, &img], 1)?);
        };
        let ref_rope = part(runs.caption, runs.references)?;
        for i in 0..self.config.refiners {
            refs = self.block(b, ref_refiner, i, &refs, &ref_rope, Some(temb))?;
        }
        Ok(b.concat(&[&cap, &refs, &img], 1)?)
    }

    /// Checks the input shapes: returns (batch, h, w).
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        references: &[Tensor<B>],
    ) -> Result<(usize, usize, usize)> {
        let cfg = &self.config;
        let &[batch, channels, h, w] = x.shape() else {
            return Err(Error::Invalid(format!(
                "OmniGen2 latents must be [B, C, h, w], got {:?}",
                x.shape()
            )));
        };
        if channels != cfg.in_channels || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "OmniGen2 takes non-empty latents of {} channels, got {:?}",
                cfg.in_channels,
                x.shape()
            )));
        }
        if timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a batch of {batch}",
                timesteps.len()
            )));
        }
        match context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.text_feat_dim => {}
            other => {
                return Err(Error::Invalid(format!(
                    "OmniGen2 conditioning must be [{batch}, N > 0, {}], got {other:?}",
                    cfg.text_feat_dim
                )));
            }
        }
        if references.len() > cfg.max_references {
            return Err(Error::Invalid(format!(
                "{} reference latents; OmniGen2 tells {} apart",
                references.len(),
                cfg.max_references
            )));
        }
        for r in references {
            match r.shape() {
                &[rb, c, rh, rw]
                    if (rb == 1 || rb == batch) && c == cfg.in_channels && rh > 0 && rw > 0 => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "OmniGen2 reference latents must be [1 or {batch}, {}, h > 0, w > 0], got {other:?}",
                        cfg.in_channels
                    )));
                }
            }
        }
        Ok((batch, h, w))
    }

    /// Gets `names` on the device (one layer of the per-layer protocol).
    fn fetch<B: Backend>(&self, b: &B, names: &[String]) -> Result<Layer<'_>> {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(self.weights.fetch(b, &names)?)
    }

    /// The t-embedding `[B, t_dim]`: sinusoid (cos half first) of `timestep_scale · (1 − t)` in f32, cast to the
    /// compute type, then Linear → SiLU → Linear.
    fn time_embedding<B: Backend>(&self, b: &B, timesteps: &[f32]) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let ts = timesteps.iter().map(|&t| 1.0 - t);
        let emb = crate::timestep::sinusoid(ts, cfg.t_freq_dim / 2, cfg.timestep_scale);
        let emb = b.from_f32(&[timesteps.len(), cfg.t_freq_dim], &emb, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let names = ["linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"]
            .map(|n| format!("time_caption_embed.timestep_embedder.{n}"));
        let layer = self.fetch(b, &names)?;
        let hidden = b.linear(&emb, &layer.weight(0), Some(&layer.weight(1)))?;
        let hidden = b.unary(&hidden, UnaryOp::Silu)?;
        Ok(b.linear(&hidden, &layer.weight(2), Some(&layer.weight(3)))?)
    }

    /// Caption tokens `[B, N, D]`: Linear(RMSNorm(context)).
    fn caption<B: Backend>(&self, b: &B, context: &Tensor<B>) -> Result<Tensor<B>> {
        let names = ["0.weight", "1.weight", "1.bias"]
            .map(|n| format!("time_caption_embed.caption_embedder.{n}"));
        let layer = self.fetch(b, &names)?;
        let y = b.rms_norm(context, Some(&layer.weight(0)), self.config.norm_eps)?;
        Ok(b.linear(&y, &layer.weight(1), Some(&layer.weight(2)))?)
    }

    /// Image tokens `[B, n, D]` of the (patch-sized) latents `x`.
    fn image<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let layer =
            self.fetch(b, &["x_embedder.weight".to_owned(), "x_embedder.bias".to_owned()])?;
        let patches = b.patchify(x, self.config.patch_size)?;
        Ok(b.linear(&patches, &layer.weight(0), Some(&layer.weight(1)))?)
    }

    /// The references' tokens `[B, Σ n_j, D]` (each patch-sized), reference j's through its own embedder plus
    /// `image_index_embedding[j]`; a reference of batch 1 is repeated over the `batch`. `None` without
    /// references.
    fn references<B: Backend>(
        &self,
        b: &B,
        references: &[Tensor<B>],
        batch: usize,
    ) -> Result<Option<Tensor<B>>> {
        if references.is_empty() {
            return Ok(None);
        }
        let names = [
            "ref_image_patch_embedder.weight",
            "ref_image_patch_embedder.bias",
            "image_index_embedding",
        ]
        .map(String::from);
        let layer = self.fetch(b, &names)?;
        let mut runs = Vec::with_capacity(references.len());
        for (j, r) in references.iter().enumerate() {
            let patches = b.patchify(r, self.config.patch_size)?;
            let tokens = b.linear(&patches, &layer.weight(0), Some(&layer.weight(1)))?;
            let index = b.weight_to_tensor(&layer.weight(2).rows(j, 1)?, tokens.dtype())?;
            let tokens = b.binary(&tokens, &index, BinaryOp::Add)?;
            runs.push(if tokens.dim(0)? == batch {
                tokens
            } else {
                b.concat(&vec![&tokens; batch], 0)?
            });
        }
        Ok(Some(b.concat(&runs.iter().collect::<Vec<_>>(), 1)?))
    }

    /// One transformer block (`{group}.{i}`), modulated by the t-embedding `temb` when given.
    fn block<B: Backend>(
        &self,
        b: &B,
        group: &str,
        i: usize,
        x: &Tensor<B>,
        rope: &Rope<B>,
        temb: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let eps = self.config.norm_eps;
        let p = format!("{group}.{i}");
        let temb = temb.filter(|_| modulated(group));
        let layer = self.fetch(b, &block_names(&p, temb.is_some()))?;
        let w = |name: &str| layer.get(&format!("{p}.{name}"));
        let modulation = match temb {
            Some(temb) => Some(self.modulation(b, &layer, &p, temb)?),
            None => None,
        };

        let (norm1, attn_scale, attn_gate) = match &modulation {
            Some(m) => ("norm1.norm.weight", Some(&m.attn_scale), Some(&m.attn_gate)),
            None => ("norm1.weight", None, None),
        };
        let h = b.rms_norm(x, Some(&w(norm1)?), eps)?;
        let h = scaled(b, h, attn_scale)?;
        let a = self.attention(b, &layer, &p, &h, rope)?;
        let a = b.rms_norm(&a, Some(&w("norm2.weight")?), eps)?;
        let x = b.binary(x, &gated(b, a, attn_gate)?, BinaryOp::Add)?;

        let h = b.rms_norm(&x, Some(&w("ffn_norm1.weight")?), eps)?;
        let h = scaled(b, h, modulation.as_ref().map(|m| &m.ffn_scale))?;
        let gate = b.linear(&h, &w("feed_forward.linear_1.weight")?, None)?;
        let up = b.linear(&h, &w("feed_forward.linear_3.weight")?, None)?;
        let f = b.linear(
            &b.gated(&gate, &up, UnaryOp::Silu)?,
            &w("feed_forward.linear_2.weight")?,
            None,
        )?;
        let f = b.rms_norm(&f, Some(&w("ffn_norm2.weight")?), eps)?;
        let f = gated(b, f, modulation.as_ref().map(|m| &m.ffn_gate))?;
        Ok(b.binary(&x, &f, BinaryOp::Add)?)
    }

    /// Block `p`'s `LuminaRMSNormZero` vectors: `Linear(SiLU(temb))` split in four (scale, gate, scale, gate),
    /// the gates through tanh.
    fn modulation<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        p: &str,
        temb: &Tensor<B>,
    ) -> Result<ScaleGates<B>> {
        let d = self.config.hidden;
        let m = b.linear(
            &b.unary(temb, UnaryOp::Silu)?,
            &layer.get(&format!("{p}.norm1.linear.weight"))?,
            Some(&layer.get(&format!("{p}.norm1.linear.bias"))?),
        )?;
        ScaleGates::of(b, &m, d)
    }

    /// Self-attention of block `p` over `h` `[B, L, D]`: q, k, v projections, per-head q/k RMSNorm, interleaved
    /// RoPE, unmasked softmax attention (grouped-query over the fewer key/value heads), output projection.
    fn attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        p: &str,
        h: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let hd = cfg.head_dim;
        let &[batch, len, _] = h.shape() else {
            return Err(Error::Invalid(format!(
                "attention input {:?} is not [B, L, D]",
                h.shape()
            )));
        };
        let w = |name: &str| layer.get(&format!("{p}.attn.{name}.weight"));
        let project = |name: &str, heads: usize| -> Result<Tensor<B>> {
            Ok(b.linear(h, &w(name)?, None)?.reshape(&[batch, len, heads, hd])?)
        };
        let rotate = |x: Tensor<B>, norm: &str| -> Result<Tensor<B>> {
            let x = b.rms_norm(&x, Some(&w(norm)?), QK_NORM_EPS)?;
            let x = b.rope(&x, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
            Ok(b.permute(&x, &[0, 2, 1, 3])?)
        };
        let q = rotate(project("to_q", cfg.heads)?, "norm_q")?;
        let k = rotate(project("to_k", cfg.kv_heads)?, "norm_k")?;
        let v = b.permute(&project("to_v", cfg.kv_heads)?, &[0, 2, 1, 3])?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (hd as f32).sqrt())?;
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, len, cfg.heads * hd])?;
        Ok(b.linear(&o, &w("to_out.0")?, None)?)
    }

    /// `norm_out` on tokens `[B, n, D]`: Linear(LayerNorm(x) · (1 + Linear(SiLU(temb)))) → `[B, n, p²·C]`.
    fn norm_out<B: Backend>(&self, b: &B, x: &Tensor<B>, temb: &Tensor<B>) -> Result<Tensor<B>> {
        let names = ["linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"]
            .map(|n| format!("norm_out.{n}"));
        let layer = self.fetch(b, &names)?;
        let scale =
            b.linear(&b.unary(temb, UnaryOp::Silu)?, &layer.weight(0), Some(&layer.weight(1)))?;
        let y = b.layer_norm(x, None, None, NORM_OUT_EPS)?;
        let y = b.modulate(&y, &scale, None)?;
        Ok(b.linear(&y, &layer.weight(2), Some(&layer.weight(3)))?)
    }
}

/// `x · (1 + scale)` with a per-sample `scale` `[B, D]`, or `x` without one.
fn scaled<B: Backend>(b: &B, x: Tensor<B>, scale: Option<&Tensor<B>>) -> Result<Tensor<B>> {
    match scale {
        Some(scale) => Ok(b.modulate(&x, scale, None)?),
        None => Ok(x),
    }
}

/// `x · gate` with a per-sample `gate` `[B, 1, D]`, or `x` without one.
fn gated<B: Backend>(b: &B, x: Tensor<B>, gate: Option<&Tensor<B>>) -> Result<Tensor<B>> {
    match gate {
        Some(gate) => Ok(b.binary(&x, gate, BinaryOp::Mul)?),
        None => Ok(x),
    }
}

/// `x` `[B, C, h, w]` padded circularly at the bottom and right to multiples of `p` (ComfyUI's
/// `pad_to_patch_size`).
fn pad_to_patch<B: Backend>(b: &B, x: &Tensor<B>, p: usize) -> Result<Tensor<B>> {
    let mut x = x.clone();
    for dim in [2, 3] {
        let side = x.dim(dim)?;
        let pad = side.next_multiple_of(p) - side;
        if pad > 0 {
            x = b.pad(&x, dim, 0, pad, PadMode::Circular)?;
        }
    }
    Ok(x)
}
