//! Regional prompting in the sampler, as ComfyUI's `comfy.samplers` does it. When sampling starts, each prompt's
//! region is resolved against the latent (`resolve_areas_and_cond_masks_multidim`: fractions into cells, masks
//! resized to the latent, a mask's bounds into an area), and every area of one side gets the other sides' prompt
//! there (`create_cond_with_same_area_if_none`). At each model call a prompt with an area is run on its block of
//! the latent alone, and each side's prediction is the weighted mean of its prompts' (`get_area_and_mult`,
//! `_calc_cond_batch`): a prompt weighs its strength (times its mask), faded over up to 8 cells at an area's
//! inner edges.
//!
//! Invariant: a tensor's values are laid out `[B, C, dims...]` (dims: `h, w`, or `t, h, w` for video), and a
//! block lists, per dimension after the batch and channels, where it starts and its length.

use super::resize::resize;
use crate::models::{Area, Cond, CondExtras, Conditioning, PromptRegion};
use crate::nodes::{ErrorKind, NodeError};
use crate::tensor::Tensor;

/// The size ComfyUI gives a dimension an area leaves whole (`add_area_dims`).
const WHOLE: usize = 2_147_483_648;

/// The most cells an area's weights fade over at an inner edge (`get_area_and_mult`'s `fuzz`).
const FUZZ: usize = 8;

/// The smallest side of an area taken from a mask's bounds.
const MIN_BOUNDS: usize = 8;

fn invalid(message: String) -> NodeError {
    NodeError::of_kind(ErrorKind::InvalidValue, message)
}

/// Readies the sides of a sampling run (positive, middle, negative, those it has) for a latent of `shape` when
/// any prompt has a region: each side [`resolve`]d, then the areas mirrored ([`mirror_areas`]).
pub(super) fn prepare(sides: &mut [&mut Conditioning], shape: &[usize]) -> Result<(), NodeError> {
    let any =
        sides.iter().any(|s| s.entries.iter().any(|e| e.extras.region != PromptRegion::default()));
    if !any {
        return Ok(());
    }
    for side in sides.iter_mut() {
        **side = resolve(side, shape)?;
    }
    mirror_areas(sides);
    Ok(())
}

/// `side` with each prompt's region resolved for a latent of `shape`: an area in fractions turned into cells,
/// the mask resized (bilinear) to the latent's last two dimensions (`[B, h, w]`; on a video latent its batch
/// is the frames), and with "mask bounds" the area made the bounding box of the mask's non-zero cells over its
/// batch, at least 8 cells a side (8 × 8 at the origin for an empty mask).
fn resolve(side: &Conditioning, shape: &[usize]) -> Result<Conditioning, NodeError> {
    let dims = latent_dims(shape)?;
    let mut out = side.clone();
    for entry in &mut out.entries {
        let region = &mut entry.extras.region;
        if let Some(Area::Fraction(fractions)) = &region.area {
            region.area = Some(Area::Cells(fraction_cells(fractions, dims)?));
        }
        if let Some(mask) = &region.mask {
            let [h, w] = [dims[dims.len() - 2], dims[dims.len() - 1]];
            let resized = resized_mask(mask, h, w)?;
            if region.area_from_mask {
                region.area = Some(Area::Cells(mask_bounds(&resized)));
                region.area_from_mask = false;
            }
            region.mask = Some(resized);
        }
    }
    Ok(out)
}

/// The dimensions of a latent `[B, C, dims...]` after its batch and channels.
fn latent_dims(shape: &[usize]) -> Result<&[usize], NodeError> {
    match shape {
        [_, _, dims @ ..] if dims.len() >= 2 => Ok(dims),
        _ => Err(invalid(format!("a prompt's area or mask on a latent of shape {shape:?}"))),
    }
}

