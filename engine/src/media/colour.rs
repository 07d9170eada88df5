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

/// Planes with strides (a decoder's buffers) as `[H, W, 3]` RGB in 0..1, appended to `out`.
pub(crate) fn yuv420_to_rgb(
    (y, u, v): (&[u8], &[u8], &[u8]),
    (y_stride, uv_stride): (usize, usize),
    (width, height): (usize, usize),
    out: &mut Vec<f32>,
) {
    out.reserve(width * height * 3);
    for row in 0..height {
        for col in 0..width {
            let luma = 1.164_383 * (f32::from(y[row * y_stride + col]) - 16.0);
            let c = (row / 2) * uv_stride + col / 2;
            let (cb, cr) = (f32::from(u[c]) - 128.0, f32::from(v[c]) - 128.0);
            let r = luma + 1.596_027 * cr;
            let g = luma - 0.391_762 * cb - 0.812_968 * cr;
            let b = luma + 2.017_232 * cb;
            out.extend([r, g, b].map(|x| (x / 255.0).clamp(0.0, 1.0)));
        }
    }
}

fn clip(x: f32) -> u8 {
    x.round().clamp(0.0, 255.0) as u8
}

#[cfg(test)]
mod tests {
    use super::{rgb_to_yuv420, yuv420_to_rgb};

    #[test]
    fn grey_and_primaries_round_trip_within_a_step() {
        let (w, h) = (4, 2);
        let colours = [[0.5, 0.5, 0.5], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.2, 0.4, 0.9]];
        for colour in colours {
            let pixels: Vec<f32> = (0..w * h).flat_map(|_| colour).collect();
            let yuv = rgb_to_yuv420(&pixels, w, h);
            let mut back = Vec::new();
            yuv420_to_rgb((&yuv.y, &yuv.u, &yuv.v), (w, yuv.chroma_width()), (w, h), &mut back);
            for (a, b) in back.iter().zip(&pixels) {
                assert!((a - b).abs() < 3.0 / 255.0, "{colour:?}: {a} vs {b}");
            }
        }
    }
}
