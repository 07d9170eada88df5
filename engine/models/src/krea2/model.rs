//! [`Krea2`]: the DiT's forward pass (ComfyUI's `SingleStreamDiT._forward`), reading one block's weights at a
//! time through [`Model::fetch`].

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{
    Config, EPS, HEAD_DIM, INDEX_TIMESTEP_ZERO, MARKER, PATCH, ROPE_THETA, TEXT_FUSION_BLOCKS,
    block_names,
};
use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::latent_tokens::{self, PatchOrder, to_batch};
use crate::named::{fetch, linear};
use crate::rope::Rope;

/// A loaded Krea 2 DiT: its config and weights (under ComfyUI's names, from [`super::load_plan`]).
pub struct Krea2 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// Where a weight of [`block_names`] sits in a block's fetch (after `mod.lin` in an image block's).
mod slot {
    pub(super) const PRENORM: usize = 0;
    pub(super) const POSTNORM: usize = 1;
    pub(super) const WQ: usize = 2;
    pub(super) const WK: usize = 3;
    pub(super) const WV: usize = 4;
    pub(super) const GATE: usize = 5;
    pub(super) const WO: usize = 6;
    pub(super) const QNORM: usize = 7;
    pub(super) const KNORM: usize = 8;
    pub(super) const MLP_GATE: usize = 9;
    pub(super) const MLP_UP: usize = 10;
    pub(super) const MLP_DOWN: usize = 11;
}

/// A block's weights as one fetch, [`block_names`]' from `base` on.
struct BlockWeights<'l, 'm> {
    layer: &'l Layer<'m>,
    base: usize,
}

impl BlockWeights<'_, '_> {
    /// The weight in `slot` (see [`slot`]).
    fn get(&self, slot: usize) -> Weight<'_> {
        self.layer.weight(self.base + slot)
    }
}

/// An attention's head layout: query heads and key/value heads, each [`HEAD_DIM`] wide.
#[derive(Debug, Clone, Copy)]
struct Heads {
    query: usize,
    kv: usize,
}

/// A block's two modulations (attention `[0]`, MLP `[1]`) by token range: each applies from its first token (the
/// first's from token 0) to the next one's. One range, or with `index_timestep_zero` a second from the first
/// reference token (the t = 0 embedding's).
struct Modulations<B: Backend> {
    ranges: Vec<(usize, [Modulation<B>; 2])>,
}

impl<B: Backend> Modulations<B> {
    /// The modulations `tvec + lin` of each `(first token, tvec [B, 6F])`: chunks (scale, shift, gate) of the
    /// attention then of the MLP (ComfyUI's `DoubleSharedModulation` order: scale before shift).
    fn of(b: &B, tvecs: &[(usize, &Tensor<B>)], lin: &Tensor<B>, f: usize) -> Result<Self> {
        let ranges = tvecs
            .iter()
            .map(|&(at, tvec)| {
                let m = b.binary(tvec, lin, BinaryOp::Add)?;
                let batch = m.dim(0)?;
                let chunk = |k: usize| b.slice(&m, -1, k * f, f);
                let set = |k: usize| -> Result<Modulation<B>> {
                    Ok(Modulation {
                        scale: chunk(k)?,
                        shift: chunk(k + 1)?,
                        gate: chunk(k + 2)?.reshape(&[batch, 1, f])?,
                    })
                };
                Ok((at, [set(0)?, set(3)?]))
            })
            .collect::<Result<_>>()?;
        Ok(Modulations { ranges })
    }

    /// `normed · (1 + scale) + shift` for sub-layer `k`.
    fn modulated(&self, b: &B, normed: &Tensor<B>, k: usize) -> Result<Tensor<B>> {
        self.per_range(b, normed, |n, m| Ok(b.modulate(n, &m[k].scale, Some(&m[k].shift))?))
    }

    /// `x + y · gate` for sub-layer `k`.
    fn gated_add(&self, b: &B, x: &Tensor<B>, y: &Tensor<B>, k: usize) -> Result<Tensor<B>> {
        let gated = self.per_range(b, y, |y, m| m[k].gated(b, y))?;
        Ok(b.binary(x, &gated, BinaryOp::Add)?)
    }

