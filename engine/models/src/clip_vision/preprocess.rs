//! ComfyUI's `clip_preprocess` (`comfy/clip_model.py`) on the host: an `IMAGE` `[B, H, W, C]` in 0..=1 to a
//! vision tower's pixel values `[B, 3, size, size]`, and those cut into the patches its embedding multiplies.
//!
//! Invariant: the resize is torch's `interpolate(mode="bicubic", antialias=True)` computed as torch computes
//! it for f32 (separable, width first, Keys' cubic with a = −0.5 stretched by the downscale factor, weights
//! and sums in f32), so the 8-bit rounding that follows lands where ComfyUI's does.

use crate::error::{Error, Result};

/// `[B, H, W, C]` (C ≥ 3; channels past the third are dropped) → `[B, 3, size, size]`: resized by bicubic
/// with antialiasing — with `crop`, so the shorter side is `size` (each side `round(side · size / shorter)`,
/// half to even) and then the centre `size × size` cut out; without, squashed to `size × size` — unless it is
/// `size × size` already; then rounded to 8 bits and normalised per channel with `mean` and `std`.
pub fn preprocess(
    image: &[f32],
    shape: [usize; 4],
    size: usize,
    mean: [f32; 3],
    std: [f32; 3],
    crop: bool,
) -> Result<Vec<f32>> {
    let [batch, h, w, c] = shape;
    if c < 3 || h == 0 || w == 0 || size == 0 || image.len() != batch * h * w * c {
        return Err(Error::Invalid(format!(
            "a vision tower takes an RGB image [B, H, W, 3], not {shape:?} ({} values)",
            image.len()
        )));
    }
    let (out_h, out_w) = if h == size && w == size {
        (h, w)
    } else if crop {
        let scale = size as f64 / h.min(w) as f64;
        (
            (scale * h as f64).round_ties_even() as usize,
            (scale * w as f64).round_ties_even() as usize,
        )
    } else {
        (size, size)
    };
    let (top, left) = ((out_h - size) / 2, (out_w - size) / 2);
    let (rows, columns) = (weights(h, out_h), weights(w, out_w));
    let mut out = Vec::with_capacity(batch * 3 * size * size);
    for b in 0..batch {
        for k in 0..3 {
            let plane: Vec<f32> = (0..h * w).map(|i| image[(b * h * w + i) * c + k]).collect();
            let resized = resample(&plane, (h, w), &rows, &columns);
            for y in top..top + size {
                for x in left..left + size {
                    let v = resized[y * out_w + x];
                    let v = (255.0 * v).clamp(0.0, 255.0).round_ties_even() / 255.0;
                    out.push((v - mean[k]) / std[k]);
                }
            }
        }
    }
    Ok(out)
}

/// Pixel values `[B, 3, size, size]` → patches `[B, (size/p)², 3·p·p]`, patch (r, s) row-major, feature
/// `(c·p + y)·p + x` = pixel (c, p·r + y, p·s + x): the order of a `[width, 3, p, p]` convolution weight
/// flattened, so the patch embedding is one matrix product.
pub fn patches(pixels: &[f32], batch: usize, size: usize, p: usize) -> Vec<f32> {
    let grid = size / p;
    let mut out = Vec::with_capacity(batch * grid * grid * 3 * p * p);
    for b in 0..batch {
        let image = &pixels[b * 3 * size * size..(b + 1) * 3 * size * size];
        for r in 0..grid {
            for s in 0..grid {
                for c in 0..3 {
                    for y in 0..p {
                        let row = (c * size + r * p + y) * size + s * p;
                        out.extend_from_slice(&image[row..row + p]);
                    }
                }
            }
        }
    }
    out
}

