//! The denoiser's per-pixel head (ComfyUI's `NerfEmbedder`, `SimpleMLPAdaLN` and `NerfFinalLayer`): each latent
//! position's patch of P² pixels, from that position's DiCo features and CoD features, as tokens of the head's
//! width X.
//!
//! For each pixel: its features are the zero noise's (the image channels), the CoD features' 1×1 projection
//! `y_embedder_x` (X per pixel) and the pixel's DCT position features (`max_freqs`² of them), through one Linear
//! (`x_embedder`). The noise's columns meet only zeros and the position features are the same for every patch,
//! so the Linear is applied as its X pixel-feature columns on the projection plus, once per decode, its
//! position columns on the DCT table with the bias (the same sum in another order; in a 16-bit compute type the
//! two parts are each rounded before they are added). Then `input_proj`, the residual MLP blocks modulated per
//! pixel by `cond_embed` of the DiCo features, RMSNorm and the final Linear to the image channels.
//!
//! Everything here is per patch, so it runs a chunk of patches at a time: its activations (P²·X values a patch,
//! 8192 released, and three times that for a block's modulation) grow with the chunk, not the image. Its weights
//! are one fetch held across the chunks.

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::dtype::round_to;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::config::{DecoderConfig, EPS, PATCH};
use super::dico::pointwise;
use crate::error::{Error, Result};
use crate::named::{fetch, weight_and_bias as wb};
use crate::rope::linspace_in;

/// The per-pixel head on `s` (the DiCo features) and `cond` (the CoD features), both `[T, C]` for T patches
/// (latent positions, batch-major), `patches` of them at a time: each patch's pixels `[T, P²·channels]`, pixel
/// (py, px) of channel c at feature `(py·P + px)·channels + c`.
pub(crate) fn decode<B: Backend>(
    b: &B,
    model: &Model,
    cfg: &DecoderConfig,
    channels: usize,
    s: &Tensor<B>,
    cond: &Tensor<B>,
    patches: usize,
) -> Result<Tensor<B>> {
    let &[total, _] = s.shape() else {
        return Err(Error::Invalid(format!("pixel head features {:?} are not [T, C]", s.shape())));
    };
    if patches == 0 {
        return Err(Error::Invalid("a decode of 0 patches at a time".into()));
    }
    let (x, p2, f2) = (cfg.pixel, PATCH * PATCH, cfg.dct_frequencies.pow(2));
    let mut names = Vec::with_capacity(11 + 8 * cfg.pixel_blocks);
    for part in
        ["y_embedder_x", "x_embedder.embedder.0", "dec_net.cond_embed", "dec_net.input_proj"]
    {
        names.extend(wb(&format!("decoder_model.{part}")));
    }
    for i in 0..cfg.pixel_blocks {
        for part in ["in_ln", "mlp.0", "mlp.2", "adaLN_modulation.1"] {
            names.extend(wb(&format!("decoder_model.dec_net.res_blocks.{i}.{part}")));
        }
    }
    names.push("decoder_model.final_layer.norm.weight".into());
    names.extend(wb("decoder_model.final_layer.linear"));
    let layer = fetch(b, model, &names)?;
    let w = |i: usize| layer.weight(i);
    let last = 8 + 8 * cfg.pixel_blocks;
    let dtype = b.compute_dtype();

    // x_embedder: its pixel-feature columns, and its position columns applied to the DCT table, plus the bias.
    let embedder = b.weight_to_tensor(&w(2), dtype)?;
    let pixel_columns = b.slice(&embedder, 1, channels, x)?;
    let positions = {
        let table = b.from_f32(&[p2, f2], &dct(dtype, PATCH, cfg.dct_frequencies), dtype)?;
        let columns = b.slice(&embedder, 1, channels + x, f2)?;
        let product = b.matmul(&table, &columns, true)?;
        b.binary(&product, &b.weight_to_tensor(&w(3), dtype)?, BinaryOp::Add)?
    };
    drop(embedder);

    let mut chunks = Vec::with_capacity(total.div_ceil(patches));
    for start in (0..total).step_by(patches) {
        let len = patches.min(total - start);
        let rows = len * p2;
        // Each pixel's projected CoD features [len·P², X] (y_embedder_x's channel k·P² + pixel).
        let y = pointwise(b, &b.slice(cond, 0, start, len)?, &w(0), &w(1))?;
        let y = b.permute(&y.reshape(&[len, x, p2])?, &[0, 2, 1])?.reshape(&[rows, x])?;
        let h = b.matmul(&y, &pixel_columns, true)?.reshape(&[len, p2, x])?;
        drop(y);
        let h = b.binary(&h, &positions, BinaryOp::Add)?.reshape(&[rows, x])?;
        let mut h = b.linear(&h, &w(6), Some(&w(7)))?;
        // The per-pixel conditioning, SiLU applied (every block's adaLN_modulation starts with it).
        let c = b.linear(&b.slice(s, 0, start, len)?, &w(4), Some(&w(5)))?;
        let c = b.unary(&c.reshape(&[rows, x])?, UnaryOp::Silu)?;
        for i in 0..cfg.pixel_blocks {
            let k = 8 + 8 * i;
            let m = b.linear(&c, &w(k + 6), Some(&w(k + 7)))?;
            let (shift, scale, gate) =
                (b.slice(&m, -1, 0, x)?, b.slice(&m, -1, x, x)?, b.slice(&m, -1, 2 * x, x)?);
            drop(m);
            let n = b.layer_norm(&h, Some(&w(k)), Some(&w(k + 1)), EPS)?.reshape(&[rows, 1, x])?;
            let n = b.modulate(&n, &scale, Some(&shift))?.reshape(&[rows, x])?;
            let n = b.unary(&b.linear(&n, &w(k + 2), Some(&w(k + 3)))?, UnaryOp::Silu)?;
            let n = b.linear(&n, &w(k + 4), Some(&w(k + 5)))?;
            h = b.binary(&h, &b.binary(&gate, &n, BinaryOp::Mul)?, BinaryOp::Add)?;
        }
        drop(c);
        let h = b.rms_norm(&h, Some(&w(last)), EPS)?;
        let h = b.linear(&h, &w(last + 1), Some(&w(last + 2)))?;
        chunks.push(h.reshape(&[len, p2 * channels])?);
    }
    if chunks.len() == 1 {
        return Ok(chunks.remove(0));
    }
    Ok(b.concat(&chunks.iter().collect::<Vec<_>>(), 0)?)
}