/// An area in fractions in cells of `dims`: sizes at least 1, both rounded half to even (Python's `round`).
/// An area of as many dimensions as the latent is ComfyUI's; one of fewer covers the latent's last ones (the
/// image node's on a video: every frame), one of more gives its last ones (the video node's on an image).
fn fraction_cells(fractions: &[f64], dims: &[usize]) -> Result<Vec<usize>, NodeError> {
    let half = fractions.len() / 2;
    if half == 0 || !fractions.len().is_multiple_of(2) {
        return Err(invalid(format!("an area of {} fractions", fractions.len())));
    }
    let used = half.min(dims.len());
    let dims = &dims[dims.len() - used..];
    let (sizes, offsets) = (&fractions[half - used..half], &fractions[2 * half - used..]);
    let cells = |f: f64, d: usize| (f * d as f64).round_ties_even().max(0.0) as usize;
    let mut out: Vec<usize> = sizes.iter().zip(dims).map(|(&f, &d)| cells(f, d).max(1)).collect();
    out.extend(offsets.iter().zip(dims).map(|(&f, &d)| cells(f, d)));
    Ok(out)
}

/// A mask `[B, H, W]` resized bilinearly to `h × w` (torch's `interpolate` without antialiasing).
fn resized_mask(mask: &Tensor, h: usize, w: usize) -> Result<Tensor, NodeError> {
    let (b, mh, mw) = match *mask.shape() {
        [b, mh, mw] => (b, mh, mw),
        [mh, mw] => (1, mh, mw),
        ref other => return Err(invalid(format!("a prompt's mask is [B, H, W], not {other:?}"))),
    };
    if (mh, mw) == (h, w) {
        return Tensor::new(vec![b, h, w], mask.data().to_vec())
            .map_err(|e| NodeError::new(e.to_string()));
    }
    let image = Tensor::new(vec![b, mh, mw, 1], mask.data().to_vec())
        .map_err(|e| NodeError::new(e.to_string()))?;
    let out = resize(&image, w, h, "bilinear", false)?;
    Tensor::new(vec![b, h, w], out.data().to_vec()).map_err(|e| NodeError::new(e.to_string()))
}

/// The area `(h, w, y, x)` of a resized mask's non-zero cells over its batch (`get_mask_aabb` of the largest
/// magnitude), each side at least [`MIN_BOUNDS`]; an empty mask's is 8 × 8 at the origin.
fn mask_bounds(mask: &Tensor) -> Vec<usize> {
    let &[_, h, w] = mask.shape() else { return vec![MIN_BOUNDS, MIN_BOUNDS, 0, 0] };
    let (mut y0, mut x0, mut y1, mut x1) = (usize::MAX, usize::MAX, 0, 0);
    for plane in mask.data().chunks_exact((h * w).max(1)) {
        for (i, _) in plane.iter().enumerate().filter(|(_, v)| **v != 0.0) {
            let (y, x) = (i / w, i % w);
            (y0, x0, y1, x1) = (y0.min(y), x0.min(x), y1.max(y), x1.max(x));
        }
    }
    if y0 == usize::MAX {
        return vec![MIN_BOUNDS, MIN_BOUNDS, 0, 0];
    }
    vec![(y1 - y0 + 1).max(MIN_BOUNDS), (x1 - x0 + 1).max(MIN_BOUNDS), y0, x0]
}

/// Gives every side a prompt in each area another side's prompt has, unless a prompt of its own already
/// covers just that area (`create_cond_with_same_area_if_none`, the sides in ComfyUI's order: positive, middle,
/// negative). The new prompt is the side's own whose area holds the other's most tightly (or one without an
/// area): its embedding and what the model reads beside it, with the other prompt's region, timestep range and
/// ControlNets.
fn mirror_areas(sides: &mut [&mut Conditioning]) {
    for k in 0..sides.len() {
        for i in 0..sides[k].entries.len() {
            let c = sides[k].entries[i].clone();
            for (kk, side) in sides.iter_mut().enumerate() {
                if kk != k {
                    mirror_into(side, &c);
                }
            }
        }
    }
}

fn mirror_into(side: &mut Conditioning, c: &Cond) {
    let Some(Area::Cells(c_area)) = &c.extras.region.area else { return };
    let mut smallest: Option<&Cond> = None;
    for x in &side.entries {
        match (&x.extras.region.area, smallest.map(|s| &s.extras.region.area)) {
            (Some(Area::Cells(a)), current) if area_inside(c_area, a) => match current {
                Some(Some(Area::Cells(s))) if product(s) <= product(a) => {}
                _ => smallest = Some(x),
            },
            (None, None) => smallest = Some(x),
            _ => {}
        }
    }
    let Some(smallest) = smallest else { return };
    if smallest.extras.region.area.as_ref() == Some(&Area::Cells(c_area.clone())) {
        return;
    }
    let extras = CondExtras {
        region: c.extras.region.clone(),
        timestep_range: c.extras.timestep_range,
        controls: c.extras.controls.clone(),
        ..smallest.extras.clone()
    };
    let copy = Cond { cond: smallest.cond.clone(), pooled: smallest.pooled.clone(), extras };
    side.entries.push(copy);
}

