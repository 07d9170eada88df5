//! [`HunyuanVideo`]: the DiT's forward pass in ComfyUI's order (`HunyuanVideo.forward_orig`), reading one
//! block's weights at a time through [`Model::fetch`].
//!
//! The latent video is cut into 1 × p × p patches (the Conv3d `img_in` as a linear map of each patch); the
//! text side is built by [`super::text`]; the double-stream blocks attend over [text side, image], the
//! single-stream blocks run over their concatenation, and the final layer maps the image tokens back to
//! patches. Every block is modulated by one vector, vec: time_in(t), plus where the model has them time_r_in(r)
//! (the meanflow models'), vector_in(pooled) and guidance_in(g) (1.0's). The text side's RoPE positions are all
//! zero; the image's are (frame, row, column) on the patch grid.

use std::sync::Arc;

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::memory::{Layer, MemoryManager, Model};
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::latent_tokens::{PatchOrder, padded, patchify, unpatchify};
use crate::rope::{Rope, linspace_in, tables_at};

use super::config::{Config, detect};
use super::keys::{T_FREQ_DIM, embedder_names, load_plan};

/// ε of the blocks' and the final layer's LayerNorms (ComfyUI's `eps=1e-6`).
pub(crate) const EPS: f32 = 1e-6;

/// A HunyuanVideo DiT: its config and its weights (ComfyUI names, no prefix) under the memory manager.
pub struct HunyuanVideo {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// What one model call takes (ComfyUI's `HunyuanVideo.forward` arguments).
pub struct HunyuanVideoInput<'a, B: Backend> {
    /// Latents `[B, in_channels, T, H, W]` in model space, the conditioning channels (image latent, mask)
    /// already joined; any float dtype.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (ComfyUI's `timestep`: σ · 1000).
    pub timesteps: &'a [f32],
    /// The text features `[B, N, context_dim]` (all N tokens attended).
    pub context: &'a Tensor<B>,
    /// The glyph text's byT5 features `[1 or B, M, byt5 in_dim]` (ComfyUI's `txt_byt5`); ignored by a model
    /// without `byt5_in`.
    pub byt5: Option<&'a Tensor<B>>,
    /// The image's vision states `[1 or B, V, vision_dim]` (ComfyUI's `clip_fea`: SigLIP's last hidden state);
    /// an error for a model without `vision_in`.
    pub clip_fea: Option<&'a Tensor<B>>,
    /// CLIP-L's pooled vector `[B, ≥ vec_dim]` for a model with `vector_in` (HunyuanVideo 1.0; `None`: zeros);
    /// ignored by others.
    pub pooled: Option<&'a Tensor<B>>,
    /// The distilled guidance per sample for a model with `guidance_in` (1.0; `None` leaves it out); ignored
    /// by others.
    pub guidance: Option<&'a [f32]>,
    /// A meanflow model's second time: the schedule's σ after this step (not scaled by 1000), as ComfyUI finds
    /// it in `sample_sigmas`; `None` leaves `time_r_in` out (ComfyUI's `disable_time_r`, or a σ not in the
    /// schedule). Ignored by other models.
    pub timestep_r: Option<f32>,
}

impl<'a, B: Backend> HunyuanVideoInput<'a, B> {
    /// A call on latents `x`, `timesteps` and text features `context` alone.
    pub fn new(x: &'a Tensor<B>, timesteps: &'a [f32], context: &'a Tensor<B>) -> Self {
        HunyuanVideoInput {
            x,
            timesteps,
            context,
            byt5: None,
            clip_fea: None,
            pooled: None,
            guidance: None,
            timestep_r: None,
        }
    }
}

/// The latent's sides and its patch grid.
#[derive(Debug, Clone, Copy)]
struct Grid {
    batch: usize,
    frames: usize,
    h: usize,
    w: usize,
    rows: usize,
    cols: usize,
}

impl Grid {
    /// Image tokens: T · rows · cols.
    fn tokens(&self) -> usize {
        self.frames * self.rows * self.cols
    }
}

