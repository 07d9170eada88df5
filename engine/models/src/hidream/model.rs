//! [`HiDream`]: the HiDream-I1 / E1 DiT forward pass in ComfyUI's order (`comfy/ldm/hidream/model.py`),
//! reading one block's weights at a time through [`Model::fetch`].
//!
//! The text is T5-XXL's states and one Llama state per block, each through its own caption projection. The
//! double blocks attend over the image, then T5's tokens and the last block's Llama tokens (the text stream they
//! carry on), then their own Llama tokens (dropped after the block); the single blocks over the image and that
//! text stream, then their own Llama tokens. Only the image tokens are rotated (the text sits at position 0).
//! The image stream's feed-forward is a mixture of experts: a softmax gate picks [`ACTIVE_EXPERTS`] routed
//! experts per token, weighted by their (unnormalised) scores, plus one shared expert.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{
    ACTIVE_EXPERTS, AXES_DIMS, Config, HEAD_DIM, LATENT_CHANNELS, LN_EPS, PATCH, QK_EPS,
    ROPE_THETA, T_FREQ_DIM, block_prefix, caption_projection,
};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::{PatchOrder, padded, to_batch, unpatchify};
use crate::rope::Rope;

/// A HiDream DiT: its config and its weights (ComfyUI's names, no prefix) under the memory manager.
pub struct HiDream {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// What one model call takes.
pub struct HiDreamInput<'a, B: Backend> {
    /// Latents `[B, 16, h, w]` in model space, any float dtype.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (σ·1000: HiDream's model sampling has multiplier 1000).
    pub timesteps: &'a [f32],
    /// T5-XXL's states `[B, N, t5_width]` (ComfyUI's `c_crossattn`).
    pub context: &'a Tensor<B>,
    /// The Llama states `[1 or B, L, M, llama_width]`, one per layer on dim 1 (ComfyUI's
    /// `encoder_hidden_states_llama3`: the output of each decoder layer, the last through the final norm).
    pub llama: &'a Tensor<B>,
    /// The pooled vector `[B, pooled_width]` (CLIP-L's and CLIP-G's projected pooled outputs joined); `None`
    /// reads zeros.
    pub pooled: Option<&'a Tensor<B>>,
    /// E1's image latent `[1 or B, 16, h, w']` in model space (`InstructPixToPixConditioning`'s), joined to the
    /// latents along the width; the output keeps the latents' width.
    pub image_cond: Option<&'a Tensor<B>>,
}

/// One attention's projections under `{prefix}.attn1.` for a stream suffix (`""` image, `"_t"` text).
fn attention_names(prefix: &str, stream: &str) -> [String; 10] {
    let p = format!("{prefix}.attn1");
    [
        format!("{p}.to_q{stream}.weight"),
        format!("{p}.to_q{stream}.bias"),
        format!("{p}.to_k{stream}.weight"),
        format!("{p}.to_k{stream}.bias"),
        format!("{p}.to_v{stream}.weight"),
        format!("{p}.to_v{stream}.bias"),
        format!("{p}.q_rms_norm{stream}.weight"),
        format!("{p}.k_rms_norm{stream}.weight"),
        format!("{p}.to_out{stream}.weight"),
        format!("{p}.to_out{stream}.bias"),
    ]
}

