//! Multi-axis rotary position embeddings (the NextDiT / Flux / Qwen-Image form): each token's position on
//! three or four axes, each axis owning a slice of the head's rotation pairs, as the cos/sin tables the backend's
//! `rope` op takes, built on the host in f64 and stored as f32.

use kiln_compute::dtype::round_to;
use kiln_compute::{Backend, DType, Tensor};

use crate::error::Result;

/// A RoPE's cosine and sine tables `[positions, pairs]` on the device, as the backend's `rope` op takes them.
pub(crate) struct Rope<B: Backend> {
    /// The cosines of each position's angles.
    pub(crate) cos: Tensor<B>,
    /// Their sines.
    pub(crate) sin: Tensor<B>,
}

impl<B: Backend> Rope<B> {
    /// Host cosines and sines, `pairs` a position (row-major), as tables of `dtype` on `b`.
    pub(crate) fn upload(
        b: &B,
        cos: &[f32],
        sin: &[f32],
        pairs: usize,
        dtype: DType,
    ) -> Result<Rope<B>> {
        let shape = [cos.len() / pairs, pairs];
        Ok(Rope { cos: b.from_f32(&shape, cos, dtype)?, sin: b.from_f32(&shape, sin, dtype)? })
    }

    /// The tables of `angles` (`pairs` a position, computed in f32 as ComfyUI computes them), stored as `dtype`.
    pub(crate) fn of_angles(b: &B, angles: &[f32], pairs: usize, dtype: DType) -> Result<Rope<B>> {
        let cos: Vec<f32> = angles.iter().map(|a| a.cos()).collect();
        let sin: Vec<f32> = angles.iter().map(|a| a.sin()).collect();
        Rope::upload(b, &cos, &sin, pairs, dtype)
    }

    /// The tables' rows `start .. start + len`: one run of a joint sequence's positions.
    pub(crate) fn rows(&self, b: &B, start: usize, len: usize) -> Result<Rope<B>> {
        Ok(Rope {
            cos: b.slice(&self.cos, 0, start, len)?,
            sin: b.slice(&self.sin, 0, start, len)?,
        })
    }
}

/// RoPE dims per axis for a head of `head_dim` split in three equal thirds (caption/time, row, column: Lumina 2's
/// 96 → 32 each, OmniGen2's and Boogu-Image's 120 → 40 each); `None` when a third would be odd or empty.
pub fn equal_thirds(head_dim: usize) -> Option<[usize; 3]> {
    (head_dim > 0 && head_dim.is_multiple_of(6)).then_some([head_dim / 3; 3])
}

/// cos and sin tables `[positions.len(), Σ axes / 2]`, row-major: for axis a of width d_a, angle
/// p_a · θ^(−2k/d_a) for k < d_a/2, the axes' angles concatenated in order.
pub(crate) fn tables<const N: usize>(
    positions: &[[i64; N]],
    axes: [usize; N],
    theta: f64,
) -> (Vec<f32>, Vec<f32>) {
    let positions: Vec<[f64; N]> = positions.iter().map(|p| p.map(|v| v as f64)).collect();
    tables_at(&positions, axes, theta)
}

/// [`tables`] for positions that need not be whole (a scaled or shifted RoPE, [`RopeOptions`]).
pub(crate) fn tables_at<const N: usize>(
    positions: &[[f64; N]],
    axes: [usize; N],
    theta: f64,
) -> (Vec<f32>, Vec<f32>) {
    let freqs: Vec<(usize, f64)> = axes
        .iter()
        .enumerate()
        .flat_map(|(a, &d)| (0..d / 2).map(move |k| (a, theta.powf(-2.0 * k as f64 / d as f64))))
        .collect();
    let n = positions.len() * freqs.len();
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for p in positions {
        for &(a, f) in &freqs {
            let angle = p[a] * f;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

/// `ScaleROPE`'s options (ComfyUI's `transformer_options["rope_options"]`): on each axis the token positions
/// 0, 1, 2, … become shift, shift + scale, shift + 2·scale, …
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeOptions {
    /// The scales of the frame (t), row (y) and column (x) axes.
    pub scale: [f64; 3],
    /// The shifts of the frame (t), row (y) and column (x) axes.
    pub shift: [f64; 3],
}

impl Default for RopeOptions {
    fn default() -> RopeOptions {
        RopeOptions { scale: [1.0; 3], shift: [0.0; 3] }
    }
}

impl RopeOptions {
    /// Whether the positions stay as they are.
    pub fn is_identity(&self) -> bool {
        *self == RopeOptions::default()
    }

    /// The `steps` positions of axis `axis` (0 t, 1 y, 2 x) starting at `start`, as ComfyUI's Wan builds them:
    /// `torch.linspace(start + shift, start + shift + (steps − 1)·scale, steps)` in float32 (its halfway
    /// formula, so the values are float32's).
    pub fn positions(&self, axis: usize, start: f64, steps: usize) -> impl Iterator<Item = f64> {
        let first = (start + self.shift[axis]) as f32;
        let last = (start + self.shift[axis] + (steps as f64 - 1.0) * self.scale[axis]) as f32;
        linspace(first, last, steps).map(f64::from)
    }
}

/// `torch.linspace(start, end, steps)` in float32: its values exactly (the kernel's halfway formula, each half
/// counted from its own end; one step is `start`).
pub fn linspace(start: f32, end: f32, steps: usize) -> impl Iterator<Item = f32> {
    let step = if steps > 1 { (end - start) / (steps - 1) as f32 } else { 0.0 };
    let half = steps / 2;
    (0..steps).map(move |i| {
        if steps == 1 || i < half {
            start + step * i as f32
        } else {
            end - step * (steps - i - 1) as f32
        }
    })
}

/// `torch.linspace(start, end, steps, dtype=dtype)`: [`linspace`] for f32; for a 16-bit type ATen's arithmetic
/// in that type (every operation rounded to it): the ends rounded, the step r(r(end − start) / r(steps − 1)),
/// element i r(start + r(step · r(i))) in the first half and r(end − r(step · r(steps − 1 − i))) in the second.
pub(crate) fn linspace_in(dtype: DType, start: f32, end: f32, steps: usize) -> Vec<f32> {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return linspace(start, end, steps).collect();
    }
    let r = |v: f32| round_to(dtype, v);
    let (start, end) = (r(start), r(end));
    let step = if steps > 1 { r(r(end - start) / r((steps - 1) as f32)) } else { 0.0 };
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if steps == 1 || i < half {
                r(start + r(step * r(i as f32)))
            } else {
                r(end - r(step * r((steps - 1 - i) as f32)))
            }
        })
        .collect()
}