impl HunyuanVideo {
    /// A model from its config and loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> HunyuanVideo {
        HunyuanVideo { config, weights }
    }

    /// Detects the model in `h` and loads it: [`crate::Error::Unsupported`] if `h` is no HunyuanVideo DiT.
    pub fn load(
        manager: &Arc<MemoryManager>,
        h: &Header,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<HunyuanVideo> {
        let config = detect(h)?.ok_or_else(|| {
            h.unsupported(
                "not a HunyuanVideo diffusion model (no `txt_in.individual_token_refiner.blocks.0.norm1.weight` \
                 with a Conv3d `img_in.proj.weight`)",
            )
        })?;
        let weights = manager.load(&load_plan(h, &config), progress)?;
        Ok(HunyuanVideo::new(config, weights))
    }

    /// ComfyUI's model output (the flow velocity, no sign flip) for `input`, f32 `[B, out_channels, T, H, W]`.
    /// Computes in `b.compute_dtype()`; sides that are not multiples of the patch are padded circularly and the
    /// output cropped back.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        input: &HunyuanVideoInput<'_, B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let grid = self.check_inputs(input)?;
        let t_sinusoid = sinusoid(b, input.timesteps.iter().copied())?;
        let vec = self.vector(b, input, &t_sinusoid, grid.batch)?;
        let silu_vec = b.unary(&vec, UnaryOp::Silu)?;
        drop(vec);
        let mut img = self.image_tokens(b, input.x, &grid)?;
        let mut txt = self.text_tokens(b, input, &t_sinusoid, grid.batch)?;
        let text_len = txt.dim(1)?;
        let rope = self.rope(b, text_len, &grid)?;
        for i in 0..cfg.double_blocks {
            (img, txt) = self.double_block(b, i, &img, &txt, &silu_vec, &rope)?;
        }
        let mut joint = b.concat(&[&txt, &img], 1)?;
        drop((img, txt));
        for i in 0..cfg.single_blocks {
            joint = self.single_block(b, i, &joint, &silu_vec, &rope)?;
        }
        let img = b.slice(&joint, 1, text_len, grid.tokens())?;
        drop(joint);
        let y = self.final_layer(b, &img, &silu_vec)?;
        let out = self.unpatchify(b, &y, &grid)?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// Checks the inputs' shapes: returns the latent's grid.
    fn check_inputs<B: Backend>(&self, input: &HunyuanVideoInput<'_, B>) -> Result<Grid> {
        let cfg = &self.config;
        let &[batch, channels, frames, h, w] = input.x.shape() else {
            return Err(Error::Invalid(format!(
                "HunyuanVideo latents must be [B, {}, T, H, W], got {:?}",
                cfg.in_channels,
                input.x.shape()
            )));
        };
        if channels != cfg.in_channels || batch == 0 || frames == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "HunyuanVideo takes non-empty latents of {} channels (noise and conditioning), got {:?}",
                cfg.in_channels,
                input.x.shape()
            )));
        }
        let per_sample = |what: &str, len: usize| match len == batch {
            true => Ok(()),
            false => Err(Error::Invalid(format!("{len} {what} for a batch of {batch}"))),
        };
        per_sample("timesteps", input.timesteps.len())?;
        if let Some(g) = input.guidance {
            per_sample("guidance values", g.len())?;
        }
        match input.context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.context_dim => {}
            other => {
                return Err(Error::Invalid(format!(
                    "HunyuanVideo text features must be [{batch}, N > 0, {}], got {other:?}",
                    cfg.context_dim
                )));
            }
        }
        if let (Some(byt5), Some(widths)) = (input.byt5, cfg.byt5) {
            side_tokens("byT5 glyph features", byt5, batch, widths.in_dim)?;
        }
        if let Some(clip) = input.clip_fea {
            let Some(dim) = cfg.vision_dim else {
                return Err(Error::Invalid(
                    "this HunyuanVideo model has no `vision_in` to take vision states (clip_fea)"
                        .to_owned(),
                ));
            };
            side_tokens("vision states", clip, batch, dim)?;
        }
        if let (Some(pooled), Some(vec_dim)) = (input.pooled, cfg.vec_dim) {
            match pooled.shape() {
                &[pb, width] if pb == batch && width >= vec_dim => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "HunyuanVideo's pooled vector must be [{batch}, {vec_dim}] (CLIP-L's), got {other:?}"
                    )));
                }
            }
        }
        let p = cfg.patch;
        Ok(Grid { batch, frames, h, w, rows: h.div_ceil(p), cols: w.div_ceil(p) })
    }

    /// Gets `names` on the device (one layer of the per-layer protocol).
    pub(super) fn fetch<B: Backend>(&self, b: &B, names: &[String]) -> Result<Layer<'_>> {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        Ok(self.weights.fetch(b, &names)?)
    }

    /// An `MLPEmbedder` `stem` on `x`: out_layer(SiLU(in_layer(x))).
    pub(super) fn embedder<B: Backend>(
        &self,
        b: &B,
        stem: &str,
        x: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let layer = self.fetch(b, &embedder_names(stem))?;
        mlp_embedder(b, &layer, 0, x)
    }

    /// vec `[B, D]`: time_in(E(t)) (`t_sinusoid`, E of the timesteps as they are); a meanflow model given the
    /// next σ r adds time_r_in(E(1000·r)) (then halves the sum unless [`Config::meanflow_sum`]); a model with
    /// `vector_in` adds vector_in(pooled) (zeros without one); a model with `guidance_in` given guidance adds
    /// guidance_in(E(1000·g)).
    fn vector<B: Backend>(
        &self,
        b: &B,
        input: &HunyuanVideoInput<'_, B>,
        t_sinusoid: &Tensor<B>,
        batch: usize,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut vec = self.embedder(b, "time_in", t_sinusoid)?;
        if let (true, Some(r)) = (cfg.meanflow, input.timestep_r) {
            let vec_r = self.embedder(b, "time_r_in", &sinusoid(b, [1000.0 * r])?)?;
            vec = b.binary(&vec, &vec_r, BinaryOp::Add)?;
            if !cfg.meanflow_sum() {
                vec = b.affine(&vec, 0.5, 0.0)?;
            }
        }
        if let Some(vec_dim) = cfg.vec_dim {
            let y = match input.pooled {
                Some(pooled) => b.cast(&b.slice(pooled, 1, 0, vec_dim)?, b.compute_dtype())?,
                None => b.full(&[batch, vec_dim], 0.0, b.compute_dtype())?,
            };
            vec = b.binary(&vec, &self.embedder(b, "vector_in", &y)?, BinaryOp::Add)?;
        }
        if let (true, Some(g)) = (cfg.guidance, input.guidance) {
            let e = sinusoid(b, g.iter().map(|g| 1000.0 * g))?;
            vec = b.binary(&vec, &self.embedder(b, "guidance_in", &e)?, BinaryOp::Add)?;
        }
        Ok(vec)
    }

    /// The image tokens `[B, T·rows·cols, D]` of `x` in the compute type: each frame padded circularly to
    /// multiples of p and cut into p × p patches (features channel-major, as the Conv3d's kernel `[D, C, 1, p,
    /// p]` is laid out), frame-major, then `img_in` as a linear map.
    fn image_tokens<B: Backend>(&self, b: &B, x: &Tensor<B>, grid: &Grid) -> Result<Tensor<B>> {
        let (d, p, c) = (self.config.hidden, self.config.patch, self.config.in_channels);
        let Grid { batch, frames, h, w, .. } = *grid;
        let x = b.cast(x, b.compute_dtype())?;
        let x = b.permute(&x, &[0, 2, 1, 3, 4])?.reshape(&[batch * frames, c, h, w])?;
        let (x, _, _) = padded(b, &x, p)?;
        let patches = patchify(b, &x, p)?.reshape(&[batch, grid.tokens(), c * p * p])?;
        let layer =
            self.fetch(b, &["img_in.proj.weight".to_owned(), "img_in.proj.bias".to_owned()])?;
        let weight = layer.weight(0).reshape(&[d, c * p * p])?;
        Ok(b.linear(&patches, &weight, Some(&layer.weight(1)))?)
    }

    /// The RoPE table of the joint sequence: `text_len` tokens at position zero, then the image's (frame, row,
    /// column), frame-major (ComfyUI's `img_ids`: `linspace`s in the compute type).
    fn rope<B: Backend>(&self, b: &B, text_len: usize, grid: &Grid) -> Result<Rope<B>> {
        let cfg = &self.config;
        let dt = b.compute_dtype();
        let axis = |n: usize| -> Vec<f64> {
            linspace_in(dt, 0.0, n as f32 - 1.0, n).into_iter().map(f64::from).collect()
        };
        let (frames, rows, cols) = (axis(grid.frames), axis(grid.rows), axis(grid.cols));
        let mut positions = vec![[0.0f64; 3]; text_len];
        positions.reserve(grid.tokens());
        for &f in &frames {
            for &r in &rows {
                positions.extend(cols.iter().map(|&s| [f, r, s]));
            }
        }
        let (cos, sin) = tables_at(&positions, cfg.axes_dims, cfg.rope_theta);
        Rope::upload(b, &cos, &sin, cfg.head_dim() / 2, DType::F32)
    }

    /// `LastLayer` on the image tokens `[B, L, D]`: (shift, scale) = adaLN_modulation(SiLU(vec)), then
    /// linear(LayerNorm(x)·(1 + scale) + shift) → `[B, L, p²·out]`.
    fn final_layer<B: Backend>(
        &self,
        b: &B,
        img: &Tensor<B>,
        silu_vec: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let d = self.config.hidden;
        let names = [
            "linear.weight",
            "linear.bias",
            "adaLN_modulation.1.weight",
            "adaLN_modulation.1.bias",
        ]
        .map(|n| format!("final_layer.{n}"));
        let layer = self.fetch(b, &names)?;
        let m = b.linear(silu_vec, &layer.weight(2), Some(&layer.weight(3)))?;
        let (shift, scale) = (b.slice(&m, -1, 0, d)?, b.slice(&m, -1, d, d)?);
        let y = b.modulate(&b.layer_norm(img, None, None, EPS)?, &scale, Some(&shift))?;
        Ok(b.linear(&y, &layer.weight(0), Some(&layer.weight(1)))?)
    }

    /// The final layer's tokens `[B, T·rows·cols, p²·out]` as the latent `[B, out, T, H, W]`: token (f, r, s),
    /// feature c·p² + py·p + px → out[c, f, p·r + py, p·s + px], cropped to the unpadded sides.
    fn unpatchify<B: Backend>(&self, b: &B, y: &Tensor<B>, grid: &Grid) -> Result<Tensor<B>> {
        let (c, p) = (self.config.out_channels, self.config.patch);
        let Grid { batch, frames, h, w, rows, cols } = *grid;
        let y = y.reshape(&[batch * frames, rows * cols, c * p * p])?;
        let out = unpatchify(b, &y, c, (rows, cols), p, PatchOrder::ChannelMajor)?;
        let out = out.reshape(&[batch, frames, c, rows * p, cols * p])?;
        let mut out = b.permute(&out, &[0, 2, 1, 3, 4])?;
        if rows * p > h {
            out = b.slice(&out, 3, 0, h)?;
        }
        if cols * p > w {
            out = b.slice(&out, 4, 0, w)?;
        }
        Ok(out)
    }
}

