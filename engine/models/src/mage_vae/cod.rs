//! The CoD decoder (ComfyUI's `CoDDecoder`): the latent `[B, 128, h, w]` to the denoiser's conditioning
//! features `[B, C, h, w]`: a 3×3 `conv_in`, its blocks (ResNet blocks as the KL autoencoders' and windowed
//! self-attention), GroupNorm, SiLU and a 3×3 `conv_out`.
//!
//! The attention runs within [`WINDOW`]×[`WINDOW`] windows of the latent: q, k and v are padded right and
//! bottom to multiples of the window by repeating the edge (so a latent smaller than a window attends over a
//! full window of repeated edges, as ComfyUI's does), each window is one head of C channels over its
//! positions, scale C^−½, and the output is cropped back before `proj_out`. Each block fetches its weights in
//! one [`Model::fetch`] and drops them before returning.

use kiln_compute::backend::{AttentionMask, BinaryOp, PadMode};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor};

use super::config::{CodBlock, EPS, GROUPS, WINDOW};
use super::dico::pointwise;
use crate::error::{Error, Result};
use crate::flux_vae::blocks::{head, resnet};
use crate::named::{conv3, fetch, weight_and_bias as wb};

/// The CoD decoder `prefix` (`decoder_model.y_embedder.decoder`) with `blocks` on the latent `z`.
pub(crate) fn decode<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    blocks: &[CodBlock],
    z: &Tensor<B>,
) -> Result<Tensor<B>> {
    let mut x = conv3(b, model, &format!("{prefix}.conv_in"), z)?;
    for (i, block) in blocks.iter().enumerate() {
        let name = format!("{prefix}.block.{i}");
        x = match block {
            CodBlock::Resnet => resnet(b, model, &name, GROUPS, &x)?,
            CodBlock::Attention => window_attention(b, model, &name, &x)?,
        };
    }
    head(b, model, prefix, GROUPS, &x)
}

/// The windowed attention block `prefix` (`.norm`, `.q`, `.k`, `.v`, `.proj_out`) on `x` `[B, C, h, w]`:
/// `x + proj_out(attention)`, each [`WINDOW`]² window of the edge-padded q, k, v attending within itself.
fn window_attention<B: Backend>(
    b: &B,
    model: &Model,
    prefix: &str,
    x: &Tensor<B>,
) -> Result<Tensor<B>> {
    let &[n, c, hh, ww] = x.shape() else {
        return Err(Error::Invalid(format!("attention input {:?} is not [B, C, h, w]", x.shape())));
    };
    let mut names = Vec::with_capacity(10);
    for part in ["norm", "q", "k", "v", "proj_out"] {
        names.extend(wb(&format!("{prefix}.{part}")));
    }
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i);
    let d = WINDOW;
    let (hp, wp) = (hh.next_multiple_of(d), ww.next_multiple_of(d));
    let (nh, nw) = (hp / d, wp / d);
    // Channels-last [B, h, w, C] after the norm.
    let tokens = {
        let h = b.group_norm(x, GROUPS, Some(&w(0)), Some(&w(1)), EPS)?;
        b.permute(&h, &[0, 2, 3, 1])?
    };
    // A projection, edge-padded to whole windows, as [B·windows, 1, d², C].
    let windows = |i: usize| -> Result<Tensor<B>> {
        let mut t = pointwise(b, &tokens, &w(i), &w(i + 1))?;
        if hp > hh {
            t = b.pad(&t, 1, 0, hp - hh, PadMode::Replicate)?;
        }
        if wp > ww {
            t = b.pad(&t, 2, 0, wp - ww, PadMode::Replicate)?;
        }
        let t = b.permute(&t.reshape(&[n, nh, d, nw, d, c])?, &[0, 1, 3, 2, 4, 5])?;
        Ok(t.reshape(&[n * nh * nw, 1, d * d, c])?)
    };
    let (q, k, v) = (windows(2)?, windows(4)?, windows(6)?);
    drop(tokens);
    let o = b.attention(&q, &k, &v, AttentionMask::None, (c as f32).powf(-0.5))?;
    drop((q, k, v));
    let o = b.permute(&o.reshape(&[n, nh, nw, d, d, c])?, &[0, 1, 3, 2, 4, 5])?;
    let mut o = o.reshape(&[n, hp, wp, c])?;
    if hp > hh {
        o = b.slice(&o, 1, 0, hh)?;
    }
    if wp > ww {
        o = b.slice(&o, 2, 0, ww)?;
    }
    let o = pointwise(b, &o, &w(8), &w(9))?;
    let o = b.permute(&o, &[0, 3, 1, 2])?;
    Ok(b.binary(x, &o, BinaryOp::Add)?)
}
