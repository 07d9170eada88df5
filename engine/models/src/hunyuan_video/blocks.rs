//! The transformer blocks HunyuanVideo shares with FLUX.1 (ComfyUI builds it from `comfy.ldm.flux.layers`):
//! the double-stream block (image and text streams, each with its own modulation, qkv, q/k RMSNorms, output
//! projection and GELU-tanh MLP, attending jointly over [text, image]) and the single-stream block (one fused
//! linear for qkv and the MLP, one for their outputs); and the heads' attention the token refiner also uses.
//!
//! Invariant: the joint sequence is always [text side, image], the order the RoPE table's rows follow.

use kiln_compute::backend::{AttentionMask, RopeLayout, UnaryOp};
use kiln_compute::memory::Layer;
use kiln_compute::{Backend, Tensor, Weight};

use crate::adaln::Modulation;
use crate::error::{Error, Result};
use crate::fp16::finite_in_f16;
use crate::rope::Rope;

use super::keys::{double_block_names, single_block_names};
use super::model::{EPS, HunyuanVideo};

/// The q/k RMSNorms' ε: ComfyUI's `RMSNorm` has none, so torch takes f32's machine epsilon.
const QK_EPS: f32 = f32::EPSILON;

/// Where a double block's stream finds its weights in the fetched layer ([`double_block_names`]' order).
#[derive(Clone, Copy)]
struct Stream {
    /// The stream's first weight in the layer: 0 for the image, [`Stream::WEIGHTS`] for the text.
    at: usize,
}

impl Stream {
    /// Weights per stream: the image's come first, then the text's.
    const WEIGHTS: usize = 12;
    const MOD: usize = 0;
    const QKV: usize = 2;
    const Q_NORM: usize = 4;
    const K_NORM: usize = 5;
    const PROJ: usize = 6;
    const MLP_IN: usize = 8;
    const MLP_OUT: usize = 10;

    /// The linear whose weight is at `offset` (its bias after it) on `x`.
    fn linear<B: Backend>(
        self,
        b: &B,
        layer: &Layer<'_>,
        offset: usize,
        x: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let i = self.at + offset;
        Ok(b.linear(x, &layer.weight(i), Some(&layer.weight(i + 1)))?)
    }
}

impl HunyuanVideo {
    /// Double-stream block `i` on the image tokens `img` `[B, Li, D]` and the text side `txt` `[B, Lt, D]`,
    /// modulated by `silu_vec` = SiLU(vec), RoPE rows [text side, image]: the new (image, text side).
    pub(super) fn double_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        img: &Tensor<B>,
        txt: &Tensor<B>,
        silu_vec: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<(Tensor<B>, Tensor<B>)> {
        let d = self.config.hidden;
        let layer = self.fetch(b, &double_block_names(i))?;
        let (img_s, txt_s) = (Stream { at: 0 }, Stream { at: Stream::WEIGHTS });
        let mods = |s: Stream| -> Result<[Modulation<B>; 2]> {
            let m = s.linear(b, &layer, Stream::MOD, silu_vec)?;
            Modulation::sets(b, &m, d, 2)?.try_into().map_err(|_| sets_error())
        };
        let (img_mod, txt_mod) = (mods(img_s)?, mods(txt_s)?);
        let qkv_of = |x: &Tensor<B>, m: &Modulation<B>, s: Stream| -> Result<[Tensor<B>; 3]> {
            let qkv = s.linear(b, &layer, Stream::QKV, &m.modulated(b, x, EPS)?)?;
            let norms = [Stream::Q_NORM, Stream::K_NORM].map(|k| layer.weight(s.at + k));
            self.split_qkv(b, &qkv, Some(&norms))
        };
        let [iq, ik, iv] = qkv_of(img, &img_mod[0], img_s)?;
        let [tq, tk, tv] = qkv_of(txt, &txt_mod[0], txt_s)?;
        let joint = |t: &Tensor<B>, i: &Tensor<B>| b.concat(&[t, i], 1);
        let qkv = [joint(&tq, &iq)?, joint(&tk, &ik)?, joint(&tv, &iv)?];
        drop((iq, ik, iv, tq, tk, tv));
        let attn = self.attention(b, qkv, Some(rope))?;
        let text_len = txt.dim(1)?;
        let txt_attn = b.slice(&attn, 1, 0, text_len)?;
        let img_attn = b.slice(&attn, 1, text_len, img.dim(1)?)?;
        drop(attn);

        let stream = |x: &Tensor<B>, a: &Tensor<B>, m: &[Modulation<B>; 2], s: Stream| {
            let x = m[0].gated_add(b, x, &s.linear(b, &layer, Stream::PROJ, a)?)?;
            let hidden = s.linear(b, &layer, Stream::MLP_IN, &m[1].modulated(b, &x, EPS)?)?;
            let hidden = b.unary(&hidden, UnaryOp::GeluTanh)?;
            m[1].gated_add(b, &x, &s.linear(b, &layer, Stream::MLP_OUT, &hidden)?)
        };
        let img = stream(img, &img_attn, &img_mod, img_s)?;
        let txt = finite_in_f16(b, stream(txt, &txt_attn, &txt_mod, txt_s)?)?;
        Ok((img, txt))
    }

