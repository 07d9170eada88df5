//! [`MageFlow`]: the DiT's forward pass in ComfyUI's order, Qwen-Image's trunk
//! ([`crate::qwen_image::DoubleStream`]) between Mage-Flow's own token embedding, positions and timestep
//! sinusoid, reading one block's weights at a time through [`Model::fetch`].
//!
//! The timestep is rounded as ComfyUI rounds it on every device: `MageFlow.process_timestep` casts the model's
//! timestep (σ) to bf16 before the DiT, and the DiT casts its f32 frequency table to the timestep's dtype, so
//! both are bf16 values even in an f32 run; their product (exact in f32), the ×1000 and the sin/cos are f32.
//! [`timestep_features`] does the same arithmetic on the host, with round-to-nearest-even to bf16 where ComfyUI
//! casts.

use kiln_compute::backend::UnaryOp;
use kiln_compute::dtype::round_to;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::{Error, Result};
use crate::latent_tokens::{self, PatchOrder};
use crate::qwen_image::{self, DoubleStream, Sequence, Timestep};
use crate::rope::Rope;

use super::config::{Config, LATENT_CHANNELS, T_FREQ_DIM};

/// A Mage-Flow DiT: its config and its weights (ComfyUI names, no prefix) under the memory manager.
pub struct MageFlow {
    /// The hyperparameters.
    pub config: Config,
    /// The weights.
    pub weights: Model,
}

/// A token grid of the joint sequence: its RoPE frame and its sides.
#[derive(Debug, Clone, Copy)]
struct Grid {
    frame: i64,
    rows: usize,
    cols: usize,
}

impl MageFlow {
    /// A model from its config and loaded weights (see [`super::load_plan`]).
    pub fn new(config: Config, weights: Model) -> MageFlow {
        MageFlow { config, weights }
    }

    /// ComfyUI's model output for latents `x` `[B, 128, h, w]` (model space, any float dtype, any sides),
    /// `sigmas` (one per sample; the model's timestep is σ, rounded to bf16 as ComfyUI rounds it) and text
    /// features `context` `[B, N, text_dim]`: v = ε − x₀, f32 `[B, 128, h, w]`. Computes in
    /// `b.compute_dtype()`.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        self.forward_with_references(b, x, sigmas, context, &[])
    }

    /// [`MageFlow::forward`] with reference latents (`ReferenceLatent`): each `[1 or B, 128, h, w]` in model
    /// space, of any sides, one token a latent pixel like the latents', appended after their tokens, the i-th
    /// at RoPE frame i (the latents' is 0). Only the latents' own tokens come out.
    pub fn forward_with_references<B: Backend>(
        &self,
        b: &B,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
        references: &[Tensor<B>],
    ) -> Result<Tensor<B>> {
        let (batch, h, w) = self.check_inputs(x, sigmas, context)?;
        let cfg = &self.config;
        let trunk = DoubleStream {
            weights: &self.weights,
            dim: cfg.dim,
            heads: cfg.heads,
            head_dim: cfg.head_dim,
        };
        let dt = b.compute_dtype();

        // Image tokens: the latents' pixels, then each reference's.
        let mut tokens = vec![latent_tokens::patchify(b, &b.cast(x, dt)?, 1)?];
        let mut grids = vec![Grid { frame: 0, rows: h, cols: w }];
        for (i, reference) in references.iter().enumerate() {
            latent_tokens::reference_sides(reference, batch, LATENT_CHANNELS)?;
            let (reference, rows, cols) = latent_tokens::batched_reference(b, reference, batch, 1)?;
            tokens.push(latent_tokens::patchify(b, &reference, 1)?);
            grids.push(Grid { frame: i as i64 + 1, rows, cols });
        }
        let mut img = trunk.image_in(b, &tokens)?;
        drop(tokens);
        let mut txt = trunk.text_in(b, &b.cast(context, dt)?)?;

        let emb = b.from_f32(&[batch, T_FREQ_DIM], &timestep_features(sigmas), DType::F32)?;
        let temb = trunk.timestep_mlp(b, &b.cast(&emb, dt)?)?;
        let timestep = Timestep::new(b.unary(&temb, UnaryOp::Silu)?);
        let seq = Sequence::uniform(self.rope(b, txt.dim(1)?, &grids)?);

        for i in 0..cfg.layers {
            (img, txt) =
                trunk.block(b, &qwen_image::block_prefix(i), &img, &txt, &timestep, &seq)?;
        }
        drop(txt);

        let img = b.slice(&img, 1, 0, h * w)?;
        let y = trunk.final_layer(b, timestep.silu(), &img)?;
        let out =
            latent_tokens::unpatchify(b, &y, LATENT_CHANNELS, (h, w), 1, PatchOrder::ChannelMajor)?;
        Ok(b.cast(&out, DType::F32)?)
    }

    /// Checks the input shapes: returns (batch, h, w).
    fn check_inputs<B: Backend>(
        &self,
        x: &Tensor<B>,
        sigmas: &[f32],
        context: &Tensor<B>,
    ) -> Result<(usize, usize, usize)> {
        let &[batch, channels, h, w] = x.shape() else {
            return Err(Error::Invalid(format!(
                "Mage-Flow latents must be [B, {LATENT_CHANNELS}, h, w], got {:?}",
                x.shape()
            )));
        };
        if channels != LATENT_CHANNELS || batch == 0 || h == 0 || w == 0 {
            return Err(Error::Invalid(format!(
                "Mage-Flow takes non-empty latents of {LATENT_CHANNELS} channels, got {:?}",
                x.shape()
            )));
        }
        if sigmas.len() != batch {
            return Err(Error::Invalid(format!("{} sigmas for a batch of {batch}", sigmas.len())));
        }
        let text_dim = self.config.text_dim;
        match *context.shape() {
            [cb, n, width] if cb == batch && n > 0 && width == text_dim => Ok((batch, h, w)),
            ref other => Err(Error::Invalid(format!(
                "Mage-Flow conditioning must be [{batch}, N > 0, {text_dim}], got {other:?}"
            ))),
        }
    }

    /// The joint sequence's RoPE table: `text_len` text tokens at position 0 on every axis (the identity
    /// rotation: Mage-Flow does not rotate text), then each grid's tokens row-major at (frame, r − ⌈rows/2⌉,
    /// s − ⌈cols/2⌉) (Mage's centring, `arange(n) − (n − n//2)`; Qwen-Image's is −⌊n/2⌋).
    fn rope<B: Backend>(&self, b: &B, text_len: usize, grids: &[Grid]) -> Result<Rope<B>> {
        let cfg = &self.config;
        let mut positions: Vec<[i64; 3]> = vec![[0; 3]; text_len];
        for &Grid { frame, rows, cols } in grids {
            let (r0, c0) = (rows.div_ceil(2) as i64, cols.div_ceil(2) as i64);
            for r in 0..rows as i64 {
                positions.extend((0..cols as i64).map(|s| [frame, r - r0, s - c0]));
            }
        }
        let (cos, sin) = crate::rope::tables(&positions, cfg.axes_dims, qwen_image::ROPE_THETA);
        Rope::upload(b, &cos, &sin, cfg.head_dim / 2, DType::F32)
    }
}

