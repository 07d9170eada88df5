//! [`embed_image`]: one image through the Qwen2.5-VL vision tower to the tokens the language model reads, as
//! ComfyUI's `Qwen2VLVisionTransformer` computes them.
//!
//! The tower sees the patches window by window: 2 × 2 patches merge into one unit, 4 × 4 units make a window
//! (the last row and column of windows may be partial), and the patches are reordered so each window's are
//! consecutive. Most blocks attend within windows; [`FULL_ATTENTION_BLOCKS`] attend over the whole image.
//! After the merger the units are put back in image order.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{
    EPS, FULL_ATTENTION_BLOCKS, HEADS, MERGE, MERGER, PATCH_EMBED, ROPE_THETA, VisionConfig, WINDOW,
};
use super::preprocess::VisionInput;
use crate::error::{Error, Result};

/// The image's tokens for the language model, `[input.tokens(), cfg.out_hidden]` in f32, in image order (merged
/// units row by row). `weights` holds the tower under its file names (`visual.*`). The tower computes in f32
/// on every device, as ComfyUI's does (it takes the pixels as `torch.float32`, its weights cast to them).
pub fn embed_image<B: Backend>(
    b: &B,
    weights: &Model,
    cfg: &VisionConfig,
    input: &VisionInput,
) -> Result<Tensor<B>> {
    let b = &b.with_compute_dtype(DType::F32)?;
    let per_patch = cfg.patch_values();
    input.check_grid(per_patch)?;
    let windows = Windows::of(cfg, input.grid_h / MERGE, input.grid_w / MERGE);
    let unit = MERGE * MERGE;
    let n = input.len();

    // The patches and their rotary angles, window by window.
    let mut patches = Vec::with_capacity(input.patches.len());
    for &u in &windows.order {
        patches.extend_from_slice(&input.patches[u * unit * per_patch..(u + 1) * unit * per_patch]);
    }
    let (cos, sin) = rope_tables(b, cfg, input.grid_w / MERGE, &windows.order)?;
    let mut x = {
        let layer = weights.fetch(b, &[PATCH_EMBED])?;
        let proj = layer.weight(0).reshape(&[cfg.hidden, per_patch])?;
        let patches = b.from_f32(&[1, n, per_patch], &patches, b.compute_dtype())?;
        b.linear(&patches, &proj, None)?
    };

    let whole = [(0, n)];
    for i in 0..cfg.depth {
        let spans: &[(usize, usize)] =
            if FULL_ATTENTION_BLOCKS.contains(&i) { &whole } else { &windows.spans };
        x = block(b, weights, cfg, i, &x, &cos, &sin, spans)?;
    }

    let merged = {
        let names = MERGER;
        let w = weights.fetch(b, &names)?;
        let x = b.rms_norm(&x, Some(&w.weight(0)), EPS)?;
        let x = x.reshape(&[1, n / unit, unit * cfg.hidden])?;
        let x = b.unary(&b.linear(&x, &w.weight(1), Some(&w.weight(2)))?, UnaryOp::Gelu)?;
        let x = b.linear(&x, &w.weight(3), Some(&w.weight(4)))?;
        b.to_f32(&b.cast(&x, DType::F32)?)?
    };
    // Back to image order: row k of the output is unit `order[k]`.
    let out = cfg.out_hidden;
    let mut ordered = vec![0f32; merged.len()];
    for (k, &u) in windows.order.iter().enumerate() {
        ordered[u * out..(u + 1) * out].copy_from_slice(&merged[k * out..(k + 1) * out]);
    }
    Ok(b.from_f32(&[n / unit, out], &ordered, b.compute_dtype())?)
}