    /// `f` on `x` `[B, N, D]` with each token range's modulations, joined along the tokens.
    fn per_range(
        &self,
        b: &B,
        x: &Tensor<B>,
        f: impl Fn(&Tensor<B>, &[Modulation<B>; 2]) -> Result<Tensor<B>>,
    ) -> Result<Tensor<B>> {
        if let [(_, only)] = self.ranges.as_slice() {
            return f(x, only);
        }
        let tokens = x.dim(1)?;
        let mut parts = Vec::with_capacity(self.ranges.len());
        for (r, (start, m)) in self.ranges.iter().enumerate() {
            let end = self.ranges.get(r + 1).map_or(tokens, |(next, _)| *next);
            parts.push(f(&b.slice(x, 1, *start, end - start)?, m)?);
        }
        Ok(b.concat(&parts.iter().collect::<Vec<_>>(), 1)?)
    }
}

/// The checked input's sizes.
struct Sizes {
    batch: usize,
    h: usize,
    w: usize,
    /// 4 for `[B, C, H, W]`, 5 for `[B, C, 1, H, W]`.
    rank: usize,
}

impl Krea2 {
    /// The DiT of `config` with `weights` loaded from [`super::load_plan`].
    pub fn new(config: Config, weights: Model) -> Krea2 {
        Krea2 { config, weights }
    }

