//! The NeRF head (ComfyUI's `chroma_radiance/layers.py`): each patch's pixels, with a DCT-like encoding of their
//! place in the patch, embedded per pixel; then MLP blocks whose weights each patch generates from its trunk
//! token; then the final head to RGB.
//!
//! Every patch is worked on alone, so cutting the patches into tiles (ComfyUI's `nerf_tile_size`) changes no
//! value, only how much is in memory at once.

use kiln_compute::backend::{BinaryOp, Conv2dParams, UnaryOp};
use kiln_compute::memory::{Layer, Model};
use kiln_compute::{Backend, DType, Tensor};

use super::config::{CHANNELS, Config, FinalHead};
use crate::error::Result;
use crate::latent_tokens::{PatchOrder, unpatchify};

/// The RMS norms' ε: ComfyUI's `RMSNorm` has none, so torch takes f32's machine epsilon (16-bit inputs are
/// normed in f32).
const NORM_EPS: f32 = f32::EPSILON;
/// `F.normalize`'s floor on a norm, squared (the ε of the RMS norm that stands in for it, times its width).
const NORMALIZE_EPS_SQ: f32 = 1e-24;

/// The embedder's position features `[p², freqs²]`, row-major: pixel (py, px) of a `patch`-sided patch at
/// coordinates y = py / (patch − 1), x = px / (patch − 1) has feature `a·freqs + b` =
/// cos(π·a·x) · cos(π·b·y) / (1 + a·b) (ComfyUI's `NerfEmbedder.fetch_pos`).
fn dct_table(patch: usize, freqs: usize) -> Vec<f32> {
    let coord = |i: usize| if patch > 1 { i as f32 / (patch - 1) as f32 } else { 0.0 };
    let mut out = Vec::with_capacity(patch * patch * freqs * freqs);
    for py in 0..patch {
        for px in 0..patch {
            let (y, x) = (coord(py), coord(px));
            for a in 0..freqs {
                for bf in 0..freqs {
                    let (a, bf) = (a as f32, bf as f32);
                    let cx = (x * a * std::f32::consts::PI).cos();
                    let cy = (y * bf * std::f32::consts::PI).cos();
                    out.push(cx * cy / (1.0 + a * bf));
                }
            }
        }
    }
    out
}

/// The NeRF head of one call: the config and the weights it fetches.
pub(super) struct Nerf<'a> {
    pub(super) config: &'a Config,
    pub(super) weights: &'a Model,
}

