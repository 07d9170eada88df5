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

/// cos and sin tables `[positions.len(), Σ axes / 2]` (see [`crate::rope::tables`]).
pub(crate) fn tables(positions: &[Position], axes: [usize; 3], theta: f64) -> (Vec<f32>, Vec<f32>) {
    let positions: Vec<[i64; 3]> = positions.iter().map(|p| p.map(i64::from)).collect();
    crate::rope::tables(&positions, axes, theta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_comfyui() {
        assert_eq!(caption_positions(2), vec![[1, 0, 0], [2, 0, 0]]);
        assert_eq!(image_positions(32, 1, 2, 1), vec![[33, 0, 0], [33, 0, 1], [0, 0, 0]]);
    }
}