    /// ComfyUI's model output (`SingleStreamDiT`'s return; the flow velocity, denoised = x − out · σ) for
    /// latents `x` `[B, channels, H, W]` or `[B, channels, 1, H, W]` (model space, any float dtype), `sigmas`
    /// (one per sample: the model's timestep is σ, which it scales by 1000 itself) and `context`
    /// `[1 or B, N, text_layers · text_dim]` (the tapped text states joined per token, as ComfyUI's Krea 2 text
    /// encoder gives them): f32 in `x`'s shape, computed in `b.compute_dtype()`. Odd sides are padded circularly
    /// to the patch and cropped back.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        self.forward_with_references(b, x, sigmas, context, &[], None)
    }

    /// [`Krea2::forward`] with reference latents (ComfyUI's `ref_latents`), each `[1 or B, channels, h, w]` (or
    /// with a frame axis of 1) in model space, placed as ComfyUI's `ref_latents_method` `method` says: `None`
    /// (the model's default: ComfyUI's detection sets none) ignores them; any method appends the i-th one's
    /// patches after the latent's at RoPE positions (i, row, column), repeated to the batch; with
    /// [`INDEX_TIMESTEP_ZERO`] their tokens are modulated by the embedding of timestep 0 in every block, with any
    /// other name ("offset", "index", "uxo") by the sample's own. Only the latent's tokens come out.
    pub fn forward_with_references<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
        references: &[Tensor<B>],
        method: Option<&str>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let m = &self.weights;
        let Sizes { batch, h, w, rank } = self.check_inputs(x, sigmas, context)?;
        let dt = b.compute_dtype();

        // Image tokens: the latent's, then (with a method) each reference's, through `first`.
        let latent = b.cast(x, dt)?.reshape(&[batch, cfg.channels, h, w])?;
        let (latent, rows, cols) = latent_tokens::padded(b, &latent, PATCH)?;
        let image_len = rows * cols;
        let mut tokens = vec![latent_tokens::patchify(b, &latent, PATCH)?];
        let mut positions = grid(0, rows, cols);
        let with_references = method.is_some() && !references.is_empty();
        if with_references {
            for (i, reference) in references.iter().enumerate() {
                let reference = b.cast(&self.reference(reference, batch)?, dt)?;
                let reference = to_batch(b, &reference, batch)?;
                let (reference, ref_rows, ref_cols) = latent_tokens::padded(b, &reference, PATCH)?;
                tokens.push(latent_tokens::patchify(b, &reference, PATCH)?);
                positions.extend(grid(i as i64 + 1, ref_rows, ref_cols));
            }
        }
        let img = linear(b, m, "first", &b.concat(&tokens.iter().collect::<Vec<_>>(), 1)?)?;
        drop(tokens);

        // t = tmlp(sinusoid(1000·t)), tvec = tproj(t); with index_timestep_zero the batch's t = 0 rows after.
        let timestep_zero = with_references && method == Some(INDEX_TIMESTEP_ZERO);
        let timesteps =
            if timestep_zero { [sigmas, &vec![0.0; batch]].concat() } else { sigmas.to_vec() };
        let (t, tvec) = self.time_embedding(b, &timesteps)?;

        let txt = self.text(b, context, batch)?;
        let text_len = txt.dim(1)?;
        let mut joint = b.concat(&[&txt, &img], 1)?;
        drop((txt, img));
        let rope = {
            let mut all = vec![[0i64; 3]; text_len];
            all.extend(positions);
            let (cos, sin) = crate::rope::tables(&all, cfg.axes, ROPE_THETA);
            Rope::upload(b, &cos, &sin, HEAD_DIM / 2, DType::F32)?
        };
        let tvecs = if timestep_zero {
            vec![
                (0, b.slice(&tvec, 0, 0, batch)?),
                (text_len + image_len, b.slice(&tvec, 0, batch, batch)?),
            ]
        } else {
            vec![(0, tvec)]
        };
        let tvecs: Vec<(usize, &Tensor<B>)> = tvecs.iter().map(|(at, t)| (*at, t)).collect();
        for i in 0..cfg.layers {
            joint = self.image_block(b, i, &joint, &tvecs, &rope)?;
        }

        // The last layer on the latent's tokens, modulated by t (not tvec): scale t + lin[0], shift t + lin[1].
        let img = b.slice(&joint, 1, text_len, image_len)?;
        drop(joint);
        let names =
            ["last.modulation.lin", "last.norm.scale", "last.linear.weight", "last.linear.bias"]
                .map(str::to_owned);
        let layer = fetch(b, m, &names)?;
        let lin = b.weight_to_tensor(&layer.weight(0), dt)?;
        let t = b.slice(&t, 0, 0, batch)?;
        let scale = b.binary(&t, &b.slice(&lin, 0, 0, 1)?, BinaryOp::Add)?;
        let shift = b.binary(&t, &b.slice(&lin, 0, 1, 1)?, BinaryOp::Add)?;
        let y = b.modulate(&rms_norm(b, &img, &layer.weight(1))?, &scale, Some(&shift))?;
        let y = b.linear(&y, &layer.weight(2), Some(&layer.weight(3)))?;
        drop(layer);
        let c = cfg.channels;
        let mut out =
            latent_tokens::unpatchify(b, &y, c, (rows, cols), PATCH, PatchOrder::ChannelMajor)?;
        if rows * PATCH > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if cols * PATCH > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        if rank == 5 {
            out = out.reshape(&[batch, c, 1, h, w])?;
        }
        Ok(b.cast(&out, DType::F32)?)
    }

    /// Checks the input shapes.
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<Sizes> {
        let cfg = &self.config;
        let (batch, channels, h, w, rank) = match *x.shape() {
            [batch, c, h, w] => (batch, c, h, w, 4),
            [batch, c, 1, h, w] => (batch, c, h, w, 5),
            ref other => {
                return Err(Error::Invalid(format!(
                    "Krea 2 latents must be [B, {}, H, W] or [B, {}, 1, H, W], got {other:?}",
                    cfg.channels, cfg.channels
                )));
            }
        };
        if channels != cfg.channels || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "Krea 2 takes non-empty latents of {} channels, got {:?}",
                cfg.channels,
                x.shape()
            )));
        }
        if sigmas.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a Krea 2 batch of {batch}",
                sigmas.len()
            )));
        }
        let width = cfg.context_dim();
        match *context.shape() {
            [cb, n, cw] if (cb == 1 || cb == batch) && n > 0 && cw == width => {}
            [_, _, cw] if cw != width => {
                return Err(Error::Invalid(format!(
                    "Krea 2 reads {width} features a text token ({} tapped layers of {}: a Qwen3-VL 4B stack), \
                     this conditioning has {cw}: load the text encoder with CLIPLoader type krea2",
                    cfg.text_layers, cfg.text_dim
                )));
            }
            ref other => {
                return Err(Error::Invalid(format!(
                    "Krea 2 conditioning must be [1 or {batch}, N > 0, {width}], got {other:?}"
                )));
            }
        }
        Ok(Sizes { batch, h, w, rank })
    }

    /// A reference latent as `[n, channels, h, w]`, `n` 1 or `batch` (a frame axis of 1 dropped).
    fn reference<B: Backend>(&self, reference: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
        let c = self.config.channels;
        let (rb, rc, rh, rw) = match *reference.shape() {
            [rb, rc, rh, rw] | [rb, rc, 1, rh, rw] => (rb, rc, rh, rw),
            _ => (0, 0, 0, 0),
        };
        if rc != c || !(rb == 1 || rb == batch) || rh == 0 || rw == 0 {
            return Err(Error::Invalid(format!(
                "a Krea 2 reference latent must be [1 or {batch}, {c}, h, w] (or with a frame axis of 1), got \
                 {:?}",
                reference.shape()
            )));
        }
        Ok(reference.reshape(&[rb, rc, rh, rw])?)
    }

    /// `(t, tvec)` `[n, F]` and `[n, 6F]` for timesteps `ts`: flux's sinusoid of 1000·t (f32, cos half first),
    /// `tmlp` (Linear, tanh GELU, Linear), then `tproj` (tanh GELU, Linear) for `tvec`.
    fn time_embedding<B: Backend>(&self, b: &B, ts: &[f32]) -> Result<(Tensor<B>, Tensor<B>)> {
        let (m, cfg) = (&self.weights, &self.config);
        let emb = crate::timestep::sinusoid(ts.iter().map(|t| 1000.0 * t), cfg.time_dim / 2, 1.0);
        let emb = b.from_f32(&[ts.len(), cfg.time_dim], &emb, DType::F32)?;
        let emb = b.cast(&emb, b.compute_dtype())?;
        let hidden = b.unary(&linear(b, m, "tmlp.0", &emb)?, UnaryOp::GeluTanh)?;
        let t = linear(b, m, "tmlp.2", &hidden)?;
        let tvec = linear(b, m, "tproj.1", &b.unary(&t, UnaryOp::GeluTanh)?)?;
        Ok((t, tvec))
    }

    /// The text tokens `[B, N, F]`: `context` `[1 or B, N, L·d]` as `[B·N, L, d]` through the layer-wise blocks
    /// (attention across one token's tapped layers), the projector's weighted sum over the layers, the refiner
    /// blocks (attention across the tokens, no positions), then `txtmlp` (RMSNorm, Linear, tanh GELU, Linear).
    fn text<B: Backend>(&self, b: &B, context: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
        let (m, cfg) = (&self.weights, &self.config);
        let context = b.cast(&to_batch(b, context, batch)?, b.compute_dtype())?;
        let n = context.dim(1)?;
        let (layers, d) = (cfg.text_layers, cfg.text_dim);
        let mut x = context.reshape(&[batch * n, layers, d])?;
        for i in 0..TEXT_FUSION_BLOCKS {
            x = self.text_block(b, &format!("txtfusion.layerwise_blocks.{i}"), &x)?;
        }
        let x = {
            let layer = fetch(b, m, &[MARKER.to_owned()])?;
            let across = b.permute(&x, &[0, 2, 1])?;
            b.linear(&across, &layer.weight(0), None)?
        };
        let mut x = x.reshape(&[batch, n, d])?;
        for i in 0..TEXT_FUSION_BLOCKS {
            x = self.text_block(b, &format!("txtfusion.refiner_blocks.{i}"), &x)?;
        }
        let normed = {
            let layer = fetch(b, m, &["txtmlp.0.scale".to_owned()])?;
            rms_norm(b, &x, &layer.weight(0))?
        };
        let hidden = b.unary(&linear(b, m, "txtmlp.1", &normed)?, UnaryOp::GeluTanh)?;
        linear(b, m, "txtmlp.3", &hidden)
    }

    /// The text adapter's block `p` (`TextFusionBlock`): x + attn(prenorm(x)), then x + mlp(postnorm(x)).
    fn text_block<B: Backend>(&self, b: &B, p: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let layer = fetch(b, &self.weights, &block_names(p))?;
        let w = BlockWeights { layer: &layer, base: 0 };
        let heads = Heads { query: cfg.text_heads, kv: cfg.text_kv_heads };
        let a = attention(b, &w, &rms_norm(b, x, &w.get(slot::PRENORM))?, heads, None)?;
        let x = b.binary(x, &a, BinaryOp::Add)?;
        let y = mlp(b, &w, &rms_norm(b, &x, &w.get(slot::POSTNORM))?)?;
        Ok(b.binary(&x, &y, BinaryOp::Add)?)
    }

    /// Image block `i` (`SingleStreamBlock`) on the joint tokens: x + pregate · attn((1 + prescale) · prenorm(x)
    /// + preshift), then likewise the MLP with the post set, each token range modulated by its `tvecs` entry.
    fn image_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        tvecs: &[(usize, &Tensor<B>)],
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let f = cfg.features;
        let p = format!("blocks.{i}");
        let mut names = vec![format!("{p}.mod.lin")];
        names.extend(block_names(&p));
        let layer = fetch(b, &self.weights, &names)?;
        let lin = b.weight_to_tensor(&layer.weight(0), b.compute_dtype())?.reshape(&[1, 6 * f])?;
        let mods = Modulations::of(b, tvecs, &lin, f)?;
        let w = BlockWeights { layer: &layer, base: 1 };
        let heads = Heads { query: cfg.heads, kv: cfg.kv_heads };
        let normed = mods.modulated(b, &rms_norm(b, x, &w.get(slot::PRENORM))?, 0)?;
        let a = attention(b, &w, &normed, heads, Some(rope))?;
        let x = mods.gated_add(b, x, &a, 0)?;
        let normed = mods.modulated(b, &rms_norm(b, &x, &w.get(slot::POSTNORM))?, 1)?;
        let y = mlp(b, &w, &normed)?;
        mods.gated_add(b, &x, &y, 1)
    }
}

