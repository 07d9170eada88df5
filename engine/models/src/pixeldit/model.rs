//! [`PixelDit`]: the DiT's forward pass (ComfyUI's `PixDiT_T2I._forward`), reading one block's weights at a time
//! through [`Model::fetch`].
//!
//! Two stages share the patch grid. The patch blocks are an MMDiT over `p × p` patch tokens and the text, each
//! stream with its own weights, modulated by the timestep. Their output, one token per patch, then conditions the
//! pixel blocks, which work on every pixel's own narrow token: modulated per pixel by a Linear of the patch's token,
//! the patch's pixels squeezed into one token for an attention across patches and expanded back, then a per-pixel
//! MLP. The per-pixel parts run `tile` patches at a time (only the attention needs every patch at once), so their
//! largest activation, the modulation of every pixel (six times the pixel width a pixel), is never whole in memory;
//! the values do not depend on the tile.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{
    CHANNELS, Config, EPS, Layout, ROPE_SPAN, ROPE_THETA, STREAM_WEIGHTS, TIME_FREQS,
    TIME_MAX_PERIOD, patch_block_names, patch_slot, pixel_block_names, pixel_slot,
};
use crate::RopeOptions;
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::{padded, patchify, to_batch};
use crate::named::{fetch, linear, weight_and_bias};
use crate::rope::{Rope, linspace};

/// Patches (rows of the batch's patch grid) the pixel blocks' per-pixel parts work on at once, unless
/// [`PixelDit::with_pixel_tile`] says otherwise: the released model's modulation of 2048 patches is 48 M values.
pub const DEFAULT_PIXEL_TILE: usize = 2048;

/// A loaded PixelDiT DiT: its config and weights (under the file's names, from [`super::load_plan`]).
pub struct PixelDit {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
    /// Patches the pixel blocks' per-pixel parts work on at once (0: all).
    tile: usize,
}

/// The checked input's sizes.
struct Sizes {
    batch: usize,
    h: usize,
    w: usize,
}

/// The patch grid of a call: its sides and where each patch sits on the 2-D RoPE's axes.
struct Grid {
    rows: usize,
    cols: usize,
    /// Column positions, `linspace(shift_x, 16·scale_x + shift_x, cols)` in f32.
    xs: Vec<f64>,
    /// Row positions, likewise over `rows`.
    ys: Vec<f64>,
}

impl Grid {
    /// The grid of `rows × cols` patches with `rope`'s row (y) and column (x) scale and shift (ComfyUI's
    /// `precompute_freqs_cis_2d`, which reads no time axis).
    fn new(rows: usize, cols: usize, rope: &RopeOptions) -> Grid {
        let axis = |n: usize, a: usize| -> Vec<f64> {
            let (scale, shift) = (rope.scale[a], rope.shift[a]);
            linspace(shift as f32, (ROPE_SPAN * scale + shift) as f32, n).map(f64::from).collect()
        };
        Grid { rows, cols, xs: axis(cols, 2), ys: axis(rows, 1) }
    }

    /// The angles of every patch (row-major) for heads `head_dim` wide: pair m turns by
    /// `pos · θ^(−2⌊m/2⌋ / (head_dim/2))`, pos the column for even m and the row for odd m (the two axes'
    /// pairs interleaved, Flux's layout of `precompute_freqs_cis_2d`'s table).
    fn angles(&self, head_dim: usize) -> Vec<f64> {
        let axis = head_dim / 2;
        let freqs: Vec<f64> =
            (0..axis / 2).map(|k| ROPE_THETA.powf(-2.0 * k as f64 / axis as f64)).collect();
        let mut out = Vec::with_capacity(self.rows * self.cols * axis);
        for &y in &self.ys {
            for &x in &self.xs {
                out.extend(freqs.iter().flat_map(|f| [x * f, y * f]));
            }
        }
        out
    }
}

/// The 1-D RoPE angles of `n` text tokens for heads `head_dim` wide: token i's pair k turns by
/// `i · θ^(−2k/head_dim)`.
fn text_angles(n: usize, head_dim: usize) -> Vec<f64> {
    let freqs: Vec<f64> =
        (0..head_dim / 2).map(|k| ROPE_THETA.powf(-2.0 * k as f64 / head_dim as f64)).collect();
    (0..n).flat_map(|i| freqs.iter().map(move |f| i as f64 * f)).collect()
}

