//! torch's bilinear `interpolate` (corners not aligned, no antialiasing) as its CPU kernel computes it, in f32:
//! the Qwen-VL image preprocessing's resize and WanDancer's stretch of the music rows.

/// For each of `len_out` output positions, the two source positions and the second's weight, as torch's
/// bilinear `interpolate` with `align_corners=False`: the source coordinate `(o + ½)·in/out − ½`, clamped at 0.
pub(crate) fn bilinear_taps(len_in: usize, len_out: usize) -> Vec<(usize, usize, f32)> {
    let scale = len_in as f32 / len_out as f32;
    (0..len_out)
        .map(|o| {
            let src = ((o as f32 + 0.5) * scale - 0.5).max(0.0);
            let i0 = (src.floor() as usize).min(len_in - 1);
            let i1 = (i0 + 1).min(len_in - 1);
            (i0, i1, src - i0 as f32)
        })
        .collect()
}

/// One `[h, w]` plane of f32 resized bilinearly to `[out_h, out_w]`.
pub(crate) fn bilinear(x: &[f32], [h, w]: [usize; 2], [out_h, out_w]: [usize; 2]) -> Vec<f32> {
    let (rows, cols) = (bilinear_taps(h, out_h), bilinear_taps(w, out_w));
    let mut out = Vec::with_capacity(out_h * out_w);
    for &(r0, r1, ly) in &rows {
        for &(c0, c1, lx) in &cols {
            let at = |r: usize, c: usize| x[r * w + c];
            let top = at(r0, c0) * (1.0 - lx) + at(r0, c1) * lx;
            let bottom = at(r1, c0) * (1.0 - lx) + at(r1, c1) * lx;
            out.push(top * (1.0 - ly) + bottom * ly);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bilinear_matches_torch_on_a_small_stretch() {
        // torch.nn.functional.interpolate(torch.tensor([[[[0., 1.], [2., 3.]]]]), size=(3, 4), mode='bilinear')
        let got = bilinear(&[0.0, 1.0, 2.0, 3.0], [2, 2], [3, 4]);
        let want = [
            0.0, 0.25, 0.75, 1.0, //
            1.0, 1.25, 1.75, 2.0, //
            2.0, 2.25, 2.75, 3.0,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-6, "{got:?}");
        }
    }
}
