//! NextDiT's 3-axis RoPE (models.md §3.3 steps 4–6): the position ids of caption and image tokens, and the
//! cos/sin tables the backend's interleaved `rope` op takes, built on the host in f64 and stored as f32.

/// A token's position: (caption index or time, row, column).
pub(crate) type Position = [u32; 3];

/// Caption tokens, pads included: (k + 1, 0, 0) for k < `len`.
pub(crate) fn caption_positions(len: usize) -> Vec<Position> {
    (0..len).map(|k| [k as u32 + 1, 0, 0]).collect()
}

/// Image tokens of a `rows × cols` patch grid after a caption of `caption_len` (padded) tokens:
/// (caption_len + 1, r, s) row-major, then `pads` pad tokens at (0, 0, 0).
pub(crate) fn image_positions(
    caption_len: usize,
    rows: usize,
    cols: usize,
    pads: usize,
) -> Vec<Position> {
    let t = caption_len as u32 + 1;
    let grid = (0..rows).flat_map(|r| (0..cols).map(move |s| [t, r as u32, s as u32]));
    grid.chain(std::iter::repeat_n([0, 0, 0], pads)).collect()
}

/// cos and sin tables `[positions.len(), Σ axes / 2]`, row-major: for axis a of width d_a, angle
/// p_a · θ^(−2k/d_a) for k < d_a/2, the axes' angles concatenated in order.
pub(crate) fn tables(positions: &[Position], axes: [usize; 3], theta: f64) -> (Vec<f32>, Vec<f32>) {
    let freqs: Vec<(usize, f64)> = axes
        .iter()
        .enumerate()
        .flat_map(|(a, &d)| (0..d / 2).map(move |k| (a, theta.powf(-2.0 * k as f64 / d as f64))))
        .collect();
    let n = positions.len() * freqs.len();
    let (mut cos, mut sin) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for p in positions {
        for &(a, f) in &freqs {
            let angle = f64::from(p[a]) * f;
            cos.push(angle.cos() as f32);
            sin.push(angle.sin() as f32);
        }
    }
    (cos, sin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_comfyui() {
        assert_eq!(caption_positions(2), vec![[1, 0, 0], [2, 0, 0]]);
        assert_eq!(image_positions(32, 1, 2, 1), vec![[33, 0, 0], [33, 0, 1], [0, 0, 0]]);
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
