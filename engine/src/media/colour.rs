//! RGB frames to and from planar YUV 4:2:0 in BT.601 limited range, the conversion FFmpeg applies to a
//! ComfyUI video whose colour space is not tagged (as neither ComfyUI's files nor Kiln's are).
//!
//! Invariant: pixels go to 8 bits as ComfyUI quantizes them, `255 · clamp(x, 0, 1)` truncated, before any
//! colour conversion, so a frame that survives the codec losslessly comes back as those bytes / 255.

/// One picture in planar 4:2:0: full-size luma, chroma at half width and height (rounded up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Yuv420 {
    pub(crate) width: usize,
    pub(crate) height: usize,
    pub(crate) y: Vec<u8>,
    pub(crate) u: Vec<u8>,
    pub(crate) v: Vec<u8>,
}

impl Yuv420 {
    /// Chroma plane width.
    pub(crate) fn chroma_width(&self) -> usize {
        self.width.div_ceil(2)
    }
}

/// A float sample as ComfyUI writes it to 8 bits: `clamp(255 · x, 0, 255)` truncated.
pub(crate) fn to_u8(x: f32) -> u8 {
    (x * 255.0).clamp(0.0, 255.0) as u8
}

/// An `[H, W, 3]` frame with values in 0..1 as 4:2:0.
pub(crate) fn rgb_to_yuv420(pixels: &[f32], width: usize, height: usize) -> Yuv420 {
    let [y, u, v] =
        yuv420_levels(pixels, width, height).map(|plane| plane.into_iter().map(clip).collect());
    Yuv420 { width, height, y, u, v }
}

/// An `[H, W, 3]` frame with values in 0..1 as 10-bit 4:2:0 planes (Y, U, V): the 8-bit levels at four times
/// the scale, rounded once.
pub(crate) fn rgb_to_yuv420_10bit(pixels: &[f32], width: usize, height: usize) -> [Vec<u16>; 3] {
    yuv420_levels(pixels, width, height).map(|plane| {
        plane.into_iter().map(|x| (4.0 * x).round().clamp(0.0, 1023.0) as u16).collect()
    })
}

/// The Y, U and V levels of a frame on the 8-bit scale (16–235 and 16–240), not yet rounded; chroma averages
/// each 2 × 2 block.
fn yuv420_levels(pixels: &[f32], width: usize, height: usize) -> [Vec<f32>; 3] {
    let (cw, ch) = (width.div_ceil(2), height.div_ceil(2));
    let bytes: Vec<u8> = pixels.iter().map(|&x| to_u8(x)).collect();
    let rgb = |x: usize, y: usize| {
        let i = (y * width + x) * 3;
        [f32::from(bytes[i]), f32::from(bytes[i + 1]), f32::from(bytes[i + 2])]
    };
    let mut luma = Vec::with_capacity(width * height);
    for y in 0..height {
        for x in 0..width {
            let [r, g, b] = rgb(x, y);
            luma.push(16.0 + 219.0 / 255.0 * (0.299 * r + 0.587 * g + 0.114 * b));
        }
    }
    let (mut u, mut v) = (Vec::with_capacity(cw * ch), Vec::with_capacity(cw * ch));
    for cy in 0..ch {
        for cx in 0..cw {
            let mut sum = [0.0f32; 3];
            let mut n = 0.0;
            for (x, y) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
                let (x, y) = (2 * cx + x, 2 * cy + y);
                if x < width && y < height {
                    let p = rgb(x, y);
                    for (s, c) in sum.iter_mut().zip(p) {
                        *s += c;
                    }
                    n += 1.0;
                }
            }
            let [r, g, b] = sum.map(|s| s / n);
            u.push(128.0 + 224.0 / 255.0 * (-0.168_736 * r - 0.331_264 * g + 0.5 * b));
            v.push(128.0 + 224.0 / 255.0 * (0.5 * r - 0.418_688 * g - 0.081_312 * b));
        }
    }
    [luma, u, v]
}

/// How a video's YUV samples become RGB: the range of the samples and the matrix's coefficients, as FFmpeg's
/// conversion applies them to a frame tagged with its colour space and range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct YuvMatrix {
    /// Multiplies `Y - y_offset`.
    y_scale: f32,
    y_offset: f32,
    cr_r: f32,
    cb_g: f32,
    cr_g: f32,
    cb_b: f32,
}