/// The DCT position features of a patch's pixels, `[P², F²]` row-major (ComfyUI's `NerfEmbedder.fetch_pos`, in
/// `dtype` as it computes them: every operation rounded to the compute type): for pixel (py, px) and frequency
/// pair (i, j), `cos(x · fᵢ · π) · cos(y · fⱼ · π) / (1 + fᵢ · fⱼ)` with x, y the pixel's `linspace(0, 1, P)`
/// and f `linspace(0, F, F)`, feature `i·F + j`.
fn dct(dtype: DType, patch: usize, frequencies: usize) -> Vec<f32> {
    let r = |v: f32| round_to(dtype, v);
    let pos = linspace_in(dtype, 0.0, 1.0, patch);
    let freqs = linspace_in(dtype, 0.0, frequencies as f32, frequencies);
    let wave = |p: f32, f: f32| r(r(r(p * f) * std::f32::consts::PI).cos());
    let mut out = Vec::with_capacity(patch * patch * frequencies * frequencies);
    for &py in &pos {
        for &px in &pos {
            for &fx in &freqs {
                for &fy in &freqs {
                    let coeff = r(1.0 / r(1.0 + r(fx * fy)));
                    out.push(r(r(wave(px, fx) * wave(py, fy)) * coeff));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The corner pixel reads 1/(1 + fᵢfⱼ) (both cosines 1); the far corner cos(fπ) pairs.
    #[test]
    fn dct_positions() {
        let table = dct(DType::F32, 16, 8);
        assert_eq!(table.len(), 256 * 64);
        let f = |k: usize| k as f32 * 8.0 / 7.0;
        assert_eq!(table[0], 1.0);
        assert!((table[9] - 1.0 / (1.0 + f(1) * f(1))).abs() < 1e-7);
        let far = &table[255 * 64..];
        let want = (f(2) * std::f32::consts::PI).cos() * (f(3) * std::f32::consts::PI).cos()
            / (1.0 + f(2) * f(3));
        assert!((far[2 * 8 + 3] - want).abs() < 1e-5, "{} vs {want}", far[2 * 8 + 3]);
    }
}