/// The product of an area's sizes.
fn product(area: &[usize]) -> usize {
    area[..area.len() / 2].iter().product()
}

/// `area` with whole leading dimensions added until it has `dims` (`add_area_dims`).
fn with_dims(area: &[usize], dims: usize) -> Vec<usize> {
    let mut area = area.to_vec();
    while area.len() / 2 < dims {
        let half = area.len() / 2;
        let mut grown = vec![WHOLE];
        grown.extend_from_slice(&area[..half]);
        grown.push(0);
        grown.extend_from_slice(&area[half..]);
        area = grown;
    }
    area
}

/// Whether area `a` lies within `outer` (`area_inside`).
fn area_inside(a: &[usize], outer: &[usize]) -> bool {
    let a = with_dims(a, outer.len() / 2);
    let outer = with_dims(outer, a.len() / 2);
    let (al, ol) = (a.len() / 2, outer.len() / 2);
    let n = al.min(ol);
    (0..n).all(|i| a[al + i] >= outer[ol + i])
        && (0..n).all(|i| a[i] + a[al + i] <= outer[i] + outer[ol + i])
}

/// Where a prompt runs at a model call and what it weighs there (`get_area_and_mult`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Placement {
    /// Per dimension after the batch and channels: where the block starts and its length.
    pub(super) block: Vec<(usize, usize)>,
    /// Whether the block is less than the whole latent (the model runs on it alone).
    pub(super) cropped: bool,
    /// The weights over the block, `[B, C, block...]`.
    pub(super) weights: Vec<f32>,
}

impl Placement {
    /// The shape of the block of a latent of `shape`.
    pub(super) fn shape(&self, shape: &[usize]) -> Vec<usize> {
        shape[..2].iter().copied().chain(self.block.iter().map(|b| b.1)).collect()
    }
}

/// The block and weights of a prompt with a resolved `region` on a latent of `shape`; `None` for a prompt over
/// the whole latent at weight 1. The block is the area clipped to the latent; the weights are the strength,
/// times the mask (its sample, or its frame on a video) times its strength, or, without a mask, faded from
/// 1/rr to 1 over the rr = min(8, side ÷ 4) cells at each edge of the area inside the latent.
pub(super) fn placement(
    region: &PromptRegion,
    shape: &[usize],
) -> Result<Option<Placement>, NodeError> {
    if region.is_whole() {
        return Ok(None);
    }
    let dims = latent_dims(shape)?;
    let (batch, channels, n) = (shape[0], shape[1], dims.len());
    let mut block: Vec<(usize, usize)> = dims.iter().map(|&d| (0, d)).collect();
    let area = match &region.area {
        Some(Area::Cells(area)) => {
            let mut area = with_dims(area, n);
            let half = area.len() / 2;
            // More dimensions than the latent: its last ones.
            area = [&area[half - n..half], &area[2 * half - n..]].concat();
            for (i, b) in block.iter_mut().enumerate() {
                let (size, offset) = (area[i], area[n + i]);
                if offset >= dims[i] || size == 0 {
                    return Err(invalid(format!(
                        "a prompt's area (sizes {:?} at {:?} in latent cells) lies outside the latent {dims:?}",
                        &area[..n],
                        &area[n..]
                    )));
                }
                *b = (offset, size.min(dims[i] - offset));
            }
            true
        }
        Some(Area::Fraction(_)) => {
            return Err(invalid("a prompt's area was not resolved before sampling".to_owned()));
        }
        None => false,
    };
    let sizes: Vec<usize> = block.iter().map(|b| b.1).collect();
    let cells: usize = sizes.iter().product();
    let strength = region.strength.unwrap_or(1.0) as f32;
    let mask = match &region.mask {
        Some(mask) => Some(MaskLookup::new(mask, region.mask_strength, shape, &block)?),
        None => None,
    };
    // Each edge's fade: the factor of the cell `t` in from it, for the first rr cells.
    let fades: Vec<(usize, Vec<f32>)> = sizes
        .iter()
        .map(|&size| {
            let rr = FUZZ.min(size / 4);
            (rr, (0..rr).map(|t| ((1.0 / rr as f64) * (t + 1) as f64) as f32).collect())
        })
        .collect();
    let mut weights = Vec::with_capacity(batch * channels * cells);
    let mut at = vec![0usize; n];
    for sample in 0..batch {
        let mut plane = Vec::with_capacity(cells);
        at.iter_mut().for_each(|a| *a = 0);
        for _ in 0..cells {
            let mut v = match &mask {
                Some(m) => m.at(sample, &at) * m.strength * strength,
                None => strength,
            };
            if area && mask.is_none() {
                for i in 0..n {
                    let (rr, fade) = &fades[i];
                    let (offset, size) = block[i];
                    if offset != 0 && at[i] < *rr {
                        v *= fade[at[i]];
                    }
                    if offset + size < dims[i] && size - 1 - at[i] < *rr {
                        v *= fade[size - 1 - at[i]];
                    }
                }
            }
            plane.push(v);
            advance(&mut at, &sizes);
        }
        for _ in 0..channels {
            weights.extend_from_slice(&plane);
        }
    }
    let cropped = block.iter().zip(dims).any(|(b, &d)| b.1 != d);
    Ok(Some(Placement { block, cropped, weights }))
}

