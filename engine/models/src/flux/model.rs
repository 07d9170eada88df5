//! [`Flux`]: the FLUX.1 DiT forward pass in ComfyUI's order (models-flux.md §4.2), reading one block's weights
//! at a time through [`Model::fetch`].

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{
    AXES_DIMS, Config, DEFAULT_REFERENCE_METHOD, EPS, HEAD_DIM, LATENT_CHANNELS, Layout, PATCH,
    ROPE_THETA, T_FREQ_DIM,
};
use crate::error::{Error, Result};
use crate::latent_tokens::{
    SideBySide, batched_reference, padded, patchify, reference_sides, unpatchify,
};

/// The q/k RMS norms' ε: ComfyUI's `RMSNorm` has none, so torch takes f32's machine epsilon (also for
/// bf16 and f16 inputs, whose norm computes in f32).
const QK_EPS: f32 = f32::EPSILON;

/// A FLUX.1 DiT: its config, the layout its file was in, and its weights (ComfyUI names, no prefix) under the
/// memory manager.
pub struct Flux {
    /// The hyperparameters.
    pub config: Config,
    /// The file's key layout (diffusers' final modulation is (scale, shift)).
    pub layout: Layout,
    /// The weights.
    pub weights: Model,
}

/// What one model call takes besides the latents.
pub struct FluxInput<'a, B: Backend> {
    /// Latents `[B, in_channels, h, w]` in model space (Fill's and the control models' extra channels already
    /// joined), any float dtype.
    pub x: &'a Tensor<B>,
    /// The model's timestep per sample (σ: both of FLUX.1's model samplings hand the net σ).
    pub timesteps: &'a [f32],
    /// T5's features `[B, N, text_dim]`.
    pub context: &'a Tensor<B>,
    /// CLIP-L's pooled vector `[B, ≥ vec_dim]` (`None`: zeros, as ComfyUI feeds a conditioning without one).
    pub pooled: Option<&'a Tensor<B>>,
    /// The distilled guidance per sample; `None` leaves the guidance embedding out (`FluxDisableGuidance`).
    /// Models without `guidance_in` (schnell) ignore it.
    pub guidance: Option<&'a [f32]>,
    /// Reference latents `[1 or B, 16, h, w]` in model space (Kontext), placed after the image's tokens.
    pub references: &'a [Tensor<B>],
    /// How the references are placed (`offset`, Kontext's default; `index`; `uxo`).
    pub method: Option<&'a str>,
}

/// The joint sequence's RoPE table (text, then image, then references), `[tokens, 64]` f32 each.
struct Rope<B: Backend> {
    cos: Tensor<B>,
    sin: Tensor<B>,
}

/// One modulation's (shift, scale, gate) chunks, `[B, D]`, `[B, D]` and `[B, 1, D]`.
struct Modulation<B: Backend> {
    shift: Tensor<B>,
    scale: Tensor<B>,
    gate: Tensor<B>,
}

impl<B: Backend> Modulation<B> {
    /// LayerNorm(x) · (1 + scale) + shift.
    fn modulated(&self, b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
        let n = b.layer_norm(x, None, None, EPS)?;
        Ok(b.modulate(&n, &self.scale, Some(&self.shift))?)
    }

    /// x + y · gate.
    fn gated_add(&self, b: &B, x: &Tensor<B>, y: &Tensor<B>) -> Result<Tensor<B>> {
        Ok(b.binary(x, &b.binary(y, &self.gate, BinaryOp::Mul)?, BinaryOp::Add)?)
    }
}

/// Where a latent's token grid sits on the RoPE axes.
#[derive(Debug, Clone, Copy)]
struct Placement {
    index: i64,
    rows: usize,
    cols: usize,
    row_offset: usize,
    col_offset: usize,
}

impl Placement {
    /// Appends the grid's positions, row-major: (index, r + row_offset, s + col_offset).
    fn extend(&self, out: &mut Vec<[i64; 3]>) {
        let (ro, co) = (self.row_offset as i64, self.col_offset as i64);
        for r in 0..self.rows as i64 {
            out.extend((0..self.cols as i64).map(|s| [self.index, r + ro, s + co]));
        }
    }
}