/// The RoPE tables of `angles` (`pairs` a token), in the compute type, as ComfyUI casts them to the input's type
/// (`precompute_freqs_cis_2d`, `_fetch_text_pos`).
fn rope_of<B: Backend>(b: &B, angles: &[f64], pairs: usize) -> Result<Rope<B>> {
    let cos: Vec<f32> = angles.iter().map(|a| a.cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|a| a.sin() as f32).collect();
    Rope::upload(b, &cos, &sin, pairs, b.compute_dtype())
}

/// `[ts.len(), 256]` row-major: for each t, cos then sin of `t · f_k` with f_k = exp(−ln(10) · k / 128) (ComfyUI's
/// `timestep_embedding` with `max_period=10`, in f32 as torch computes it).
fn time_sinusoid(ts: &[f32]) -> Vec<f32> {
    let half = TIME_FREQS / 2;
    let log_period = -(TIME_MAX_PERIOD.ln() as f32);
    let freqs: Vec<f32> = (0..half).map(|k| (log_period * k as f32 / half as f32).exp()).collect();
    let mut emb = Vec::with_capacity(ts.len() * TIME_FREQS);
    for &t in ts {
        emb.extend(freqs.iter().map(|f| (t * f).cos()));
        emb.extend(freqs.iter().map(|f| (t * f).sin()));
    }
    emb
}

/// The pixel embedder's sin/cos table `[rows·cols·p², dim]` of a padded image of `rows × cols` patches of side
/// `p`, in the order of the pixel tokens (patch row-major, then the pixel's row and column in it): pixel (Y, X) has
/// sin(X·ω_k), cos(X·ω_k), sin(Y·ω_k), cos(Y·ω_k), k < dim/4, ω_k = 1 / 10000^(k / (dim/4)) (ComfyUI's
/// `get_2d_sincos_pos_embed`, in f32).
fn pixel_table(dim: usize, (rows, cols): (usize, usize), p: usize) -> Vec<f32> {
    let q = dim / 4;
    let omega: Vec<f32> =
        (0..q).map(|k| 1.0 / 10000f32.powf(k as f32 / (dim as f32 / 4.0))).collect();
    let mut out = Vec::with_capacity(rows * cols * p * p * dim);
    for r in 0..rows {
        for c in 0..cols {
            for py in 0..p {
                for px in 0..p {
                    let (y, x) = ((r * p + py) as f32, (c * p + px) as f32);
                    out.extend(omega.iter().map(|w| (x * w).sin()));
                    out.extend(omega.iter().map(|w| (x * w).cos()));
                    out.extend(omega.iter().map(|w| (y * w).sin()));
                    out.extend(omega.iter().map(|w| (y * w).cos()));
                }
            }
        }
    }
    out
}

/// `x · (1 + scale) + shift` per pixel: `x`, `scale`, `shift` `[n, dim]`.
fn modulate_pixels<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    scale: &Tensor<B>,
    shift: &Tensor<B>,
) -> Result<Tensor<B>> {
    let (n, dim) = (x.dim(0)?, x.dim(1)?);
    Ok(b.modulate(&x.reshape(&[n, 1, dim])?, scale, Some(shift))?.reshape(&[n, dim])?)
}

/// Attention over heads `q`, `k`, `v` `[B, N, H, D]` (q and k normed, not yet turned): `rope`'s rotation of q
/// and k, unmasked attention with scale 1/√D, `[B, N, H·D]`.
fn attend<B: Backend>(
    b: &B,
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    rope: &Rope<B>,
) -> Result<Tensor<B>> {
    let (batch, n, heads, dim) = (q.dim(0)?, q.dim(1)?, q.dim(2)?, q.dim(3)?);
    let turn = |t: &Tensor<B>| b.rope(t, &rope.cos, &rope.sin, RopeLayout::Interleaved);
    let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
    let (q, k, v) = (heads_first(&turn(q)?)?, heads_first(&turn(k)?)?, heads_first(v)?);
    let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (dim as f32).sqrt())?;
    Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, heads * dim])?)
}

/// What a pixel block keeps of a tile between its attention and its MLP: the attention's gate per pixel
/// `[n·p², dim]` and, in the released layout (whose one Linear gives both halves), the MLP's (shift, scale,
/// gate) `[n·p², 3·dim]`.
struct Kept<B: Backend> {
    gate: Tensor<B>,
    mlp: Option<Tensor<B>>,
}