/// Steps a row-major index `at` over `sizes`.
fn advance(at: &mut [usize], sizes: &[usize]) {
    for i in (0..at.len()).rev() {
        at[i] += 1;
        if at[i] < sizes[i] {
            return;
        }
        at[i] = 0;
    }
}

/// A resolved mask read at a block's cells: a sample's (an image latent's batch cycles through the mask's), or
/// on a video latent a frame's (a one-frame mask serves every frame).
struct MaskLookup<'a> {
    values: &'a [f32],
    /// The mask's planes, each `h × w`.
    planes: usize,
    /// Whether the planes are frames (a video latent) rather than samples.
    frames: bool,
    /// How many of its planes an image latent's samples cycle through (ComfyUI's `mask[:batch]`, repeated).
    cycle: usize,
    /// The mask's scale (`mask_strength`), as f32.
    strength: f32,
    block: Vec<(usize, usize)>,
    width: usize,
    plane: usize,
}

impl<'a> MaskLookup<'a> {
    fn new(
        mask: &'a Tensor,
        strength: Option<f64>,
        shape: &[usize],
        block: &[(usize, usize)],
    ) -> Result<MaskLookup<'a>, NodeError> {
        let &[planes, h, w] = mask.shape() else {
            return Err(invalid(format!("a resolved mask of shape {:?}", mask.shape())));
        };
        let dims = &shape[2..];
        if (h, w) != (dims[dims.len() - 2], dims[dims.len() - 1]) || planes == 0 {
            return Err(invalid(format!(
                "a mask of {planes} × {h} × {w} for a latent of shape {shape:?}"
            )));
        }
        let frames = dims.len() == 3;
        let cycle = planes.min(shape[0]).max(1);
        if frames {
            // One plane per frame, or one for all; under an area that cuts frames, at least as many as it
            // reaches (ComfyUI narrows the mask to them).
            let (start, len) = block[0];
            let whole = (start, len) == (0, dims[0]);
            let fits = planes == 1 || if whole { planes == len } else { planes >= start + len };
            if !fits {
                return Err(invalid(format!(
                    "a prompt's mask has {planes} frames for a video latent of {} frames (the prompt covers \
                     frames {start}..{}): give one mask for every frame, or one for all",
                    dims[0],
                    start + len
                )));
            }
        } else if !shape[0].is_multiple_of(cycle) {
            return Err(invalid(format!(
                "a prompt's mask batch of {planes} does not divide the latent's batch of {}",
                shape[0]
            )));
        }
        Ok(MaskLookup {
            values: mask.data(),
            planes,
            frames,
            cycle,
            strength: strength.unwrap_or(1.0) as f32,
            block: block.to_vec(),
            width: w,
            plane: h * w,
        })
    }

    /// The mask at the block cell `at` of `sample`.
    fn at(&self, sample: usize, at: &[usize]) -> f32 {
        let n = at.len();
        let y = self.block[n - 2].0 + at[n - 2];
        let x = self.block[n - 1].0 + at[n - 1];
        let plane = if self.frames {
            if self.planes == 1 { 0 } else { self.block[0].0 + at[0] }
        } else {
            sample % self.cycle
        };
        self.values[plane * self.plane + y * self.width + x]
    }
}

