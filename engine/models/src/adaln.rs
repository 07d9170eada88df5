//! adaLN modulation as the DiTs with FLUX's blocks read it (FLUX.1 and .2, Chroma, HiDream): per-sample (shift,
//! scale, gate) sets cut from a modulation vector, `LayerNorm(x)·(1 + scale) + shift` before a sub-block and the
//! gated residual after it; and as Lumina's blocks read it (Z-Image, Lumina 2, OmniGen2): [`ScaleGates`], no
//! shift.

use kiln_compute::backend::{BinaryOp, UnaryOp};
use kiln_compute::{Backend, Tensor};

use crate::error::Result;

/// One modulation's (shift, scale, gate): `[B, D]`, `[B, D]` and `[B, 1, D]`.
pub(crate) struct Modulation<B: Backend> {
    pub(crate) shift: Tensor<B>,
    pub(crate) scale: Tensor<B>,
    pub(crate) gate: Tensor<B>,
}

impl<B: Backend> Modulation<B> {
    /// The first `sets` modulations of `m` `[B, ≥ 3·sets·dim]`: set s is chunks 3s, 3s + 1, 3s + 2 (shift, scale,
    /// gate) of width `dim`.
    pub(crate) fn sets(
        b: &B,
        m: &Tensor<B>,
        dim: usize,
        sets: usize,
    ) -> Result<Vec<Modulation<B>>> {
        let batch = m.dim(0)?;
        let chunk = |k: usize| b.slice(m, -1, k * dim, dim);
        (0..sets)
            .map(|s| {
                Ok(Modulation {
                    shift: chunk(3 * s)?,
                    scale: chunk(3 * s + 1)?,
                    gate: chunk(3 * s + 2)?.reshape(&[batch, 1, dim])?,
                })
            })
            .collect()
    }

    /// LayerNorm(x) (no affine weights, ε `eps`) · (1 + scale) + shift.
    pub(crate) fn modulated(&self, b: &B, x: &Tensor<B>, eps: f32) -> Result<Tensor<B>> {
        let n = b.layer_norm(x, None, None, eps)?;
        Ok(b.modulate(&n, &self.scale, Some(&self.shift))?)
    }

    /// y · gate.
    pub(crate) fn gated(&self, b: &B, y: &Tensor<B>) -> Result<Tensor<B>> {
        Ok(b.binary(y, &self.gate, BinaryOp::Mul)?)
    }

    /// x + y · gate.
    pub(crate) fn gated_add(&self, b: &B, x: &Tensor<B>, y: &Tensor<B>) -> Result<Tensor<B>> {
        Ok(b.binary(x, &self.gated(b, y)?, BinaryOp::Add)?)
    }
}

/// A Lumina block's modulation (Z-Image, Lumina 2, OmniGen2): the attention's and the MLP's scales (applied as
/// `1 + s`) `[B, D]` and their gates, `tanh(g)` `[B, 1, D]` to broadcast over tokens.
pub(crate) struct ScaleGates<B: Backend> {
    pub(crate) attn_scale: Tensor<B>,
    pub(crate) attn_gate: Tensor<B>,
    pub(crate) ffn_scale: Tensor<B>,
    pub(crate) ffn_gate: Tensor<B>,
}

impl<B: Backend> ScaleGates<B> {
    /// The four chunks of width `dim` of `m` `[B, 4·dim]`, in Lumina's order: attention scale, attention gate, MLP
    /// scale, MLP gate.
    pub(crate) fn of(b: &B, m: &Tensor<B>, dim: usize) -> Result<ScaleGates<B>> {
        let chunk = |k: usize| b.slice(m, -1, k * dim, dim);
        let gate = |k: usize| -> Result<Tensor<B>> {
            let g = b.unary(&chunk(k)?, UnaryOp::Tanh)?;
            let batch = g.dim(0)?;
            Ok(g.reshape(&[batch, 1, dim])?)
        };
        Ok(ScaleGates {
            attn_scale: chunk(0)?,
            attn_gate: gate(1)?,
            ffn_scale: chunk(2)?,
            ffn_gate: gate(3)?,
        })
    }
}