impl Flux {
    /// A model from its config, its file's layout and its loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, layout: Layout, weights: Model) -> Flux {
        Flux { config, layout, weights }
    }

    /// ComfyUI's model output v = ε − x₀ (no sign flip) for `input`, f32 `[B, 16, h, w]`. Computes in
    /// `b.compute_dtype()`; odd `h`/`w` are padded circularly and cropped back.
    pub fn forward<B: Backend>(&self, b: &B, input: &FluxInput<'_, B>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, h, w) = self.check_inputs(input)?;
        let dt = b.compute_dtype();
        let (x, rows, cols) = padded(b, &b.cast(input.x, dt)?, PATCH)?;
        let image_len = rows * cols;
        let mut tokens = vec![patchify(b, &x, PATCH)?];
        let mut positions: Vec<[i64; 3]> = vec![[0; 3]; input.context.dim(1)?];
        let image = Placement { index: 0, rows, cols, row_offset: 0, col_offset: 0 };
        image.extend(&mut positions);
        for (reference, place) in self.place_references(b, input, batch, (rows, cols))? {
            place.extend(&mut positions);
            tokens.push(patchify(b, &reference, PATCH)?);
        }
        let rope = rope_table(b, &positions)?;

        let silu_vec = b.unary(&self.vector(b, input, batch)?, UnaryOp::Silu)?;
        let mut img = {
            let layer = self.fetch(b, &["img_in.weight", "img_in.bias"])?;
            let tokens: Vec<&Tensor<B>> = tokens.iter().collect();
            b.linear(&b.concat(&tokens, 1)?, &layer.weight(0), Some(&layer.weight(1)))?
        };
        drop(tokens);
        let mut txt = {
            let layer = self.fetch(b, &["txt_in.weight", "txt_in.bias"])?;
            b.linear(&b.cast(input.context, dt)?, &layer.weight(0), Some(&layer.weight(1)))?
        };
        for i in 0..cfg.double_blocks {
            (img, txt) = self.double_block(b, i, &img, &txt, &silu_vec, &rope)?;
        }
        let text_len = txt.dim(1)?;
        let mut joint = b.concat(&[&txt, &img], 1)?;
        drop((img, txt));
        for i in 0..cfg.single_blocks {
            joint = self.single_block(b, i, &joint, &silu_vec, &rope)?;
        }
        let img = b.slice(&joint, 1, text_len, image_len)?;
        drop(joint);

        // Final layer: adaLN (shift, scale) in ComfyUI's files, then the projection to patches.
        let layer = self.fetch(
            b,
            &[
                "final_layer.adaLN_modulation.1.weight",
                "final_layer.adaLN_modulation.1.bias",
                "final_layer.linear.weight",
                "final_layer.linear.bias",
            ],
        )?;
        let emb = b.linear(&silu_vec, &layer.weight(0), Some(&layer.weight(1)))?;
        let (first, second) =
            (b.slice(&emb, -1, 0, cfg.dim)?, b.slice(&emb, -1, cfg.dim, cfg.dim)?);
        let (shift, scale) =
            if self.layout.final_scale_first() { (second, first) } else { (first, second) };
        let y = b.modulate(&b.layer_norm(&img, None, None, EPS)?, &scale, Some(&shift))?;
        let y = b.linear(&y, &layer.weight(2), Some(&layer.weight(3)))?;
        let mut out = unpatchify(b, &y, LATENT_CHANNELS, (rows, cols), PATCH)?;
        if rows * PATCH > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if cols * PATCH > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        Ok(b.cast(&out, DType::F32)?)
    }

    /// Checks the inputs' shapes: returns (batch, h, w).
    fn check_inputs<B: Backend>(&self, input: &FluxInput<'_, B>) -> Result<(usize, usize, usize)> {
        let cfg = &self.config;
        let &[batch, channels, h, w] = input.x.shape() else {
            return Err(Error::Invalid(format!(
                "{} latents must be [B, {}, h, w], got {:?}",
                cfg.variant(),
                cfg.in_channels,
                input.x.shape()
            )));
        };
        if channels != cfg.in_channels || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "{} takes non-empty latents of {} channels, got {:?}",
                cfg.variant(),
                cfg.in_channels,
                input.x.shape()
            )));
        }
        if input.timesteps.len() != batch {
            return Err(Error::Invalid(format!(
                "{} timesteps for a batch of {batch}",
                input.timesteps.len()
            )));
        }
        if let Some(g) = input.guidance
            && g.len() != batch
        {
            return Err(Error::Invalid(format!(
                "{} guidance values for a batch of {batch}",
                g.len()
            )));
        }
        match input.context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == cfg.text_dim => {}
            other => {
                return Err(Error::Invalid(format!(
                    "{} conditioning must be [{batch}, N > 0, {}] (T5-XXL's features), got {other:?}",
                    cfg.variant(),
                    cfg.text_dim
                )));
            }
        }
        if let (Some(pooled), Some(vec_dim)) = (input.pooled, cfg.vec_dim) {
            match pooled.shape() {
                &[pb, width] if pb == batch && width >= vec_dim => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "{}'s pooled vector must be [{batch}, {vec_dim}] (CLIP-L's), got {other:?}",
                        cfg.variant()
                    )));
                }
            }
        }
        Ok((batch, h, w))
    }

    /// Gets `names` on the device (one layer of the per-layer protocol).
    fn fetch<B: Backend>(&self, b: &B, names: &[&str]) -> Result<Layer<'_>> {
        Ok(self.weights.fetch(b, names)?)
    }

    /// vec `[B, D]`: time_in(E(σ)), plus guidance_in(E(g)) where the model and the input have guidance, plus
    /// vector_in(pooled) where the model has `vector_in` (zeros without a pooled vector).
    fn vector<B: Backend>(
        &self,
        b: &B,
        input: &FluxInput<'_, B>,
        batch: usize,
    ) -> Result<Tensor<B>> {
        let mut vec = self.embedder(b, "time_in", &sinusoid(b, input.timesteps)?)?;
        if self.config.guidance
            && let Some(g) = input.guidance
        {
            let guidance = self.embedder(b, "guidance_in", &sinusoid(b, g)?)?;
            vec = b.binary(&vec, &guidance, BinaryOp::Add)?;
        }
        if let Some(vec_dim) = self.config.vec_dim {
            let y = match input.pooled {
                Some(pooled) => b.cast(&b.slice(pooled, 1, 0, vec_dim)?, b.compute_dtype())?,
                None => b.full(&[batch, vec_dim], 0.0, b.compute_dtype())?,
            };
            let pooled = self.embedder(b, "vector_in", &y)?;
            vec = b.binary(&vec, &pooled, BinaryOp::Add)?;
        }
        Ok(vec)
    }

    /// An `MLPEmbedder` under `name`: out_layer(SiLU(in_layer(x))).
    fn embedder<B: Backend>(&self, b: &B, name: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
        let names = ["in_layer.weight", "in_layer.bias", "out_layer.weight", "out_layer.bias"]
            .map(|n| format!("{name}.{n}"));
        let layer = self.fetch(b, &names.each_ref().map(String::as_str))?;
        let hidden =
            b.unary(&b.linear(x, &layer.weight(0), Some(&layer.weight(1)))?, UnaryOp::Silu)?;
        Ok(b.linear(&hidden, &layer.weight(2), Some(&layer.weight(3)))?)
    }

    /// The references in the compute type, padded to the patch size and repeated to the batch, each with its
    /// placement as ComfyUI's `_forward` gives it for the method (`offset` unless named otherwise; `index`:
    /// index k for the k-th; `uxo`: index 0, diagonally beyond the image and the references before it).
    fn place_references<B: Backend>(
        &self,
        b: &B,
        input: &FluxInput<'_, B>,
        batch: usize,
        (rows, cols): (usize, usize),
    ) -> Result<Vec<(Tensor<B>, Placement)>> {
        let method = input.method.unwrap_or(DEFAULT_REFERENCE_METHOD);
        if method == "index_timestep_zero" && !input.references.is_empty() {
            return Err(Error::Invalid(format!(
                "reference method `index_timestep_zero` is for FLUX.2 and Qwen-Image Edit; {} places \
                 references by `offset`, `index` or `uxo`",
                self.config.variant()
            )));
        }
        let (mut index, mut h, mut w) = (0i64, 0usize, 0usize);
        let mut side_by_side = SideBySide::default();
        let mut placed = Vec::with_capacity(input.references.len());
        for reference in input.references {
            let (rh, rw) = reference_sides(reference, batch, LATENT_CHANNELS)?;
            let (mut h_offset, mut w_offset) = (0, 0);
            match method {
                "index" => index += 1,
                "uxo" => {
                    index = 0;
                    h_offset = rows * PATCH + h;
                    w_offset = cols * PATCH + w;
                    h += rh;
                    w += rw;
                }
                _ => {
                    index = 1;
                    (h_offset, w_offset) = side_by_side.place(rh, rw);
                }
            }
            let (reference, ref_rows, ref_cols) = batched_reference(b, reference, batch, PATCH)?;
            let place = Placement {
                index,
                rows: ref_rows,
                cols: ref_cols,
                row_offset: (h_offset + PATCH / 2) / PATCH,
                col_offset: (w_offset + PATCH / 2) / PATCH,
            };
            placed.push((reference, place));
        }
        Ok(placed)
    }

    /// A modulation `lin` (`[k·3·D, D]` and bias) of `silu_vec`: k sets of (shift, scale, gate).
    fn modulation<B: Backend>(
        &self,
        b: &B,
        silu_vec: &Tensor<B>,
        weight: &Weight<'_>,
        bias: &Weight<'_>,
        sets: usize,
    ) -> Result<Vec<Modulation<B>>> {
        let d = self.config.dim;
        let m = b.linear(silu_vec, weight, Some(bias))?;
        let batch = m.dim(0)?;
        let chunk = |k: usize| b.slice(&m, -1, k * d, d);
        (0..sets)
            .map(|s| {
                Ok(Modulation {
                    shift: chunk(3 * s)?,
                    scale: chunk(3 * s + 1)?,
                    gate: chunk(3 * s + 2)?.reshape(&[batch, 1, d])?,
                })
            })
            .collect()
    }

    /// q, k, v `[B, L, H, 128]` from a fused qkv projection's output `[B, L, 3·D]`, q and k RMS-normed per
    /// head with the gains `q_norm`, `k_norm`.
    fn split_qkv<B: Backend>(
        &self,
        b: &B,
        qkv: &Tensor<B>,
        q_norm: &Weight<'_>,
        k_norm: &Weight<'_>,
    ) -> Result<[Tensor<B>; 3]> {
        let (d, heads) = (self.config.dim, self.config.heads);
        let (batch, len) = (qkv.dim(0)?, qkv.dim(1)?);
        let part = |k: usize| -> Result<Tensor<B>> {
            Ok(b.slice(qkv, -1, k * d, d)?.reshape(&[batch, len, heads, HEAD_DIM])?)
        };
        let q = b.rms_norm(&part(0)?, Some(q_norm), QK_EPS)?;
        let k = b.rms_norm(&part(1)?, Some(k_norm), QK_EPS)?;
        Ok([q, k, part(2)?])
    }

    /// Unmasked attention over a joint sequence: RoPE on q and k `[B, N, H, 128]`, then softmax(q·kᵀ/√128)·v,
    /// back to `[B, N, D]`.
    fn attention<B: Backend>(
        &self,
        b: &B,
        [q, k, v]: [Tensor<B>; 3],
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let q = heads_first(&b.rope(&q, &rope.cos, &rope.sin, RopeLayout::Interleaved)?)?;
        let k = heads_first(&b.rope(&k, &rope.cos, &rope.sin, RopeLayout::Interleaved)?)?;
        let v = heads_first(&v)?;
        let o = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (HEAD_DIM as f32).sqrt())?;
        let batch = o.dim(0)?;
        Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, usize::MAX, self.config.dim])?)
    }

    /// Double-stream block `i` on the image and text tokens.
    fn double_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        silu_vec: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let mut names = Vec::with_capacity(24);
        for stream in ["img", "txt"] {
            for t in ["mod.lin", "attn.qkv", "attn.proj", "mlp.0", "mlp.2"] {
                names.push(format!("double_blocks.{i}.{stream}_{t}.weight"));
                names.push(format!("double_blocks.{i}.{stream}_{t}.bias"));
            }
            for t in ["query_norm", "key_norm"] {
                names.push(format!("double_blocks.{i}.{stream}_attn.norm.{t}.weight"));
            }
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let layer = self.fetch(b, &names)?;
        let w = |k: usize| layer.weight(k);
        // Per stream s (0: image, 1: text) the weights start at 12·s: mod.lin, qkv, proj, mlp.0, mlp.2 (weight
        // and bias each), then the q and k norm gains.
        let mods = [0, 12].map(|o| self.modulation(b, silu_vec, &w(o), &w(o + 1), 2));
        let [img_mod, txt_mod] = mods;
        let (img_mod, txt_mod) = (img_mod?, txt_mod?);
        let qkv_of = |x: &Tensor<B>, m: &Modulation<B>, o: usize| -> Result<[Tensor<B>; 3]> {
            let qkv = b.linear(&m.modulated(b, x)?, &w(o + 2), Some(&w(o + 3)))?;
            self.split_qkv(b, &qkv, &w(o + 10), &w(o + 11))
        };
        let [iq, ik, iv] = qkv_of(img, &img_mod[0], 0)?;
        let [tq, tk, tv] = qkv_of(txt, &txt_mod[0], 12)?;
        let joint = |t: &Tensor<B>, i: &Tensor<B>| b.concat(&[t, i], 1);
        let attn =
            self.attention(b, [joint(&tq, &iq)?, joint(&tk, &ik)?, joint(&tv, &iv)?], rope)?;
        drop((iq, ik, iv, tq, tk, tv));
        let text_len = txt.dim(1)?;
        let txt_attn = b.slice(&attn, 1, 0, text_len)?;
        let img_attn = b.slice(&attn, 1, text_len, img.dim(1)?)?;
        drop(attn);

        let stream =
            |x: &Tensor<B>, a: &Tensor<B>, m: &[Modulation<B>], o: usize| -> Result<Tensor<B>> {
                let x = m[0].gated_add(b, x, &b.linear(a, &w(o + 4), Some(&w(o + 5)))?)?;
                let hidden = b.linear(&m[1].modulated(b, &x)?, &w(o + 6), Some(&w(o + 7)))?;
                let hidden = b.unary(&hidden, UnaryOp::GeluTanh)?;
                let out = b.linear(&hidden, &w(o + 8), Some(&w(o + 9)))?;
                m[1].gated_add(b, &x, &out)
            };
        let img = stream(img, &img_attn, &img_mod, 0)?;
        let txt = stream(txt, &txt_attn, &txt_mod, 12)?;
        Ok((img, txt))
    }

    /// Single-stream block `i` on the joint sequence (text, then image).
    fn single_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        silu_vec: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let names = [
            "modulation.lin.weight",
            "modulation.lin.bias",
            "linear1.weight",
            "linear1.bias",
            "linear2.weight",
            "linear2.bias",
            "norm.query_norm.weight",
            "norm.key_norm.weight",
        ]
        .map(|n| format!("single_blocks.{i}.{n}"));
        let layer = self.fetch(b, &names.each_ref().map(String::as_str))?;
        let w = |k: usize| layer.weight(k);
        let m = self.modulation(b, silu_vec, &w(0), &w(1), 1)?.remove(0);
        let d = self.config.dim;
        let hidden = b.linear(&m.modulated(b, x)?, &w(2), Some(&w(3)))?;
        let qkv = b.slice(&hidden, -1, 0, 3 * d)?;
        let mlp = b.slice(&hidden, -1, 3 * d, self.config.mlp_hidden)?;
        drop(hidden);
        let attn = self.attention(b, self.split_qkv(b, &qkv, &w(6), &w(7))?, rope)?;
        drop(qkv);
        let mlp = b.unary(&mlp, UnaryOp::GeluTanh)?;
        let out = b.linear(&b.concat(&[&attn, &mlp], 2)?, &w(4), Some(&w(5)))?;
        m.gated_add(b, x, &out)
    }
}

/// `[ts.len(), 256]` in the compute type: ComfyUI's `timestep_embedding` of 1000·t (the product rounded to f32
/// first, then by each frequency), cos half first.
fn sinusoid<B: Backend>(b: &B, ts: &[f32]) -> Result<Tensor<B>> {
    let emb = crate::timestep::sinusoid(ts.iter().map(|t| 1000.0 * t), T_FREQ_DIM / 2, 1.0);
    let emb = b.from_f32(&[ts.len(), T_FREQ_DIM], &emb, DType::F32)?;
    Ok(b.cast(&emb, b.compute_dtype())?)
}

/// The RoPE table of `positions` (adjacent feature pairs, the axes' angles in order).
fn rope_table<B: Backend>(b: &B, positions: &[[i64; 3]]) -> Result<Rope<B>> {
    let (cos, sin) = crate::rope::tables(positions, AXES_DIMS, ROPE_THETA);
    let half = HEAD_DIM / 2;
    Ok(Rope {
        cos: b.from_f32(&[positions.len(), half], &cos, DType::F32)?,
        sin: b.from_f32(&[positions.len(), half], &sin, DType::F32)?,
    })
}
