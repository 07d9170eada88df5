//! ComfyUI's `lanczos` resampling, which is Pillow's: each image goes to 8 bits (`np.clip(255 · v, 0, 255)`
//! truncated), Pillow resizes it with `Image.LANCZOS` (separable passes, horizontal first, each in 8-bit fixed
//! point with 22-bit coefficients, an 8-bit image between them; windows cut at the edges and renormalised;
//! support 3 widened by the scale when shrinking), and the result comes back as v / 255. Four-channel images go
//! through premultiplied alpha, as Pillow resizes RGBA (`RGBa`).

/// Fraction bits of Pillow's 8-bit coefficients (`PRECISION_BITS`).
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Lanczos with a = 3 (Pillow's `lanczos_filter`).
fn lanczos(x: f64) -> f64 {
    let sinc = |x: f64| {
        if x == 0.0 { 1.0 } else { (x * std::f64::consts::PI).sin() / (x * std::f64::consts::PI) }
    };
    if (-3.0..3.0).contains(&x) { sinc(x) * sinc(x / 3.0) } else { 0.0 }
}

/// Pillow's `precompute_coeffs` and `normalize_coeffs_8bpc`: for each output index, the first input index and
/// the fixed-point weights of the inputs from there.
fn coefficients(len_in: usize, len_out: usize) -> Vec<(usize, Vec<i64>)> {
    let scale = len_in as f64 / len_out as f64;
    let filterscale = scale.max(1.0);
    let support = 3.0 * filterscale;
    (0..len_out)
        .map(|xx| {
            let center = (xx as f64 + 0.5) * scale;
            // C's `(int)` truncates toward zero.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(len_in as i64) as usize;
            let count = xmax.saturating_sub(xmin);
            let w: Vec<f64> = (0..count)
                .map(|x| lanczos(((x + xmin) as f64 - center + 0.5) / filterscale))
                .collect();
            let total: f64 = w.iter().sum();
            let fixed = w
                .iter()
                .map(|&k| {
                    let k = if total != 0.0 { k / total } else { k };
                    let scaled = k * f64::from(1u32 << PRECISION_BITS);
                    (if k < 0.0 { scaled - 0.5 } else { scaled + 0.5 }) as i64
                })
                .collect();
            (xmin, fixed)
        })
        .collect()
}

/// Pillow's `clip8`: a fixed-point sum back to 8 bits.
fn clip8(sum: i64) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// One 8-bit pass along an axis: `src` holds `lines` lines of `len_in` pixels of `c` bytes, `stride` apart
/// along the axis and `line_step` apart between lines; the output has the same layout with `len_out` pixels.
fn pass(
    src: &[u8],
    (lines, len_in, len_out, c): (usize, usize, usize, usize),
    along: impl Fn(usize, usize) -> usize,
) -> Vec<u8> {
    let coeffs = coefficients(len_in, len_out);
    let mut out = vec![0u8; lines * len_out * c];
    for line in 0..lines {
        for (o, (first, k)) in coeffs.iter().enumerate() {
            for ch in 0..c {
                let mut sum = 1i64 << (PRECISION_BITS - 1);
                for (t, &w) in k.iter().enumerate() {
                    sum += i64::from(src[along(line, first + t) * c + ch]) * w;
                }
                out[(line * len_out + o) * c + ch] = clip8(sum);
            }
        }
    }
    out
}

/// `image` (`h × w` pixels of `c` channels, row-major, values in 0..1) resized to `width × height` as ComfyUI's
/// `lanczos` does.
pub(crate) fn resize(
    image: &[f32],
    (h, w, c): (usize, usize, usize),
    width: usize,
    height: usize,
) -> Vec<f32> {
    let bytes: Vec<u8> = image.iter().map(|&v| (255.0 * v).clamp(0.0, 255.0) as u8).collect();
    resize_bytes(bytes, (h, w, c), width, height).iter().map(|&b| f32::from(b) / 255.0).collect()
}

/// An 8-bit image (`h × w` pixels of `c` channels, row-major; four channels are RGBA) resized to
/// `width × height` as Pillow's `Image.LANCZOS` does.
pub(crate) fn resize_bytes(
    mut bytes: Vec<u8>,
    (h, w, c): (usize, usize, usize),
    width: usize,
    height: usize,
) -> Vec<u8> {
    if c == 4 {
        premultiply(&mut bytes);
    }
    if width != w {
        // Rows of w pixels → rows of width.
        bytes = pass(&bytes, (h, w, width, c), |row, x| row * w + x);
    }
    if height != h {
        // Columns of h pixels → columns of height, written transposed, then put back in rows.
        let columns = pass(&bytes, (width, h, height, c), |col, y| y * width + col);
        bytes = vec![0u8; height * width * c];
        for col in 0..width {
            for y in 0..height {
                let (from, to) = ((col * height + y) * c, (y * width + col) * c);
                bytes[to..to + c].copy_from_slice(&columns[from..from + c]);
            }
        }
    }
    if c == 4 {
        unpremultiply(&mut bytes);
    }
    bytes
}

/// Pillow's `rgbA2rgba`: each colour times alpha / 255, rounded as its `MULDIV255`.
fn premultiply(bytes: &mut [u8]) {
    for px in bytes.chunks_exact_mut(4) {
        let alpha = u32::from(px[3]);
        for v in &mut px[..3] {
            let t = u32::from(*v) * alpha + 128;
            *v = (((t >> 8) + t) >> 8) as u8;
        }
    }
}

/// Pillow's `rgba2rgbA`: each colour times 255 / alpha (integer division, clipped), unchanged at alpha 0 or 255.
fn unpremultiply(bytes: &mut [u8]) {
    for px in bytes.chunks_exact_mut(4) {
        let alpha = u32::from(px[3]);
        if alpha != 0 && alpha != 255 {
            for v in &mut px[..3] {
                *v = (255 * u32::from(*v) / alpha).min(255) as u8;
            }
        }
    }
}
