//! ComfyUI's tiled VAE passes (`VAE.decode_tiled`, `VAE.encode_tiled`): a large latent or image goes through
//! the VAE tile by tile, the overlaps feathered and blended, so a pass never holds more than a tile's
//! activations.
//!
//! [`tiled_scale`] is `comfy.utils.tiled_scale_multidim` over the dimensions after `[1, C]` of one sample: the
//! two spatial ones of an image, or time and space of a clip (`decode_tiled_3d`, `encode_tiled_3d`), where a
//! tile of T latent frames decodes to 4T − 3 frames and is placed at 4× its first frame. A family's tiling calls
//! it as ComfyUI does: the 2-D VAEs (Flux's) average three passes with tiles of (h, w), (h/2, 2w) and
//! (2h, w/2); the 3-D VAEs (Wan's) make one pass, an image's frame dimension one tile. Each temporal tile starts
//! its own clip (its first frame decoded or encoded as a first frame), as in ComfyUI.

use kiln_models::family::VaeFamily;

use crate::nodes::{ErrorKind, NodeError};
use crate::tensor::Tensor;

/// How one dimension's sizes and positions change through the VAE (ComfyUI's `upscale_amount` and
/// `index_formulas`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Scale {
    /// Latent positions to pixels: × the factor (the VAE's downscale: 8, 16 for FLUX.2's and Wan 2.2's).
    Up(usize),
    /// Pixels to latent positions: ÷ the factor.
    Down(usize),
    /// Latent frames to frames: T → max(0, 4T − 3) frames, placed at 4× (`frames` per latent frame).
    FramesUp(usize),
    /// Frames to latent frames: L → ⌊(L + 3)/4⌋, placed at ÷ 4.
    FramesDown(usize),
}

impl Scale {
    /// The output size of `v` input positions (ComfyUI's `get_scale`, unrounded).
    fn size(self, v: usize) -> f64 {
        match self {
            Scale::Up(f) => v as f64 * f as f64,
            Scale::Down(f) => v as f64 / f as f64,
            Scale::FramesUp(f) => (v * f).saturating_sub(f - 1) as f64,
            Scale::FramesDown(f) => v.div_ceil(f) as f64,
        }
    }

    /// Where input position `v` lands in the output (ComfyUI's `get_pos`, unrounded).
    fn pos(self, v: usize) -> f64 {
        match self {
            Scale::Up(f) | Scale::FramesUp(f) => v as f64 * f as f64,
            Scale::Down(f) | Scale::FramesDown(f) => v as f64 / f as f64,
        }
    }
}

/// Python's `round` (half to even) of a non-negative value.
fn round(v: f64) -> usize {
    v.round_ties_even() as usize
}

/// One dimension of a tiling: the tile and overlap in input positions, and how it scales.
#[derive(Clone, Copy, Debug)]
pub(super) struct Axis {
    /// Input positions per tile.
    pub(super) tile: usize,
    /// Input positions tiles overlap by.
    pub(super) overlap: usize,
    /// How sizes and positions change.
    pub(super) scale: Scale,
}

impl Axis {
    /// Where the tiles along a dimension of `size` input positions start (before the last is moved back to end
    /// at the edge): every `tile − overlap`, or one tile when the dimension fits one.
    fn starts(&self, size: usize) -> Vec<usize> {
        if size > self.tile {
            (0..size - self.overlap).step_by(self.tile - self.overlap).collect()
        } else {
            vec![0]
        }
    }
}

/// How many tiles [`tiled_scale`] runs for a sample of `size` (the dimensions after `[1, C]`), for progress.
/// ComfyUI's `get_tiled_scale_steps` counts ⌈side / (tile − overlap)⌉ per side, which can exceed the tiles run
/// (a side between 481 and 512 is one tile); Kiln counts the tiles, so progress ends at its total.
pub(super) fn tile_count(size: &[usize], axes: &[Axis]) -> usize {
    size.iter().zip(axes).map(|(&s, a)| a.starts(s).len()).product()
}

/// Row-major strides of `size`.
fn strides(size: &[usize]) -> Vec<usize> {
    let mut s = vec![1; size.len()];
    for d in (0..size.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * size[d + 1];
    }
    s
}