impl PixelDit {
    /// The DiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> PixelDit {
        PixelDit { config, weights, tile: DEFAULT_PIXEL_TILE }
    }

    /// This DiT working on `patches` patches at a time in the pixel blocks' per-pixel parts (0: all at once);
    /// the values do not depend on it.
    pub fn with_pixel_tile(mut self, patches: usize) -> PixelDit {
        self.tile = patches;
        self
    }

    /// ComfyUI's model output (the flow velocity: denoised = x − out · σ) for pixels `x` `[B, 3, H, W]` in model
    /// space (any float dtype, any sides: padded circularly to the patch and cropped back), `timesteps` (one per
    /// sample: σ · 1000, what ComfyUI's model sampling passes) and `context` `[1 or B, N > 0, text_dim]` (its
    /// first `text_max` tokens are read): f32 in `x`'s shape, computed in `b.compute_dtype()`.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        self.forward_with_rope(b, x, timesteps, context, &RopeOptions::default())
    }

    /// [`PixelDit::forward`] with `ScaleROPE`'s options (ComfyUI's `rope_options`), which move the patch grid's
    /// 2-D RoPE positions, of the patch and of the pixel blocks: columns to `linspace(shift_x, 16·scale_x +
    /// shift_x, cols)`, rows likewise. The time axis and the text's positions are not read.
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
        let p = cfg.patch;
        let (img, rows, cols) = padded(b, &b.cast(x, b.compute_dtype())?, p)?;
        let grid = Grid::new(rows, cols, rope);
        let tokens = rows * cols;

        let temb = self.time_embedding(b, timesteps)?;
        let condition = b.unary(&temb, UnaryOp::Silu)?;
        let mut txt = self.text(b, context, batch)?;
        let mut s = linear(b, &self.weights, &cfg.key("s_embedder.proj"), &patchify(b, &img, p)?)?;
        let joint_rope = {
            let pairs = cfg.head_dim / 2;
            let mut angles = text_angles(txt.dim(1)?, cfg.head_dim);
            angles.extend(grid.angles(cfg.head_dim));
            rope_of(b, &angles, pairs)?
        };
        for i in 0..cfg.patch_depth {
            (s, txt) = self.patch_block(b, i, &s, &txt, &condition, &joint_rope)?;
        }
        drop((txt, joint_rope, condition));

        // One condition per patch: SiLU(temb + s), rows batch-major.
        let temb = temb.reshape(&[batch, 1, cfg.hidden])?;
        let s = b.unary(&b.binary(&s, &temb, BinaryOp::Add)?, UnaryOp::Silu)?;
        let s = s.reshape(&[batch * tokens, cfg.hidden])?;
        let mut pixels = self.pixel_embed(b, &img, (rows, cols))?;
        drop(img);
        let pixel_rope = rope_of(b, &grid.angles(cfg.attn_head_dim), cfg.attn_head_dim / 2)?;
        for i in 0..cfg.pixel_depth {
            pixels = self.pixel_block(b, i, &pixels, &s, batch, &pixel_rope)?;
        }
        drop(s);

        let layer = fetch(
            b,
            &self.weights,
            &[
                cfg.key("final_layer.norm.weight"),
                cfg.key("final_layer.linear.weight"),
                cfg.key("final_layer.linear.bias"),
            ],
        )?;
        let y = b.rms_norm(&pixels, Some(&layer.weight(0)), EPS)?;
        let rgb = b.linear(&y, &layer.weight(1), Some(&layer.weight(2)))?;
        let rgb = rgb.reshape(&[batch, tokens, p * p * CHANNELS])?;
        let mut out = b.unpatchify(&rgb, p, CHANNELS, rows * p, cols * p)?;
        if rows * p > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if cols * p > w {
            out = b.slice(&out, 3, 0, w)?;
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
        let &[batch, channels, h, w] = x.shape() else {
            return Err(Error::Invalid(format!(
                "PixelDiT takes pixels [B, 3, H, W], got {:?}",
                x.shape()
            )));
        };
        if channels != CHANNELS || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "PixelDiT takes non-empty RGB pixels (3 channels), got {:?}",
                x.shape()
            )));
        }
        if timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a PixelDiT batch of {batch}",
                timesteps.len()
            )));
        }
        let width = self.config.text_dim;
        match *context.shape() {
            [cb, n, cw] if (cb == 1 || cb == batch) && n > 0 && cw == width => {}
            [_, _, cw] if cw != width => {
                return Err(Error::Invalid(format!(
                    "PixelDiT reads {width} features a text token, this conditioning has {cw}: encode the \
                     prompt with its text encoder (Gemma 2 2B)"
                )));
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "PixelDiT conditioning must be [1 or {batch}, N > 0, {width}], got {other:?}"
                )));
            }
        }
        Ok(Sizes { batch, h, w })
    }

    /// `temb` `[B, hidden]` for `timesteps` (σ · 1000): [`time_sinusoid`] in the compute type through
    /// `t_embedder.mlp` (Linear, SiLU, Linear).
    fn time_embedding<B: Backend>(&self, b: &B, timesteps: &[f32]) -> Result<Tensor<B>> {
        let (m, cfg) = (&self.weights, &self.config);
        let emb =
            b.from_f32(&[timesteps.len(), TIME_FREQS], &time_sinusoid(timesteps), DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let hidden = b.unary(&linear(b, m, &cfg.key("t_embedder.mlp.0"), &emb)?, UnaryOp::Silu)?;
        linear(b, m, &cfg.key("t_embedder.mlp.2"), &hidden)
    }

    /// The text tokens `[B, n, hidden]`, n = min(N, `text_max`): `context` repeated to the batch and cut,
    /// `y_embedder` (Linear, RMSNorm), plus the first n rows of `y_pos_embedding`.
    fn text<B: Backend>(&self, b: &B, context: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let n = context.dim(1)?.min(cfg.text_max);
        let context = b.cast(&to_batch(b, context, batch)?, b.compute_dtype())?;
        let context = b.slice(&context, 1, 0, n)?;
        let mut names = weight_and_bias(&cfg.key("y_embedder.proj")).to_vec();
        names.extend([cfg.key("y_embedder.norm.weight"), cfg.key("y_pos_embedding")]);
        let layer = fetch(b, &self.weights, &names)?;
        let y = b.linear(&context, &layer.weight(0), Some(&layer.weight(1)))?;
        let y = b.rms_norm(&y, Some(&layer.weight(2)), EPS)?;
        let table = layer.weight(3).reshape(&[cfg.text_max, cfg.hidden])?.rows(0, n)?;
        let positions =
            b.weight_to_tensor(&table, b.compute_dtype())?.reshape(&[1, n, cfg.hidden])?;
        Ok(b.binary(&y, &positions, BinaryOp::Add)?)
    }

    /// Patch block `i` on the image tokens `x` `[B, L, hidden]` and the text's `y` `[B, n, hidden]`, each stream
    /// `x + gate · attn(RMSNorm(x) · (1 + scale) + shift)`, then likewise its SwiGLU MLP, with the modulations
    /// of `condition` (SiLU of the timestep embedding).
    fn patch_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        y: &Tensor<B>,
        condition: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        use patch_slot::{ADA, ADA_BIAS, NORM1, NORM2, W1, W2, W3};
        let d = self.config.hidden;
        let layer = fetch(b, &self.weights, &patch_block_names(&self.config, i))?;
        let slot = |stream: usize, s: usize| layer.weight(stream * STREAM_WEIGHTS + s);
        let mods = |stream: usize| -> Result<Vec<Modulation<B>>> {
            let m = b.linear(condition, &slot(stream, ADA), Some(&slot(stream, ADA_BIAS)))?;
            Modulation::sets(b, &m, d, 2)
        };
        let (mx, my) = (mods(0)?, mods(1)?);
        let normed =
            |t: &Tensor<B>, stream: usize, s: usize, m: &Modulation<B>| -> Result<Tensor<B>> {
                let n = b.rms_norm(t, Some(&slot(stream, s)), EPS)?;
                Ok(b.modulate(&n, &m.scale, Some(&m.shift))?)
            };
        let (ax, ay) = self.joint_attention(
            b,
            &layer,
            &normed(x, 0, NORM1, &mx[0])?,
            &normed(y, 1, NORM1, &my[0])?,
            rope,
        )?;
        let x = mx[0].gated_add(b, x, &ax)?;
        let y = my[0].gated_add(b, y, &ay)?;
        let mlp = |t: &Tensor<B>, stream: usize| -> Result<Tensor<B>> {
            let gate = b.linear(t, &slot(stream, W1), None)?;
            let up = b.linear(t, &slot(stream, W3), None)?;
            Ok(b.linear(&b.gated(&gate, &up, UnaryOp::Silu)?, &slot(stream, W2), None)?)
        };
        let x = mx[1].gated_add(b, &x, &mlp(&normed(&x, 0, NORM2, &mx[1])?, 0)?)?;
        let y = my[1].gated_add(b, &y, &mlp(&normed(&y, 1, NORM2, &my[1])?, 1)?)?;
        Ok((x, y))
    }

    /// A patch block's joint attention over [text, image] (RoPE `rope` in that order): each stream's bias-free
    /// q, k, v from its fused `qkv`, per-head RMS norms of q and k, one unmasked attention, each stream's output
    /// projection; (image, text).
    fn joint_attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        x: &Tensor<B>,
        y: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        use patch_slot::{K_NORM, PROJ, PROJ_BIAS, Q_NORM, QKV};
        let cfg = &self.config;
        let (d, batch, ny) = (cfg.hidden, x.dim(0)?, y.dim(1)?);
        let slot = |stream: usize, s: usize| layer.weight(stream * STREAM_WEIGHTS + s);
        // Part `part` (0 q, 1 k, 2 v) of a stream's heads [B, N, H, hd], q and k normed.
        let heads = |t: &Tensor<B>, stream: usize, part: usize| -> Result<Tensor<B>> {
            let n = t.dim(1)?;
            let w = slot(stream, QKV).rows(part * d, d)?;
            let h = b.linear(t, &w, None)?.reshape(&[batch, n, cfg.heads, cfg.head_dim])?;
            match part {
                0 => Ok(b.rms_norm(&h, Some(&slot(stream, Q_NORM)), EPS)?),
                1 => Ok(b.rms_norm(&h, Some(&slot(stream, K_NORM)), EPS)?),
                _ => Ok(h),
            }
        };
        let joint = |part: usize| -> Result<Tensor<B>> {
            Ok(b.concat(&[&heads(y, 1, part)?, &heads(x, 0, part)?], 1)?)
        };
        let o = attend(b, &joint(0)?, &joint(1)?, &joint(2)?, rope)?;
        let oy = b.slice(&o, 1, 0, ny)?;
        let ox = b.slice(&o, 1, ny, o.dim(1)? - ny)?;
        drop(o);
        let ax = b.linear(&ox, &slot(0, PROJ), Some(&slot(0, PROJ_BIAS)))?;
        let ay = b.linear(&oy, &slot(1, PROJ), Some(&slot(1, PROJ_BIAS)))?;
        Ok((ax, ay))
    }

    /// The pixel tokens `[B·L, p², pixel_dim]` of the padded image `img` `[B, 3, p·rows, p·cols]`: each pixel's
    /// RGB through `pixel_embedder.proj`, plus [`pixel_table`].
    fn pixel_embed<B: Backend>(
        &self,
        b: &B,
        img: &Tensor<B>,
        (rows, cols): (usize, usize),
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, p, pd) = (img.dim(0)?, cfg.patch, cfg.pixel_dim);
        let n = rows * cols * p * p;
        // The backend's patch order is the pixels' own: feature (py·p + px)·3 + c.
        let rgb = b.patchify(img, p)?.reshape(&[batch, n, CHANNELS])?;
        let x = linear(b, &self.weights, &cfg.key("pixel_embedder.proj"), &rgb)?;
        let table =
            b.from_f32(&[1, n, pd], &pixel_table(pd, (rows, cols), p), b.compute_dtype())?;
        let x = b.binary(&x, &table, BinaryOp::Add)?;
        Ok(x.reshape(&[batch * rows * cols, p * p, pd])?)
    }

    /// The tiles of `n` patch rows the per-pixel parts work on.
    fn tiles(&self, n: usize) -> Vec<(usize, usize)> {
        let tile = if self.tile == 0 { n } else { self.tile.min(n) };
        (0..n).step_by(tile.max(1)).map(|at| (at, tile.min(n - at))).collect()
    }

    /// Pixel block `i` on the pixel tokens `x` `[B·L, p², pd]`, conditioned per patch by `s` `[B·L, hidden]`:
    /// per pixel `x + gate · expand(attn(compress(RMSNorm(x) · (1 + scale) + shift)))`, the attention across the
    /// patches of each sample, then `x + gate · MLP(RMSNorm(x) · (1 + scale) + shift)` with the MLP's modulation.
    fn pixel_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        s: &Tensor<B>,
        batch: usize,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        use pixel_slot::{
            COMPRESS, COMPRESS_BIAS, EXPAND, EXPAND_BIAS, FC1, FC1_BIAS, FC2, FC2_BIAS, NORM1,
            NORM2,
        };
        let cfg = &self.config;
        let (n, p2, pd) = (x.dim(0)?, cfg.patch * cfg.patch, cfg.pixel_dim);
        let layer = fetch(b, &self.weights, &pixel_block_names(cfg, i))?;
        let tiles = self.tiles(n);

        // The attention's input: a tile's pixels modulated and squeezed to one token a patch.
        let mut squeezed = Vec::with_capacity(tiles.len());
        let mut kept = Vec::with_capacity(tiles.len());
        for &(at, len) in &tiles {
            let (msa, mlp) = self.modulation(b, &layer, &b.slice(s, 0, at, len)?, true)?;
            let chunk = |k: usize| b.slice(&msa, -1, k * pd, pd);
            let normed = b.rms_norm(&b.slice(x, 0, at, len)?, Some(&layer.weight(NORM1)), EPS)?;
            let normed =
                modulate_pixels(b, &normed.reshape(&[len * p2, pd])?, &chunk(1)?, &chunk(0)?)?;
            let flat = normed.reshape(&[len, p2 * pd])?;
            squeezed.push(b.linear(
                &flat,
                &layer.weight(COMPRESS),
                Some(&layer.weight(COMPRESS_BIAS)),
            )?);
            kept.push(Kept { gate: chunk(2)?, mlp });
        }
        let squeezed = join(b, squeezed)?.reshape(&[batch, n / batch, cfg.attn_dim])?;
        let attended = self.pixel_attention(b, &layer, &squeezed, rope)?;
        let attended = attended.reshape(&[n, cfg.attn_dim])?;
        drop(squeezed);

        let mut out = Vec::with_capacity(tiles.len());
        for (&(at, len), kept) in tiles.iter().zip(kept) {
            let expanded = b.linear(
                &b.slice(&attended, 0, at, len)?,
                &layer.weight(EXPAND),
                Some(&layer.weight(EXPAND_BIAS)),
            )?;
            let expanded = expanded.reshape(&[len * p2, pd])?;
            let xt = b.slice(x, 0, at, len)?.reshape(&[len * p2, pd])?;
            let xt =
                b.binary(&xt, &b.binary(&expanded, &kept.gate, BinaryOp::Mul)?, BinaryOp::Add)?;
            drop(expanded);
            let mlp = match kept.mlp {
                Some(m) => m,
                None => self.modulation(b, &layer, &b.slice(s, 0, at, len)?, false)?.0,
            };
            let chunk = |k: usize| b.slice(&mlp, -1, k * pd, pd);
            let normed = b.rms_norm(&xt, Some(&layer.weight(NORM2)), EPS)?;
            let normed = modulate_pixels(b, &normed, &chunk(1)?, &chunk(0)?)?;
            let hidden = b.linear(&normed, &layer.weight(FC1), Some(&layer.weight(FC1_BIAS)))?;
            let hidden = b.unary(&hidden, UnaryOp::Gelu)?;
            let y = b.linear(&hidden, &layer.weight(FC2), Some(&layer.weight(FC2_BIAS)))?;
            let xt = b.binary(&xt, &b.binary(&y, &chunk(2)?, BinaryOp::Mul)?, BinaryOp::Add)?;
            out.push(xt.reshape(&[len, p2, pd])?);
        }
        join(b, out)
    }

    /// A tile's per-pixel modulation from its patches' conditions `s` `[len, hidden]`, each `[len·p², 3·pd]`
    /// (shift, scale, gate): with `attention`, the attention's and (the released layout, whose one Linear gives
    /// both) the MLP's; without, the MLP's (the processed layout's second Linear).
    fn modulation<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        s: &Tensor<B>,
        attention: bool,
    ) -> Result<(Tensor<B>, Option<Tensor<B>>)> {
        use pixel_slot::ADA;
        let cfg = &self.config;
        let (len, p2, pd) = (s.dim(0)?, cfg.patch * cfg.patch, cfg.pixel_dim);
        match cfg.layout {
            Layout::Released => {
                // Rows per pixel: the attention's three chunks, then the MLP's.
                let m = b.linear(s, &layer.weight(ADA), Some(&layer.weight(ADA + 1)))?;
                let m = m.reshape(&[len * p2, 6 * pd])?;
                let (msa, mlp) = (b.slice(&m, -1, 0, 3 * pd)?, b.slice(&m, -1, 3 * pd, 3 * pd)?);
                Ok(if attention { (msa, Some(mlp)) } else { (mlp, None) })
            }
            Layout::Comfy => {
                let at = if attention { ADA } else { ADA + 2 };
                let m = b.linear(s, &layer.weight(at), Some(&layer.weight(at + 1)))?;
                Ok((m.reshape(&[len * p2, 3 * pd])?, None))
            }
        }
    }

    /// A pixel block's attention on the patches' squeezed tokens `x` `[B, L, attn_dim]`: bias-free q, k, v from
    /// the fused `qkv`, per-head RMS norms of q and k, the 2-D RoPE, unmasked attention, the output projection.
    fn pixel_attention<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        x: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        use pixel_slot::{K_NORM, PROJ, PROJ_BIAS, Q_NORM, QKV};
        let cfg = &self.config;
        let (a, batch, n) = (cfg.attn_dim, x.dim(0)?, x.dim(1)?);
        let heads = |part: usize| -> Result<Tensor<B>> {
            let w = layer.weight(QKV).rows(part * a, a)?;
            let h =
                b.linear(x, &w, None)?.reshape(&[batch, n, cfg.attn_heads, cfg.attn_head_dim])?;
            match part {
                0 => Ok(b.rms_norm(&h, Some(&layer.weight(Q_NORM)), EPS)?),
                1 => Ok(b.rms_norm(&h, Some(&layer.weight(K_NORM)), EPS)?),
                _ => Ok(h),
            }
        };
        let o = attend(b, &heads(0)?, &heads(1)?, &heads(2)?, rope)?;
        Ok(b.linear(&o, &layer.weight(PROJ), Some(&layer.weight(PROJ_BIAS)))?)
    }
}

