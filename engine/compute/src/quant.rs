//! ComfyUI's quantized weight layouts (weight-formats.md §4): what a weight's stored bytes stand for, and the
//! exact decoding both backends share.
//!
//! A quantized weight is its stored elements (fp8, int8, packed 4-bit codes) and, for the block and row
//! formats, a table of scales stored right after them in the same slot of device memory. [`Quant`] says which
//! format; the decoding functions here are the CPU's, and the CUDA kernels (`kernels/quant.cu`) transliterate
//! them.

/// Values per MXFP8 block (one e8m0 exponent each).
pub const MXFP8_BLOCK: usize = 32;
/// Values per NVFP4 block (one e4m3 scale each).
pub const NVFP4_BLOCK: usize = 16;

/// The 16 E2M1 values by 4-bit code (sign, 2 exponent bits, 1 mantissa bit).
pub const E2M1: [f32; 16] =
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];

/// How a weight's stored elements stand for its values.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Quant {
    /// As stored.
    #[default]
    None,
    /// Times one scale: ComfyUI's per-tensor fp8 (`float8_e4m3fn`, `float8_e5m2`, the legacy scaled fp8).
    /// Read as `f32(q) · scale`.
    Tensor(f32),
    /// `int8_tensorwise`: int8 values times an f32 scale, one per row (`per_row`) or one for the whole weight,
    /// stored after the values, the rows rotated back by groups of `convrot` columns when given (the weight
    /// was rotated so before quantization). With `activations`, a linear layer runs it as ComfyUI's diffusion
    /// models do on every device (§5.3): the input rotated likewise, quantized to int8 per row, multiplied in
    /// integers; without (ComfyUI's text encoders), the weight is dequantized.
    Int8 {
        /// One scale per row rather than one for all.
        per_row: bool,
        /// ConvRot's group size: the weight's input columns are rotated by a normalised Hadamard matrix.
        convrot: Option<usize>,
        /// Whether a linear layer quantizes its input to int8 (else it dequantizes the weight).
        activations: bool,
    },
    /// `mxfp8`: e4m3 values times `2^(e − 127)` per block of [`MXFP8_BLOCK`] along a row, the e8m0 exponents
    /// stored after the values in cuBLAS's swizzled block-scale layout ([`swizzled`]).
    Mxfp8,
    /// `nvfp4`: two E2M1 codes per byte (the even element in the high nibble), times `global · f32(s)` with s
    /// an e4m3 scale per block of [`NVFP4_BLOCK`] along a row, stored after the codes, swizzled.
    Nvfp4 {
        /// The per-tensor scale (`weight_scale_2`).
        global: f32,
    },
}

impl Quant {
    /// ComfyUI's name of the format, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Quant::None => "unquantized",
            Quant::Tensor(_) => "scaled fp8",
            Quant::Int8 { .. } => "int8_tensorwise",
            Quant::Mxfp8 => "mxfp8",
            Quant::Nvfp4 { .. } => "nvfp4",
        }
    }

    /// Whether the format keeps a table of scales after the values (the row and block formats).
    pub fn has_table(&self) -> bool {
        matches!(self, Quant::Int8 { .. } | Quant::Mxfp8 | Quant::Nvfp4 { .. })
    }

    /// Values a row of `stored` elements holds (two per byte for NVFP4).
    pub fn row_values(&self, stored: usize) -> usize {
        match self {
            Quant::Nvfp4 { .. } => stored * 2,
            _ => stored,
        }
    }

    /// Bytes of the scale table of a weight of `rows` rows of `cols` values.
    pub fn table_bytes(&self, rows: usize, cols: usize) -> usize {
        match self {
            Quant::None | Quant::Tensor(_) => 0,
            Quant::Int8 { per_row, .. } => 4 * if *per_row { rows } else { 1 },
            Quant::Mxfp8 => swizzled_len(rows, cols / MXFP8_BLOCK),
            Quant::Nvfp4 { .. } => swizzled_len(rows, cols / NVFP4_BLOCK),
        }
    }
}

/// Columns of a swizzled block-scale table for `blocks` blocks per row (padded to a multiple of 4).
pub fn swizzled_cols(blocks: usize) -> usize {
    blocks.div_ceil(4) * 4
}

/// Bytes of a swizzled table for `rows` rows of `blocks` blocks (rows padded to a multiple of 128).
pub fn swizzled_len(rows: usize, blocks: usize) -> usize {
    rows.div_ceil(128) * 128 * swizzled_cols(blocks)
}

