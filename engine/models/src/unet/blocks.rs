//! The UNet's building blocks as ComfyUI's `openaimodel.py` and `attention.py` run them: the timestep-conditioned
//! ResBlock, the SpatialTransformer (self-attention, cross-attention, GEGLU feed-forward), the stride-2
//! Downsample and the nearest Upsample. Each fetches its weights by LDM name and drops them before returning.

use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};
pub(crate) use crate::named::conv3;
use crate::named::{conv2d, fetch, weight_and_bias as wb};

/// GroupNorm groups of every norm.
pub(crate) const GROUPS: usize = 32;
/// ε of the ResBlocks' and the output's GroupNorms (torch's default).
pub(crate) const RES_EPS: f32 = 1e-5;
/// ε of the SpatialTransformer's GroupNorm (`Normalize`).
const TRANSFORMER_EPS: f32 = 1e-6;
/// ε of the transformer blocks' LayerNorms (torch's default).
const LAYER_NORM_EPS: f32 = 1e-5;

/// `[B, C, H, W]` of `x`.
fn dims4<B: Backend>(x: &Tensor<B>) -> Result<[usize; 4]> {
    match *x.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        ref other => Err(Error::Invalid(format!("UNet features {other:?} are not [B, C, H, W]"))),
    }
}

/// The Downsample `name` (`.op`): a 3×3 conv of stride 2, padding 1 on every side.
pub(crate) fn downsample<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    conv2d(b, model, name, x, Conv2dParams { stride: 2, padding: [1, 1, 1, 1] })
}

/// The Upsample `name` (`.conv`): nearest to `size` (the skip's height and width; 2× the input, or one less
/// where the encoder halved an odd side), then a 3×3 conv. Nearest to 2s − 1 reads the same rows as 2× cropped.
pub(crate) fn upsample<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
    size: [usize; 2],
) -> Result<Tensor<B>> {
    let [_, _, h, w] = dims4(x)?;
    if size[0] > 2 * h || size[1] > 2 * w || size[0] + 1 < 2 * h || size[1] + 1 < 2 * w {
        return Err(Error::Invalid(format!(
            "the UNet upsamples {h}×{w} to the skip's {}×{}, which is not 2× or 2× − 1",
            size[0], size[1]
        )));
    }
    let mut up = b.upsample_nearest2x(x)?;
    if size[0] < 2 * h {
        up = b.slice(&up, 2, 0, size[0])?;
    }
    if size[1] < 2 * w {
        up = b.slice(&up, 3, 0, size[1])?;
    }
    conv3(b, model, name, &up)
}

/// GroupNorm then SiLU, with the layer's weights `w`, `bias`.
fn norm_silu<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    w: &kiln_compute::Weight<'_>,
    bias: &kiln_compute::Weight<'_>,
) -> Result<Tensor<B>> {
    let h = b.group_norm(x, GROUPS, Some(w), Some(bias), RES_EPS)?;
    Ok(b.unary(&h, UnaryOp::Silu)?)
}

/// The closing GroupNorm, SiLU and 3×3 conv (`out.0`, `out.2`).
pub(crate) fn head<B: Backend>(b: &B, model: &Model, x: &Tensor<B>) -> Result<Tensor<B>> {
    let h = {
        let layer = fetch(b, model, &wb("out.0"))?;
        norm_silu(b, x, &layer.weight(0), &layer.weight(1))?
    };
    conv3(b, model, "out.2", &h)
}

/// ResBlock `prefix`: `skip(x) + out_layers(in_layers(x) + emb_layers(emb))`, where in/out layers are
/// GroupNorm, SiLU and a 3×3 conv, `emb_layers` SiLU and a Linear, and the skip a 1×1 conv when the width
/// changes. `emb_silu` is SiLU(emb) `[B, time_embed_dim]`.
pub(crate) fn res_block<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    emb_silu: &Tensor<B>,
) -> Result<Tensor<B>> {
    let shortcut = format!("{prefix}.skip_connection.weight");
    let has_shortcut = model.info(&shortcut).is_some();
    let mut names = Vec::with_capacity(12);
    for part in ["in_layers.0", "in_layers.2", "emb_layers.1", "out_layers.0", "out_layers.3"] {
        names.extend(wb(&format!("{prefix}.{part}")));
    }
    if has_shortcut {
        names.extend(wb(&format!("{prefix}.skip_connection")));
    }
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i);
    let h = norm_silu(b, x, &w(0), &w(1))?;
    let h = b.conv2d(&h, &w(2), Some(&w(3)), Conv2dParams::same(1))?;
    let [n, c, _, _] = dims4(&h)?;
    let e = b.linear(emb_silu, &w(4), Some(&w(5)))?;
    let e = b.cast(&e, h.dtype())?.reshape(&[n, c, 1, 1])?;
    let h = b.binary(&h, &e, BinaryOp::Add)?;
    let h = norm_silu(b, &h, &w(6), &w(7))?;
    let h = b.conv2d(&h, &w(8), Some(&w(9)), Conv2dParams::same(1))?;
    let skip = if has_shortcut {
        b.conv2d(x, &w(10), Some(&w(11)), Conv2dParams::same(0))?
    } else {
        x.clone()
    };
    Ok(b.binary(&skip, &h, BinaryOp::Add)?)
}

