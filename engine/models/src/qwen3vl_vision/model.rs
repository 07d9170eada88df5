//! [`embed_image`]: one image through the Qwen3-VL vision tower to the tokens the language model reads and its
//! DeepStack features, as ComfyUI's `Qwen3VLVisionModel` (its `Qwen35VisionModel` with DeepStack mergers)
//! computes them.
//!
//! Unlike Qwen2.5-VL's tower there are no windows: every block attends over the whole image. The patches enter
//! in merge order (each 2 × 2 group consecutive, groups row by row, as [`VisionInput`] holds them), plus the
//! learned position table bilinearly resampled to the patch grid; blocks are LayerNorm, attention with 2-D
//! RoPE, LayerNorm, a tanh-GELU MLP. After the blocks ComfyUI lists in [`Config::deepstack`] a DeepStack
//! merger turns the patches into language-model tokens (2 × 2 groups joined, then LayerNorm, exact GELU); the
//! final merger does the same with its LayerNorm before the join. The tokens come out in image order.

use kiln_compute::backend::{AttentionMask, BinaryOp, RopeLayout, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{Config, EPS, PATCH_EMBED, POS_EMBED, ROPE_THETA};
use crate::error::{Error, Result};
use crate::qwen_vl::{MERGE, VisionInput};

/// What a tower gives for one image: the tokens for the language model and the DeepStack features added to
/// its first layers' outputs at those tokens.
#[derive(Debug, Clone)]
pub struct ImageEmbeds<B: Backend> {
    /// The merged tokens `[input.tokens(), out_hidden]` (f32), in image order (merged groups row by row).
    pub merged: Tensor<B>,
    /// One `[input.tokens(), out_hidden]` (f32) per DeepStack merger, in [`Config::deepstack`] order.
    pub deepstack: Vec<Tensor<B>>,
}

/// The image's tokens and DeepStack features ([`ImageEmbeds`]). `weights` holds the tower under ComfyUI's
/// names (`visual.*`, [`super::load_plan`]). The tower computes in f32 on every device, as ComfyUI's does (it
/// takes the pixels as `torch.float32`, its weights cast to them). `input` is made with [`Config::patching`];
/// an input of another patch size, or a config whose width does not split into heads whose width is a
/// multiple of 4 (2-D RoPE), is [`Error::Invalid`].
pub fn embed_image<B: Backend>(
    b: &B,
    weights: &Model,
    cfg: &Config,
    input: &VisionInput,
) -> Result<ImageEmbeds<B>> {
    let b = &b.with_compute_dtype(DType::F32)?;
    let per_patch = cfg.patch_values();
    input.check_grid(per_patch)?;
    if cfg.heads == 0 || !cfg.hidden.is_multiple_of(cfg.heads) || !cfg.head_dim().is_multiple_of(4)
    {
        return Err(Error::Invalid(format!(
            "a Qwen3-VL vision tower {} wide in {} heads (each head's width must be a multiple of 4)",
            cfg.hidden, cfg.heads
        )));
    }
    let n = input.len();

    let mut x = {
        let layer = weights.fetch(b, &PATCH_EMBED)?;
        let proj = layer.weight(0).reshape(&[cfg.hidden, per_patch])?;
        let patches = b.from_f32(&[1, n, per_patch], &input.patches, DType::F32)?;
        b.linear(&patches, &proj, Some(&layer.weight(1)))?
    };
    let positions = {
        let layer = weights.fetch(b, &[POS_EMBED])?;
        position_embeddings(b, cfg, &layer.weight(0), input.grid_h, input.grid_w)?
    };
    x = b.binary(&x, &positions.reshape(&[1, n, cfg.hidden])?, BinaryOp::Add)?;

    let (cos, sin) = rope_tables(b, cfg, input.grid_h, input.grid_w)?;
    let mut deepstack = Vec::with_capacity(cfg.deepstack.len());
    for i in 0..cfg.depth {
        x = block(b, weights, cfg, i, &x, &cos, &sin)?;
        for (k, _) in cfg.deepstack.iter().enumerate().filter(|&(_, &at)| at == i) {
            deepstack.push(merger(b, weights, cfg, &cfg.deepstack_names(k), &x, Norm::AfterJoin)?);
        }
    }
    let merged = merger(b, weights, cfg, &cfg.merger_names(), &x, Norm::BeforeJoin)?;
    Ok(ImageEmbeds { merged, deepstack })
}

/// Where a merger's LayerNorm sits: the final merger normalises each patch before the 2 × 2 join, a DeepStack
/// merger the joined group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Norm {
    BeforeJoin,
    AfterJoin,
}

