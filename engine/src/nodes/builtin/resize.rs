//! Resampling of `[B, H, W, C]` tensors with ComfyUI's methods, and its center crop.

use crate::nodes::{ErrorKind, NodeError};
use crate::tensor::Tensor;

/// The upscale methods of ImageScale and LatentUpscale.
pub(crate) const METHODS: [&str; 5] = ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"];

/// Resizes each image of a `[B, H, W, C]` tensor to `width` × `height`; with `center_crop`, first crops the
/// source to the target's aspect ratio around its center.
pub(crate) fn resize(
    image: &Tensor,
    width: usize,
    height: usize,
    method: &str,
    center_crop: bool,
) -> Result<Tensor, NodeError> {
    let [batch, h, w, c] = image.shape() else {
        return Err(NodeError::new(format!(
            "expected a [B, H, W, C] tensor, got {:?}",
            image.shape()
        )));
    };
    let (batch, h, w, c) = (*batch, *h, *w, *c);
    if width == 0 || height == 0 || w == 0 || h == 0 {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("cannot resize {w}x{h} to {width}x{height}"),
        ));
    }
    let (x0, y0, cw, ch) = if center_crop { crop_box(w, h, width, height) } else { (0, 0, w, h) };
    let kernel = Kernel::parse(method)?;
    let mut out = Vec::with_capacity(batch * width * height * c);
    for b in 0..batch {
        let src = &image.data()[b * h * w * c..(b + 1) * h * w * c];
        // Horizontal pass: ch rows of cw → ch rows of width.
        let mut horizontal = vec![0.0f32; ch * width * c];
        let xs = weights(cw, width, kernel);
        for y in 0..ch {
            for (ox, taps) in xs.iter().enumerate() {
                for k in 0..c {
                    let v: f32 = taps
                        .iter()
                        .map(|&(ix, wt)| wt * src[((y0 + y) * w + x0 + ix) * c + k])
                        .sum();
                    horizontal[(y * width + ox) * c + k] = v;
                }
            }
        }
        // Vertical pass: ch → height.
        let ys = weights(ch, height, kernel);
        for taps in &ys {
            for ox in 0..width {
                for k in 0..c {
                    let v: f32 = taps
                        .iter()
                        .map(|&(iy, wt)| wt * horizontal[(iy * width + ox) * c + k])
                        .sum();
                    out.push(v);
                }
            }
        }
    }
    Tensor::new(vec![batch, height, width, c], out).map_err(|e| NodeError::new(e.to_string()))
}

/// The source box with the target's aspect ratio, centered, as ComfyUI's `common_upscale` crops: the offset
/// rounded (half to even, Python's `round`) and the same margin cut from both sides.
fn crop_box(w: usize, h: usize, width: usize, height: usize) -> (usize, usize, usize, usize) {
    let old = w as f64 / h as f64;
    let new = width as f64 / height as f64;
    let margin = |side: usize, ratio: f64| {
        let side_f = side as f64;
        let m = ((side_f - side_f * ratio) / 2.0).round_ties_even() as usize;
        m.min(side.saturating_sub(1) / 2)
    };
    if old > new {
        let x = margin(w, new / old);
        (x, 0, w - 2 * x, h)
    } else if old < new {
        let y = margin(h, old / new);
        (0, y, w, h - 2 * y)
    } else {
        (0, 0, w, h)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kernel {
    Nearest,
    Bilinear,
    Area,
    Bicubic,
    Lanczos,
}

impl Kernel {
    fn parse(method: &str) -> Result<Kernel, NodeError> {
        Ok(match method {
            "nearest-exact" => Kernel::Nearest,
            "bilinear" | "bislerp" => Kernel::Bilinear,
            "area" => Kernel::Area,
            "bicubic" => Kernel::Bicubic,
            "lanczos" => Kernel::Lanczos,
            other => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("unknown upscale method {other}"),
                ));
            }
        })
    }
}

fn cubic(x: f64) -> f64 {
    // Keys' cubic with a = -0.75, as torch's bicubic.
    let a = -0.75;
    let x = x.abs();
    if x <= 1.0 {
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a
    } else {
        0.0
    }
}