    /// Single-stream block `i` on the joint sequence `x` `[B, L, D]` ([text side, image]).
    pub(super) fn single_block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        silu_vec: &Tensor<B>,
        rope: &Rope<B>,
    ) -> Result<Tensor<B>> {
        let (d, f) = (self.config.hidden, self.config.mlp_hidden());
        let layer = self.fetch(b, &single_block_names(i))?;
        let w = |k: usize| layer.weight(k);
        let m = b.linear(silu_vec, &w(6), Some(&w(7)))?;
        let m = Modulation::sets(b, &m, d, 1)?.pop().ok_or_else(sets_error)?;
        let hidden = b.linear(&m.modulated(b, x, EPS)?, &w(0), Some(&w(1)))?;
        let qkv = b.slice(&hidden, -1, 0, 3 * d)?;
        let mlp = b.slice(&hidden, -1, 3 * d, f)?;
        drop(hidden);
        let qkv = self.split_qkv(b, &qkv, Some(&[w(4), w(5)]))?;
        let attn = self.attention(b, qkv, Some(rope))?;
        let mlp = b.unary(&mlp, UnaryOp::GeluTanh)?;
        let out = b.linear(&b.concat(&[&attn, &mlp], 2)?, &w(2), Some(&w(3)))?;
        finite_in_f16(b, m.gated_add(b, x, &out)?)
    }

    /// q, k, v `[B, L, H, hd]` from a fused qkv projection's output `[B, L, 3·D]`, q and k RMS-normed per head
    /// with the gains `norms` (q's, k's) where given (the blocks; the token refiner has none).
    pub(super) fn split_qkv<B: Backend>(
        &self,
        b: &B,
        qkv: &Tensor<B>,
        norms: Option<&[Weight<'_>; 2]>,
    ) -> Result<[Tensor<B>; 3]> {
        let (d, heads, hd) = (self.config.hidden, self.config.heads, self.config.head_dim());
        let (batch, len) = (qkv.dim(0)?, qkv.dim(1)?);
        let part = |k: usize| -> Result<Tensor<B>> {
            Ok(b.slice(qkv, -1, k * d, d)?.reshape(&[batch, len, heads, hd])?)
        };
        let (q, k) = (part(0)?, part(1)?);
        let (q, k) = match norms {
            Some([qn, kn]) => {
                (b.rms_norm(&q, Some(qn), QK_EPS)?, b.rms_norm(&k, Some(kn), QK_EPS)?)
            }
            None => (q, k),
        };
        Ok([q, k, part(2)?])
    }

    /// Unmasked attention of q, k, v `[B, L, H, hd]`, RoPE on q and k (interleaved pairs, FLUX's) where given:
    /// softmax(q·kᵀ/√hd)·v back to `[B, L, D]`.
    pub(super) fn attention<B: Backend>(
        &self,
        b: &B,
        [q, k, v]: [Tensor<B>; 3],
        rope: Option<&Rope<B>>,
    ) -> Result<Tensor<B>> {
        let (q, k) = match rope {
            Some(r) => (
                b.rope(&q, &r.cos, &r.sin, RopeLayout::Interleaved)?,
                b.rope(&k, &r.cos, &r.sin, RopeLayout::Interleaved)?,
            ),
            None => (q, k),
        };
        let heads_first = |t: &Tensor<B>| b.permute(t, &[0, 2, 1, 3]);
        let (q, k, v) = (heads_first(&q)?, heads_first(&k)?, heads_first(&v)?);
        let scale = 1.0 / (self.config.head_dim() as f32).sqrt();
        let o = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
        let (batch, len) = (o.dim(0)?, o.dim(2)?);
        Ok(b.permute(&o, &[0, 2, 1, 3])?.reshape(&[batch, len, self.config.hidden])?)
    }
}

/// A modulation with the wrong number of sets: a bug, not an input error.
fn sets_error() -> Error {
    Error::Invalid(
        "internal: a HunyuanVideo modulation produced the wrong number of sets".to_owned(),
    )
}