/// A merger (weights `names`, in [`Config::merger_names`] order) on x `[1, N, hidden]` → `[N / 4, out_hidden]`:
/// each 2 × 2 group's patches joined, LayerNorm where `norm` says, linear, exact GELU, linear.
fn merger<B: Backend>(
    b: &B,
    weights: &Model,
    cfg: &Config,
    names: &[String],
    x: &Tensor<B>,
    norm: Norm,
) -> Result<Tensor<B>> {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let layer = weights.fetch(b, &names)?;
    let w: Vec<Weight<'_>> = (0..names.len()).map(|j| layer.weight(j)).collect();
    let [norm_w, norm_b, fc1, fc1_b, fc2, fc2_b] = &w[..] else {
        return Err(Error::Invalid(format!("{} weights for a vision merger", w.len())));
    };
    let unit = MERGE * MERGE;
    let tokens = x.dim(1)? / unit;
    let x = match norm {
        Norm::BeforeJoin => b
            .layer_norm(x, Some(norm_w), Some(norm_b), EPS)?
            .reshape(&[tokens, unit * cfg.hidden])?,
        Norm::AfterJoin => {
            let x = x.reshape(&[tokens, unit * cfg.hidden])?;
            b.layer_norm(&x, Some(norm_w), Some(norm_b), EPS)?
        }
    };
    let x = b.unary(&b.linear(&x, fc1, Some(fc1_b))?, UnaryOp::Gelu)?;
    Ok(b.linear(&x, fc2, Some(fc2_b))?)
}

/// Block `i` on x `[1, N, hidden]`: attention over every patch, then the MLP, each after a LayerNorm and added
/// back.
fn block<B: Backend>(
    b: &B,
    weights: &Model,
    cfg: &Config,
    i: usize,
    x: &Tensor<B>,
    cos: &Tensor<B>,
    sin: &Tensor<B>,
) -> Result<Tensor<B>> {
    let n = x.dim(1)?;
    let names = cfg.block_names(i);
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let layer = weights.fetch(b, &names)?;
    let w: Vec<Weight<'_>> = (0..names.len()).map(|j| layer.weight(j)).collect();
    let [norm1, norm1_b, qkv, qkv_b, proj, proj_b, norm2, norm2_b, fc1, fc1_b, fc2, fc2_b] = &w[..]
    else {
        return Err(Error::Invalid(format!("{} weights for a vision block", w.len())));
    };

    let (heads, hd) = (cfg.heads, cfg.head_dim());
    let h = b.layer_norm(x, Some(norm1), Some(norm1_b), EPS)?;
    let qkv = b.linear(&h, qkv, Some(qkv_b))?.reshape(&[1, n, 3, heads, hd])?;
    let head = |j: usize, rotate: bool| -> Result<Tensor<B>> {
        let t = b.slice(&qkv, 2, j, 1)?.reshape(&[1, n, heads, hd])?;
        let t = if rotate { b.rope(&t, cos, sin, RopeLayout::Half)? } else { t };
        Ok(b.permute(&t, &[0, 2, 1, 3])?)
    };
    let (q, k, v) = (head(0, true)?, head(1, true)?, head(2, false)?);
    let a = b.attention(&q, &k, &v, AttentionMask::None, 1.0 / (hd as f32).sqrt())?;
    let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[1, n, cfg.hidden])?;
    let x = b.binary(x, &b.linear(&a, proj, Some(proj_b))?, BinaryOp::Add)?;

    let h = b.layer_norm(&x, Some(norm2), Some(norm2_b), EPS)?;
    let h = b.unary(&b.linear(&h, fc1, Some(fc1_b))?, UnaryOp::GeluTanh)?;
    Ok(b.binary(&x, &b.linear(&h, fc2, Some(fc2_b))?, BinaryOp::Add)?)
}

/// torch's `linspace(0, end, steps)` in f32 as its CPU kernel computes it: the first half counts up from 0,
/// the second down from `end`.
fn linspace(end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![0.0];
    }
    let step = end / (steps - 1) as f32;
    (0..steps)
        .map(|i| if i < steps / 2 { step * i as f32 } else { end - step * (steps - 1 - i) as f32 })
        .collect()
}

