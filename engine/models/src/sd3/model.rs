//! [`Sd3`]: the MMDiT's forward pass (ComfyUI's `MMDiT.forward` and `_block_mixing`).

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{Config, HEAD_DIM, LN_EPS, PATCH, QK_EPS, T_FREQ_DIM};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::{PatchOrder, padded, to_batch, unpatchify};
use crate::named::{conv2d, linear};

/// A loaded MMDiT: its config and weights (under ComfyUI's names, from [`super::load_plan`]).
pub struct Sd3 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// One call's inputs.
pub struct Sd3Input<'a, B: Backend> {
    /// Latents `[B, C, h, w]`.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (σ·1000).
    pub timesteps: &'a [f32],
    /// Text states `[B or 1, N, context_width]` (CLIP-L's and CLIP-G's padded to T5-XXL's width, then T5-XXL's).
    pub context: &'a Tensor<B>,
    /// The pooled vector `y` `[B or 1, adm_width]` (CLIP-L's and CLIP-G's); without one the timestep alone
    /// modulates, as ComfyUI skips `y_embedder` for a missing `y`.
    pub pooled: Option<&'a Tensor<B>>,
    /// What a ControlNet adds to the image tokens after each block (ComfyUI's `control["output"]`): entry i after
    /// block i, each `[B, N, D]`; `None` leaves a block's tokens as they are.
    pub controls: &'a [Option<Tensor<B>>],
}

/// A stream's modulations in a block: (attention, MLP) sets, or a `pre_only` context's shift and scale alone.
pub(crate) enum StreamMods<B: Backend> {
    /// The attention's and the MLP's (shift, scale, gate).
    Full(Modulation<B>, Modulation<B>),
    /// The last context block's: its attention input's shift and scale.
    PreOnly { shift: Tensor<B>, scale: Tensor<B> },
}

