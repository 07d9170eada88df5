//! [`ChromaRadiance`]: ComfyUI's `ChromaRadiance._forward` — pixels padded to the patch, a strided convolution
//! into Chroma's trunk, the NeRF head back to pixels, cropped, and (x₀ models) turned into a velocity.

use kiln_compute::backend::BinaryOp;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use super::config::{CHANNELS, Config, DEFAULT_NERF_TILE};
use super::nerf::Nerf;
use crate::error::{Error, Result};
use crate::flux::{Flux, Layout};
use crate::latent_tokens::{padded, patchify};

/// What ComfyUI's `ChromaRadianceOptions` node overrides for a call (its `chroma_radiance_options`); `None`
/// keeps the model's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RadianceOptions {
    /// Patches per NeRF tile; 0 works on every patch at once. The values do not depend on it.
    pub nerf_tile_size: Option<usize>,
    /// Whether text tokens take sequential positions (the node can force this on for checkpoints trained so
    /// that lack the marker key).
    pub sequential_txt_ids: Option<bool>,
}

/// A Chroma Radiance DiT: its config and Chroma's trunk over its loaded weights (every weight, the NeRF head's
/// included, by ComfyUI's name).
pub struct ChromaRadiance {
    /// The hyperparameters.
    pub config: Config,
    trunk: Flux,
}

impl ChromaRadiance {
    /// A model from its config and its loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> ChromaRadiance {
        let trunk = Flux::new(config.trunk.clone(), Layout::Comfy, weights);
        ChromaRadiance { config, trunk }
    }

    /// The loaded weights.
    pub fn weights(&self) -> &Model {
        &self.trunk.weights
    }

    /// ComfyUI's model output for pixels `x` `[B, 3, h, w]` (any float type) at `timesteps` (σ per sample, as
    /// ComfyUI's FLUX model sampling hands it over), text features `context` `[B, N, text_dim]` (T5-XXL's) and
    /// the distilled guidance per sample (`None`: 0, Chroma's default): f32 `[B, 3, h, w]`, a velocity. Odd sides
    /// are padded circularly to the patch and cropped back; an x₀ model's prediction becomes
    /// `(x − x₀) / σ`, with x unpadded (ComfyUI subtracts from the padded image, which fails for sides that are
    /// not multiples of the patch; for the others both are the same).
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        guidance: Option<&[f32]>,
        options: &RadianceOptions,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let (batch, h, w) = self.check_inputs(x, timesteps, context, guidance)?;
        let p = cfg.patch;
        let x = b.cast(x, b.compute_dtype())?;
        let (img, rows, cols) = padded(b, &x, p)?;
        let pixels = patchify(b, &img, p)?;
        drop(img);
        let tokens = self.patch_embed(b, &pixels)?;
        let sequential = options.sequential_txt_ids.unwrap_or(cfg.sequential_txt_ids);
        let positions = positions(context.dim(1)?, rows, cols, sequential);
        let hidden =
            self.trunk.chroma_trunk(b, tokens, context, &positions, (timesteps, guidance))?;
        let patches = batch * rows * cols;
        let hidden = hidden.reshape(&[patches, cfg.trunk.dim])?;
        let pixels = pixels.reshape(&[patches, CHANNELS, p * p])?;
        let pixels = b.permute(&pixels, &[0, 2, 1])?;
        let tile = options.nerf_tile_size.unwrap_or(DEFAULT_NERF_TILE);
        // ComfyUI's tiles: `tile` patches' worth of rows at a time where there are more patches than that.
        let chunk = if tile > 0 && rows * cols > tile { tile * batch } else { patches };
        let nerf = Nerf { config: cfg, weights: self.weights() };
        let mut out = nerf.forward(b, &pixels, &hidden, (batch, rows, cols), chunk)?;
        if rows * p > h {
            out = b.slice(&out, 2, 0, h)?;
        }
        if cols * p > w {
            out = b.slice(&out, 3, 0, w)?;
        }
        let out = b.cast(&out, DType::F32)?;
        if !cfg.x0 {
            return Ok(out);
        }
        let sigma = b.from_f32(&[batch, 1, 1, 1], timesteps, DType::F32)?;
        let noisy = b.cast(&x, DType::F32)?;
        Ok(b.binary(&b.binary(&noisy, &out, BinaryOp::Sub)?, &sigma, BinaryOp::Div)?)
    }

    /// `img_in_patch`, the strided convolution, as a linear layer over the channel-major patches `pixels`
    /// `[B, L, 3·p²]`: the tokens `[B, L, D]`.
    fn patch_embed<B: Backend>(&self, b: &B, pixels: &Tensor<B>) -> Result<Tensor<B>> {
        let layer = self.weights().fetch(b, &["img_in_patch.weight", "img_in_patch.bias"])?;
        let p = self.config.patch;
        let weight = layer.weight(0).reshape(&[self.config.trunk.dim, CHANNELS * p * p])?;
        Ok(b.linear(pixels, &weight, Some(&layer.weight(1)))?)
    }

    /// Checks the inputs' shapes: returns (batch, h, w).
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        timesteps: &[f32],
        context: &Tensor<B>,
        guidance: Option<&[f32]>,
    ) -> Result<(usize, usize, usize)> {
        let text_dim = self.config.trunk.text_dim;
        let &[batch, CHANNELS, h, w] = x.shape() else {
            return Err(Error::Invalid(format!(
                "Chroma Radiance takes pixels [B, 3, h, w], got {:?}",
                x.shape()
            )));
        };
        if batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "Chroma Radiance takes non-empty pixels, got {:?}",
                x.shape()
            )));
        }
        if timesteps.len() != batch || guidance.is_some_and(|g| g.len() != batch) {
            return Err(Error::Invalid(format!(
                "Chroma Radiance needs one timestep (and guidance, if any) per sample of a batch of {batch}"
            )));
        }
        match context.shape() {
            &[cb, n, width] if cb == batch && n > 0 && width == text_dim => Ok((batch, h, w)),
            other => Err(Error::Invalid(format!(
                "Chroma Radiance conditioning must be [{batch}, N > 0, {text_dim}] (T5-XXL's features), got \
                 {other:?}"
            ))),
        }
    }
}

/// The RoPE positions of `text` text tokens then a `rows × cols` image grid: text at (l, 0, 0) with sequential
/// ids, else (0, 0, 0); the image's patch (r, c) at (0, r, c).
fn positions(text: usize, rows: usize, cols: usize, sequential: bool) -> Vec<[i64; 4]> {
    let mut out: Vec<[i64; 4]> =
        (0..text as i64).map(|l| if sequential { [l, 0, 0, 0] } else { [0; 4] }).collect();
    for r in 0..rows as i64 {
        out.extend((0..cols as i64).map(|c| [0, r, c, 0]));
    }
    out
}
