//! OmniGen2's 3-axis RoPE positions (ComfyUI's `OmniGen2RotaryPosEmbed`) for the joint sequence [caption,
//! references, image], and the cos/sin tables the backend's interleaved `rope` op takes.
//!
//! Caption token k sits at (k, k, k). Each reference image, then the image, is a grid of tokens (t, r, s) row-major
//! at one time index t: the first at the caption's length, each next one shifted by the larger side (in tokens)
//! of the reference before it.

/// A token's position: (caption index or time, row, column).
pub(crate) type Position = [i64; 3];

/// A patch grid's sides in tokens: (rows, columns).
pub(crate) type Grid = (usize, usize);

/// The positions of a caption of `caption_len` tokens, the `references`' grids and the image's, in that order.
pub(crate) fn positions(caption_len: usize, references: &[Grid], image: Grid) -> Vec<Position> {
    let mut out: Vec<Position> = (0..caption_len as i64).map(|k| [k; 3]).collect();
    let mut t = caption_len;
    for &(rows, cols) in references {
        out.extend(grid(t, rows, cols));
        t += rows.max(cols);
    }
    out.extend(grid(t, image.0, image.1));
    out
}

/// A `rows × cols` grid at time `t`: (t, r, s) row-major.
fn grid(t: usize, rows: usize, cols: usize) -> impl Iterator<Item = Position> {
    let t = t as i64;
    (0..rows as i64).flat_map(move |r| (0..cols as i64).map(move |s| [t, r, s]))
}

/// cos and sin tables `[positions.len(), Σ axes / 2]` (see [`crate::rope::tables`]).
pub(crate) fn tables(positions: &[Position], axes: [usize; 3], theta: f64) -> (Vec<f32>, Vec<f32>) {
    crate::rope::tables(positions, axes, theta)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_follow_comfyui() {
        assert_eq!(positions(2, &[], (1, 2)), vec![[0, 0, 0], [1, 1, 1], [2, 0, 0], [2, 0, 1]]);
        // A 1×3 reference at time 1 shifts the next one by 3; a 2×1 one by 2.
        let got = positions(1, &[(1, 3), (2, 1)], (1, 1));
        let want =
            vec![[0, 0, 0], [1, 0, 0], [1, 0, 1], [1, 0, 2], [4, 0, 0], [4, 1, 0], [6, 0, 0]];
        assert_eq!(got, want);
    }
}