impl Sd3 {
    /// The MMDiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> Sd3 {
        Sd3 { config, weights }
    }

    /// ComfyUI's model output for `input`, f32 `[B, out_channels, h, w]`, computed in `b.compute_dtype()`.
    pub fn forward<B: Backend>(&self, b: &B, input: &Sd3Input<'_, B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let m = &self.weights;
        let &[batch, channels, h, w] = input.x.shape() else {
            return Err(Error::Invalid(format!(
                "MMDiT input {:?} is not [B, C, H, W]",
                input.x.shape()
            )));
        };
        if channels != cfg.in_channels || input.timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "the MMDiT takes {} channels and a timestep per sample; got {:?} and {} timesteps",
                cfg.in_channels,
                input.x.shape(),
                input.timesteps.len()
            )));
        }
        let dt = b.compute_dtype();
        let (tokens, rows, cols) = self.patch_embed(b, &b.cast(input.x, dt)?)?;
        if rows > cfg.pos_embed_max || cols > cfg.pos_embed_max {
            return Err(Error::Invalid(format!(
                "the latent is {rows}×{cols} patches; this MMDiT's position table covers {m}×{m} ({px}×{px} pixels)",
                m = cfg.pos_embed_max,
                px = cfg.pos_embed_max * PATCH * 8
            )));
        }
        let position = to_batch(b, &self.position_crop(b, rows, cols)?, batch)?;
        let mut img = b.binary(&tokens, &position, BinaryOp::Add)?;
        drop((tokens, position));

        // Every adaLN reads SiLU(timestep embedding + pooled vector's embedding).
        let silu_c = {
            let t = crate::timestep::sinusoid(input.timesteps.iter().copied(), T_FREQ_DIM / 2, 1.0);
            let t = b.cast(&b.from_f32(&[batch, T_FREQ_DIM], &t, DType::F32)?, dt)?;
            let mut c = mlp(b, m, "t_embedder.mlp", &t)?;
            if let Some(pooled) = input.pooled {
                let y = b.cast(&to_batch(b, pooled, batch)?, dt)?;
                c = b.binary(&c, &mlp(b, m, "y_embedder.mlp", &y)?, BinaryOp::Add)?;
            }
            b.unary(&c, UnaryOp::Silu)?
        };
        let mut context = {
            let context = b.cast(&to_batch(b, input.context, batch)?, dt)?;
            linear(b, m, "context_embedder", &context)?
        };

        for i in 0..cfg.blocks {
            let (c, x) = self.joint_block(b, i, &context, &img, &silu_c)?;
            context = c.unwrap_or(context);
            img = x;
            if let Some(Some(add)) = input.controls.get(i) {
                img = b.binary(&img, &b.cast(add, dt)?, BinaryOp::Add)?;
            }
        }

        let out = {
            let mods = linear(b, m, "final_layer.adaLN_modulation.1", &silu_c)?;
            let (shift, scale) =
                (b.slice(&mods, -1, 0, cfg.dim)?, b.slice(&mods, -1, cfg.dim, cfg.dim)?);
            let x = b.modulate(&b.layer_norm(&img, None, None, LN_EPS)?, &scale, Some(&shift))?;
            linear(b, m, "final_layer.linear", &x)?
        };
        let out =
            unpatchify(b, &out, cfg.out_channels, (rows, cols), PATCH, PatchOrder::ChannelsLast)?;
        let out = match (out.dim(2)? == h, out.dim(3)? == w) {
            (true, true) => out,
            _ => b.slice(&b.slice(&out, 2, 0, h)?, 3, 0, w)?,
        };
        Ok(b.cast(&out, DType::F32)?)
    }

    /// The learned position table's centred `rows × cols` crop `[1, rows·cols, D]` (`cropped_pos_embed`).
    fn position_crop<B: Backend>(&self, b: &B, rows: usize, cols: usize) -> Result<Tensor<B>> {
        let (side, d) = (self.config.pos_embed_max, self.config.dim);
        let layer = self.fetch(b, &["pos_embed"])?;
        let table =
            b.weight_to_tensor(&layer.weight(0), b.compute_dtype())?.reshape(&[side, side, d])?;
        let (top, left) = ((side - rows) / 2, (side - cols) / 2);
        let crop = b.slice(&b.slice(&table, 0, top, rows)?, 1, left, cols)?;
        Ok(crop.reshape(&[1, rows * cols, d])?)
    }

    /// Joint block `i` on the text tokens `context` and the image tokens `x`: the new text tokens (`None` after
    /// the last block, whose context stream stops at its attention) and image tokens.
    fn joint_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        context: &Tensor<B>,
        x: &Tensor<B>,
        silu_c: &Tensor<B>,
    ) -> Result<(Option<Tensor<B>>, Tensor<B>)> {
        let cfg = &self.config;
        let stream = |name: &str| Stream {
            weights: &self.weights,
            prefix: format!("joint_blocks.{i}.{name}"),
            dim: cfg.dim,
            heads: cfg.heads,
            qk_norm: cfg.qk_norm,
        };
        let (ctx_stream, x_stream) = (stream("context_block"), stream("x_block"));
        let ctx_mods = ctx_stream.modulations(b, silu_c, cfg.pre_only(i))?;
        let x_mods = x_stream.modulations(b, silu_c, false)?;
        let [cq, ck, cv] = ctx_stream.qkv(b, &ctx_mods, context)?;
        let [xq, xk, xv] = x_stream.qkv(b, &x_mods, x)?;
        let text_len = context.dim(1)?;
        let joined = |a: Tensor<B>, c: Tensor<B>| b.concat(&[&a, &c], 2);
        let attn = attention(b, joined(cq, xq)?, joined(ck, xk)?, joined(cv, xv)?, cfg.dim)?;
        let ctx_attn = b.slice(&attn, 1, 0, text_len)?;
        let x_attn = b.slice(&attn, 1, text_len, x.dim(1)?)?;
        drop(attn);
        let context = match &ctx_mods {
            StreamMods::PreOnly { .. } => None,
            StreamMods::Full(..) => {
                Some(ctx_stream.post_attention(b, &ctx_mods, context, &ctx_attn)?)
            }
        };
        let x = x_stream.post_attention(b, &x_mods, x, &x_attn)?;
        Ok((context, x))
    }

    /// The latent `x` `[B, C, h, w]` padded circularly to the patch size and patch-embedded by `x_embedder`
    /// (the ControlNets read the model's), `[B, rows·cols, D]`, with the token grid.
    pub(crate) fn patch_embed<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
    ) -> Result<(Tensor<B>, usize, usize)> {
        patch_embed(b, &self.weights, "x_embedder.proj", x, self.config.dim)
    }

    /// The weights `names`, fetched together.
    fn fetch<B: Backend>(&self, b: &B, names: &[&str]) -> Result<Layer<'_>> {
        Ok(self.weights.fetch(b, names)?)
    }
}

/// `mlp.2(SiLU(mlp.0(x)))` of the embedder `stem` of `weights` (the timestep's and the pooled vector's).
pub(crate) fn mlp<B: Backend>(
    b: &B,
    weights: &Model,
    stem: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let h = linear(b, weights, &format!("{stem}.0"), x)?;
    linear(b, weights, &format!("{stem}.2"), &b.unary(&h, UnaryOp::Silu)?)
}

/// `x` `[B, C, h, w]` padded circularly to the patch size and embedded by the patch convolution `name`
/// (`PatchEmbed`): `[B, rows·cols, dim]` and the token grid.
pub(crate) fn patch_embed<B: Backend>(
    b: &B,
    weights: &Model,
    name: &str,
    x: &Tensor<B>,
    dim: usize,
) -> Result<(Tensor<B>, usize, usize)> {
    let (x, rows, cols) = padded(b, x, PATCH)?;
    let e = conv2d(b, weights, name, &x, Conv2dParams { stride: PATCH, padding: [0; 4] })?;
    let batch = e.dim(0)?;
    Ok((b.permute(&e.reshape(&[batch, dim, rows * cols])?, &[0, 2, 1])?, rows, cols))
}