/// Every multi-index of `size` but the last dimension's, row-major.
fn rows(size: &[usize]) -> Vec<Vec<usize>> {
    let lead = &size[..size.len() - 1];
    let count: usize = lead.iter().product();
    let mut out = Vec::with_capacity(count);
    let mut index = vec![0; lead.len()];
    for _ in 0..count {
        out.push(index.clone());
        for d in (0..lead.len()).rev() {
            index[d] += 1;
            if index[d] < lead[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// `sample` `[1, C, dims…]` through `pass` tile by tile (ComfyUI's `tiled_scale_multidim`), one [`Axis`] per
/// dimension after `C`: tiles of `tile` input positions start every `tile − overlap`, the last one moved back
/// to end at the edge; each output tile is weighted by a mask that ramps up over `round(scale(overlap))`
/// positions from each side ((t + 1) / feather), placed at `round(pos(start))`, and the output is the weighted
/// sum over the summed weights. An input that fits one tile goes through whole.
pub(super) fn tiled_scale(
    sample: &Tensor,
    axes: &[Axis],
    pass: &mut dyn FnMut(&Tensor) -> Result<Tensor, NodeError>,
) -> Result<Tensor, NodeError> {
    let shape = sample.shape();
    if shape.len() != axes.len() + 2 || shape[0] != 1 {
        return Err(NodeError::new(format!(
            "tiling {} dimensions expects [1, C, …], got {shape:?}",
            axes.len()
        )));
    }
    let channels = shape[1];
    let size = &shape[2..];
    if size.iter().zip(axes).all(|(&s, a)| s <= a.tile) {
        return pass(sample);
    }
    if let Some(a) = size.iter().zip(axes).find(|(s, a)| **s > a.tile && a.tile <= a.overlap) {
        let a = a.1;
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "tiles of {} cannot overlap by {} (this VAE's passes halve the tile along one side): raise \
                 tile_size or lower overlap",
                a.tile, a.overlap
            ),
        ));
    }
    let out_size: Vec<usize> =
        size.iter().zip(axes).map(|(&s, a)| round(a.scale.size(s))).collect();
    let out_plane: usize = out_size.iter().product();
    let out_strides = strides(&out_size);
    let mut out_channels = None;
    let mut out = Vec::new();
    let mut weight = vec![0f32; out_plane];
    let starts: Vec<Vec<usize>> = size.iter().zip(axes).map(|(&s, a)| a.starts(s)).collect();
    let feathers: Vec<usize> = axes.iter().map(|a| round(a.scale.size(a.overlap))).collect();
    for it in rows(&starts.iter().map(Vec::len).chain([1]).collect::<Vec<_>>()) {
        let pos: Vec<usize> = (0..size.len())
            .map(|d| starts[d][it[d]].min(size[d] - axes[d].overlap.min(size[d])))
            .collect();
        let len: Vec<usize> = (0..size.len()).map(|d| axes[d].tile.min(size[d] - pos[d])).collect();
        let input = crop(sample.data(), channels, size, &pos, &len)?;
        let output = pass(&input)?;
        let oshape = output.shape();
        if oshape.len() != shape.len() || oshape[0] != 1 {
            return Err(NodeError::new(format!("a tile came out {oshape:?}")));
        }
        let oc = oshape[1];
        if *out_channels.get_or_insert(oc) != oc {
            return Err(NodeError::new(format!("a tile came out with {oc} channels")));
        }
        out.resize(oc * out_plane, 0.0);
        let tile_size = &oshape[2..];
        let masks: Vec<Vec<f32>> =
            tile_size.iter().zip(&feathers).map(|(&n, &f)| ramp(n, f)).collect();
        let at: Vec<usize> = pos.iter().zip(axes).map(|(&p, a)| round(a.scale.pos(p))).collect();
        let visible: Vec<usize> =
            (0..size.len()).map(|d| tile_size[d].min(out_size[d].saturating_sub(at[d]))).collect();
        if visible.contains(&0) {
            continue;
        }
        let tile_strides = strides(tile_size);
        let tile_plane: usize = tile_size.iter().product();
        let last = size.len() - 1;
        for row in rows(&visible) {
            let lead: f32 = row.iter().enumerate().map(|(d, &i)| masks[d][i]).product();
            let (mut o, mut t) = (0, 0);
            for (d, &i) in row.iter().enumerate() {
                o += (at[d] + i) * out_strides[d];
                t += i * tile_strides[d];
            }
            o += at[last];
            for (k, m) in masks[last].iter().take(visible[last]).enumerate() {
                let m = lead * m;
                for c in 0..oc {
                    out[c * out_plane + o + k] += output.data()[c * tile_plane + t + k] * m;
                }
                weight[o + k] += m;
            }
        }
    }
    for plane in out.chunks_exact_mut(out_plane) {
        plane.iter_mut().zip(&weight).for_each(|(v, m)| *v /= m);
    }
    let mut out_shape = vec![1, out_channels.unwrap_or(0)];
    out_shape.extend(out_size);
    Tensor::new(out_shape, out).map_err(|e| NodeError::new(e.to_string()))
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

/// The `[1, C, len…]` window at `pos` of a `[1, C, size…]` sample.
fn crop(
    data: &[f32],
    channels: usize,
    size: &[usize],
    pos: &[usize],
    len: &[usize],
) -> Result<Tensor, NodeError> {
    let plane: usize = size.iter().product();
    let stride = strides(size);
    let last = size.len() - 1;
    let mut values = Vec::with_capacity(channels * len.iter().product::<usize>());
    for c in 0..channels {
        for row in rows(len) {
            let mut at = c * plane + pos[last];
            for (d, &i) in row.iter().enumerate() {
                at += (pos[d] + i) * stride[d];
            }
            values.extend_from_slice(&data[at..at + len[last]]);
        }
    }
    let mut shape = vec![1, channels];
    shape.extend_from_slice(len);
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

/// `sample` through `pass` tiled as `family`'s VAE is in ComfyUI, spatial tiles of `tile` × `tile` input
/// positions overlapping by `overlap`, `scale` the spatial [`Scale`]: a 2-D VAE averages three passes of an
/// image `[1, C, H, W]`, (t, t), (t/2, 2t) then (2t, t/2) in columns × rows when decoding, in ComfyUI's order for
/// each direction; a 3-D VAE makes one pass, over time too for a clip `[1, C, T, H, W]`, with `temporal` (tile
/// and overlap in input frames, and how frames scale).
pub(super) fn tiled_pass(
    family: VaeFamily,
    sample: &Tensor,
    (tile, overlap): (usize, usize),
    scale: Scale,
    temporal: Option<Axis>,
    pass: &mut dyn FnMut(&Tensor) -> Result<Tensor, NodeError>,
) -> Result<Tensor, NodeError> {
    let space = |side: usize| Axis { tile: side, overlap, scale };
    match family {
        VaeFamily::Wan21
        | VaeFamily::Wan22
        | VaeFamily::HunyuanVideo15
        | VaeFamily::HunyuanVideo => match (sample.shape().len(), temporal) {
            (5, Some(time)) => tiled_scale(sample, &[time, space(tile), space(tile)], pass),
            (4, _) => tiled_scale(sample, &[space(tile), space(tile)], pass),
            _ => Err(NodeError::new(format!(
                "a tiled pass of {} takes an image [1, C, H, W] or a clip [1, C, T, H, W], got {:?}",
                family.name(),
                sample.shape()
            ))),
        },
        VaeFamily::Flux | VaeFamily::Flux2 | VaeFamily::MageFlow | VaeFamily::PixelSpace => {
            // `tiled_scale(tile_x, tile_y)` tiles (rows, columns) = (tile_y, tile_x).
            let passes: [(usize, usize); 3] = match scale {
                Scale::Up(_) | Scale::FramesUp(_) => {
                    [(tile * 2, tile / 2), (tile / 2, tile * 2), (tile, tile)]
                }
                Scale::Down(_) | Scale::FramesDown(_) => {
                    [(tile, tile), (tile / 2, tile * 2), (tile * 2, tile / 2)]
                }
            };
            let mut sum: Option<Tensor> = None;
            for (rows, cols) in passes {
                let part = tiled_scale(sample, &[space(rows), space(cols)], pass)?;
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
    use super::{Axis, Scale, ramp, tiled_scale};
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
            let axes = [tile[0], tile[1]].map(|tile| Axis { tile, overlap, scale });
            let got = tiled_scale(&sample, &axes, &mut stand_in(up)).expect("tiled");
            let want = numbers("output");
            assert_eq!(got.data().len(), want.len(), "{name}");
            let worst =
                got.data().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(worst < 1e-5, "{name}: off by {worst}");
        }
    }

    /// The stand-in clip passes of `scripts/reference/wan_vae_video.py`: up keeps latent frame 0 and repeats
    /// frame k at frames 4k − 3 ..= 4k, each position 2 × 2; down keeps frame 0, averages frames 4k − 3 ..= 4k
    /// and 2 × 2 blocks; both add the tile's mean.
    fn clip_stand_in(up: bool) -> impl FnMut(&Tensor) -> Result<Tensor, crate::nodes::NodeError> {
        move |t: &Tensor| {
            let &[1, c, f, h, w] = t.shape() else { unreachable!() };
            let x = |ch: usize, fi: usize, y: usize, xi: usize| {
                t.data()[((ch * f + fi) * h + y) * w + xi]
            };
            let mean = t.data().iter().sum::<f32>() / t.data().len() as f32;
            let (of, oh, ow) =
                if up { (4 * f - 3, h * 2, w * 2) } else { (1 + (f - 1) / 4, h / 2, w / 2) };
            let mut v = Vec::with_capacity(c * of * oh * ow);
            for ch in 0..c {
                for fo in 0..of {
                    let frames: Vec<usize> = match (up, fo) {
                        (true, _) => vec![fo.div_ceil(4)],
                        (false, 0) => vec![0],
                        (false, k) => (4 * k - 3..=4 * k).collect(),
                    };
                    for y in 0..oh {
                        for xo in 0..ow {
                            let value = if up {
                                x(ch, frames[0], y / 2, xo / 2)
                            } else {
                                let block = |fi: usize| {
                                    (0..4)
                                        .map(|i| x(ch, fi, y * 2 + i / 2, xo * 2 + i % 2))
                                        .sum::<f32>()
                                        / 4.0
                                };
                                frames.iter().map(|&fi| block(fi)).sum::<f32>()
                                    / frames.len() as f32
                            };
                            v.push(value + mean);
                        }
                    }
                }
            }
            let shape = vec![1, c, of, oh, ow];
            Ok(Tensor::new(shape, v).expect("a tensor"))
        }
    }

    /// ComfyUI's 3-D tiling of a Wan VAE's clips (`decode_tiled_3d`, `encode_tiled_3d`: 4T − 3 frames placed at
    /// 4×, ⌊(L + 3)/4⌋ latent frames placed at ÷ 4) on the stand-in passes (the `tiled3d` cases of
    /// engine/models/tests/fixtures/wan_vae_video, from `scripts/reference/wan_vae_video.py`).
    #[test]
    fn clips_tile_in_time_as_comfyui_tiles_them() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models/tests/fixtures/wan_vae_video/tiled3d.json");
        let cases: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture"))
                .expect("JSON");
        for (name, case) in cases.as_object().expect("cases") {
            let numbers = |key: &str| -> Vec<f32> {
                let values = case[key].as_array().expect(key);
                values.iter().map(|v| v.as_f64().expect("a number") as f32).collect()
            };
            let dims = |key: &str| -> Vec<usize> {
                let values = case[key].as_array().expect(key);
                values.iter().map(|v| v.as_u64().expect("a size") as usize).collect()
            };
            let up = case["direction"] == "up";
            let (tile, overlap) = (dims("tile"), dims("overlap"));
            let scales = if up {
                [Scale::FramesUp(4), Scale::Up(2), Scale::Up(2)]
            } else {
                [Scale::FramesDown(4), Scale::Down(2), Scale::Down(2)]
            };
            let axes: Vec<Axis> = (0..3)
                .map(|d| Axis { tile: tile[d], overlap: overlap[d], scale: scales[d] })
                .collect();
            let sample = Tensor::new(dims("shape"), numbers("input")).expect("a tensor");
            let got = tiled_scale(&sample, &axes, &mut clip_stand_in(up)).expect("tiled");
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
            let axes = [4, 6].map(|tile| Axis { tile, overlap: 2, scale: Scale::Up(f) });
            let tiled = tiled_scale(&sample, &axes, &mut nearest).expect("tiled");
            assert_eq!(tiled.shape(), whole.shape());
            for (a, b) in tiled.data().iter().zip(whole.data()) {
                assert!((a - b).abs() < 1e-6, "×{f}: {a} vs {b}");
            }
        }
    }
}