/// The values of `block` of a `[B, C, dims...]` tensor of `shape`.
pub(super) fn crop(values: &[f32], shape: &[usize], block: &[(usize, usize)]) -> Vec<f32> {
    let run = block.last().map_or(1, |b| b.1);
    let mut out =
        Vec::with_capacity(shape[0] * shape[1] * block.iter().map(|b| b.1).product::<usize>());
    for start in runs(shape, block) {
        out.extend_from_slice(&values[start..start + run]);
    }
    out
}

/// Adds `values` (over `block`) times `weights` to `sum`, and `weights` to `counts`, both of `shape`.
pub(super) fn add_weighted(
    (sum, counts): (&mut [f32], &mut [f32]),
    shape: &[usize],
    block: &[(usize, usize)],
    values: &[f32],
    weights: &[f32],
) {
    let run = block.last().map_or(1, |b| b.1);
    for (k, start) in runs(shape, block).enumerate() {
        let (v, w) = (&values[k * run..][..run], &weights[k * run..][..run]);
        for j in 0..run {
            sum[start + j] += v[j] * w[j];
            counts[start + j] += w[j];
        }
    }
}

/// Where each run of `block`'s last dimension starts in a `[B, C, dims...]` tensor of `shape`, in row-major
/// order of the block.
fn runs(shape: &[usize], block: &[(usize, usize)]) -> impl Iterator<Item = usize> {
    let n = block.len();
    // The outer index space: batch × channels × the block's dimensions but the last.
    let mut sizes = vec![shape[0] * shape[1]];
    sizes.extend(block[..n.saturating_sub(1)].iter().map(|b| b.1));
    let mut strides = vec![0usize; n + 1];
    let mut stride = 1;
    for i in (0..n).rev() {
        strides[i + 1] = stride;
        stride *= shape[i + 2];
    }
    strides[0] = stride;
    let total: usize = sizes.iter().product();
    let block = block.to_vec();
    let mut at = vec![0usize; sizes.len()];
    (0..total).map(move |_| {
        let mut start = at[0] * strides[0];
        for i in 1..at.len() {
            start += (block[i - 1].0 + at[i]) * strides[i];
        }
        start += block[n - 1].0 * strides[n];
        advance(&mut at, &sizes);
        start
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn io() -> BTreeMap<String, Tensor> {
        crate::fixtures::tensors("regions/resolve.safetensors")
    }

    fn cells(t: &Tensor) -> Vec<usize> {
        t.data().iter().map(|&v| v as usize).collect()
    }

    fn prompt(value: f32, region: PromptRegion) -> Cond {
        let mut c = Cond::new(Tensor::full(vec![1, 2, 4], value), None);
        c.extras.region = region;
        c
    }

    fn resolved(region: PromptRegion, shape: &[usize]) -> PromptRegion {
        let side = Conditioning { entries: vec![prompt(0.0, region)] };
        resolve(&side, shape).expect("resolves").entries[0].extras.region.clone()
    }

    fn area(fractions_or_cells: Area) -> PromptRegion {
        PromptRegion { area: Some(fractions_or_cells), ..PromptRegion::default() }
    }

    fn masked(mask: &Tensor, strength: f64, bounds: bool) -> PromptRegion {
        PromptRegion {
            mask: Some(mask.clone()),
            mask_strength: Some(strength),
            area_from_mask: bounds,
            ..PromptRegion::default()
        }
    }

    /// `regions.py`'s record of `resolve_areas_and_cond_masks_multidim`.
    #[test]
    fn fractions_masks_and_bounds_resolve_as_comfyuis() {
        let io = io();
        let pct2 = Area::Fraction(vec![0.5, 0.25, 0.3, 0.75]);
        let pct3 = Area::Fraction(vec![0.67, 0.5, 0.35, 0.34, 0.25, 0.5]);
        let got = |region, shape: &[usize]| resolved(region, shape).area;
        assert_eq!(
            got(area(pct2.clone()), &[1, 16, 24, 10]),
            Some(Area::Cells(cells(&io["pct2.area"])))
        );
        let want3 = cells(&io["pct3.area"]);
        assert_eq!(got(area(pct3.clone()), &[1, 16, 3, 24, 20]), Some(Area::Cells(want3.clone())));
        // Kiln's own: the image node's fractions on a video cover every frame; the video node's on an image
        // give its last dimensions.
        assert_eq!(
            got(area(pct2), &[1, 16, 5, 24, 10]),
            Some(Area::Cells(cells(&io["pct2.area"])))
        );
        let spatial = vec![want3[1], want3[2], want3[4], want3[5]];
        assert_eq!(got(area(pct3), &[1, 16, 24, 20]), Some(Area::Cells(spatial)));

        let mask = |name: &str, shape: &[usize]| {
            resolved(masked(&io[&format!("{name}.in")], 0.7, false), shape).mask.expect("a mask")
        };
        let m4 = mask("mask4", &[2, 16, 24, 20]);
        assert_eq!(m4.shape(), &[2, 24, 20]);
        crate::fixtures::assert_within("mask4", m4.data(), io["mask4.out"].data(), 1e-5);
        let m5 = mask("mask5", &[1, 16, 3, 24, 20]);
        assert_eq!(m5.shape(), &[3, 24, 20]);
        crate::fixtures::assert_within("mask5", m5.data(), io["mask5.out"].data(), 1e-5);

        let empty = Tensor::full(vec![1, 37, 29], 0.0);
        for (name, mask) in [
            ("bounds", &io["bounds.in"]),
            ("bounds_small", &io["bounds_small.in"]),
            ("bounds_empty", &empty),
        ] {
            let region = resolved(masked(mask, 1.0, true), &[1, 16, 24, 20]);
            assert_eq!(
                region.area,
                Some(Area::Cells(cells(&io[&format!("{name}.area")]))),
                "{name}"
            );
            assert!(!region.area_from_mask);
        }
    }

    /// `regions.py`'s record of `get_area_and_mult`: the block each prompt covers and its weights.
    #[test]
    fn blocks_and_weights_are_comfyuis() {
        let io = io();
        let edge = || PromptRegion {
            area: Some(Area::Cells(vec![12, 8, 6, 4])),
            strength: Some(1.5),
            ..PromptRegion::default()
        };
        let image = [2, 3, 24, 20];
        let video = [1, 3, 3, 24, 20];
        let cases = [
            ("edge", edge(), &image[..]),
            (
                "corner",
                PromptRegion { area: Some(Area::Cells(vec![20, 12, 0, 0])), ..edge() },
                &image,
            ),
            (
                "outside",
                PromptRegion {
                    area: Some(Area::Cells(vec![40, 40, 8, 8])),
                    strength: Some(1.0),
                    ..edge()
                },
                &image,
            ),
            ("masked", PromptRegion { ..masked(&io["mask4.in"], 0.7, false) }, &image),
            ("mask_only", masked(&io["mask4.in"], 0.7, false), &image),
            ("video_area", edge(), &video),
            (
                "video_pct",
                PromptRegion {
                    area: Some(Area::Fraction(vec![0.67, 0.5, 0.35, 0.34, 0.25, 0.5])),
                    strength: Some(1.3),
                    ..PromptRegion::default()
                },
                &video,
            ),
            ("video_mask", masked(&io["mask5.in"], 0.6, false), &video),
        ];
        for (name, mut region, shape) in cases {
            if name == "masked" {
                region.area = edge().area;
                region.strength = edge().strength;
            }
            let region = resolved(region, shape);
            let placed = placement(&region, shape).expect("placed").expect("a region");
            let mut area: Vec<usize> = placed.block.iter().map(|b| b.1).collect();
            area.extend(placed.block.iter().map(|b| b.0));
            assert_eq!(area, cells(&io[&format!("area.{name}")]), "{name}");
            let want = &io[&format!("mult.{name}")];
            assert_eq!(placed.shape(shape), want.shape(), "{name}");
            crate::fixtures::assert_within(name, &placed.weights, want.data(), 1e-5);
        }
    }

    #[test]
    fn each_area_gets_the_other_sides_prompt_there() {
        let cells = |v: &[usize]| PromptRegion {
            area: Some(Area::Cells(v.to_vec())),
            strength: Some(1.5),
            ..PromptRegion::default()
        };
        let mut positive = Conditioning {
            entries: vec![prompt(1.0, PromptRegion::default()), prompt(2.0, cells(&[4, 4, 2, 2]))],
        };
        // The negative's tightest area holding (4, 4) at (2, 2) is its (6, 6) at (1, 1), not the whole one.
        let mut negative = Conditioning {
            entries: vec![
                prompt(-1.0, PromptRegion::default()),
                prompt(-2.0, cells(&[6, 6, 1, 1])),
                prompt(-3.0, cells(&[8, 8, 0, 0])),
            ],
        };
        mirror_areas(&mut [&mut positive, &mut negative]);
        let added = &negative.entries[3];
        assert_eq!(added.cond.data()[0], -2.0, "the tightest holding area's prompt");
        assert_eq!(added.extras.region, cells(&[4, 4, 2, 2]), "the positive's region");
        // The negative's areas come back to the positive with its whole prompt, the copy's own area excepted.
        let back: Vec<f32> = positive.entries[2..].iter().map(|c| c.cond.data()[0]).collect();
        assert_eq!(back, vec![1.0, 1.0]);
        assert_eq!(negative.entries.len(), 4);
        // A side that has the same area already gets nothing.
        let mut same = Conditioning { entries: vec![prompt(-1.0, cells(&[4, 4, 2, 2]))] };
        let mut one = Conditioning { entries: vec![prompt(2.0, cells(&[4, 4, 2, 2]))] };
        mirror_areas(&mut [&mut one, &mut same]);
        assert_eq!((one.entries.len(), same.entries.len()), (1, 1));
    }

    #[test]
    fn impossible_regions_are_refused_with_a_reason() {
        let far = area(Area::Cells(vec![8, 8, 30, 0]));
        let err = placement(&far, &[1, 16, 24, 20]).expect_err("outside");
        assert!(err.message.contains("outside the latent"), "{}", err.message);
        let three = masked(&Tensor::full(vec![3, 24, 20], 1.0), 1.0, false);
        let err = placement(&three, &[4, 16, 24, 20]).expect_err("3 does not divide 4");
        assert!(err.message.contains("does not divide"), "{}", err.message);
        let two_frames = masked(&Tensor::full(vec![2, 24, 20], 1.0), 1.0, false);
        let err = placement(&two_frames, &[1, 16, 3, 24, 20]).expect_err("2 of 3 frames");
        assert!(err.message.contains("frames"), "{}", err.message);
        // Over a single-frame video, a mask's second plane would be left unread (ComfyUI refuses it too).
        let err = placement(&two_frames, &[2, 16, 1, 24, 20]).expect_err("2 planes, 1 frame");
        assert!(err.message.contains("frames"), "{}", err.message);
        // Under an area that cuts frames 1..3, three planes reach them.
        let cut = PromptRegion {
            area: Some(Area::Cells(vec![2, 24, 20, 1, 0, 0])),
            ..masked(&Tensor::full(vec![3, 24, 20], 1.0), 1.0, false)
        };
        assert!(placement(&cut, &[1, 16, 3, 24, 20]).is_ok());
    }

    #[test]
    fn crop_and_weighted_add_address_the_block() {
        // [1, 2, 3, 4]: values are their flat index.
        let shape = [1, 2, 3, 4];
        let values: Vec<f32> = (0..24).map(|v| v as f32).collect();
        let block = [(1, 2), (2, 2)];
        assert_eq!(
            crop(&values, &shape, &block),
            vec![6.0, 7.0, 10.0, 11.0, 18.0, 19.0, 22.0, 23.0]
        );
        let (mut sum, mut counts) = (vec![0.0; 24], vec![0.0; 24]);
        add_weighted((&mut sum, &mut counts), &shape, &block, &[1.0; 8], &[2.0; 8]);
        let touched: Vec<usize> = (0..24).filter(|&i| counts[i] == 2.0 && sum[i] == 2.0).collect();
        assert_eq!(touched, vec![6, 7, 10, 11, 18, 19, 22, 23]);
    }
}
