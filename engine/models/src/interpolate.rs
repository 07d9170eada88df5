//! torch's bilinear and bicubic `interpolate` (corners not aligned, no antialiasing) as its CPU kernel computes
//! them, in f32: the Qwen-VL image preprocessing's resize and WanDancer's stretch of the music rows.

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

/// torch's bicubic coefficient `A`.
const CUBIC_A: f32 = -0.75;

/// For each of `len_out` output positions, the four source positions (clamped into the input) and their
/// weights, as torch's bicubic `interpolate` with `align_corners=False`: the source coordinate
/// `(o + ½)·in/out − ½` (not clamped), the taps at its floor −1 … +2 with Keys' cubic convolution.
fn bicubic_taps(len_in: usize, len_out: usize) -> Vec<([usize; 4], [f32; 4])> {
    let scale = len_in as f32 / len_out as f32;
    let near = |x: f32| ((CUBIC_A + 2.0) * x - (CUBIC_A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((CUBIC_A * x - 5.0 * CUBIC_A) * x + 8.0 * CUBIC_A) * x - 4.0 * CUBIC_A;
    (0..len_out)
        .map(|o| {
            let src = (o as f32 + 0.5) * scale - 0.5;
            let base = src.floor();
            let t = src - base;
            let at = |k: isize| (base as isize + k).clamp(0, len_in as isize - 1) as usize;
            ([at(-1), at(0), at(1), at(2)], [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)])
        })
        .collect()
}

/// One `[h, w]` plane of f32 resized bicubically to `[out_h, out_w]` (each row's four taps first, then the
/// column's, as torch's CPU kernel sums them).
pub(crate) fn bicubic(x: &[f32], [h, w]: [usize; 2], [out_h, out_w]: [usize; 2]) -> Vec<f32> {
    let (rows, cols) = (bicubic_taps(h, out_h), bicubic_taps(w, out_w));
    let mut out = Vec::with_capacity(out_h * out_w);
    for (ry, wy) in &rows {
        for (cx, wx) in &cols {
            let row = |r: usize| (0..4).map(|k| x[r * w + cx[k]] * wx[k]).sum::<f32>();
            out.push((0..4).map(|k| row(ry[k]) * wy[k]).sum());
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

    #[test]
    fn bicubic_matches_torch_on_a_small_stretch_and_keeps_a_same_size_plane() {
        // torch.nn.functional.interpolate(torch.tensor([[[[0., 1.], [2., 3.]]]]), size=(3, 4), mode='bicubic')
        let got = bicubic(&[0.0, 1.0, 2.0, 3.0], [2, 2], [3, 4]);
        let want = [
            -0.2791, 0.0530, 0.5998, 0.9319, //
            0.8945, 1.2266, 1.7734, 2.1055, //
            2.0681, 2.4002, 2.9470, 3.2791,
        ];
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-4, "{got:?}");
        }
        let plane: Vec<f32> = (0..12).map(|i| i as f32 * 0.37).collect();
        assert_eq!(bicubic(&plane, [3, 4], [3, 4]), plane);
    }
}