/// The position table `table` `[side², hidden]` bilinearly resampled to a `grid_h` × `grid_w` patch grid
/// (ComfyUI's `fast_pos_embed_interpolate`: the grid's rows and columns spread evenly over the table's
/// `0..side − 1`, each patch the weighted sum of its four neighbouring entries) → `[N, hidden]` in merge order.
fn position_embeddings<B: Backend>(
    b: &B,
    cfg: &Config,
    table: &Weight<'_>,
    grid_h: usize,
    grid_w: usize,
) -> Result<Tensor<B>> {
    let side = cfg.position_side;
    let last = side.saturating_sub(1);
    // For each row (column): the table row (column) below and above it, and the weight of the one above.
    let taps = |steps: usize| -> Vec<(usize, usize, f32)> {
        linspace(last as f32, steps)
            .into_iter()
            .map(|t| {
                let floor = t as usize;
                (floor, (floor + 1).min(last), t - floor as f32)
            })
            .collect()
    };
    let (rows, cols) = (taps(grid_h), taps(grid_w));
    let n = grid_h * grid_w;
    let mut ids: [Vec<u32>; 4] = Default::default();
    let mut weights: [Vec<f32>; 4] = Default::default();
    for by in 0..grid_h / MERGE {
        for bx in 0..grid_w / MERGE {
            for my in 0..MERGE {
                for mx in 0..MERGE {
                    let (y0, y1, dh) = rows[by * MERGE + my];
                    let (x0, x1, dw) = cols[bx * MERGE + mx];
                    let corners = [
                        (y0, x0, (1.0 - dh) * (1.0 - dw)),
                        (y0, x1, (1.0 - dh) * dw),
                        (y1, x0, dh * (1.0 - dw)),
                        (y1, x1, dh * dw),
                    ];
                    for (j, (y, x, weight)) in corners.into_iter().enumerate() {
                        ids[j].push((y * side + x) as u32);
                        weights[j].push(weight);
                    }
                }
            }
        }
    }
    let mut sum: Option<Tensor<B>> = None;
    for (ids, weights) in ids.iter().zip(&weights) {
        let rows = b.embedding(ids, table)?;
        let weights = b.from_f32(&[n, 1], weights, DType::F32)?;
        let term = b.binary(&rows, &weights, BinaryOp::Mul)?;
        sum = Some(match sum {
            Some(s) => b.binary(&s, &term, BinaryOp::Add)?,
            None => term,
        });
    }
    sum.ok_or_else(|| Error::Invalid("no position embedding terms".to_owned()))
}

/// The rotary cosines and sines `[N, head_dim / 2]` (f32) of the patches in merge order: each head's first
/// quarter of frequencies turns with the patch's row, the second with its column (θ = 10⁴ over half a head).
fn rope_tables<B: Backend>(
    b: &B,
    cfg: &Config,
    grid_h: usize,
    grid_w: usize,
) -> Result<(Tensor<B>, Tensor<B>)> {
    let dim = cfg.head_dim() / 2;
    let inv_freq: Vec<f32> =
        (0..dim / 2).map(|j| 1.0 / ROPE_THETA.powf((2 * j) as f32 / dim as f32)).collect();
    let mut angles = Vec::with_capacity(grid_h * grid_w * dim);
    for by in 0..grid_h / MERGE {
        for bx in 0..grid_w / MERGE {
            for my in 0..MERGE {
                for mx in 0..MERGE {
                    let (row, col) = ((by * MERGE + my) as f32, (bx * MERGE + mx) as f32);
                    angles.extend(inv_freq.iter().map(|&f| row * f));
                    angles.extend(inv_freq.iter().map(|&f| col * f));
                }
            }
        }
    }
    let n = grid_h * grid_w;
    let cos: Vec<f32> = angles.iter().map(|&a| f64::from(a).cos() as f32).collect();
    let sin: Vec<f32> = angles.iter().map(|&a| f64::from(a).sin() as f32).collect();
    Ok((b.from_f32(&[n, dim], &cos, DType::F32)?, b.from_f32(&[n, dim], &sin, DType::F32)?))
}

#[cfg(test)]
mod tests {
    use super::linspace;

    #[test]
    fn linspace_counts_from_both_ends_as_torch() {
        assert_eq!(linspace(47.0, 2), vec![0.0, 47.0]);
        assert_eq!(linspace(47.0, 1), vec![0.0]);
        let l = linspace(7.0, 5);
        assert_eq!(l, vec![0.0, 1.75, 3.5, 5.25, 7.0]);
    }
}
