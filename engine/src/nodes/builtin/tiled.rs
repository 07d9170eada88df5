//! ComfyUI's tiled VAE passes (`VAE.decode_tiled`, `VAE.encode_tiled`): a large latent or image goes through
//! the VAE tile by tile, the overlaps feathered and blended, so a pass never holds more than a tile's
//! activations.
//!
//! [`tiled_scale`] is `comfy.utils.tiled_scale_multidim` over the two spatial dimensions of one sample.
//! A family's tiling calls it as ComfyUI does: the 2-D VAEs (Flux's) average three passes with tiles of
//! (h, w), (h/2, 2w) and (2h, w/2); the 3-D VAEs (Wan's; an image is one frame, its frame dimension one tile)
//! make one pass.

use kiln_models::family::VaeFamily;

use crate::nodes::{ErrorKind, NodeError};
use crate::tensor::Tensor;

/// Which way through the VAE, with the factor sizes change by (the VAE's downscale: 8, 16 for FLUX.2's).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scale {
    /// Latent positions to pixels: × the factor.
    Up(usize),
    /// Pixels to latent positions: ÷ the factor.
    Down(usize),
}

impl Scale {
    /// `v` positions on the input side, on the output side (unrounded).
    fn of(self, v: usize) -> f64 {
        match self {
            Scale::Up(factor) => v as f64 * factor as f64,
            Scale::Down(factor) => v as f64 / factor as f64,
        }
    }

    /// Python's `round` of [`Scale::of`] (half to even).
    fn rounded(self, v: usize) -> usize {
        self.of(v).round_ties_even() as usize
    }
}

/// `sample` `[1, C, H, W]` through `pass` tile by tile (ComfyUI's `tiled_scale_multidim`): tiles of
/// `tile` = (rows, columns) input positions start every `tile − overlap`, the last one moved back to end at
/// the edge; each output tile is weighted by a mask that ramps up over `round(overlap · scale)` positions
/// from each side ((t + 1) / feather), and the output is the weighted sum over the summed weights. An input
/// that fits one tile goes through whole.
pub(super) fn tiled_scale(
    sample: &Tensor,
    tile: [usize; 2],
    overlap: usize,
    scale: Scale,
    pass: &mut dyn FnMut(&Tensor) -> Result<Tensor, NodeError>,
) -> Result<Tensor, NodeError> {
    let &[1, channels, h, w] = sample.shape() else {
        return Err(NodeError::new(format!(
            "tiling expects [1, C, H, W], got {:?}",
            sample.shape()
        )));
    };
    let size = [h, w];
    if size.iter().zip(tile).all(|(&s, t)| s <= t) {
        return pass(sample);
    }
    if tile.iter().any(|&t| t <= overlap) {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "tiles of {} × {} cannot overlap by {overlap} (this VAE's passes halve the tile along one \
                 side): raise tile_size or lower overlap",
                tile[1], tile[0]
            ),
        ));
    }
    let out_size = size.map(|s| scale.rounded(s));
    // The output's channels are the first tile's.
    let mut out_channels = None;
    let mut out = Vec::new();
    let mut weight = vec![0f32; out_size[0] * out_size[1]];
    let starts = |d: usize| -> Vec<usize> {
        if size[d] > tile[d] {
            (0..size[d] - overlap).step_by(tile[d] - overlap).collect()
        } else {
            vec![0]
        }
    };
    let feather = scale.rounded(overlap);
    for &y in &starts(0) {
        for &x in &starts(1) {
            let pos = [y.min(size[0] - overlap), x.min(size[1] - overlap)];
            let len = [0, 1].map(|d| tile[d].min(size[d] - pos[d]));
            let input = crop(sample.data(), channels, size, pos, len)?;
            let output = pass(&input)?;
            let &[1, oc, th, tw] = output.shape() else {
                return Err(NodeError::new(format!("a tile came out {:?}", output.shape())));
            };
            if *out_channels.get_or_insert(oc) != oc {
                return Err(NodeError::new(format!("a tile came out with {oc} channels")));
            }
            out.resize(oc * out_size[0] * out_size[1], 0.0);
            let rows = ramp(th, feather);
            let cols = ramp(tw, feather);
            let at = pos.map(|p| scale.rounded(p));
            let visible = [th.min(out_size[0] - at[0]), tw.min(out_size[1] - at[1])];
            for c in 0..oc {
                for (ty, row) in rows.iter().enumerate().take(visible[0]) {
                    for (tx, col) in cols.iter().enumerate().take(visible[1]) {
                        let m = row * col;
                        let (oy, ox) = (at[0] + ty, at[1] + tx);
                        out[(c * out_size[0] + oy) * out_size[1] + ox] +=
                            output.data()[(c * th + ty) * tw + tx] * m;
                        if c == 0 {
                            weight[oy * out_size[1] + ox] += m;
                        }
                    }
                }
            }
        }
    }
    for plane in out.chunks_exact_mut(weight.len()) {
        plane.iter_mut().zip(&weight).for_each(|(v, m)| *v /= m);
    }
    let channels = out_channels.unwrap_or(0);
    Tensor::new(vec![1, channels, out_size[0], out_size[1]], out)
        .map_err(|e| NodeError::new(e.to_string()))
}