impl HiDream {
    /// A model from its config and its loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> HiDream {
        HiDream { config, weights }
    }

    /// ComfyUI's model output for `input` (its `_forward`, sign flip included), f32 `[B, 16, h, w]`. Computes in
    /// `b.compute_dtype()`; odd sides are padded circularly and cropped back.
    pub fn forward<B: Backend>(&self, b: &B, input: &HiDreamInput<'_, B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, h, w) = self.check_inputs(input)?;
        let dt = b.compute_dtype();
        let mut x = b.cast(input.x, dt)?;
        if let Some(image) = input.image_cond {
            let image = b.cast(&to_batch(b, image, batch)?, dt)?;
            x = b.concat(&[&x, &image], 3)?;
        }
        let (x, rows, cols) = padded(b, &x, PATCH)?;
        let image_len = rows * cols;

        // adaLN input: the timestep's embedding plus the pooled vector's; every modulation reads its SiLU.
        let t_emb = {
            let emb =
                crate::timestep::sinusoid(input.timesteps.iter().copied(), T_FREQ_DIM / 2, 1.0);
            let emb = b.from_f32(&[batch, T_FREQ_DIM], &emb, DType::F32)?;
            self.embedder(b, "t_embedder.timestep_embedder", &b.cast(&emb, dt)?)?
        };
        let pooled = match input.pooled {
            Some(p) => b.cast(p, dt)?,
            None => b.full(&[batch, cfg.pooled_width], 0.0, dt)?,
        };
        let p_emb = self.embedder(b, "p_embedder.pooled_embedder", &pooled)?;
        let silu_adaln = b.unary(&b.binary(&t_emb, &p_emb, BinaryOp::Add)?, UnaryOp::Silu)?;
        drop((t_emb, p_emb, pooled));

        let mut img = {
            let layer = self.fetch(b, &["x_embedder.proj.weight", "x_embedder.proj.bias"])?;
            let tokens = patchify(b, &x, PATCH)?;
            b.linear(&tokens, &layer.weight(0), Some(&layer.weight(1)))?
        };
        drop(x);

        // The text stream: T5-XXL's tokens, then the last block's Llama tokens.
        let states = input.llama.dim(1)?;
        let t5 = self.project(b, cfg.blocks(), &b.cast(input.context, dt)?)?;
        let last = self.llama_tokens(b, input.llama, cfg.blocks() - 1, (states, batch))?;
        let mut text = b.concat(&[&t5, &last], 1)?;
        let text_len = text.dim(1)?;
        drop(t5);
        let llama_len = input.llama.dim(2)?;
        let rope = rope_table(b, rows, cols, text_len + llama_len)?;

        // The last block's own tokens are the stream's: projected once.
        let own_tokens = |k: usize| -> Result<Tensor<B>> {
            match k + 1 == cfg.blocks() {
                true => Ok(last.clone()),
                false => self.llama_tokens(b, input.llama, k, (states, batch)),
            }
        };
        for k in 0..cfg.double_blocks {
            let own = own_tokens(k)?;
            let txt = b.concat(&[&text, &own], 1)?;
            drop(own);
            let (i, t) = self.double_block(b, k, &img, &txt, &silu_adaln, &rope)?;
            img = i;
            text = b.slice(&t, 1, 0, text_len)?;
        }
        let mut hidden = b.concat(&[&img, &text], 1)?;
        drop((img, text));
        let hidden_len = hidden.dim(1)?;
        for k in cfg.double_blocks..cfg.blocks() {
            let own = own_tokens(k)?;
            let joint = b.concat(&[&hidden, &own], 1)?;
            drop(own);
            let out = self.single_block(b, k, &joint, &silu_adaln, &rope)?;
            hidden = b.slice(&out, 1, 0, hidden_len)?;
        }
        let img = b.slice(&hidden, 1, 0, image_len)?;
        drop(hidden);

        // Final layer: (shift, scale) from SiLU(adaLN input), then the projection to patches.
        let layer = self.fetch(
            b,
            &[
                "final_layer.adaLN_modulation.1.weight",
                "final_layer.adaLN_modulation.1.bias",
                "final_layer.linear.weight",
                "final_layer.linear.bias",
            ],
        )?;
        let m = b.linear(&silu_adaln, &layer.weight(0), Some(&layer.weight(1)))?;
        let (shift, scale) = (b.slice(&m, -1, 0, cfg.dim)?, b.slice(&m, -1, cfg.dim, cfg.dim)?);
        let y = b.modulate(&b.layer_norm(&img, None, None, LN_EPS)?, &scale, Some(&shift))?;
        let y = b.linear(&y, &layer.weight(2), Some(&layer.weight(3)))?;
        let mut out =
            unpatchify(b, &y, LATENT_CHANNELS, (rows, cols), PATCH, PatchOrder::ChannelsLast)?;
        if rows * PATCH > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if cols * PATCH > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        let out = b.affine(&b.cast(&out, DType::F32)?, -1.0, 0.0)?;
        Ok(out)
    }

    /// Checks the inputs' shapes: returns (batch, h, w) of the latents.
    fn check_inputs<B: Backend>(
        &self,
        input: &HiDreamInput<'_, B>,
    ) -> Result<(usize, usize, usize)> {
        let cfg = &self.config;
        let &[batch, channels, h, w] = input.x.shape() else {
            return Err(Error::Invalid(format!(
                "HiDream latents must be [B, {LATENT_CHANNELS}, h, w], got {:?}",
                input.x.shape()
            )));
        };
        if channels != LATENT_CHANNELS || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "HiDream takes non-empty latents of {LATENT_CHANNELS} channels, got {:?}",
                input.x.shape()
            )));
        }
        if input.timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a batch of {batch}",
                input.timesteps.len()
            )));
        }
        match input.context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.t5_width => {}
            other => {
                return Err(Error::Invalid(format!(
                    "HiDream's T5-XXL conditioning must be [{batch}, N > 0, {}], got {other:?}",
                    cfg.t5_width
                )));
            }
        }
        match input.llama.shape() {
            &[lb, layers, n, width]
                if (lb == 1 || lb == batch) && layers > 0 && n > 0 && width == cfg.llama_width => {}
            other => {
                return Err(Error::Invalid(format!(
                    "HiDream's Llama states must be [1 or {batch}, layers, N > 0, {}], got {other:?}",
                    cfg.llama_width
                )));
            }
        }
        if let Some(pooled) = input.pooled {
            match pooled.shape() {
                &[pb, width] if pb == batch && width == cfg.pooled_width => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "HiDream's pooled vector must be [{batch}, {}] (CLIP-L's and CLIP-G's), got {other:?}",
                        cfg.pooled_width
                    )));
                }
            }
        }
        if let Some(image) = input.image_cond {
            match image.shape() {
                &[ib, c, ih, _] if (ib == 1 || ib == batch) && c == LATENT_CHANNELS && ih == h => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "HiDream E1's image latent must be [1 or {batch}, {LATENT_CHANNELS}, {h}, w'] (as high \
                         as the latents, which it is joined to along the width), got {other:?}: scale the image \
                         to the output's size"
                    )));
                }
            }
        }
        Ok((batch, h, w))
    }

    fn fetch<B: Backend>(&self, b: &B, names: &[&str]) -> Result<Layer<'_>> {
        Ok(self.weights.fetch(b, names)?)
    }

    /// `linear_2(SiLU(linear_1(x)))` of the embedder under `stem`.
    fn embedder<B: Backend>(&self, b: &B, stem: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let names = ["linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias"]
            .map(|n| format!("{stem}.{n}"));
        let layer = self.fetch(b, &names.each_ref().map(String::as_str))?;
        let hidden = b.linear(x, &layer.weight(0), Some(&layer.weight(1)))?;
        let hidden = b.unary(&hidden, UnaryOp::Silu)?;
        Ok(b.linear(&hidden, &layer.weight(2), Some(&layer.weight(3)))?)
    }

    /// `x` through caption projection `k`.
    fn project<B: Backend>(&self, b: &B, k: usize, x: &Tensor<B>) -> Result<Tensor<B>> {
        let name = caption_projection(k);
        let layer = self.fetch(b, &[name.as_str()])?;
        Ok(b.linear(x, &layer.weight(0), None)?)
    }

    /// Block `k`'s Llama tokens `[B, M, D]`: its Llama state (of `states`, repeated to `batch`) through its caption
    /// projection.
    fn llama_tokens<B: Backend>(
        &self,
        b: &B,
        llama: &Tensor<B>,
        k: usize,
        (states, batch): (usize, usize),
    ) -> Result<Tensor<B>> {
        let index = self.config.llama_state(k, states);
        let &[rows, _, n, width] = llama.shape() else {
            return Err(Error::Invalid(format!("Llama states {:?}", llama.shape())));
        };
        let state = b.slice(llama, 1, index, 1)?.reshape(&[rows, n, width])?;
        let state = to_batch(b, &state, batch)?;
        self.project(b, k, &b.cast(&state, b.compute_dtype())?)
    }

    /// The `sets` modulations of the block's `adaLN_modulation` (weights at 0 and 1 of `layer`).
    fn modulations<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        silu_adaln: &Tensor<B>,
        sets: usize,
    ) -> Result<Vec<Modulation<B>>> {
        let m = b.linear(silu_adaln, &layer.weight(0), Some(&layer.weight(1)))?;
        Modulation::sets(b, &m, self.config.dim, sets)
    }

    /// q, k, v `[B, L, H, 128]` of `x` by the projections at `at` in `layer` ([`attention_names`]' order): q and k
    /// RMS-normed over the whole width before the heads are split.
    fn qkv<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        at: usize,
        x: &Tensor<B>,
    ) -> Result<[Tensor<B>; 3]> {
        let (batch, len) = (x.dim(0)?, x.dim(1)?);
        let heads = self.config.heads;
        let lin = |i: usize| b.linear(x, &layer.weight(at + i), Some(&layer.weight(at + i + 1)));
        let q = b.rms_norm(&lin(0)?, Some(&layer.weight(at + 6)), QK_EPS)?;
        let k = b.rms_norm(&lin(2)?, Some(&layer.weight(at + 7)), QK_EPS)?;
        let v = lin(4)?;
        let split = |t: Tensor<B>| t.reshape(&[batch, len, heads, HEAD_DIM]);
        Ok([split(q)?, split(k)?, split(v)?])
    }

    /// Unmasked attention over a joint sequence `[B, N, H, 128]` (RoPE on q and k), back to `[B, N, D]`.
    fn attention<B: Backend>(
        &self,
        b: &B,
        [q, k, v]: [Tensor<B>; 3],
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let n = q.dim(1)?;
        let (cos, sin) = (b.slice(&rope.cos, 0, 0, n)?, b.slice(&rope.sin, 0, 0, n)?);
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let q = heads_first(&b.rope(&q, &cos, &sin, RopeLayout::Interleaved)?)?;
        let k = heads_first(&b.rope(&k, &cos, &sin, RopeLayout::Interleaved)?)?;
        let v = heads_first(&v)?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (HEAD_DIM as f32).sqrt())?;
        let batch = o.dim(0)?;
        Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, self.config.dim])?)
    }

    /// Double-stream block `k` on the image tokens and its text tokens.
    fn double_block<B: Backend>(
        &self,
        b: &B,
        k: usize,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        silu_adaln: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let p = block_prefix(&self.config, k);
        let mut names =
            vec![format!("{p}.adaLN_modulation.1.weight"), format!("{p}.adaLN_modulation.1.bias")];
        names.extend(attention_names(&p, ""));
        names.extend(attention_names(&p, "_t"));
        let layer = self.fetch(b, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        let mods = self.modulations(b, &layer, silu_adaln, 4)?;
        let [attn_i, mlp_i, attn_t, mlp_t] = &mods[..] else {
            return Err(Error::Invalid(
                "internal: a HiDream double block's modulations".to_owned(),
            ));
        };
        let [qi, ki, vi] = self.qkv(b, &layer, 2, &attn_i.modulated(b, img, LN_EPS)?)?;
        let [qt, kt, vt] = self.qkv(b, &layer, 12, &attn_t.modulated(b, txt, LN_EPS)?)?;
        let joint = |a: &Tensor<B>, t: &Tensor<B>| b.concat(&[a, t], 1);
        let attn =
            self.attention(b, [joint(&qi, &qt)?, joint(&ki, &kt)?, joint(&vi, &vt)?], rope)?;
        drop((qi, ki, vi, qt, kt, vt));
        let image_len = img.dim(1)?;
        let attn_img = b.slice(&attn, 1, 0, image_len)?;
        let attn_txt = b.slice(&attn, 1, image_len, txt.dim(1)?)?;
        drop(attn);
        let out_i = b.linear(&attn_img, &layer.weight(10), Some(&layer.weight(11)))?;
        let out_t = b.linear(&attn_txt, &layer.weight(20), Some(&layer.weight(21)))?;
        let img = attn_i.gated_add(b, img, &out_i)?;
        let txt = attn_t.gated_add(b, txt, &out_t)?;
        drop((layer, out_i, out_t));

        let ff_i = self.image_feed_forward(b, &p, &mlp_i.modulated(b, &img, LN_EPS)?)?;
        let img = mlp_i.gated_add(b, &img, &ff_i)?;
        let ff_t = self.swiglu(b, &format!("{p}.ff_t"), &mlp_t.modulated(b, &txt, LN_EPS)?)?;
        let txt = mlp_t.gated_add(b, &txt, &ff_t)?;
        Ok((img, txt))
    }

    /// Single-stream block `k` on the joint sequence (image, text stream, the block's Llama tokens).
    fn single_block<B: Backend>(
        &self,
        b: &B,
        k: usize,
        x: &Tensor<B>,
        silu_adaln: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let p = block_prefix(&self.config, k);
        let mut names =
            vec![format!("{p}.adaLN_modulation.1.weight"), format!("{p}.adaLN_modulation.1.bias")];
        names.extend(attention_names(&p, ""));
        let layer = self.fetch(b, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        let mods = self.modulations(b, &layer, silu_adaln, 2)?;
        let [attn_m, mlp_m] = &mods[..] else {
            return Err(Error::Invalid(
                "internal: a HiDream single block's modulations".to_owned(),
            ));
        };
        let qkv = self.qkv(b, &layer, 2, &attn_m.modulated(b, x, LN_EPS)?)?;
        let attn = self.attention(b, qkv, rope)?;
        let out = b.linear(&attn, &layer.weight(10), Some(&layer.weight(11)))?;
        drop((layer, attn));
        let x = attn_m.gated_add(b, x, &out)?;
        let ff = self.image_feed_forward(b, &p, &mlp_m.modulated(b, &x, LN_EPS)?)?;
        mlp_m.gated_add(b, &x, &ff)
    }

    /// `w2(SiLU(w1·x) ⊙ w3·x)` of the SwiGLU under `stem`.
    fn swiglu<B: Backend>(&self, b: &B, stem: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let names = ["w1.weight", "w2.weight", "w3.weight"].map(|n| format!("{stem}.{n}"));
        let layer = self.fetch(b, &names.each_ref().map(String::as_str))?;
        let gate = b.linear(x, &layer.weight(0), None)?;
        let up = b.linear(x, &layer.weight(2), None)?;
        let hidden = b.gated(&gate, &up, UnaryOp::Silu)?;
        Ok(b.linear(&hidden, &layer.weight(1), None)?)
    }

    /// The image stream's feed-forward of block `prefix` on `x` `[B, L, D]`: the routed experts' outputs
    /// weighted by the gate's scores of the [`ACTIVE_EXPERTS`] best (softmax over all, not renormalised), then
    /// the shared expert's added (ComfyUI's `MOEFeedForwardSwiGLU`); a plain SwiGLU without experts.
    fn image_feed_forward<B: Backend>(
        &self,
        b: &B,
        prefix: &str,
        x: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let experts = self.config.experts;
        let stem = format!("{prefix}.ff_i");
        if experts == 0 {
            return self.swiglu(b, &stem, x);
        }
        let scores = {
            let gate = format!("{stem}.gate.weight");
            let layer = self.fetch(b, &[gate.as_str()])?;
            b.to_f32(&b.softmax(&b.linear(x, &layer.weight(0), None)?)?)?
        };
        let weights = routing_weights(&scores, experts, ACTIVE_EXPERTS.min(experts));
        let (batch, len) = (x.dim(0)?, x.dim(1)?);
        let mut routed: Option<Tensor<B>> = None;
        for (e, column) in weights.iter().enumerate() {
            if column.iter().all(|&w| w == 0.0) {
                continue;
            }
            let out = self.swiglu(b, &format!("{stem}.experts.{e}"), x)?;
            let column = b.from_f32(&[batch, len, 1], column, b.compute_dtype())?;
            let weighted = b.binary(&out, &column, BinaryOp::Mul)?;
            routed = Some(match routed {
                Some(sum) => b.binary(&sum, &weighted, BinaryOp::Add)?,
                None => weighted,
            });
        }
        let shared = self.swiglu(b, &format!("{stem}.shared_experts"), x)?;
        match routed {
            Some(routed) => Ok(b.binary(&routed, &shared, BinaryOp::Add)?),
            None => Ok(shared),
        }
    }
}

/// Per expert, each token's weight: its gate score where the expert is among the token's `active` best, else
/// 0. `scores` is `[tokens, experts]` row-major. Ties go to the lower index.
fn routing_weights(scores: &[f32], experts: usize, active: usize) -> Vec<Vec<f32>> {
    let tokens = scores.len() / experts;
    let mut weights = vec![vec![0.0; tokens]; experts];
    let mut order: Vec<usize> = (0..experts).collect();
    for (t, row) in scores.chunks_exact(experts).enumerate() {
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        for &e in &order[..active] {
            weights[e][t] = row[e];
        }
    }
    weights
}

/// Latents `[B, C, H, W]` (H, W multiples of `p`) → tokens `[B, (H/p)·(W/p), p²·C]`, token (r, s) row-major,
/// feature `(py·p + px)·C + c` (ComfyUI's HiDream `patchify`: `(p1 p2 C)`, channels last, unlike FLUX's).
fn patchify<B: Backend>(b: &B, x: &Tensor<B>, p: usize) -> Result<Tensor<B>> {
    let &[batch, c, h, w] = x.shape() else {
        return Err(Error::Invalid(format!("latents {:?} are not [B, C, H, W]", x.shape())));
    };
    let (rows, cols) = (h / p, w / p);
    let t = x.reshape(&[batch, c, rows, p, cols, p])?;
    let t = b.permute(&t, &[0, 2, 4, 3, 5, 1])?;
    Ok(t.reshape(&[batch, rows * cols, p * p * c])?)
}

/// The RoPE table of the image's `rows × cols` tokens at (0, r, c), then `text` tokens at the origin.
fn rope_table<B: Backend>(b: &B, rows: usize, cols: usize, text: usize) -> Result<Rope<B>> {
    let mut positions: Vec<[i64; 3]> = Vec::with_capacity(rows * cols + text);
    for r in 0..rows as i64 {
        positions.extend((0..cols as i64).map(|c| [0, r, c]));
    }
    positions.resize(rows * cols + text, [0; 3]);
    let (cos, sin) = crate::rope::tables(&positions, AXES_DIMS, ROPE_THETA);
    let half = HEAD_DIM / 2;
    Rope::upload(b, &cos, &sin, half, DType::F32)
}

#[cfg(test)]
mod tests {
    use super::routing_weights;

    #[test]
    fn each_token_keeps_its_best_experts_scores() {
        let scores = [0.1, 0.5, 0.15, 0.25, 0.4, 0.3, 0.2, 0.1];
        let w = routing_weights(&scores, 4, 2);
        assert_eq!(w[0], vec![0.0, 0.4]);
        assert_eq!(w[1], vec![0.5, 0.3]);
        assert_eq!(w[2], vec![0.0, 0.0]);
        assert_eq!(w[3], vec![0.25, 0.0]);
    }
}