/// The tiles joined back along the rows (one tile: itself).
fn join<B: Backend>(b: &B, mut tiles: Vec<Tensor<B>>) -> Result<Tensor<B>> {
    if tiles.len() == 1 {
        return Ok(tiles.remove(0));
    }
    Ok(b.concat(&tiles.iter().collect::<Vec<_>>(), 0)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_interleaves_columns_and_rows() {
        // 2 × 3 patches, heads 8 wide: 2 frequencies an axis, pairs (x f0, y f0, x f1, y f1).
        let grid = Grid::new(2, 3, &RopeOptions::default());
        assert_eq!(grid.xs, [0.0, 8.0, 16.0]);
        assert_eq!(grid.ys, [0.0, 16.0]);
        let angles = grid.angles(8);
        assert_eq!(angles.len(), 6 * 4);
        // Patch (1, 2): x 16, y 16; second frequency 1e4^(−2/4) = 0.01.
        let last = &angles[20..];
        assert_eq!(last[0], 16.0);
        assert!((last[2] - 0.16).abs() < 1e-12 && (last[3] - 0.16).abs() < 1e-12);
        // One patch a side sits at the shift.
        let one = Grid::new(1, 1, &RopeOptions { scale: [1.0; 3], shift: [0.0, 3.0, -1.0] });
        assert_eq!((one.xs.as_slice(), one.ys.as_slice()), (&[-1.0][..], &[3.0][..]));
    }

    #[test]
    fn pixel_table_is_columns_then_rows() {
        // One 2 × 2 patch, width 4: per pixel sin x, cos x, sin y, cos y (ω = 1).
        let t = pixel_table(4, (1, 1), 2);
        assert_eq!(&t[..4], &[0.0, 1.0, 0.0, 1.0]);
        let (s1, c1) = (1f32.sin(), 1f32.cos());
        assert_eq!(&t[4..8], &[s1, c1, 0.0, 1.0]);
        assert_eq!(&t[8..12], &[0.0, 1.0, s1, c1]);
    }
}
