//! [`OmniGen2`]: the DiT's forward pass (OmniGen2's or Boogu-Image's) in ComfyUI's order, reading one block's
//! weights at a time through [`Model::fetch`].
//!
//! The caption is embedded and refined alone (no modulation); the image's and each reference's patches have
//! their own embedders, the references marked by `image_index_embedding[j]`, and are refined apart (noise and
//! reference-image refiners, modulated); the joint blocks then run over [caption, references, image], and the
//! last image tokens are un-patchified. Every block is Lumina's: RMSNorm-zero modulation (`1 + scale`, tanh
//! gates), per-head q/k RMSNorm, interleaved 3-axis RoPE, grouped-query attention and a SwiGLU.
//!
//! Boogu-Image runs its double-stream blocks between the refiners and the joint blocks, on the caption
//! ("instruction") and the images ([references, image]) as two streams: a joint attention over [caption, images]
//! (each stream its own q/k/v and output projections, then one shared norm pair and output), an image-only
//! self-attention, and each stream its own modulations, sandwich norms and SwiGLU ([`OmniGen2::double_block`]).

use std::sync::Arc;

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, MemoryManager, Model};
use kiln_compute::{Backend, DType, Tensor};

use crate::adaln::ScaleGates;
use crate::error::{Error, Result};
use crate::header::Header;
use crate::latent_tokens::padded;
use crate::rope::Rope;

use super::config::{Config, detect};
use super::keys::{DOUBLE_STREAM, REFINERS, block_names, double_block_names, load_plan, modulated};
use super::rope::{self, Grid};

/// ε of the attention's per-head q/k RMSNorms (ComfyUI's `Attention(eps=1e-5)`, whatever `norm_eps`).
const QK_NORM_EPS: f32 = 1e-5;
/// ε of the output LayerNorm (`LuminaLayerNormContinuous`, no affine).
const NORM_OUT_EPS: f32 = 1e-6;