/// The offset of the scale of row `r`, block `c` in cuBLAS's "128×4" block-scale layout of a table with
/// `cols` (padded) columns: 128-row by 4-column tiles of 512 bytes, each 32 rows × 16 bytes with the four
/// 32-row quarters of the tile side by side (weight-formats.md §4.4).
pub fn swizzled(r: usize, c: usize, cols: usize) -> usize {
    (r / 128 * (cols / 4) + c / 4) * 512 + (r % 32) * 16 + (r % 128) / 32 * 4 + c % 4
}

/// An e8m0 exponent as f32: `2^(e − 127)`, with 0 decoding to 0 and 255 to infinity (comfy-kitchen's
/// `e8m0_to_f32`).
pub fn e8m0(e: u8) -> f32 {
    if e == 0 { 0.0 } else { f32::from_bits(u32::from(e) << 23) }
}

/// Decodes values `c0..c0 + out.len()` of row `r` of an MXFP8 weight: `values` the row's e4m3 bytes from
/// column `c0`, `table` the whole scale table, `cols` the row's value count. Exact in f32.
pub fn decode_mxfp8(
    values: &[u8],
    table: &[u8],
    (r, c0, cols): (usize, usize, usize),
    out: &mut [f32],
) {
    let table_cols = swizzled_cols(cols / MXFP8_BLOCK);
    for (i, (o, &q)) in out.iter_mut().zip(values).enumerate() {
        let c = c0 + i;
        let scale = e8m0(table[swizzled(r, c / MXFP8_BLOCK, table_cols)]);
        *o = crate::dtype::f8e4m3_to_f32(q) * scale;
    }
}

/// Decodes values `c0..c0 + out.len()` (`c0` even) of row `r` of an NVFP4 weight: `codes` the row's packed
/// bytes from value `c0`, `table` the whole scale table, `cols` the row's value count. As comfy-kitchen's
/// eager dequantization in f32: `E2M1[code] · (global · f32(scale))`.
pub fn decode_nvfp4(
    codes: &[u8],
    table: &[u8],
    global: f32,
    (r, c0, cols): (usize, usize, usize),
    out: &mut [f32],
) {
    let table_cols = swizzled_cols(cols / NVFP4_BLOCK);
    for (i, o) in out.iter_mut().enumerate() {
        let c = c0 + i;
        let byte = codes[i / 2];
        let code = if c % 2 == 0 { byte >> 4 } else { byte & 0x0f };
        let block = crate::dtype::f8e4m3_to_f32(table[swizzled(r, c / NVFP4_BLOCK, table_cols)]);
        *o = E2M1[usize::from(code)] * (global * block);
    }
}

/// ConvRot's 4 × 4 Hadamard block h₄: its `g × g` matrix is `h₄ ⊗ h₄ ⊗ …` divided by √g.
const H4: [[f32; 4]; 4] =
    [[1., 1., 1., -1.], [1., 1., -1., 1.], [1., -1., 1., 1.], [-1., 1., 1., 1.]];

/// ConvRot's normalised `g × g` Hadamard matrix (row-major): `h₄ ⊗ h₄ ⊗ …` divided by √g, with h₄ =
/// `[[1,1,1,−1],[1,1,−1,1],[1,−1,1,1],[−1,1,1,1]]`; symmetric and its own inverse. `None` unless g is a power
/// of 4 (at least 4).
pub fn hadamard(g: usize) -> Option<Vec<f32>> {
    if g < 4 || !g.is_power_of_two() || !g.trailing_zeros().is_multiple_of(2) {
        return None;
    }
    let norm = (g as f32).sqrt();
    let mut h = vec![0.0f32; g * g];
    for (i, row) in h.chunks_exact_mut(g).enumerate() {
        for (j, v) in row.iter_mut().enumerate() {
            // The Kronecker power: the product of h₄'s entries at each base-4 digit of (i, j).
            let (mut a, mut b, mut sign) = (i, j, 1.0f32);
            while a > 0 || b > 0 {
                sign *= H4[a % 4][b % 4];
                a /= 4;
                b /= 4;
            }
            *v = sign / norm;
        }
    }
    Some(h)
}

/// Each group of `g` values of `values` (g a power of 4) through ConvRot's [`hadamard`] matrix, as its Kronecker
/// structure allows: h₄ along each base-4 digit of the index in turn, then 1/√g; 4·log₄ g multiply-adds a value
/// instead of g. The matrix is symmetric and its own inverse, so this also turns rotated values back.
pub fn hadamard_rotate(values: &mut [f32], g: usize) {
    let norm = 1.0 / (g as f32).sqrt();
    for chunk in values.chunks_exact_mut(g) {
        let mut stride = 1;
        while stride < g {
            for base in (0..g).step_by(4 * stride) {
                for o in base..base + stride {
                    let x =
                        [chunk[o], chunk[o + stride], chunk[o + 2 * stride], chunk[o + 3 * stride]];
                    for (t, h) in H4.iter().enumerate() {
                        chunk[o + t * stride] =
                            h[0] * x[0] + h[1] * x[1] + h[2] * x[2] + h[3] * x[3];
                    }
                }
            }
            stride *= 4;
        }
        for v in chunk {
            *v *= norm;
        }
    }
}