/// [`linspace`] in float64 (`torch.linspace(.., dtype=torch.float64)`, as ComfyUI's beta schedule makes it).
pub(crate) fn linspace_f64(start: f64, end: f64, steps: usize) -> impl Iterator<Item = f64> {
    let step = if steps > 1 { (end - start) / (steps - 1) as f64 } else { 0.0 };
    let half = steps / 2;
    (0..steps).map(move |i| {
        if steps == 1 || i < half {
            start + step * i as f64
        } else {
            end - step * (steps - i - 1) as f64
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_thirds_split_the_head() {
        assert_eq!(equal_thirds(120), Some([40, 40, 40]));
        assert_eq!(equal_thirds(96), Some([32, 32, 32]));
        assert_eq!(equal_thirds(24), Some([8, 8, 8]));
        assert_eq!(equal_thirds(16), None);
        assert_eq!(equal_thirds(0), None);
    }

    #[test]
    fn positions_are_scaled_and_shifted_as_comfyuis_linspace() {
        let identity = RopeOptions::default();
        assert_eq!(identity.positions(0, 0.0, 4).collect::<Vec<_>>(), [0.0, 1.0, 2.0, 3.0]);
        let chrono = RopeOptions { scale: [7.0, 1.0, 1.0], shift: [0.0, 2.0, 0.0] };
        assert_eq!(chrono.positions(0, 0.0, 2).collect::<Vec<_>>(), [0.0, 7.0]);
        assert_eq!(chrono.positions(1, 0.0, 3).collect::<Vec<_>>(), [2.0, 3.0, 4.0]);
        assert_eq!(chrono.positions(0, 1.0, 1).collect::<Vec<_>>(), [1.0]);
        // float32 values, both halves reaching the ends exactly.
        let third = RopeOptions { scale: [1.0 / 3.0, 1.0, 1.0], shift: [0.0; 3] };
        let got: Vec<f64> = third.positions(0, 0.0, 4).collect();
        assert_eq!(got[0], 0.0);
        assert_eq!(got[3], f64::from(1.0f32));
        assert_eq!(got[1], f64::from((1.0f32 / 3.0f32) * 1.0));
    }

    #[test]
    fn linspace_is_torchs() {
        assert_eq!(linspace(0.0, 1.0, 1).collect::<Vec<_>>(), [0.0]);
        assert_eq!(linspace(-1.0, 1.0, 3).collect::<Vec<_>>(), [-1.0, 0.0, 1.0]);
        assert_eq!(linspace(2.0, 2.0, 0).count(), 0);
        assert_eq!(
            linspace(0.0, 1.0, 4).collect::<Vec<_>>(),
            [0.0, 1.0 / 3.0, 1.0 - 1.0 / 3.0, 1.0]
        );
        assert_eq!(linspace(-0.0, 2.5, 2).collect::<Vec<_>>(), [0.0, 2.5]);
    }

    #[test]
    fn a_16_bit_linspace_rounds_as_atens() {
        assert_eq!(linspace_in(DType::F32, 0.0, 3.0, 4), [0.0, 1.0, 2.0, 3.0]);
        // Up to 256 every integer is a bf16.
        let short = linspace_in(DType::BF16, 0.0, 255.0, 256);
        assert!(short.iter().enumerate().all(|(i, &p)| p == i as f32));
        // 300 positions: the end rounds to 300 (bf16 steps by 2 from 256), the step to r(300 / r(299)) = 1; the
        // first half counts up from 0, the second back from 300, rounded: ComfyUI's text positions in bf16.
        let long = linspace_in(DType::BF16, 0.0, 299.0, 300);
        assert_eq!(long[..150], (0..150).map(|i| i as f32).collect::<Vec<_>>()[..]);
        assert_eq!((long[150], long[200]), (151.0, 201.0));
        assert_eq!((long[297], long[298], long[299]), (298.0, 300.0, 300.0));
        assert_eq!(linspace_in(DType::F16, 0.0, 299.0, 300)[299], 299.0);
    }

    #[test]
    fn tables_concatenate_axes() {
        let (cos, sin) = tables(&[[1, 2, 3]], [2, 4, 2], 256.0);
        assert_eq!(cos.len(), 4);
        // Axis 0 (k = 0): angle 1; axis 1: angles 2 and 2/16; axis 2: angle 3.
        let want = [1.0f64, 2.0, 2.0 / 16.0, 3.0];
        for (i, w) in want.iter().enumerate() {
            assert!((f64::from(cos[i]) - w.cos()).abs() < 1e-7, "cos {i}");
            assert!((f64::from(sin[i]) - w.sin()).abs() < 1e-7, "sin {i}");
        }
    }
}
