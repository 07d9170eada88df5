//! The autoencoder's building blocks: ResnetBlock, the mid-block attention, plain and stride-2 convs, the
//! upsample. Each fetches its weights (by LDM name) through [`Model::fetch`] and drops them before returning,
//! and keeps at most its input and two temporaries alive.

use kiln_compute::Backend;
use kiln_compute::Tensor;
use kiln_compute::backend::{AttentionMask, BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::Model;

use crate::error::{Error, Result};
pub(crate) use crate::named::conv3;
use crate::named::{conv2d, fetch, weight_and_bias as wb};

/// GroupNorm ε of every norm.
const EPS: f32 = 1e-6;

/// The encoder's downsample `name`: zero-pad right and bottom by one, then a 3×3 conv of stride 2.
pub(crate) fn downsample<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    conv2d(b, model, name, x, Conv2dParams { stride: 2, padding: [0, 1, 0, 1] })
}

/// The decoder's upsample `name`: nearest 2×, then a 3×3 conv.
pub(crate) fn upsample<B: Backend>(
    b: &B,
    model: &Model,
    name: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let up = b.upsample_nearest2x(x)?;
    conv3(b, model, name, &up)
}

/// GroupNorm then SiLU (norm `name`; the caller holds the weights).
fn norm_silu<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    groups: usize,
    w: &kiln_compute::Weight<'_>,
    bias: &kiln_compute::Weight<'_>,
) -> Result<Tensor<B>> {
    let h = b.group_norm(x, groups, Some(w), Some(bias), EPS)?;
    Ok(b.unary(&h, UnaryOp::Silu)?)
}

/// The closing GroupNorm, SiLU and conv of a side (`{side}.norm_out`, `{side}.conv_out`).
pub(crate) fn head<B: Backend>(
    b: &B,
    model: &Model,
    side: &str,
    groups: usize,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let h = {
        let layer = fetch(b, model, &wb(&format!("{side}.norm_out")))?;
        norm_silu(b, x, groups, &layer.weight(0), &layer.weight(1))?
    };
    conv3(b, model, &format!("{side}.conv_out"), &h)
}

/// ResnetBlock `prefix`: `skip(x) + conv2(SiLU(GN(conv1(SiLU(GN(x))))))`, the skip a 1×1 `nin_shortcut` when
/// the width changes.
pub(crate) fn resnet<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    groups: usize,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let shortcut = format!("{prefix}.nin_shortcut.weight");
    let has_shortcut = model.info(&shortcut).is_some();
    let mut names = Vec::with_capacity(10);
    for part in ["norm1", "conv1", "norm2", "conv2"] {
        names.extend(wb(&format!("{prefix}.{part}")));
    }
    if has_shortcut {
        names.extend(wb(&format!("{prefix}.nin_shortcut")));
    }
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i);
    let h = norm_silu(b, x, groups, &w(0), &w(1))?;
    let h = b.conv2d(&h, &w(2), Some(&w(3)), Conv2dParams::same(1))?;
    let h = norm_silu(b, &h, groups, &w(4), &w(5))?;
    let h = b.conv2d(&h, &w(6), Some(&w(7)), Conv2dParams::same(1))?;
    let out = if has_shortcut {
        let skip = b.conv2d(x, &w(8), Some(&w(9)), Conv2dParams::same(0))?;
        b.binary(&skip, &h, BinaryOp::Add)?
    } else {
        b.binary(x, &h, BinaryOp::Add)?
    };
    Ok(out)
}

/// The mid-block attention `prefix` (`.norm`, `.q`, `.k`, `.v`, `.proj_out`): `x + proj_out(attn)` with one
/// head over the H·W positions, scale C^−½. The projections are read as `[C, C]` whether stored as 1×1 convs
/// or as diffusers' Linear weights.
pub(crate) fn attention<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    groups: usize,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let &[n, c, hh, ww] = x.shape() else {
        return Err(Error::Invalid(format!("attention input {:?} is not [B, C, H, W]", x.shape())));
    };
    let mut names = Vec::with_capacity(10);
    for part in ["norm", "q", "k", "v", "proj_out"] {
        names.extend(wb(&format!("{prefix}.{part}")));
    }
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i).reshape(&[c, c]);
    // Tokens [B, H·W, C].
    let tokens = {
        let h = b.group_norm(x, groups, Some(&layer.weight(0)), Some(&layer.weight(1)), EPS)?;
        b.permute(&h.reshape(&[n, c, hh * ww])?, &[0, 2, 1])?
    };
    let project = |i: usize| -> Result<Tensor<B>> {
        let t = b.linear(&tokens, &w(i)?, Some(&layer.weight(i + 1)))?;
        Ok(t.reshape(&[n, 1, hh * ww, c])?)
    };
    let (q, k, v) = (project(2)?, project(4)?, project(6)?);
    drop(tokens);
    let o = b.attention(&q, &k, &v, AttentionMask::None, (c as f32).powf(-0.5))?;
    drop((q, k, v));
    let o = b.linear(&o.reshape(&[n, hh * ww, c])?, &w(8)?, Some(&layer.weight(9)))?;
    let o = b.permute(&o, &[0, 2, 1])?.reshape(&[n, c, hh, ww])?;
    Ok(b.binary(x, &o, BinaryOp::Add)?)
}