/// Checks side tokens (`what`: byT5 features, vision states) are `[B' ≥ 1, n > 0, width]`; they are fitted to the
/// batch as ComfyUI's `repeat_to_batch_size` fits a `CONDRegular` (the first rows of more, repeats of fewer).
fn side_tokens<B: Backend>(what: &str, t: &Tensor<B>, batch: usize, width: usize) -> Result<()> {
    match t.shape() {
        &[tb, n, w] if tb > 0 && n > 0 && w == width => Ok(()),
        other => Err(Error::Invalid(format!(
            "HunyuanVideo {what} for {batch} samples must be [B ≥ 1, n > 0, {width}], got {other:?}"
        ))),
    }
}

/// An `MLPEmbedder` whose in_layer weight and bias, out_layer weight and bias are `layer`'s weights `at`,
/// `at + 1`, `at + 2`, `at + 3`: out_layer(SiLU(in_layer(x))).
pub(super) fn mlp_embedder<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    at: usize,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let hidden = b.linear(x, &layer.weight(at), Some(&layer.weight(at + 1)))?;
    let hidden = b.unary(&hidden, UnaryOp::Silu)?;
    Ok(b.linear(&hidden, &layer.weight(at + 2), Some(&layer.weight(at + 3)))?)
}

/// `[n, 256]` in the compute type: ComfyUI's `timestep_embedding` of each `t` as given (the caller applies any
/// time factor, rounding the product to f32 first, as torch does), cos half first.
pub(super) fn sinusoid<B: Backend>(b: &B, ts: impl IntoIterator<Item = f32>) -> Result<Tensor<B>> {
    let emb = crate::timestep::sinusoid(ts, T_FREQ_DIM / 2, 1.0);
    let n = emb.len() / T_FREQ_DIM;
    let emb = b.from_f32(&[n, T_FREQ_DIM], &emb, DType::F32)?;
    Ok(b.cast(&emb, b.compute_dtype())?)
}