/// An OmniGen2 or Boogu-Image DiT ([`Config::is_boogu`]): its config and its weights (ComfyUI names, no prefix)
/// under the memory manager.
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

    /// Detects the model in `h` and loads it: [`crate::Error::Unsupported`] if `h` is no OmniGen2 or Boogu-Image
    /// DiT.
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
    /// cropped back. A Boogu-Image config runs its double-stream blocks before the joint ones.
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
        let (x, rows, cols) = padded(b, &b.cast(x, dt)?, p)?;
        let (hp, wp) = (rows * p, cols * p);
        let mut grids: Vec<Grid> = Vec::with_capacity(references.len());
        let mut padded_refs = Vec::with_capacity(references.len());
        for r in references {
            let (r, rows, cols) = padded(b, &b.cast(r, dt)?, p)?;
            grids.push((rows, cols));
            padded_refs.push(r);
        }
        let references = padded_refs;

        let temb = self.time_embedding(b, timesteps)?;
        let cap = self.caption(b, &b.cast(context, dt)?)?;
        let img = self.image(b, &x)?;
        let refs = self.references(b, &references, batch)?;
        let runs = Runs {
            caption: cap.dim(1)?,
            references: grids.iter().map(|(r, c)| r * c).sum(),
            image: img.dim(1)?,
        };
        let positions = rope::positions(runs.caption, &grids, (rows, cols));
        let (cos, sin) = rope::tables(&positions, cfg.axes_dims, cfg.rope_theta);
        let rope = Rope::upload(b, &cos, &sin, cfg.head_dim / 2, DType::F32)?;

        let (mut cap, mut images) = self.refine(b, cap, refs, img, &rope, runs, &temb)?;
        if cfg.double_stream_layers > 0 {
            // The image self-attention sees [references, image], which follow the caption in the joint table.
            let images_rope = rope.rows(b, runs.caption, runs.references + runs.image)?;
            for i in 0..cfg.double_stream_layers {
                (cap, images) =
                    self.double_block(b, i, &cap, &images, &rope, &images_rope, &temb)?;
            }
        }
        let mut joint = b.concat(&[&cap, &images], 1)?;
        drop((cap, images));
        let main = cfg.variant.layers_group();
        for i in 0..cfg.layers {
            joint = self.block(b, main, i, &joint, &rope, Some(&temb))?;
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
    /// with its part of the joint `rope`; returns the caption and the images [references, image].
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
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let part = |start, len| rope.rows(b, start, len);
        let [noise, ref_refiner, context_refiner] = REFINERS;
        let cap_rope = part(0, runs.caption)?;
        for i in 0..self.config.refiners {
            cap = self.block(b, context_refiner, i, &cap, &cap_rope, None)?;
        }
        let img_rope = part(runs.caption + runs.references, runs.image)?;
        for i in 0..self.config.refiners {
            img = self.block(b, noise, i, &img, &img_rope, Some(temb))?;
        }
        let Some(mut refs) = refs else {
            return Ok((cap, img));
        };
        let ref_rope = part(runs.caption, runs.references)?;
        for i in 0..self.config.refiners {
            refs = self.block(b, ref_refiner, i, &refs, &ref_rope, Some(temb))?;
        }
        Ok((cap, b.concat(&[&refs, &img], 1)?))
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
        let a = self.attention(b, &layer, &format!("{p}.attn"), &h, rope)?;
        let a = b.rms_norm(&a, Some(&w("norm2.weight")?), eps)?;
        let x = b.binary(x, &gated(b, a, attn_gate)?, BinaryOp::Add)?;

        let h = b.rms_norm(&x, Some(&w("ffn_norm1.weight")?), eps)?;
        let h = scaled(b, h, modulation.as_ref().map(|m| &m.ffn_scale))?;
        let f = feed_forward(b, &layer, &format!("{p}.feed_forward"), &h)?;
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

    /// Boogu-Image's double-stream block `double_stream_layers.{i}` on the caption `cap` `[B, Lc, D]` and the
    /// images `images` `[B, Li, D]` ([references, image]), with the joint `rope` over [caption, images] and
    /// `images_rope` (its images' rows): the new (caption, images).
    ///
    /// Each `LuminaRMSNormZero` gives RMSNorm(x)·(1 + m₀) and the chunks m₀ … m₃ of Linear(SiLU(temb)), x being
    /// the block's input stream. With the images' norm1, norm2, norm3 and the caption's norm1, norm2:
    /// - the joint attention takes both streams' norm1 outputs; each stream adds tanh(norm1's m₁)·RMSNorm(its part),
    ///   then the images add tanh(norm3's m₁)·RMSNorm(self-attention over norm3's output);
    /// - a stream's FFN input is norm2's output ·(1 + norm1's m₂) + norm2's m₁ (ComfyUI's "shift": norm2's
    ///   second chunk, no tanh), both from the block's input, not the updated stream; the stream adds
    ///   tanh(norm1's m₃)·RMSNorm(FFN(RMSNorm(that input))).
    #[allow(clippy::too_many_arguments)]
    fn double_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        cap: &Tensor<B>,
        images: &Tensor<B>,
        rope: &Rope<B>,
        images_rope: &Rope<B>,
        temb: &Tensor<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let (d, eps) = (self.config.hidden, self.config.norm_eps);
        let p = format!("{DOUBLE_STREAM}.{i}");
        let layer = self.fetch(b, &double_block_names(&p))?;
        let w = |name: &str| layer.get(&format!("{p}.{name}.weight"));
        let emb = b.unary(temb, UnaryOp::Silu)?;
        // `LuminaRMSNormZero` `norm` of x: (RMSNorm(x)·(1 + m₀), [m₀, m₁, m₂, m₃] each `[B, D]`).
        let zero = |norm: &str, x: &Tensor<B>| -> Result<(Tensor<B>, Vec<Tensor<B>>)> {
            let bias = layer.get(&format!("{p}.{norm}.linear.bias"))?;
            let m = b.linear(&emb, &w(&format!("{norm}.linear"))?, Some(&bias))?;
            let m = (0..4).map(|k| b.slice(&m, -1, k * d, d)).collect::<Result<Vec<_>, _>>()?;
            let y = b.rms_norm(x, Some(&w(&format!("{norm}.norm"))?), eps)?;
            Ok((b.modulate(&y, &m[0], None)?, m))
        };
        // x + tanh(gate)·RMSNorm_norm(y).
        let residual =
            |x: &Tensor<B>, y: &Tensor<B>, norm: &str, gate: &Tensor<B>| -> Result<Tensor<B>> {
                let y = b.rms_norm(y, Some(&w(norm)?), eps)?;
                let gate = b.unary(gate, UnaryOp::Tanh)?;
                let gate = gate.reshape(&[gate.dim(0)?, 1, d])?;
                Ok(b.binary(x, &b.binary(&y, &gate, BinaryOp::Mul)?, BinaryOp::Add)?)
            };
        // The stream's FFN residual from its norm2 output and its norm1's and norm2's chunks.
        let ffn =
            |stream: &str, x: &Tensor<B>, n2: &Tensor<B>, m1: &[Tensor<B>], m2: &[Tensor<B>]| {
                let input = b.modulate(n2, &m1[2], Some(&m2[1]))?;
                let h = b.rms_norm(&input, Some(&w(&format!("{stream}_ffn_norm1"))?), eps)?;
                let f = feed_forward(b, &layer, &format!("{p}.{stream}_feed_forward"), &h)?;
                residual(x, &f, &format!("{stream}_ffn_norm2"), &m1[3])
            };

        let (img_n1, img_m1) = zero("img_norm1", images)?;
        let (img_n2, img_m2) = zero("img_norm2", images)?;
        let (img_n3, img_m3) = zero("img_norm3", images)?;
        let (cap_n1, cap_m1) = zero("instruct_norm1", cap)?;
        let (cap_n2, cap_m2) = zero("instruct_norm2", cap)?;
        let (cap_attn, img_attn) = self.joint_attention(b, &layer, &p, &cap_n1, &img_n1, rope)?;
        let self_attn =
            self.attention(b, &layer, &format!("{p}.img_self_attn"), &img_n3, images_rope)?;

        let x = residual(images, &img_attn, "img_attn_norm", &img_m1[1])?;
        let x = residual(&x, &self_attn, "img_self_attn_norm", &img_m3[1])?;
        let images = ffn("img", &x, &img_n2, &img_m1, &img_m2)?;
        let c = residual(cap, &cap_attn, "instruct_attn_norm", &cap_m1[1])?;
        let cap = ffn("instruct", &c, &cap_n2, &cap_m1, &cap_m2)?;
        Ok((cap, images))
    }

    /// The joint attention of double-stream block `p` over [caption, images] (`cap` `[B, Lc, D]`, `images`
    /// `[B, Li, D]`): each stream's q/k/v projections (`processor.instruct_to_q`, `processor.img_to_q`, …), one
    /// [`OmniGen2::heads_attention`] over the joint `rope`, each stream's output projection
    /// (`processor.instruct_out`, `processor.img_out`) then the shared `to_out.0`: (caption's, images').
    fn joint_attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        p: &str,
        cap: &Tensor<B>,
        images: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let a = format!("{p}.img_instruct_attn");
        let w = |name: &str| layer.get(&format!("{a}.{name}.weight"));
        let project = |stream: &str, x: &Tensor<B>| -> Result<Vec<Tensor<B>>> {
            ["to_q", "to_k", "to_v"]
                .iter()
                .map(|proj| Ok(b.linear(x, &w(&format!("processor.{stream}_{proj}"))?, None)?))
                .collect()
        };
        let (cap_qkv, img_qkv) = (project("instruct", cap)?, project("img", images)?);
        let joint = |k: usize| b.concat(&[&cap_qkv[k], &img_qkv[k]], 1);
        let o = self.heads_attention(b, layer, &a, [joint(0)?, joint(1)?, joint(2)?], rope)?;
        drop((cap_qkv, img_qkv));
        let (lc, li) = (cap.dim(1)?, images.dim(1)?);
        let out = |start: usize, len: usize, proj: &str| -> Result<Tensor<B>> {
            let o = b.linear(&b.slice(&o, 1, start, len)?, &w(proj)?, None)?;
            Ok(b.linear(&o, &w("to_out.0")?, None)?)
        };
        Ok((out(0, lc, "processor.instruct_out")?, out(lc, li, "processor.img_out")?))
    }

    /// Self-attention `a` (`layers.3.attn`, a double-stream block's `img_self_attn`) over `h` `[B, L, D]`: q, k, v
    /// projections, [`OmniGen2::heads_attention`], output projection.
    fn attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        a: &str,
        h: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let w = |name: &str| layer.get(&format!("{a}.{name}.weight"));
        let project = |name: &str| -> Result<Tensor<B>> { Ok(b.linear(h, &w(name)?, None)?) };
        let (q, k, v) = (project("to_q")?, project("to_k")?, project("to_v")?);
        let o = self.heads_attention(b, layer, a, [q, k, v], rope)?;
        Ok(b.linear(&o, &w("to_out.0")?, None)?)
    }

    /// The attention proper of `a` on projected `[q, k, v]` (`[B, L, heads · hd]`, `[B, L, kv_heads · hd]` twice):
    /// per-head q/k RMSNorm (`{a}.norm_q`, `{a}.norm_k`), interleaved RoPE, unmasked softmax attention
    /// (grouped-query over the fewer key/value heads) → `[B, L, heads · hd]`, before any output projection.
    fn heads_attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        a: &str,
        [q, k, v]: [Tensor<B>; 3],
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let hd = cfg.head_dim;
        let &[batch, len, _] = q.shape() else {
            return Err(Error::Invalid(format!(
                "attention input {:?} is not [B, L, D]",
                q.shape()
            )));
        };
        let heads = |x: Tensor<B>, heads: usize| x.reshape(&[batch, len, heads, hd]);
        let rotate = |x: Tensor<B>, norm: &str| -> Result<Tensor<B>> {
            let x =
                b.rms_norm(&x, Some(&layer.get(&format!("{a}.{norm}.weight"))?), QK_NORM_EPS)?;
            let x = b.rope(&x, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
            Ok(b.permute(&x, &[0, 2, 1, 3])?)
        };
        let q = rotate(heads(q, cfg.heads)?, "norm_q")?;
        let k = rotate(heads(k, cfg.kv_heads)?, "norm_k")?;
        let v = b.permute(&heads(v, cfg.kv_heads)?, &[0, 2, 1, 3])?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (hd as f32).sqrt())?;
        Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, len, cfg.heads * hd])?)
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

/// The SwiGLU `f` (`layers.3.feed_forward`, `…img_feed_forward`) on `h`: `linear_2(SiLU(linear_1(h)) ·
/// linear_3(h))`.
fn feed_forward<B: Backend>(b: &B, layer: &Layer<'_>, f: &str, h: &Tensor<B>) -> Result<Tensor<B>> {
    let w = |k: usize| layer.get(&format!("{f}.linear_{k}.weight"));
    let gate = b.linear(h, &w(1)?, None)?;
    let up = b.linear(h, &w(3)?, None)?;
    Ok(b.linear(&b.gated(&gate, &up, UnaryOp::Silu)?, &w(2)?, None)?)
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