/// The timestep sinusoid `[sigmas.len(), 256]` (row-major) Mage-Flow's `TimestepEmbedding` reads, as ComfyUI
/// computes it: t = σ rounded to bf16 (`MageFlow.process_timestep`); frequencies f_k = exp(−ln(10⁴)·k/128)
/// in f32, rounded to bf16 (the cast to the timestep's dtype); then in f32 a_k = 1000 · (t · f_k) and the
/// row cos a_0 … cos a_127, sin a_0 … sin a_127 (`flip_sin_to_cos`).
pub fn timestep_features(sigmas: &[f32]) -> Vec<f32> {
    let half = T_FREQ_DIM / 2;
    let bf16 = |v: f32| round_to(DType::BF16, v);
    let log_period = -(10000f64.ln() as f32);
    let freqs: Vec<f32> =
        (0..half).map(|k| bf16((log_period * k as f32 / half as f32).exp())).collect();
    let mut emb = Vec::with_capacity(sigmas.len() * T_FREQ_DIM);
    for &sigma in sigmas {
        let t = bf16(sigma);
        let angles: Vec<f32> = freqs.iter().map(|f| 1000.0 * (t * f)).collect();
        emb.extend(angles.iter().map(|a| a.cos()));
        emb.extend(angles.iter().map(|a| a.sin()));
    }
    emb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestep_and_frequencies_are_bf16_values() {
        // 0.7 is 0.69921875 in bf16: the angle of frequency 1 is 699.21875, not 700.
        let emb = timestep_features(&[0.7]);
        assert_eq!(emb.len(), T_FREQ_DIM);
        assert_eq!(emb[0], 699.21875f32.cos());
        assert_eq!(emb[128], 699.21875f32.sin());
        // f_1 = exp(−ln(10⁴)/128) ≈ 0.930572 is 0.9296875 in bf16.
        let t = round_to(DType::BF16, 0.7);
        assert_eq!(emb[1], (1000.0 * (t * 0.9296875f32)).cos());
        // σ = 0 gives cos 1 and sin 0 everywhere.
        let zero = timestep_features(&[0.0]);
        assert!(zero[..128].iter().all(|&c| c == 1.0) && zero[128..].iter().all(|&s| s == 0.0));
    }
}