/// comfy-kitchen's int8 scale of a row (or a whole tensor) `x`: `max(max|x| / 127, 1e-30)` in f32
/// (`quantize_int8_rowwise`, `quantize_int8_tensorwise` with `scale="recalculate"`).
pub fn int8_scale(x: &[f32]) -> f32 {
    (x.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0).max(1e-30)
}

/// comfy-kitchen's dynamic per-row int8 quantization of activations (`quantize_int8_rowwise`): the row's
/// scale `s` ([`int8_scale`]), then `clamp(round_half_even(x / s), −128, 127)`. Returns s.
pub fn quantize_row_i8(x: &[f32], q: &mut [i8]) -> f32 {
    let scale = int8_scale(x);
    for (q, v) in q.iter_mut().zip(x) {
        *q = (v / scale).round_ties_even().clamp(-128.0, 127.0) as i8;
    }
    scale
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fast_rotation_is_the_hadamard_product() {
        for group in [4, 16, 64, 256] {
            let h = hadamard(group).expect("a power of 4");
            let x: Vec<f32> = (0..3 * group).map(|i| ((i * 53 % 97) as f32 - 48.0) / 9.0).collect();
            let mut fast = x.clone();
            hadamard_rotate(&mut fast, group);
            for (chunk, got) in x.chunks(group).zip(fast.chunks(group)) {
                for (j, &g) in got.iter().enumerate() {
                    let want: f64 = chunk
                        .iter()
                        .zip(&h[j * group..][..group])
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum();
                    assert!(
                        (f64::from(g) - want).abs() < 1e-4,
                        "group {group} at {j}: {g} vs {want}"
                    );
                }
            }
            hadamard_rotate(&mut fast, group);
            for (a, b) in x.iter().zip(&fast) {
                assert!((a - b).abs() < 1e-4, "group {group}: not its own inverse");
            }
        }
    }

    #[test]
    fn hadamard_is_orthonormal_and_symmetric() {
        assert!(hadamard(8).is_none() && hadamard(2).is_none());
        for g in [4, 16, 64] {
            let h = hadamard(g).expect("a power of 4");
            for i in 0..g {
                for j in 0..g {
                    assert_eq!(h[i * g + j], h[j * g + i], "symmetric at ({i}, {j})");
                    let dot: f32 = (0..g).map(|k| h[i * g + k] * h[j * g + k]).sum();
                    let want = if i == j { 1.0 } else { 0.0 };
                    assert!((dot - want).abs() < 1e-6, "g {g}: row {i} · row {j} = {dot}");
                }
            }
        }
        // The first tile is h₄ / 2 for g = 4.
        assert_eq!(hadamard(4).expect("4")[..4], [0.5, 0.5, 0.5, -0.5]);
    }

    #[test]
    fn the_swizzle_is_a_bijection_onto_its_table() {
        for (rows, blocks) in [(1, 1), (130, 5), (256, 8)] {
            let cols = swizzled_cols(blocks);
            let len = swizzled_len(rows, blocks);
            let mut seen = vec![false; len];
            for r in 0..rows.div_ceil(128) * 128 {
                for c in 0..cols {
                    let at = swizzled(r, c, cols);
                    assert!(at < len && !seen[at], "({r}, {c}) → {at}");
                    seen[at] = true;
                }
            }
        }
        // weight-formats.md §4.4's example points: row 33 is the second 32-row quarter, 4 bytes in.
        assert_eq!(swizzled(33, 0, 4), 16 + 4);
        assert_eq!(swizzled(0, 5, 8), 512 + 1);
    }

    #[test]
    fn e8m0_decodes_zero_to_zero() {
        assert_eq!(e8m0(0), 0.0);
        assert_eq!(e8m0(127), 1.0);
        assert_eq!(e8m0(130), 8.0);
        assert_eq!(e8m0(255), f32::INFINITY);
    }

    #[test]
    fn row_quantization_rounds_ties_to_even_and_survives_a_zero_row() {
        let mut q = [0i8; 4];
        let s = quantize_row_i8(&[127.0, 0.5, 1.5, -127.0], &mut q);
        assert_eq!((s, q), (1.0, [127, 0, 2, -127]));
        let s = quantize_row_i8(&[0.0; 4], &mut q);
        assert_eq!((s, q), (1e-30, [0; 4]));
    }
}