/// Multi-head attention `prefix` (`to_q`, `to_k`, `to_v` without bias, `to_out.0` with) of tokens `x`
/// `[B, L, C]` over `context` `[B, N, D]` (`x` itself for self-attention), heads of `head_channels`.
fn attention<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    context: &Tensor<B>,
    head_channels: usize,
) -> Result<Tensor<B>> {
    let &[n, l, c] = x.shape() else {
        return Err(Error::Invalid(format!("attention tokens {:?} are not [B, L, C]", x.shape())));
    };
    let m = context.dim(1)?;
    if !c.is_multiple_of(head_channels) {
        return Err(Error::Invalid(format!(
            "width {c} is not a multiple of the head width {head_channels}"
        )));
    }
    let heads = c / head_channels;
    let mut names: Vec<String> =
        ["to_q", "to_k", "to_v"].iter().map(|p| format!("{prefix}.{p}.weight")).collect();
    names.extend(wb(&format!("{prefix}.to_out.0")));
    let layer = fetch(b, model, &names)?;
    let split = |t: Tensor<B>, len: usize| -> Result<Tensor<B>> {
        Ok(b.permute(&t.reshape(&[n, len, heads, head_channels])?, &[0, 2, 1, 3])?)
    };
    let q = split(b.linear(x, &layer.weight(0), None)?, l)?;
    let k = split(b.linear(context, &layer.weight(1), None)?, m)?;
    let v = split(b.linear(context, &layer.weight(2), None)?, m)?;
    let scale = (head_channels as f32).powf(-0.5);
    let o = b.attention(&q, &k, &v, AttentionMask::None, scale)?;
    drop((q, k, v));
    let o = b.permute(&o, &[0, 2, 1, 3])?.reshape(&[n, l, c])?;
    Ok(b.linear(&o, &layer.weight(3), Some(&layer.weight(4)))?)
}

/// `x + f(LayerNorm(x))` for the LayerNorm `norm` of a transformer block.
fn layer_norm<B: Backend>(b: &B, model: &Model, norm: &str, x: &Tensor<B>) -> Result<Tensor<B>> {
    let layer = fetch(b, model, &wb(norm))?;
    Ok(b.layer_norm(x, Some(&layer.weight(0)), Some(&layer.weight(1)), LAYER_NORM_EPS)?)
}

/// One BasicTransformerBlock `prefix` on tokens `x` `[B, L, C]`: self-attention, cross-attention over
/// `context`, then the GEGLU feed-forward (`ff.net.0.proj` gives value and gate halves, `ff.net.2` projects
/// back), each pre-norm and residual.
fn transformer_block<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: Tensor<B>,
    context: &Tensor<B>,
    head_channels: usize,
) -> Result<Tensor<B>> {
    let h = layer_norm(b, model, &format!("{prefix}.norm1"), &x)?;
    let a = attention(b, model, &format!("{prefix}.attn1"), &h, &h, head_channels)?;
    let x = b.binary(&x, &a, BinaryOp::Add)?;
    let h = layer_norm(b, model, &format!("{prefix}.norm2"), &x)?;
    let a = attention(b, model, &format!("{prefix}.attn2"), &h, context, head_channels)?;
    let x = b.binary(&x, &a, BinaryOp::Add)?;
    let h = layer_norm(b, model, &format!("{prefix}.norm3"), &x)?;
    let f = {
        let mut names = wb(&format!("{prefix}.ff.net.0.proj")).to_vec();
        names.extend(wb(&format!("{prefix}.ff.net.2")));
        let layer = fetch(b, model, &names)?;
        let both = b.linear(&h, &layer.weight(0), Some(&layer.weight(1)))?;
        let inner = both.dim(2)? / 2;
        let value = b.slice(&both, 2, 0, inner)?;
        let gate = b.slice(&both, 2, inner, inner)?;
        drop(both);
        let g = b.gated(&gate, &value, UnaryOp::Gelu)?;
        b.linear(&g, &layer.weight(2), Some(&layer.weight(3)))?
    };
    Ok(b.binary(&x, &f, BinaryOp::Add)?)
}

/// SpatialTransformer `prefix` with `depth` blocks: `x + proj_out(blocks(proj_in(GroupNorm(x))))` over the H·W
/// tokens, the projections Linear (`linear`) or 1×1 convs read as `[C, C]`.
pub(crate) fn spatial_transformer<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
    context: &Tensor<B>,
    depth: usize,
    head_channels: usize,
) -> Result<Tensor<B>> {
    let [n, c, hh, ww] = dims4(x)?;
    let project = |name: &str, t: &Tensor<B>| -> Result<Tensor<B>> {
        let layer = fetch(b, model, &wb(&format!("{prefix}.{name}")))?;
        let w = layer.weight(0);
        let rows = w.shape()[0];
        let w = w.reshape(&[rows, w.shape()[1..].iter().product()])?;
        Ok(b.linear(t, &w, Some(&layer.weight(1)))?)
    };
    let mut tokens = {
        let layer = fetch(b, model, &wb(&format!("{prefix}.norm")))?;
        let h = b.group_norm(
            x,
            GROUPS,
            Some(&layer.weight(0)),
            Some(&layer.weight(1)),
            TRANSFORMER_EPS,
        )?;
        let h = b.permute(&h.reshape(&[n, c, hh * ww])?, &[0, 2, 1])?;
        project("proj_in", &h)?
    };
    for d in 0..depth {
        let block = format!("{prefix}.transformer_blocks.{d}");
        tokens = transformer_block(b, model, &block, tokens, context, head_channels)?;
    }
    let out = project("proj_out", &tokens)?;
    let out = b.permute(&out, &[0, 2, 1])?.reshape(&[n, c, hh, ww])?;
    Ok(b.binary(x, &out, BinaryOp::Add)?)
}