fn lanczos3(x: f64) -> f64 {
    let x = x.abs();
    if x < 1e-8 {
        return 1.0;
    }
    if x >= 3.0 {
        return 0.0;
    }
    let px = std::f64::consts::PI * x;
    3.0 * px.sin() * (px / 3.0).sin() / (px * px)
}

/// For each output index, the source indices and weights (summing to 1).
fn weights(len_in: usize, len_out: usize, kernel: Kernel) -> Vec<Vec<(usize, f32)>> {
    let scale = len_in as f64 / len_out as f64;
    (0..len_out)
        .map(|o| {
            let center = (o as f64 + 0.5) * scale;
            let taps: Vec<(usize, f64)> = match kernel {
                Kernel::Nearest => vec![(((center).floor() as usize).min(len_in - 1), 1.0)],
                // torch's "area" is adaptive average pooling: the plain mean of source pixels
                // ⌊o·in/out⌋ .. ⌈(o+1)·in/out⌉, not an overlap-weighted one.
                Kernel::Area => {
                    let first = o * len_in / len_out;
                    let last = ((o + 1) * len_in).div_ceil(len_out);
                    (first..last).map(|i| (i, 1.0)).collect()
                }
                Kernel::Bilinear | Kernel::Bicubic | Kernel::Lanczos => {
                    let (support, f): (f64, fn(f64) -> f64) = match kernel {
                        Kernel::Bilinear => (1.0, |x| (1.0 - x.abs()).max(0.0)),
                        Kernel::Bicubic => (2.0, cubic),
                        _ => (3.0, lanczos3),
                    };
                    // Lanczos widens its support when shrinking (antialiasing, as PIL); the others do not, as torch.
                    let stretch = if kernel == Kernel::Lanczos { scale.max(1.0) } else { 1.0 };
                    let x = center - 0.5;
                    let lo = (x - support * stretch).floor() as i64;
                    let hi = (x + support * stretch).ceil() as i64;
                    (lo..=hi)
                        .map(|i| {
                            (i.clamp(0, len_in as i64 - 1) as usize, f((i as f64 - x) / stretch))
                        })
                        .filter(|t| t.1 != 0.0)
                        .collect()
                }
            };
            let total: f64 = taps.iter().map(|t| t.1).sum();
            let total = if total.abs() < 1e-12 { 1.0 } else { total };
            taps.into_iter().map(|(i, w)| (i, (w / total) as f32)).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{METHODS, crop_box, resize};
    use crate::tensor::Tensor;

    #[test]
    fn every_method_keeps_a_flat_image_flat() {
        let image = Tensor::full(vec![2, 5, 7, 3], 0.25);
        for method in METHODS {
            let out = resize(&image, 11, 3, method, false).expect("resizes");
            assert_eq!(out.shape(), &[2, 3, 11, 3], "{method}");
            assert!(out.data().iter().all(|v| (v - 0.25).abs() < 1e-5), "{method}");
        }
    }

    #[test]
    fn nearest_doubling_repeats_pixels() {
        let image = Tensor::new(vec![1, 1, 2, 1], vec![0.0, 1.0]).expect("shape");
        let out = resize(&image, 4, 1, "nearest-exact", false).expect("resizes");
        assert_eq!(out.data(), &[0.0, 0.0, 1.0, 1.0]);
    }

    #[test]
    fn center_crop_cuts_comfyuis_margins() {
        // (w, h) → (width, height): ComfyUI's crop box, as `common_upscale` computes it.
        assert_eq!(crop_box(1000, 1000, 1024, 576), (0, 219, 1000, 562));
        assert_eq!(crop_box(1001, 1000, 64, 64), (0, 0, 1001, 1000), "a half rounds to even");
        assert_eq!(crop_box(1080, 1920, 928, 1664), (5, 0, 1070, 1920));
        assert_eq!(crop_box(64, 48, 32, 24), (0, 0, 64, 48));
    }

    #[test]
    fn center_crop_keeps_the_middle() {
        // A 4x1 image [0, 1, 1, 0] cropped to a 2x1 aspect ratio 1:... keeps the two middle pixels.
        let image = Tensor::new(vec![1, 1, 4, 1], vec![0.0, 1.0, 1.0, 0.0]).expect("shape");
        let out = resize(&image, 1, 1, "area", true).expect("resizes");
        assert_eq!(out.data(), &[1.0]);
    }
}