/// Block `i` on x `[1, N, hidden]`: attention within each of `spans` (patch ranges), then the SwiGLU MLP,
/// each after an RMSNorm and added back.
#[allow(clippy::too_many_arguments)]
fn block<B: Backend>(
    b: &B,
    weights: &Model,
    cfg: &VisionConfig,
    i: usize,
    x: &Tensor<B>,
    cos: &Tensor<B>,
    sin: &Tensor<B>,
    spans: &[(usize, usize)],
) -> Result<Tensor<B>> {
    let n = x.dim(1)?;
    let names = cfg.block_names(i);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let layer = weights.fetch(b, &names)?;
    let w: Vec<Weight<'_>> = (0..names.len()).map(|j| layer.weight(j)).collect();
    let [
        norm1,
        qkv,
        qkv_bias,
        proj,
        proj_bias,
        norm2,
        gate,
        gate_bias,
        up,
        up_bias,
        down,
        down_bias,
    ] = &w[..]
    else {
        return Err(Error::Invalid(format!("{} weights for a vision block", w.len())));
    };

    let hd = cfg.head_dim();
    let h = b.rms_norm(x, Some(norm1), EPS)?;
    let qkv = b.linear(&h, qkv, Some(qkv_bias))?.reshape(&[1, n, 3, HEADS, hd])?;
    let head = |j: usize, rotate: bool| -> Result<Tensor<B>> {
        let t = b.slice(&qkv, 2, j, 1)?.reshape(&[1, n, HEADS, hd])?;
        let t = if rotate { b.rope(&t, cos, sin, RopeLayout::Half)? } else { t };
        Ok(b.permute(&t, &[0, 2, 1, 3])?)
    };
    let (q, k, v) = (head(0, true)?, head(1, true)?, head(2, false)?);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut parts = Vec::with_capacity(spans.len());
    for &(start, len) in spans {
        let part = |t: &Tensor<B>| b.slice(t, 2, start, len);
        parts.push(b.attention(&part(&q)?, &part(&k)?, &part(&v)?, AttentionMask::None, scale)?);
    }
    let a = if parts.len() == 1 {
        parts.remove(0)
    } else {
        b.concat(&parts.iter().collect::<Vec<_>>(), 2)?
    };
    let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[1, n, cfg.hidden])?;
    let x = b.binary(x, &b.linear(&a, proj, Some(proj_bias))?, BinaryOp::Add)?;

    let h = b.rms_norm(&x, Some(norm2), EPS)?;
    let act = b.gated(
        &b.linear(&h, gate, Some(gate_bias))?,
        &b.linear(&h, up, Some(up_bias))?,
        UnaryOp::Silu,
    )?;
    Ok(b.binary(&x, &b.linear(&act, down, Some(down_bias))?, BinaryOp::Add)?)
}

/// The windows of a grid of merged units: the units window by window (each window's row by row), and each
/// window's patch range in that order.
struct Windows {
    /// Unit indices (row-major in the image) in window order.
    order: Vec<usize>,
    /// `(first patch, patches)` of each non-empty window.
    spans: Vec<(usize, usize)>,
}

impl Windows {
    /// The windows of `rows` × `cols` merged units.
    fn of(cfg: &VisionConfig, rows: usize, cols: usize) -> Windows {
        let side = WINDOW / MERGE / cfg.patch;
        let mut order = Vec::with_capacity(rows * cols);
        let mut spans = Vec::new();
        for wy in (0..rows).step_by(side) {
            for wx in (0..cols).step_by(side) {
                let first = order.len();
                for y in wy..(wy + side).min(rows) {
                    order.extend((wx..(wx + side).min(cols)).map(|x| y * cols + x));
                }
                let unit = MERGE * MERGE;
                spans.push((first * unit, (order.len() - first) * unit));
            }
        }
        Windows { order, spans }
    }
}

/// The rotary cosines and sines `[N, head_dim / 2]` (f32) of the patches in window order: each head's first
/// quarter of frequencies turns with the patch's row, the second with its column (θ = 10⁴ over half a head).
fn rope_tables<B: Backend>(
    b: &B,
    cfg: &VisionConfig,
    unit_cols: usize,
    order: &[usize],
) -> Result<(Tensor<B>, Tensor<B>)> {
    let dim = cfg.head_dim() / 2;
    let inv_freq: Vec<f32> =
        (0..dim / 2).map(|j| 1.0 / ROPE_THETA.powf((2 * j) as f32 / dim as f32)).collect();
    let mut angles = Vec::with_capacity(order.len() * MERGE * MERGE * dim);
    for &u in order {
        let (uy, ux) = (u / unit_cols, u % unit_cols);
        for my in 0..MERGE {
            for mx in 0..MERGE {
                let (row, col) = ((uy * MERGE + my) as f32, (ux * MERGE + mx) as f32);
                angles.extend(inv_freq.iter().map(|&f| row * f));
                angles.extend(inv_freq.iter().map(|&f| col * f));
            }
        }
    }
    let n = angles.len() / dim;
    let cos: Vec<f32> = angles.iter().map(|&a| f64::from(a).cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|&a| f64::from(a).sin() as f32).collect();
    Ok((b.from_f32(&[n, dim], &cos, DType::F32)?, b.from_f32(&[n, dim], &sin, DType::F32)?))
}