/// Unmasked attention over `[B, H, N, 64]`, back to `[B, N, dim]`.
pub(crate) fn attention<B: Backend>(
    b: &B,
    q: Tensor<B>,
    k: Tensor<B>,
    v: Tensor<B>,
    dim: usize,
) -> Result<Tensor<B>> {
    let (batch, n) = (q.dim(0)?, q.dim(2)?);
    let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (HEAD_DIM as f32).sqrt())?;
    Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, dim])?)
}

/// One adaLN-modulated stream of a block (ComfyUI's `DismantledBlock`): its weights under `prefix`.
pub(crate) struct Stream<'m> {
    /// The weights holding the stream's.
    pub(crate) weights: &'m Model,
    /// Where they are (`joint_blocks.3.x_block`).
    pub(crate) prefix: String,
    /// Hidden width.
    pub(crate) dim: usize,
    /// Heads of [`HEAD_DIM`].
    pub(crate) heads: usize,
    /// Whether q and k are RMS-normed per head.
    pub(crate) qk_norm: bool,
}

impl Stream<'_> {
    /// The stream's modulations from `SiLU(c)`.
    pub(crate) fn modulations<B: Backend>(
        &self,
        b: &B,
        silu_c: &Tensor<B>,
        pre_only: bool,
    ) -> Result<StreamMods<B>> {
        let d = self.dim;
        let m = linear(b, self.weights, &format!("{}.adaLN_modulation.1", self.prefix), silu_c)?;
        if pre_only {
            return Ok(StreamMods::PreOnly {
                shift: b.slice(&m, -1, 0, d)?,
                scale: b.slice(&m, -1, d, d)?,
            });
        }
        let mut sets = Modulation::sets(b, &m, d, 2)?.into_iter();
        match (sets.next(), sets.next()) {
            (Some(attn), Some(mlp)) => Ok(StreamMods::Full(attn, mlp)),
            _ => Err(Error::Invalid("an MMDiT block without its two modulations".to_owned())),
        }
    }

    /// q, k, v `[B, H, L, 64]` for tokens `x`: the modulated LayerNorm through `qkv`, q and k RMS-normed per head
    /// where the stream has the norms.
    pub(crate) fn qkv<B: Backend>(
        &self,
        b: &B,
        mods: &StreamMods<B>,
        x: &Tensor<B>,
    ) -> Result<[Tensor<B>; 3]> {
        let (batch, len, heads) = (x.dim(0)?, x.dim(1)?, self.heads);
        let normed = match mods {
            StreamMods::Full(attn, _) => attn.modulated(b, x, LN_EPS)?,
            StreamMods::PreOnly { shift, scale } => {
                b.modulate(&b.layer_norm(x, None, None, LN_EPS)?, scale, Some(shift))?
            }
        };
        let all = linear(b, self.weights, &format!("{}.attn.qkv", self.prefix), &normed)?
            .reshape(&[batch, len, 3, heads, HEAD_DIM])?;
        let part = |k: usize| -> Result<Tensor<B>> {
            Ok(b.slice(&all, 2, k, 1)?.reshape(&[batch, len, heads, HEAD_DIM])?)
        };
        let (mut q, mut k, v) = (part(0)?, part(1)?, part(2)?);
        if self.qk_norm {
            let names = [
                format!("{}.attn.ln_q.weight", self.prefix),
                format!("{}.attn.ln_k.weight", self.prefix),
            ];
            let norms = self.weights.fetch(b, &names.each_ref().map(String::as_str))?;
            q = b.rms_norm(&q, Some(&norms.weight(0)), QK_EPS)?;
            k = b.rms_norm(&k, Some(&norms.weight(1)), QK_EPS)?;
        }
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        Ok([heads_first(&q)?, heads_first(&k)?, heads_first(&v)?])
    }

    /// `post_attention`: x + gate·proj(attention), then x + gate·MLP(modulated LayerNorm(x)).
    pub(crate) fn post_attention<B: Backend>(
        &self,
        b: &B,
        mods: &StreamMods<B>,
        x: &Tensor<B>,
        attn: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let StreamMods::Full(attn_mod, mlp_mod) = mods else {
            return Err(Error::Invalid("a pre-only MMDiT stream has no post-attention".to_owned()));
        };
        let (m, p) = (self.weights, &self.prefix);
        let x = attn_mod.gated_add(b, x, &linear(b, m, &format!("{p}.attn.proj"), attn)?)?;
        let h = linear(b, m, &format!("{p}.mlp.fc1"), &mlp_mod.modulated(b, &x, LN_EPS)?)?;
        let h = linear(b, m, &format!("{p}.mlp.fc2"), &b.unary(&h, UnaryOp::GeluTanh)?)?;
        mlp_mod.gated_add(b, &x, &h)
    }

    /// The whole block on `x` alone (self-attention; a ControlNet's blocks).
    pub(crate) fn self_block<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        silu_c: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let mods = self.modulations(b, silu_c, false)?;
        let [q, k, v] = self.qkv(b, &mods, x)?;
        let attn = attention(b, q, k, v, self.dim)?;
        self.post_attention(b, &mods, x, &attn)
    }
}