/// The positions (index, row, column) of a `rows × cols` token grid, row-major.
fn grid(index: i64, rows: usize, cols: usize) -> Vec<[i64; 3]> {
    (0..rows as i64).flat_map(|r| (0..cols as i64).map(move |c| [index, r, c])).collect()
}

/// Krea 2's RMSNorm of `x` over its last dimension with the zero-centred weight `scale`: computed in f32 and
/// scaled by `1 + scale` (ComfyUI's `F.rms_norm(x.float(), weight = scale + 1)`), then back to `x`'s type.
fn rms_norm<B: Backend>(b: &B, x: &Tensor<B>, scale: &Weight<'_>) -> Result<Tensor<B>> {
    let dtype = x.dtype();
    let shape = x.shape().to_vec();
    let d = scale.numel();
    let scale = b.weight_to_tensor(scale, DType::F32)?.reshape(&[1, d])?;
    let wide = if dtype == DType::F32 { x.clone() } else { b.cast(x, DType::F32)? };
    let normed = b.rms_norm(&wide, None, EPS)?;
    let rows = normed.numel() / d;
    let y = b.modulate(&normed.reshape(&[1, rows, d])?, &scale, None)?.reshape(&shape)?;
    Ok(if dtype == DType::F32 { y } else { b.cast(&y, dtype)? })
}