impl YuvMatrix {
    /// BT.601 in limited range: what FFmpeg assumes for untagged video.
    pub(crate) const BT601_LIMITED: YuvMatrix = YuvMatrix {
        y_scale: 1.164_383,
        y_offset: 16.0,
        cr_r: 1.596_027,
        cb_g: 0.391_762,
        cr_g: 0.812_968,
        cb_b: 2.017_232,
    };

    /// The matrix of luma weights `kr` (red) and `kb` (blue), in limited (16–235) or full (0–255) range.
    pub(crate) fn new(kr: f32, kb: f32, full_range: bool) -> YuvMatrix {
        let kg = 1.0 - kr - kb;
        let (y_scale, y_offset, c) =
            if full_range { (1.0, 0.0, 1.0) } else { (255.0 / 219.0, 16.0, 255.0 / 224.0) };
        YuvMatrix {
            y_scale,
            y_offset,
            cr_r: 2.0 * (1.0 - kr) * c,
            cb_g: 2.0 * kb * (1.0 - kb) / kg * c,
            cr_g: 2.0 * kr * (1.0 - kr) / kg * c,
            cb_b: 2.0 * (1.0 - kb) * c,
        }
    }
}

/// Planes with strides (a decoder's buffers) as `[H, W, 3]` RGB in 0..1 by `matrix`, appended to `out`.
pub(crate) fn yuv420_to_rgb(
    (y, u, v): (&[u8], &[u8], &[u8]),
    (y_stride, uv_stride): (usize, usize),
    (width, height): (usize, usize),
    matrix: &YuvMatrix,
    out: &mut Vec<f32>,
) {
    out.reserve(width * height * 3);
    for row in 0..height {
        for col in 0..width {
            let luma = matrix.y_scale * (f32::from(y[row * y_stride + col]) - matrix.y_offset);
            let c = (row / 2) * uv_stride + col / 2;
            let (cb, cr) = (f32::from(u[c]) - 128.0, f32::from(v[c]) - 128.0);
            let r = luma + matrix.cr_r * cr;
            let g = luma - matrix.cb_g * cb - matrix.cr_g * cr;
            let b = luma + matrix.cb_b * cb;
            out.extend([r, g, b].map(|x| (x / 255.0).clamp(0.0, 1.0)));
        }
    }
}

fn clip(x: f32) -> u8 {
    x.round().clamp(0.0, 255.0) as u8
}

#[cfg(test)]
mod tests {
    use super::{YuvMatrix, rgb_to_yuv420, yuv420_to_rgb};

    #[test]
    fn grey_and_primaries_round_trip_within_a_step() {
        let (w, h) = (4, 2);
        let colours = [[0.5, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.2, 0.4, 0.9]];
        for colour in colours {
            let pixels: Vec<f32> = (0..w * h).flat_map(|_| colour).collect();
            let yuv = rgb_to_yuv420(&pixels, w, h);
            let mut back = Vec::new();
            let planes = (yuv.y.as_slice(), yuv.u.as_slice(), yuv.v.as_slice());
            yuv420_to_rgb(
                planes,
                (w, yuv.chroma_width()),
                (w, h),
                &YuvMatrix::BT601_LIMITED,
                &mut back,
            );
            for (a, b) in back.iter().zip(&pixels) {
                assert!((a - b).abs() < 3.0 / 255.0, "{colour:?}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn the_general_matrix_gives_bt601s_coefficients_and_full_range_keeps_levels() {
        let general = YuvMatrix::new(0.299, 0.114, false);
        let fixed = YuvMatrix::BT601_LIMITED;
        for (a, b) in [
            (general.y_scale, fixed.y_scale),
            (general.cr_r, fixed.cr_r),
            (general.cb_g, fixed.cb_g),
            (general.cr_g, fixed.cr_g),
            (general.cb_b, fixed.cb_b),
        ] {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        // Full-range BT.709: grey 200 stays 200; pure Cr lifts red by 2(1 - 0.2126) per level.
        let mut out = Vec::new();
        let full = YuvMatrix::new(0.2126, 0.0722, true);
        yuv420_to_rgb((&[200], &[128], &[138]), (1, 1), (1, 1), &full, &mut out);
        assert!((out[0] * 255.0 - (200.0 + 15.748)).abs() < 1e-3, "{out:?}");
    }
}
