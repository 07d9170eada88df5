//! Rotary position embedding on the CPU, in both pair layouts (interleaved and rotate-half).

use super::Cpu;
use super::storage::{PAR_CHUNK, read_f32, tensor_from_f32};
use crate::backend::RopeLayout;
use crate::error::{Error, Result};
use crate::tensor::Tensor;
use rayon::prelude::*;

/// Rotates x `[B, N, H, D]` (see [`crate::Backend::rope`]).
pub(crate) fn rope(
    x: &Tensor<Cpu>,
    cos: &Tensor<Cpu>,
    sin: &Tensor<Cpu>,
    layout: RopeLayout,
) -> Result<Tensor<Cpu>> {
    const OP: &str = "rope";
    let &[_, n, h, d] = x.shape() else {
        return Err(Error::shape(OP, format!("x must be [B, N, H, D], got {:?}", x.shape())));
    };
    if d % 2 != 0 {
        return Err(Error::shape(OP, format!("head dim {d} is odd")));
    }
    let half = d / 2;
    for (t, what) in [(cos, "cos"), (sin, "sin")] {
        if t.shape() != [n, half] {
            return Err(Error::shape(
                OP,
                format!("{what} must be [{n}, {half}], got {:?}", t.shape()),
            ));
        }
    }
    let xs = read_f32(x, OP)?;
    let (cs, sn) = (read_f32(cos, OP)?, read_f32(sin, OP)?);
    let mut out = vec![0.0f32; xs.len()];
    if let Some(heads_per_task) = PAR_CHUNK.checked_div(d) {
        let heads_per_task = heads_per_task.max(1);
        out.par_chunks_mut(heads_per_task * d)
            .zip(xs.par_chunks(heads_per_task * d))
            .enumerate()
            .for_each(|(t, (o, xi))| {
                for (r, (or, xr)) in o.chunks_exact_mut(d).zip(xi.chunks_exact(d)).enumerate() {
                    // Row r of the task is head (b, token, head); its angles are those of the token.
                    let token = (t * heads_per_task + r) / h % n;
                    let c = &cs[token * half..(token + 1) * half];
                    let s = &sn[token * half..(token + 1) * half];
                    match layout {
                        RopeLayout::Interleaved => {
                            for m in 0..half {
                                let (a, b) = (xr[2 * m], xr[2 * m + 1]);
                                or[2 * m] = a * c[m] - b * s[m];
                                or[2 * m + 1] = a * s[m] + b * c[m];
                            }
                        }
                        RopeLayout::Half => {
                            for m in 0..half {
                                let (a, b) = (xr[m], xr[m + half]);
                                or[m] = a * c[m] - b * s[m];
                                or[m + half] = a * s[m] + b * c[m];
                            }
                        }
                    }
                }
            });
    }
    tensor_from_f32(x.shape().to_vec(), out, x.dtype(), OP)
}
