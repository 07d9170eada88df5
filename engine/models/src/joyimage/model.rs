//! [`JoyImage`]: the DiT's forward pass (ComfyUI's `JoyImageTransformer3DModel._forward`), reading one block's
//! weights at a time through [`Model::fetch`].

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{Config, EPS, IMG_IN, ROPE_THETA, STREAM_WEIGHTS, TIME_DIM, block_names};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::to_batch;
use crate::named::{fetch, linear, weight_and_bias};
use crate::rope::Rope;

/// A loaded JoyAI Image Edit DiT: its config and weights (under ComfyUI's names, from [`super::load_plan`]).
pub struct JoyImage {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// Where a weight sits among a stream's [`STREAM_WEIGHTS`] in a block's fetch (see `config::STREAM`).
mod slot {
    pub(super) const MOD: usize = 0;
    pub(super) const MLP_IN: usize = 1;
    pub(super) const MLP_OUT: usize = 3;
    pub(super) const QKV: usize = 5;
    pub(super) const Q_NORM: usize = 7;
    pub(super) const K_NORM: usize = 8;
    pub(super) const PROJ: usize = 9;
}

/// One stream's (image or text) weights in a block's fetch: [`STREAM_WEIGHTS`] from `base` on.
struct Stream<'l, 'm> {
    layer: &'l Layer<'m>,
    base: usize,
}

impl Stream<'_, '_> {
    /// The weight in `slot` (see [`slot`]).
    fn get(&self, slot: usize) -> Weight<'_> {
        self.layer.weight(self.base + slot)
    }

    /// `x · Wᵀ + b` for the Linear whose weight is in `slot` and bias in the next.
    fn linear<B: Backend>(&self, b: &B, slot: usize, x: &Tensor<B>) -> Result<Tensor<B>> {
        Ok(b.linear(x, &self.get(slot), Some(&self.get(slot + 1)))?)
    }

    /// The attention's `[0]` and the MLP's `[1]` (shift, scale, gate): `vec` `[B, 6D]` plus the stream's
    /// modulation table, cut in six.
    fn modulations<B: Backend>(
        &self,
        b: &B,
        vec: &Tensor<B>,
        d: usize,
    ) -> Result<Vec<Modulation<B>>> {
        let table =
            b.weight_to_tensor(&self.get(slot::MOD), b.compute_dtype())?.reshape(&[1, 6 * d])?;
        Modulation::sets(b, &b.binary(vec, &table, BinaryOp::Add)?, d, 2)
    }

    /// The MLP: Linear, tanh GELU, Linear.
    fn mlp<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let hidden = b.unary(&self.linear(b, slot::MLP_IN, x)?, UnaryOp::GeluTanh)?;
        self.linear(b, slot::MLP_OUT, &hidden)
    }

    /// q, k, v `[B, N, heads, head_dim]` of `x` `[B, N, D]`: the fused projection cut in three, q and k
    /// RMS-normed per head.
    fn qkv<B: Backend>(&self, b: &B, x: &Tensor<B>, cfg: &Config) -> Result<[Tensor<B>; 3]> {
        let (batch, n, d) = (x.dim(0)?, x.dim(1)?, cfg.hidden);
        let y = self.linear(b, slot::QKV, x)?;
        let part = |k: usize| -> Result<Tensor<B>> {
            Ok(b.slice(&y, -1, k * d, d)?.reshape(&[batch, n, cfg.heads, cfg.head_dim])?)
        };
        let q = b.rms_norm(&part(0)?, Some(&self.get(slot::Q_NORM)), EPS)?;
        let k = b.rms_norm(&part(1)?, Some(&self.get(slot::K_NORM)), EPS)?;
        Ok([q, k, part(2)?])
    }
}

/// A component's patch grid: frames, rows, columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grid {
    frames: usize,
    rows: usize,
    cols: usize,
}

impl Grid {
    /// Its tokens.
    fn tokens(&self) -> usize {
        self.frames * self.rows * self.cols
    }
}

/// The checked input's sizes.
struct Sizes {
    batch: usize,
    /// Frames, rows and columns of the latent.
    sides: [usize; 3],
    /// 4 for `[B, C, H, W]`, 5 for `[B, C, T, H, W]`.
    rank: usize,
}

