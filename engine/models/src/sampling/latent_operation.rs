//! ComfyUI's `LATENT_OPERATION`s (`comfy_extras.nodes_latent`): functions of a latent that `LatentApplyOperation`
//! applies to a latent and `LatentApplyOperationCFG` to the guidance before CFG.
//!
//! Both work on each position's vector over the channels: its length (`torch.linalg.vector_norm(dim=1)`) and
//! its direction. The arithmetic is torch's in f32, in its order; means and standard deviations are
//! accumulated in f64.

use super::guidance::{channel_norms, dims};
use crate::error::{Error, Result};
use crate::gaussian;

/// A latent operation.
#[derive(Clone, Debug, PartialEq)]
pub enum LatentOperation {
    /// `LatentOperationTonemapReinhard`: each position's length `m` compressed by Reinhard's `m / (m + 1)`
    /// relative to `top = (5·std + mean) · multiplier` of the sample's lengths, its direction kept.
    TonemapReinhard {
        /// Scales the knee.
        multiplier: f32,
    },
    /// `LatentOperationSharpen`: the directions (the latent over its lengths) through `ImageSharpen`'s
    /// unsharp mask, times the lengths again.
    Sharpen {
        /// The kernel reaches this far from its middle.
        radius: usize,
        /// The Gaussian's width on ComfyUI's -1..=1 grid.
        sigma: f64,
        /// The strength.
        alpha: f64,
    },
}

impl LatentOperation {
    /// The operation on `latent` `[B, C, ...]` (the sharpening: `[B, C, H, W]` larger than the radius).
    pub fn apply(&self, latent: &[f32], shape: &[usize]) -> Result<Vec<f32>> {
        match *self {
            LatentOperation::TonemapReinhard { multiplier } => {
                Ok(tonemap_reinhard(latent, shape, multiplier))
            }
            LatentOperation::Sharpen { radius, sigma, alpha } => {
                sharpen(latent, shape, radius, sigma, alpha)
            }
        }
    }
}

/// [`LatentOperation::TonemapReinhard`] on `latent` `[B, C, ...]`.
fn tonemap_reinhard(latent: &[f32], shape: &[usize], multiplier: f32) -> Vec<f32> {
    let (batch, channels, inner) = dims(shape);
    let lengths: Vec<f32> = channel_norms(latent, shape).iter().map(|n| n + 1e-10).collect();
    let mut out = vec![0.0f32; latent.len()];
    for (b, m) in lengths.chunks_exact(inner.max(1)).enumerate().take(batch) {
        let n = m.len() as f64;
        let mean = m.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        // torch.std: Bessel's correction (NaN for one position, as torch gives).
        let var = m.iter().map(|&v| (f64::from(v) - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let (mean, std) = (mean as f32, var.sqrt() as f32);
        let top = (std * 5.0 + mean) * multiplier;
        let inverse = 1.0 / top;
        for (i, &length) in m.iter().enumerate() {
            let scaled = length * inverse;
            let compressed = scaled / (scaled + 1.0) * top;
            for c in 0..channels {
                let j = (b * channels + c) * inner + i;
                out[j] = latent[j] / length * compressed;
            }
        }
    }
    out
}

/// [`LatentOperation::Sharpen`] on `latent` `[B, C, H, W]`.
fn sharpen(
    latent: &[f32],
    shape: &[usize],
    radius: usize,
    sigma: f64,
    alpha: f64,
) -> Result<Vec<f32>> {
    let &[_, channels, h, w] = shape else {
        return Err(Error::Invalid(format!(
            "LatentOperationSharpen works on image latents [B, C, H, W], got shape {shape:?}"
        )));
    };
    if radius >= h || radius >= w {
        return Err(Error::Invalid(format!(
            "LatentOperationSharpen: a sharpen_radius of {radius} needs a latent larger than it on both sides \
             (reflect padding), got {w}x{h}"
        )));
    }
    let lengths: Vec<f32> = channel_norms(latent, shape).iter().map(|n| n + 1e-6).collect();
    let kernel = gaussian::sharpen_kernel(2 * radius + 1, sigma, alpha);
    let plane = h * w;
    let mut direction = vec![0.0f32; plane];
    let mut sharpened = vec![0.0f32; plane];
    let mut out = vec![0.0f32; latent.len()];
    for (k, (src, dst)) in latent.chunks_exact(plane).zip(out.chunks_exact_mut(plane)).enumerate() {
        let m = &lengths[(k / channels) * plane..(k / channels + 1) * plane];
        for ((d, v), l) in direction.iter_mut().zip(src).zip(m) {
            *d = v / l;
        }
        gaussian::convolve_plane(&direction, (h, w), &kernel, radius, &mut sharpened);
        for ((o, s), l) in dst.iter_mut().zip(&sharpened).zip(m) {
            *o = l * s;
        }
    }
    Ok(out)
}