/// A block's attention on `x` `[B, N, width]`: bias-free q, k, v and gate projections, per-head RMS norms of q
/// and k, RoPE (interleaved pairs) where given, grouped-query attention, then `wo(out · sigmoid(gate))`.
fn attention<B: Backend>(
    b: &B,
    w: &BlockWeights<'_, '_>,
    x: &Tensor<B>,
    heads: Heads,
    rope: Option<&Rope<B>>,
) -> Result<Tensor<B>> {
    let (batch, n) = (x.dim(0)?, x.dim(1)?);
    let project = |slot: usize, count: usize| -> Result<Tensor<B>> {
        Ok(b.linear(x, &w.get(slot), None)?.reshape(&[batch, n, count, HEAD_DIM])?)
    };
    let mut q = rms_norm(b, &project(slot::WQ, heads.query)?, &w.get(slot::QNORM))?;
    let mut k = rms_norm(b, &project(slot::WK, heads.kv)?, &w.get(slot::KNORM))?;
    let v = project(slot::WV, heads.kv)?;
    if let Some(rope) = rope {
        q = b.rope(&q, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
        k = b.rope(&k, &rope.cos, &rope.sin, RopeLayout::Interleaved)?;
    }
    let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
    let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(&v)?);
    let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (HEAD_DIM as f32).sqrt())?;
    let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, n, heads.query * HEAD_DIM])?;
    let gate = b.unary(&b.linear(x, &w.get(slot::GATE), None)?, UnaryOp::Sigmoid)?;
    Ok(b.linear(&b.binary(&o, &gate, BinaryOp::Mul)?, &w.get(slot::WO), None)?)
}

/// A block's SwiGLU: `down(silu(gate(x)) · up(x))`, all bias-free.
fn mlp<B: Backend>(b: &B, w: &BlockWeights<'_, '_>, x: &Tensor<B>) -> Result<Tensor<B>> {
    let gate = b.linear(x, &w.get(slot::MLP_GATE), None)?;
    let up = b.linear(x, &w.get(slot::MLP_UP), None)?;
    let hidden = b.gated(&gate, &up, UnaryOp::Silu)?;
    Ok(b.linear(&hidden, &w.get(slot::MLP_DOWN), None)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_row_major_with_their_index() {
        assert_eq!(grid(0, 1, 2), vec![[0, 0, 0], [0, 0, 1]]);
        assert_eq!(grid(2, 2, 1), vec![[2, 0, 0], [2, 1, 0]]);
    }
}
