//! [`Kandinsky5`]: the DiT's forward pass (ComfyUI's `Kandinsky5._forward` and `forward_orig`).

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::config::{Config, LN_EPS, PATCH};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::{padded, to_batch};
use crate::named::{fetch, linear};
use crate::rope::{Rope, linspace_in, tables_at};

/// RoPE's base period on every axis.
const ROPE_THETA: f64 = 10000.0;

/// A loaded Kandinsky 5 DiT: its config and weights (under ComfyUI's names, from [`super::load_plan`]).
pub struct Kandinsky5 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// One call's inputs.
pub struct Kandinsky5Input<'a, B: Backend> {
    /// The DiT's input, `[B, C, h, w]` (one frame) or `[B, C, T, h, w]`, C = [`Config::in_channels`]: the latent
    /// (model space), then for the video models [`Config::concat_channels`] more (ComfyUI's `concat_cond`: the
    /// latent's count of zeros, then the mask), as ComfyUI's `_apply_model` joins them.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (σ·1000).
    pub timesteps: &'a [f32],
    /// Text states `[B or 1, N, text_dim]` (Qwen2.5-VL's).
    pub context: &'a Tensor<B>,
    /// The pooled vector `[B or 1, pooled_dim]` (CLIP-L's).
    pub pooled: &'a Tensor<B>,
    /// ComfyUI's `time_dim_replace`: clean latents `[1 or B, channels, F, h, w]` (model space: the encoded start
    /// image through the latent format's `process_in`) that overwrite the first `channels` channels of `x`'s
    /// first F frames (F ≤ T) before anything else; the concat channels and the output are left alone.
    pub time_dim_replace: Option<&'a Tensor<B>>,
}