impl JoyImage {
    /// The DiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> JoyImage {
        JoyImage { config, weights }
    }

    /// ComfyUI's model output (the flow velocity: denoised = x − out · σ) for latents `x` `[B, channels, T, H,
    /// W]` (or `[B, channels, H, W]`, one frame) in model space, `timesteps` (one per sample: σ · 1000, what
    /// ComfyUI's model sampling passes), `context` `[1 or B, N, text_dim]` and reference latents `refs`, each
    /// `[1 or B, channels, t, h, w]` (or 4-D) already through `process_latent_in`: f32 in `x`'s shape, computed in
    /// `b.compute_dtype()`. Every component is padded circularly to the patch; the references' tokens follow
    /// the latent's, their RoPE frames running on after its (rows and columns from 0 for each); only the
    /// latent's tokens are decoded, cropped back to its sides.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        refs: &[Tensor<B>],
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let Sizes { batch, sides, rank } = self.check_inputs(x, timesteps, context)?;
        let dt = b.compute_dtype();
        let [t, h, w] = sides;
        let latent = b.cast(x, dt)?.reshape(&[batch, cfg.channels, t, h, w])?;
        let (patches, grid) = self.patches(b, &latent)?;
        let (mut parts, mut grids) = (vec![patches], vec![grid]);
        for reference in refs {
            let reference = to_batch(b, &b.cast(&self.reference(reference, batch)?, dt)?, batch)?;
            let (patches, grid) = self.patches(b, &reference)?;
            parts.push(patches);
            grids.push(grid);
        }
        let mut img = self.img_in(b, &b.concat(&parts.iter().collect::<Vec<_>>(), 1)?)?;
        drop(parts);
        let vec = self.time_embedding(b, timesteps)?;
        let mut txt = self.text(b, context, batch)?;
        let rope = self.rope(b, &grids)?;
        for i in 0..cfg.layers {
            (img, txt) = self.block(b, i, &img, &txt, &vec, &rope)?;
        }
        drop(txt);
        // Only the latent's tokens: LayerNorm (no modulation), proj_out, un-patched and cropped.
        let img = b.slice(&img, 1, 0, grid.tokens())?;
        let y = linear(b, &self.weights, "proj_out", &b.layer_norm(&img, None, None, EPS)?)?;
        let mut out = self.unpatchify(b, &y, grid)?;
        for (axis, (&side, padded)) in sides.iter().zip(self.padded_sides(grid)).enumerate() {
            if padded > side {
                out = b.slice(&out, axis as isize + 2, 0, side)?;
            }
        }
        if rank == 4 {
            out = out.reshape(&[batch, cfg.channels, h, w])?;
        }
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
        let (batch, channels, sides, rank) = match *x.shape() {
            [batch, c, h, w] => (batch, c, [1, h, w], 4),
            [batch, c, t, h, w] => (batch, c, [t, h, w], 5),
            ref other => {
                return Err(Error::Invalid(format!(
                    "JoyAI Image Edit latents must be [B, {c}, T, H, W] or [B, {c}, H, W], got {other:?}"
                )));
            }
        };
        if channels != c || batch == 0 || sides.contains(&0) {
            return Err(Error::Invalid(format!(
                "JoyAI Image Edit takes non-empty latents of {c} channels, got {:?}",
                x.shape()
            )));
        }
        if timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a JoyAI Image Edit batch of {batch}",
                timesteps.len()
            )));
        }
        let width = self.config.text_dim;
        match *context.shape() {
            [cb, n, cw] if (cb == 1 || cb == batch) && n > 0 && cw == width => {}
            [_, _, cw] if cw != width => {
                return Err(Error::Invalid(format!(
                    "JoyAI Image Edit reads {width} features a text token, this conditioning has {cw}: load \
                     the text encoder with CLIPLoader type joyimage"
                )));
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "JoyAI Image Edit conditioning must be [1 or {batch}, N > 0, {width}], got {other:?}"
                )));
            }
        }
        Ok(Sizes { batch, sides, rank })
    }

    /// A reference latent as `[n, channels, t, h, w]`, `n` 1 or `batch` (a 4-D one as one frame).
    fn reference<B: Backend>(&self, reference: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
        let c = self.config.channels;
        let (rb, rc, sides) = match *reference.shape() {
            [rb, rc, rh, rw] => (rb, rc, [1, rh, rw]),
            [rb, rc, rt, rh, rw] => (rb, rc, [rt, rh, rw]),
            _ => (0, 0, [0; 3]),
        };
        if rc != c || !(rb == 1 || rb == batch) || sides.contains(&0) {
            return Err(Error::Invalid(format!(
                "a JoyAI Image Edit reference latent must be [1 or {batch}, {c}, t, h, w] (or 4-D), got {:?}",
                reference.shape()
            )));
        }
        Ok(reference.reshape(&[rb, rc, sides[0], sides[1], sides[2]])?)
    }

    /// The sides of a component of `grid` padded to the patch.
    fn padded_sides(&self, grid: Grid) -> [usize; 3] {
        let p = self.config.patch;
        [grid.frames * p[0], grid.rows * p[1], grid.cols * p[2]]
    }

    /// The patches `[n, frames·rows·cols, channels·pt·ph·pw]` of `x` `[n, C, T, H, W]` (ComfyUI's
    /// `pad_to_patch_size`, circular at the end of each axis, then the Conv3d's input windows, (frame, row,
    /// column)-major, features channel-major as its kernel is laid out) and its grid.
    fn patches<B: Backend>(&self, b: &B, x: &Tensor<B>) -> Result<(Tensor<B>, Grid)> {
        let [pt, ph, pw] = self.config.patch;
        let (n, c) = (x.dim(0)?, x.dim(1)?);
        let mut x = x.clone();
        for (axis, p) in [(2, pt), (3, ph), (4, pw)] {
            let side = x.dim(axis)?;
            let pad = side.next_multiple_of(p) - side;
            if pad > 0 {
                x = b.pad(&x, axis, 0, pad, PadMode::Circular)?;
            }
        }
        let grid = Grid { frames: x.dim(2)? / pt, rows: x.dim(3)? / ph, cols: x.dim(4)? / pw };
        let x = x.reshape(&[n, c, grid.frames, pt, grid.rows, ph, grid.cols, pw])?;
        let x = b.permute(&x, &[0, 2, 4, 6, 1, 3, 5, 7])?;
        Ok((x.reshape(&[n, grid.tokens(), self.config.patch_features()])?, grid))
    }

    /// `img_in` (the Conv3d as a Linear of each patch's features) on patches `[B, N, channels·pt·ph·pw]`.
    fn img_in<B: Backend>(&self, b: &B, patches: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let layer = fetch(b, &self.weights, &weight_and_bias(IMG_IN.trim_end_matches(".weight")))?;
        let weight = layer.weight(0).reshape(&[cfg.hidden, cfg.patch_features()])?;
        Ok(b.linear(patches, &weight, Some(&layer.weight(1)))?)
    }

    /// Tokens `[B, frames·rows·cols, pt·ph·pw·channels]` (features channels last, as `proj_out` gives them) →
    /// latents `[B, channels, frames·pt, rows·ph, cols·pw]`.
    fn unpatchify<B: Backend>(&self, b: &B, y: &Tensor<B>, grid: Grid) -> Result<Tensor<B>> {
        let ([pt, ph, pw], c) = (self.config.patch, self.config.channels);
        let batch = y.dim(0)?;
        let y = y.reshape(&[batch, grid.frames, grid.rows, grid.cols, pt, ph, pw, c])?;
        let y = b.permute(&y, &[0, 7, 1, 4, 2, 5, 3, 6])?;
        let [t, h, w] = self.padded_sides(grid);
        Ok(y.reshape(&[batch, c, t, h, w])?)
    }

    /// vec `[B, 6D]` for `timesteps` (σ · 1000): the sinusoid (256 wide, cos half first, f32) in the compute
    /// type through `time_embedder` (Linear, SiLU, Linear), then `time_proj(silu(·))`.
    fn time_embedding<B: Backend>(&self, b: &B, timesteps: &[f32]) -> Result<Tensor<B>> {
        let m = &self.weights;
        let emb = crate::timestep::sinusoid(timesteps.iter().copied(), TIME_DIM / 2, 1.0);
        let emb = b.from_f32(&[timesteps.len(), TIME_DIM], &emb, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let hidden = b.unary(
            &linear(b, m, "condition_embedder.time_embedder.linear_1", &emb)?,
            UnaryOp::Silu,
        )?;
        let temb = linear(b, m, "condition_embedder.time_embedder.linear_2", &hidden)?;
        linear(b, m, "condition_embedder.time_proj", &b.unary(&temb, UnaryOp::Silu)?)
    }

    /// The text tokens `[B, N, D]`: `context` repeated to the batch through `text_embedder` (Linear, tanh GELU,
    /// Linear).
    fn text<B: Backend>(&self, b: &B, context: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
        let m = &self.weights;
        let context = b.cast(&to_batch(b, context, batch)?, b.compute_dtype())?;
        let hidden = b.unary(
            &linear(b, m, "condition_embedder.text_embedder.linear_1", &context)?,
            UnaryOp::GeluTanh,
        )?;
        linear(b, m, "condition_embedder.text_embedder.linear_2", &hidden)
    }

    /// The image tokens' RoPE tables: each component's (frame, row, column) grid, frames running on from the
    /// previous component's, rows and columns from 0; angles `position · θ^(−2k/d)` per axis, in f32 as ComfyUI
    /// computes them.
    fn rope<B: Backend>(&self, b: &B, grids: &[Grid]) -> Result<Rope<B>> {
        let axes = self.config.axes;
        let freqs: Vec<(usize, f32)> = axes
            .iter()
            .enumerate()
            .flat_map(|(a, &d)| {
                (0..d / 2).map(move |k| (a, 1.0 / ROPE_THETA.powf((2 * k) as f32 / d as f32)))
            })
            .collect();
        let mut angles = Vec::new();
        let mut first_frame = 0;
        for g in grids {
            for t in first_frame..first_frame + g.frames {
                for r in 0..g.rows {
                    for c in 0..g.cols {
                        let pos = [t as f32, r as f32, c as f32];
                        angles.extend(freqs.iter().map(|&(a, f)| pos[a] * f));
                    }
                }
            }
            first_frame += g.frames;
        }
        Rope::of_angles(b, &angles, freqs.len(), DType::F32)
    }

    /// Double-stream block `i` on the image and text tokens: each stream `x + gate · attn((1 + scale) · LN(x) +
    /// shift)` (one joint attention), then `x + gate · mlp((1 + scale) · LN(x) + shift)`, modulated by `vec`
    /// plus its own table.
    fn block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        vec: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let d = self.config.hidden;
        let layer = fetch(b, &self.weights, &block_names(&format!("double_blocks.{i}")))?;
        let streams =
            [Stream { layer: &layer, base: 0 }, Stream { layer: &layer, base: STREAM_WEIGHTS }];
        let img_mods = streams[0].modulations(b, vec, d)?;
        let txt_mods = streams[1].modulations(b, vec, d)?;
        let (img_a, txt_a) = self.attention(
            b,
            &streams,
            &img_mods[0].modulated(b, img, EPS)?,
            &txt_mods[0].modulated(b, txt, EPS)?,
            rope,
        )?;
        let img = img_mods[0].gated_add(b, img, &img_a)?;
        let txt = txt_mods[0].gated_add(b, txt, &txt_a)?;
        let img_m = streams[0].mlp(b, &img_mods[1].modulated(b, &img, EPS)?)?;
        let txt_m = streams[1].mlp(b, &txt_mods[1].modulated(b, &txt, EPS)?)?;
        Ok((img_mods[1].gated_add(b, &img, &img_m)?, txt_mods[1].gated_add(b, &txt, &txt_m)?))
    }

    /// The joint attention of a block: each stream's q, k, v (the image's q and k rotated by `rope`, interleaved
    /// pairs; the text's not), one unmasked attention over [image tokens, text tokens], each stream's part
    /// through its own output projection.
    fn attention<B: Backend>(
        &self,
        b: &B,
        streams: &[Stream<'_, '_>; 2],
        img: &Tensor<B>,
        txt: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let cfg = &self.config;
        let (batch, n_img, n_txt) = (img.dim(0)?, img.dim(1)?, txt.dim(1)?);
        let [iq, ik, iv] = streams[0].qkv(b, img, cfg)?;
        let [tq, tk, tv] = streams[1].qkv(b, txt, cfg)?;
        let iq = b.rope(&iq, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
        let ik = b.rope(&ik, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
        let joint = |a: &Tensor<B>, t: &Tensor<B>| -> Result<Tensor<B>> {
            Ok(b.permute(&b.concat(&[a, t], 1)?, &[0, 2, 1, 3])?)
        };
        let (q, k, v) = (joint(&iq, &tq)?, joint(&ik, &tk)?, joint(&iv, &tv)?);
        let scale = 1.0 / (cfg.head_dim as f32).sqrt();
        let o = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n_img + n_txt, cfg.hidden])?;
        let img_o = streams[0].linear(b, slot::PROJ, &b.slice(&o, 1, 0, n_img)?)?;
        let txt_o = streams[1].linear(b, slot::PROJ, &b.slice(&o, 1, n_img, n_txt)?)?;
        Ok((img_o, txt_o))
    }
}