/// A tile's mask along one dimension of `len` positions: 1, times (t + 1) / feather at positions t and
/// len − 1 − t for t < feather (both, in that order, as ComfyUI multiplies them), unless feather ≥ len.
fn ramp(len: usize, feather: usize) -> Vec<f32> {
    let mut mask = vec![1f32; len];
    if feather < len {
        for t in 0..feather {
            let a = (t + 1) as f32 / feather as f32;
            mask[t] *= a;
            mask[len - 1 - t] *= a;
        }
    }
    mask
}

/// The `[1, C, len]` window at `pos` of a `[1, C, size]` sample.
fn crop(
    data: &[f32],
    channels: usize,
    size: [usize; 2],
    pos: [usize; 2],
    len: [usize; 2],
) -> Result<Tensor, NodeError> {
    let mut values = Vec::with_capacity(channels * len[0] * len[1]);
    for c in 0..channels {
        for y in pos[0]..pos[0] + len[0] {
            let row = (c * size[0] + y) * size[1];
            values.extend_from_slice(&data[row + pos[1]..row + pos[1] + len[1]]);
        }
    }
    Tensor::new(vec![1, channels, len[0], len[1]], values)
        .map_err(|e| NodeError::new(e.to_string()))
}

/// `sample` through `pass` tiled as `family`'s VAE is in ComfyUI, tiles of `tile` × `tile` input positions
/// overlapping by `overlap`: a 2-D VAE averages three passes, (t, t), (t/2, 2t) then (2t, t/2) in columns ×
/// rows when decoding, in ComfyUI's order for each direction; a 3-D VAE makes one pass.
pub(super) fn tiled_pass(
    family: VaeFamily,
    sample: &Tensor,
    tile: usize,
    overlap: usize,
    scale: Scale,
    pass: &mut dyn FnMut(&Tensor) -> Result<Tensor, NodeError>,
) -> Result<Tensor, NodeError> {
    let mut run =
        |rows: usize, cols: usize| tiled_scale(sample, [rows, cols], overlap, scale, pass);
    match family {
        VaeFamily::Wan21 => run(tile, tile),
        VaeFamily::Flux | VaeFamily::Flux2 => {
            // `tiled_scale(tile_x, tile_y)` tiles (rows, columns) = (tile_y, tile_x).
            let passes: [(usize, usize); 3] = match scale {
                Scale::Up(_) => [(tile * 2, tile / 2), (tile / 2, tile * 2), (tile, tile)],
                Scale::Down(_) => [(tile, tile), (tile / 2, tile * 2), (tile * 2, tile / 2)],
            };
            let mut sum: Option<Tensor> = None;
            for (rows, cols) in passes {
                let part = run(rows, cols)?;
                sum = Some(match sum {
                    None => part,
                    Some(s) => {
                        let data = s.data().iter().zip(part.data()).map(|(a, b)| a + b).collect();
                        Tensor::new(s.shape().to_vec(), data)
                            .map_err(|e| NodeError::new(e.to_string()))?
                    }
                });
            }
            let sum = sum.ok_or_else(|| NodeError::new("no tiled pass ran"))?;
            Ok(sum.map(|v| v / 3.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Scale, ramp, tiled_scale};
    use crate::tensor::Tensor;

    #[test]
    fn ramps_feather_both_ends_and_square_a_shared_middle() {
        assert_eq!(ramp(5, 2), vec![0.5, 1.0, 1.0, 1.0, 0.5]);
        // The middle of 5 is t = 2 from both ends: × 3/4 twice.
        assert_eq!(ramp(5, 4), vec![0.25, 0.5, 0.5625, 0.5, 0.25]);
        // A feather as long as the tile leaves it unweighted.
        assert_eq!(ramp(3, 3), vec![1.0, 1.0, 1.0]);
    }

    /// The stand-in pass of `scripts/reference/tiled_vae.py`: ×8 nearest or 8×8 mean, plus the tile's mean.
    fn stand_in(up: bool) -> impl FnMut(&Tensor) -> Result<Tensor, crate::nodes::NodeError> {
        move |t: &Tensor| {
            let &[1, c, h, w] = t.shape() else { unreachable!() };
            let mean = t.data().iter().sum::<f32>() / t.data().len() as f32;
            let (oh, ow) = if up { (h * 8, w * 8) } else { (h / 8, w / 8) };
            let mut v = Vec::with_capacity(c * oh * ow);
            for ch in 0..c {
                for y in 0..oh {
                    for x in 0..ow {
                        let value = if up {
                            t.data()[(ch * h + y / 8) * w + x / 8]
                        } else {
                            let block = (0..64)
                                .map(|i| t.data()[(ch * h + y * 8 + i / 8) * w + x * 8 + i % 8]);
                            block.sum::<f32>() / 64.0
                        };
                        v.push(value + mean);
                    }
                }
            }
            Ok(Tensor::new(vec![1, c, oh, ow], v).expect("a tensor"))
        }
    }

    /// ComfyUI's `tiled_scale_multidim` on the stand-in pass (engine/tests/fixtures/tiled_vae, from
    /// `scripts/reference/tiled_vae.py`): tiles, their clamped last positions, the feathered blend.
    #[test]
    fn tiles_blend_as_comfyui_blends_them() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tiled_vae/cases.json");
        let cases: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture"))
                .expect("JSON");
        for (name, case) in cases.as_object().expect("cases") {
            let numbers = |key: &str| -> Vec<f32> {
                case[key]
                    .as_array()
                    .expect(key)
                    .iter()
                    .map(|v| v.as_f64().expect("a number") as f32)
                    .collect()
            };
            let dims = |key: &str| -> Vec<usize> {
                case[key]
                    .as_array()
                    .expect(key)
                    .iter()
                    .map(|v| v.as_u64().expect("a size") as usize)
                    .collect()
            };
            let shape = dims("shape");
            let tile = dims("tile");
            let up = case["direction"] == "up";
            let sample = Tensor::new(shape, numbers("input")).expect("a tensor");
            let scale = if up { Scale::Up(8) } else { Scale::Down(8) };
            let overlap = case["overlap"].as_u64().expect("overlap") as usize;
            let got = tiled_scale(&sample, [tile[0], tile[1]], overlap, scale, &mut stand_in(up))
                .expect("tiled");
            let want = numbers("output");
            assert_eq!(got.data().len(), want.len(), "{name}");
            let worst =
                got.data().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{name}: off by {worst}");
        }
    }

    #[test]
    fn a_pointwise_pass_is_unchanged_by_tiling() {
        // A pass that scales each position ×8 (×16, as FLUX.2's VAE) nearest (a stand-in decoder): blending
        // equal tiles gives the untiled output.
        for f in [8, 16] {
            let (h, w) = (11, 13);
            let sample =
                Tensor::new(vec![1, 2, h, w], (0..2 * h * w).map(|i| (i as f32).sin()).collect())
                    .expect("a tensor");
            let mut nearest = |t: &Tensor| {
                let &[1, c, th, tw] = t.shape() else { unreachable!() };
                let mut v = Vec::new();
                for ch in 0..c {
                    for y in 0..th * f {
                        for x in 0..tw * f {
                            v.push(t.data()[(ch * th + y / f) * tw + x / f]);
                        }
                    }
                }
                Ok(Tensor::new(vec![1, c, th * f, tw * f], v).expect("a tensor"))
            };
            let whole = nearest(&sample).expect("whole");
            let tiled = tiled_scale(&sample, [4, 6], 2, Scale::Up(f), &mut nearest).expect("tiled");
            assert_eq!(tiled.shape(), whole.shape());
            for (a, b) in tiled.data().iter().zip(whole.data()) {
                assert!((a - b).abs() < 1e-6, "×{f}: {a} vs {b}");
            }
        }
    }
}