impl Nerf<'_> {
    /// RGB `[B, 3, p·rows, p·cols]` in the compute type from the padded image's pixel patches `pixels`
    /// `[B·L, p², 3]` and the trunk's tokens `hidden` `[B·L, D]` (rows batch-major), worked on `chunk` rows
    /// at a time.
    pub(super) fn forward<B: Backend>(
        &self,
        b: &B,
        pixels: &Tensor<B>,
        hidden: &Tensor<B>,
        (batch, rows, cols): (usize, usize, usize),
        chunk: usize,
    ) -> Result<Tensor<B>> {
        let n = pixels.dim(0)?;
        let chunks: Vec<(usize, usize)> =
            (0..n).step_by(chunk.max(1)).map(|at| (at, chunk.max(1).min(n - at))).collect();
        let mut x = self.embed(b, pixels, &chunks)?;
        for i in 0..self.config.nerf_depth {
            x = self.block(b, i, &x, hidden, &chunks)?;
        }
        self.head(b, &x, (batch, rows, cols))
    }

    /// The embedder (in f32, as ComfyUI's detection sets `nerf_embedder_dtype`): each pixel's channels and
    /// position features through one linear layer, `[B·L, p², nerf_hidden]` in the compute type.
    fn embed<B: Backend>(
        &self,
        b: &B,
        pixels: &Tensor<B>,
        chunks: &[(usize, usize)],
    ) -> Result<Tensor<B>> {
        let cfg = self.config;
        let (p2, f2) = (cfg.patch * cfg.patch, cfg.nerf_max_freqs * cfg.nerf_max_freqs);
        let f32b = b.with_compute_dtype(DType::F32)?;
        let dct =
            b.from_f32(&[1, p2, f2], &dct_table(cfg.patch, cfg.nerf_max_freqs), DType::F32)?;
        let layer = self.weights.fetch(
            b,
            &["nerf_image_embedder.embedder.0.weight", "nerf_image_embedder.embedder.0.bias"],
        )?;
        let mut out = Vec::with_capacity(chunks.len());
        for &(at, len) in chunks {
            let px = b.cast(&b.slice(pixels, 0, at, len)?, DType::F32)?;
            let pos =
                f32b.binary(&f32b.full(&[len, p2, f2], 0.0, DType::F32)?, &dct, BinaryOp::Add)?;
            let input = f32b.concat(&[&px, &pos], -1)?;
            let y = f32b.linear(&input, &layer.weight(0), Some(&layer.weight(1)))?;
            out.push(b.cast(&y, b.compute_dtype())?);
        }
        join(b, out)
    }

    /// NeRF block `i` (ComfyUI's `NerfGLUBlock`): each patch's token generates a gated MLP's three matrices,
    /// each column-normalised, applied to its RMS-normed pixels, added back.
    fn block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        hidden: &Tensor<B>,
        chunks: &[(usize, usize)],
    ) -> Result<Tensor<B>> {
        let p = format!("nerf_blocks.{i}");
        let names = [
            format!("{p}.param_generator.weight"),
            format!("{p}.param_generator.bias"),
            format!("{p}.norm.weight"),
        ];
        let layer = self.weights.fetch(b, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        let mut out = Vec::with_capacity(chunks.len());
        for &(at, len) in chunks {
            let x = b.slice(x, 0, at, len)?;
            let s = b.slice(hidden, 0, at, len)?;
            out.push(self.block_tile(b, &layer, &x, &s)?);
        }
        join(b, out)
    }

    /// One tile of a NeRF block: `x` `[n, p², h]`, the patches' tokens `s` `[n, D]`.
    fn block_tile<B: Backend>(
        &self,
        b: &B,
        layer: &Layer<'_>,
        x: &Tensor<B>,
        s: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let (h, r) = (self.config.nerf_hidden, self.config.nerf_mlp_ratio);
        let (n, k) = (x.dim(0)?, h * h * r);
        let params = b.linear(s, &layer.weight(0), Some(&layer.weight(1)))?;
        // The gate's and the value's matrices [h, h·r] each, transposed to [h·r, h] so that each column of the
        // original (what `normalize(dim=-2)` normalises) is a row.
        let fc1 = b.slice(&params, -1, 0, 2 * k)?.reshape(&[n, 2, h, h * r])?;
        let fc1 =
            normalized_rows(b, &b.permute(&fc1, &[0, 1, 3, 2])?, h)?.reshape(&[n, 2 * h * r, h])?;
        // The output matrix [h·r, h], transposed to [h, h·r].
        let fc2 = b.slice(&params, -1, 2 * k, k)?.reshape(&[n, h * r, h])?;
        let fc2 = normalized_rows(b, &b.permute(&fc2, &[0, 2, 1])?, h * r)?;
        drop(params);
        let y = b.rms_norm(x, Some(&layer.weight(2)), NORM_EPS)?;
        let both = b.matmul(&y, &fc1, true)?;
        let gate = b.slice(&both, -1, 0, h * r)?;
        let value = b.slice(&both, -1, h * r, h * r)?;
        let mixed = b.gated(&gate, &value, UnaryOp::Silu)?;
        Ok(b.binary(&b.matmul(&mixed, &fc2, true)?, x, BinaryOp::Add)?)
    }

    /// The final head on the pixels' features `x` `[B·L, p², h]`: RMS norm per pixel, then a linear layer per
    /// pixel or a 3×3 convolution over the image, `[B, 3, p·rows, p·cols]`.
    fn head<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        (batch, rows, cols): (usize, usize, usize),
    ) -> Result<Tensor<B>> {
        let cfg = self.config;
        let (p, h) = (cfg.patch, cfg.nerf_hidden);
        let prefix = cfg.head.prefix();
        let tail = match cfg.head {
            FinalHead::Linear => "linear",
            FinalHead::Conv => "conv",
        };
        let names = [
            format!("{prefix}.norm.weight"),
            format!("{prefix}.{tail}.weight"),
            format!("{prefix}.{tail}.bias"),
        ];
        let layer = self.weights.fetch(b, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        let y = b.rms_norm(x, Some(&layer.weight(0)), NORM_EPS)?;
        let image = |t: &Tensor<B>, channels: usize| -> Result<Tensor<B>> {
            let tokens = t.reshape(&[batch, rows * cols, p * p * channels])?;
            unpatchify(b, &tokens, channels, (rows, cols), p, PatchOrder::ChannelsLast)
        };
        match cfg.head {
            FinalHead::Linear => {
                let rgb = b.linear(&y, &layer.weight(1), Some(&layer.weight(2)))?;
                image(&rgb, CHANNELS)
            }
            FinalHead::Conv => {
                let features = image(&y, h)?;
                let params = Conv2dParams::same(1);
                Ok(b.conv2d(&features, &layer.weight(1), Some(&layer.weight(2)), params)?)
            }
        }
    }
}

/// `t` `[.., n]` with each last-axis row divided by its Euclidean norm (torch's `F.normalize`, its floor on the
/// norm 1e-12): an RMS norm without gain, scaled by 1/√n.
fn normalized_rows<B: Backend>(b: &B, t: &Tensor<B>, n: usize) -> Result<Tensor<B>> {
    let unit = b.rms_norm(t, None, NORMALIZE_EPS_SQ / n as f32)?;
    Ok(b.affine(&unit, 1.0 / (n as f32).sqrt(), 0.0)?)
}

/// The tiles joined back along the rows (one tile: itself).
fn join<B: Backend>(b: &B, mut tiles: Vec<Tensor<B>>) -> Result<Tensor<B>> {
    if tiles.len() == 1 {
        return Ok(tiles.remove(0));
    }
    Ok(b.concat(&tiles.iter().collect::<Vec<_>>(), 0)?)
}