/// One plane `[h, w]` resampled to the sizes `rows` and `columns` were made for: along the width first, then
/// the height, a side whose size does not change left as it is (as torch's separable kernel does).
fn resample(
    plane: &[f32],
    (h, w): (usize, usize),
    rows: &[(usize, Vec<f32>)],
    columns: &[(usize, Vec<f32>)],
) -> Vec<f32> {
    let horizontal: Vec<f32> = if columns.len() == w {
        plane.to_vec()
    } else {
        (0..h)
            .flat_map(|y| columns.iter().map(move |(x0, taps)| dot(plane, y * w + x0, 1, taps)))
            .collect()
    };
    let out_w = columns.len();
    if rows.len() == h {
        return horizontal;
    }
    rows.iter()
        .flat_map(|(y0, taps)| {
            let horizontal = &horizontal;
            (0..out_w).map(move |x| dot(horizontal, y0 * out_w + x, out_w, taps))
        })
        .collect()
}

/// `Σ taps[j] · values[start + j · stride]`, summed in order from the first tap as torch does.
fn dot(values: &[f32], start: usize, stride: usize, taps: &[f32]) -> f32 {
    let mut t = values[start] * taps[0];
    for (j, w) in taps.iter().enumerate().skip(1) {
        t += values[start + j * stride] * w;
    }
    t
}

/// For each of `out` outputs, its first input and its weights: torch's `_compute_indices_min_size_weights_aa`
/// for bicubic (support 2, stretched by the scale when shrinking) with `scalar_t = float`, each step promoted
/// to f64 or rounded to f32 where torch's expression does (the double literals 0.5, 1.0 and 4 · 0.5).
fn weights(input: usize, out: usize) -> Vec<(usize, Vec<f32>)> {
    let scale = input as f32 / out as f32;
    let shrinking = scale >= 1.0;
    let support = if shrinking { (2.0 * f64::from(scale)) as f32 } else { 2.0 };
    let invscale = if shrinking { (1.0 / f64::from(scale)) as f32 } else { 1.0 };
    let max_taps = support.ceil() as i64 * 2 + 1;
    (0..out)
        .map(|i| {
            let center = (f64::from(scale) * (i as f64 + 0.5)) as f32;
            let xmin = ((f64::from(center - support) + 0.5) as i64).max(0);
            let xmax = ((f64::from(center + support) + 0.5) as i64).min(input as i64);
            let size = (xmax - xmin).clamp(0, max_taps);
            let mut taps: Vec<f32> = (xmin..xmin + size)
                .map(|j| {
                    let d = j as f32 - center;
                    cubic(((f64::from(d) + 0.5) * f64::from(invscale)) as f32)
                })
                .collect();
            let mut total = 0.0f32;
            for t in &taps {
                total += t;
            }
            if total != 0.0 {
                taps.iter_mut().for_each(|t| *t /= total);
            }
            (xmin as usize, taps)
        })
        .collect()
}

/// Keys' cubic convolution with a = −0.5 (torch's antialiased bicubic, as Pillow's).
fn cubic(x: f32) -> f32 {
    const A: f32 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::{patches, preprocess};

    #[test]
    fn a_flat_image_stays_flat_at_any_size() {
        // 0.2 is 51/255, so the 8-bit rounding keeps it.
        for (h, w, crop) in [(7, 11, true), (40, 30, false), (5, 5, true)] {
            let image = vec![0.2; h * w * 3];
            let out = preprocess(&image, [1, h, w, 3], 6, [0.0; 3], [1.0; 3], crop).unwrap();
            assert_eq!(out.len(), 3 * 36);
            assert!(out.iter().all(|v| (v - 0.2).abs() < 1e-6), "{h}x{w}");
        }
    }

    #[test]
    fn patches_follow_the_convolution_weights_order() {
        // One 4×4 image of 3 channels, patch 2: value = c·100 + y·10 + x.
        let pixels: Vec<f32> = (0..3)
            .flat_map(|c| {
                (0..4).flat_map(move |y| (0..4).map(move |x| (c * 100 + y * 10 + x) as f32))
            })
            .collect();
        let out = patches(&pixels, 1, 4, 2);
        assert_eq!(out.len(), 4 * 12);
        // Patch (0, 1): rows 0..2, columns 2..4; channel 0 then 1 then 2.
        assert_eq!(&out[12..18], &[2.0, 3.0, 12.0, 13.0, 102.0, 103.0]);
    }
}
