//! Multi-axis rotary position embeddings (the NextDiT / Flux / Qwen-Image form): each token's position on
//! three or four axes, each axis owning a slice of the head's rotation pairs, as the cos/sin tables the backend's
//! `rope` op takes, built on the host in f64 and stored as f32.

/// cos and sin tables `[positions.len(), Σ axes / 2]`, row-major: for axis a of width d_a, angle
/// p_a · θ^(−2k/d_a) for k < d_a/2, the axes' angles concatenated in order.
pub(crate) fn tables<const N: usize>(
    positions: &[[i64; N]],
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
            let angle = p[a] as f64 * f;
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