impl Kandinsky5 {
    /// The DiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> Kandinsky5 {
        Kandinsky5 { config, weights }
    }

    /// ComfyUI's model output for `input`, f32 `[B, channels, h, w]` or `[B, channels, T, h, w]` as `x` is,
    /// computed in `b.compute_dtype()` (ComfyUI's `Kandinsky5._forward`; unlike it, the padding to even sides is
    /// cropped off).
    pub fn forward<B: Backend>(&self, b: &B, input: &Kandinsky5Input<'_, B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let m = &self.weights;
        let (batch, in_channels, frames, h, w) = match *input.x.shape() {
            [batch, c, h, w] => (batch, c, 1, h, w),
            [batch, c, t, h, w] => (batch, c, t, h, w),
            _ => {
                return Err(Error::Invalid(format!(
                    "Kandinsky 5 input {:?} is not [B, C, H, W] or [B, C, T, H, W]",
                    input.x.shape()
                )));
            }
        };
        if in_channels != cfg.in_channels()
            || input.timesteps.len() != batch
            || frames == 0
            || h == 0
            || w == 0
        {
            return Err(Error::Invalid(format!(
                "the Kandinsky 5 DiT takes {} channels{} and a timestep per sample; got {:?} and {} timesteps",
                cfg.in_channels(),
                if cfg.is_video() {
                    format!(" (the latent's {} joined with ComfyUI's concat_cond)", cfg.channels)
                } else {
                    String::new()
                },
                input.x.shape(),
                input.timesteps.len()
            )));
        }
        let (text_width, pooled_width) = (input.context.dim(2)?, input.pooled.dim(1)?);
        if (text_width, pooled_width) != (cfg.text_dim, cfg.pooled_dim) {
            return Err(Error::Invalid(format!(
                "Kandinsky 5 reads {}-wide text states and a {}-wide pooled vector (Qwen2.5-VL 7B's and CLIP-L's); \
                 this prompt's are {text_width} and {pooled_width} wide: encode it with DualCLIPLoader type \
                 {} (qwen_2.5_vl_7b and clip_l)",
                cfg.text_dim,
                cfg.pooled_dim,
                if cfg.is_video() { "kandinsky5" } else { "kandinsky5_image" }
            )));
        }
        let dt = b.compute_dtype();

        // Every modulation reads SiLU(timestep embedding + pooled vector's embedding).
        let silu_t = {
            let t = crate::timestep::sinusoid(input.timesteps.iter().copied(), cfg.dim / 2, 1.0);
            let t = b.cast(&b.from_f32(&[batch, cfg.dim], &t, DType::F32)?, dt)?;
            let t = linear(b, m, "time_embeddings.in_layer", &t)?;
            let t = linear(b, m, "time_embeddings.out_layer", &b.unary(&t, UnaryOp::Silu)?)?;
            let pooled = b.cast(&to_batch(b, input.pooled, batch)?, dt)?;
            let pooled = self.embed(b, "pooled_text_embeddings", &pooled)?;
            b.unary(&b.binary(&t, &pooled, BinaryOp::Add)?, UnaryOp::Silu)?
        };

        let mut text = {
            let context = b.cast(&to_batch(b, input.context, batch)?, dt)?;
            self.embed(b, "text_embeddings", &context)?
        };
        let text_positions: Vec<[f64; 1]> =
            self.positions(b, 1.0, text.dim(1)?).map(|p| [p]).collect();
        let text_rope = self.rope(b, &text_positions, [cfg.head_dim])?;
        for i in 0..cfg.text_blocks {
            text = self.text_block(b, i, &text, &silu_t, &text_rope)?;
        }

        let x = b.cast(input.x, dt)?.reshape(&[batch, in_channels, frames, h, w])?;
        let x = match input.time_dim_replace {
            Some(clean) => self.replace_frames(b, &x, clean)?,
            None => x,
        };
        // Padded circularly to even rows and columns, each (channel, frame) plane on its own.
        let (x, rows, cols) = padded(b, &x.reshape(&[batch, in_channels * frames, h, w])?, PATCH)?;
        let mut img = {
            // Patches frame-major, then row, column; features channels last: (row in patch, column in patch,
            // channel).
            let t = x.reshape(&[batch, in_channels, frames, rows, PATCH, cols, PATCH])?;
            let t = b.permute(&t, &[0, 2, 3, 5, 4, 6, 1])?;
            let t = t.reshape(&[batch, frames * rows * cols, in_channels * PATCH * PATCH])?;
            linear(b, m, "visual_embeddings.in_layer", &t)?
        };
        let img_rope = self.rope(
            b,
            &self.visual_positions(b, cfg.rope_scale_at(h, w), frames, rows, cols),
            cfg.axes,
        )?;
        for i in 0..cfg.visual_blocks {
            img = self.visual_block(b, i, &img, &text, &silu_t, &img_rope)?;
        }

        let out = {
            let mods = linear(b, m, "out_layer.modulation.out_layer", &silu_t)?;
            let (shift, scale) =
                (b.slice(&mods, -1, 0, cfg.dim)?, b.slice(&mods, -1, cfg.dim, cfg.dim)?);
            let x = b.modulate(&b.layer_norm(&img, None, None, LN_EPS)?, &scale, Some(&shift))?;
            linear(b, m, "out_layer.out_layer", &x)?
        };
        // Each token's features channel-major (channel, row in patch, column in patch), unlike the input's.
        let c = cfg.channels;
        let out = out.reshape(&[batch, frames, rows, cols, c, PATCH, PATCH])?;
        let out = b.permute(&out, &[0, 4, 1, 2, 5, 3, 6])?;
        let mut out = out.reshape(&[batch, c, frames, rows * PATCH, cols * PATCH])?;
        if rows * PATCH != h {
            out = b.slice(&out, 3, 0, h)?;
        }
        if cols * PATCH != w {
            out = b.slice(&out, 4, 0, w)?;
        }
        let out = match input.x.shape().len() {
            4 => out.reshape(&[batch, c, h, w])?,
            _ => out,
        };
        Ok(b.cast(&out, DType::F32)?)
    }

    /// `x` `[B, C, T, h, w]` (compute type) with its first `channels` channels of the first F frames replaced by
    /// `clean` `[1 or B, channels, F, h, w]` (ComfyUI's `x[:, :C_r, :F_r] = time_dim_replace`; it pads both to the
    /// patch first, which, circular, commutes with the replacement).
    fn replace_frames<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        clean: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let c = self.config.channels;
        let &[batch, in_channels, frames, h, w] = x.shape() else {
            return Err(Error::Invalid(format!("Kandinsky 5 input {:?} is not 5-D", x.shape())));
        };
        let fits = match *clean.shape() {
            [rb, rc, f, rh, rw] => {
                (rb == 1 || rb == batch)
                    && rc == c
                    && (1..=frames).contains(&f)
                    && (rh, rw) == (h, w)
            }
            _ => false,
        };
        if !fits {
            return Err(Error::Invalid(format!(
                "Kandinsky 5's time_dim_replace must be [1 or {batch}, {c}, 1..={frames}, {h}, {w}] (clean \
                 latent frames for the start of a [{batch}, {in_channels}, {frames}, {h}, {w}] input); got {:?}",
                clean.shape()
            )));
        }
        let f = clean.dim(2)?;
        let clean = b.cast(&to_batch(b, clean, batch)?, b.compute_dtype())?;
        let latent = if f < frames {
            let rest = b.slice(&b.slice(x, 1, 0, c)?, 2, f, frames - f)?;
            b.concat(&[&clean, &rest], 2)?
        } else {
            clean
        };
        if in_channels == c {
            return Ok(latent);
        }
        let joined = b.slice(x, 1, c, in_channels - c)?;
        Ok(b.concat(&[&latent, &joined], 1)?)
    }

    /// Text block `i` (`TransformerEncoderBlock`): modulated self-attention, then the modulated feed-forward.
    fn text_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        silu_t: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let p = format!("text_transformer_blocks.{i}");
        let mods = linear(b, &self.weights, &format!("{p}.text_modulation.out_layer"), silu_t)?;
        let [attn, ff] = self.modulations::<B, 2>(b, &mods)?;
        let out = self.attention(
            b,
            &format!("{p}.self_attention"),
            &attn.modulated(b, x, LN_EPS)?,
            None,
            Some(rope),
        )?;
        let x = attn.gated_add(b, x, &out)?;
        let out = self.feed_forward(b, &p, &ff.modulated(b, &x, LN_EPS)?)?;
        ff.gated_add(b, &x, &out)
    }

    /// Visual block `i` (`TransformerDecoderBlock`): modulated self-attention, cross-attention to `text`, then the
    /// modulated feed-forward.
    fn visual_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        text: &Tensor<B>,
        silu_t: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let p = format!("visual_transformer_blocks.{i}");
        let mods = linear(b, &self.weights, &format!("{p}.visual_modulation.out_layer"), silu_t)?;
        let [attn, cross, ff] = self.modulations::<B, 3>(b, &mods)?;
        let normed = attn.modulated(b, x, LN_EPS)?;
        let out = self.attention(b, &format!("{p}.self_attention"), &normed, None, Some(rope))?;
        let x = attn.gated_add(b, x, &out)?;
        let normed = cross.modulated(b, &x, LN_EPS)?;
        let out = self.attention(b, &format!("{p}.cross_attention"), &normed, Some(text), None)?;
        let x = cross.gated_add(b, &x, &out)?;
        let out = self.feed_forward(b, &p, &ff.modulated(b, &x, LN_EPS)?)?;
        ff.gated_add(b, &x, &out)
    }

    /// The `N` (shift, scale, gate) sets of a block's modulation vector.
    fn modulations<B: Backend, const N: usize>(
        &self,
        b: &B,
        mods: &Tensor<B>,
    ) -> Result<[Modulation<B>; N]> {
        let sets = Modulation::sets(b, mods, self.config.dim, N)?;
        <[Modulation<B>; N]>::try_from(sets)
            .map_err(|_| Error::Invalid("a Kandinsky 5 block without its modulations".to_owned()))
    }

    /// The attention `p` (`SelfAttention`, `CrossAttention`) of queries from `x`: keys and values from `context`
    /// when given (cross-attention, no RoPE), else from `x`; q and k RMS-normed per head, then rotated by `rope`
    /// when given.
    fn attention<B: Backend>(
        &self,
        b: &B,
        p: &str,
        x: &Tensor<B>,
        context: Option<&Tensor<B>>,
        rope: Option<&Rope<B>>,
    ) -> Result<Tensor<B>> {
        let (m, cfg) = (&self.weights, &self.config);
        let (heads, head_dim) = (cfg.heads(), cfg.head_dim);
        let kv = context.unwrap_or(x);
        let split = |t: Tensor<B>| -> Result<Tensor<B>> {
            let (batch, n) = (t.dim(0)?, t.dim(1)?);
            Ok(t.reshape(&[batch, n, heads, head_dim])?)
        };
        let q = split(linear(b, m, &format!("{p}.to_query"), x)?)?;
        let k = split(linear(b, m, &format!("{p}.to_key"), kv)?)?;
        let v = split(linear(b, m, &format!("{p}.to_value"), kv)?)?;
        // torch's `RMSNorm` without an ε: f32's machine epsilon for every floating type (ATen computes 16-bit
        // types in f32 and takes its ε).
        let eps = f32::EPSILON;
        let norms =
            fetch(b, m, &[format!("{p}.query_norm.weight"), format!("{p}.key_norm.weight")])?;
        let mut q = b.rms_norm(&q, Some(&norms.weight(0)), eps)?;
        let mut k = b.rms_norm(&k, Some(&norms.weight(1)), eps)?;
        drop(norms);
        if let Some(rope) = rope {
            q = b.rope(&q, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
            k = b.rope(&k, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
        }
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(&v)?);
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (head_dim as f32).sqrt())?;
        let (batch, n) = (o.dim(0)?, o.dim(2)?);
        let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, cfg.dim])?;
        linear(b, m, &format!("{p}.out_layer"), &o)
    }

    /// Block `p`'s feed-forward: `out_layer(GELU(in_layer(x)))`, both without bias.
    fn feed_forward<B: Backend>(&self, b: &B, p: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let names = [
            format!("{p}.feed_forward.in_layer.weight"),
            format!("{p}.feed_forward.out_layer.weight"),
        ];
        let layer = fetch(b, &self.weights, &names)?;
        let h = b.unary(&b.linear(x, &layer.weight(0), None)?, UnaryOp::Gelu)?;
        Ok(b.linear(&h, &layer.weight(1), None)?)
    }

    /// `stem`'s `in_layer` then its affine LayerNorm (`TextEmbeddings`: the text's and the pooled vector's).
    fn embed<B: Backend>(&self, b: &B, stem: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let x = linear(b, &self.weights, &format!("{stem}.in_layer"), x)?;
        let norm =
            fetch(b, &self.weights, &[format!("{stem}.norm.weight"), format!("{stem}.norm.bias")])?;
        Ok(b.layer_norm(&x, Some(&norm.weight(0)), Some(&norm.weight(1)), LN_EPS)?)
    }

    /// `steps` positions from 0 to `(steps − 1) / factor`, as ComfyUI makes them: `torch.linspace` in the
    /// compute type (a 16-bit type's arithmetic moves the larger ones).
    fn positions<B: Backend>(&self, b: &B, factor: f64, steps: usize) -> impl Iterator<Item = f64> {
        let last = (steps as f64 - 1.0) / factor;
        linspace_in(b.compute_dtype(), 0.0, last as f32, steps).into_iter().map(f64::from)
    }

    /// The visual tokens' (frame, row, column) positions, frame-major then row-major (`rope_encode_3d`: each axis
    /// i / scale, from `scale` ([`Config::rope_scale_at`])).
    fn visual_positions<B: Backend>(
        &self,
        b: &B,
        [scale_t, scale_h, scale_w]: [f64; 3],
        frames: usize,
        rows: usize,
        cols: usize,
    ) -> Vec<[f64; 3]> {
        let ts: Vec<f64> = self.positions(b, scale_t, frames).collect();
        let ys: Vec<f64> = self.positions(b, scale_h, rows).collect();
        let xs: Vec<f64> = self.positions(b, scale_w, cols).collect();
        let mut all = Vec::with_capacity(frames * rows * cols);
        for &t in &ts {
            for &y in &ys {
                all.extend(xs.iter().map(|&x| [t, y, x]));
            }
        }
        all
    }

    /// The RoPE tables of `positions` on `axes` (adjacent feature pairs, the axes' angles in order).
    fn rope<B: Backend, const N: usize>(
        &self,
        b: &B,
        positions: &[[f64; N]],
        axes: [usize; N],
    ) -> Result<Rope<B>> {
        let (cos, sin) = tables_at(positions, axes, ROPE_THETA);
        Rope::upload(b, &cos, &sin, self.config.head_dim / 2, DType::F32)
    }
}
