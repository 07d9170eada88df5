//! [`VisionInput`]: an image made into a vision tower's patches as ComfyUI's `process_qwen2vl_images` makes
//! them (not transformers' image processor, which resizes with PIL's bicubic), for Qwen2.5-VL's tower and, with
//! its own [`Patching`], Qwen3-VL's.

use super::config::{MERGE, VisionConfig};
use crate::error::{Error, Result};

/// Fewest pixels an image is resized to (56²), ComfyUI's default.
pub const MIN_PIXELS: usize = 3136;
/// Most pixels an image is resized to, ComfyUI's default.
pub const MAX_PIXELS: usize = 12_845_056;
/// CLIP's per-channel mean the pixels are normalised with (Qwen2.5-VL's, ComfyUI's default).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// CLIP's per-channel standard deviation the pixels are normalised with (Qwen2.5-VL's, ComfyUI's default).
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

/// How an image becomes a tower's patches: the arguments of ComfyUI's `process_qwen2vl_images` that differ
/// between towers (2 × 2 patches always merge into one token).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Patching {
    /// Side of a patch in pixels (Qwen2.5-VL's 14, Qwen3-VL's 16).
    pub patch: usize,
    /// Frames in a patch (the one image repeated to fill them).
    pub temporal_patch: usize,
    /// Per-channel mean subtracted from the resized pixels.
    pub mean: [f32; 3],
    /// Per-channel deviation the pixels are then divided by.
    pub std: [f32; 3],
    /// Fewest pixels the image is resized to ([`MIN_PIXELS`] unless an encoder sets its own).
    pub min_pixels: usize,
    /// Most pixels the image is resized to ([`MAX_PIXELS`] unless an encoder sets its own).
    pub max_pixels: usize,
    /// How the image is resized (torch's `interpolate` mode).
    pub resample: Resample,
}

/// torch's `interpolate` mode the image is resized with (corners not aligned, no antialiasing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resample {
    /// `bilinear`, ComfyUI's default.
    Bilinear,
    /// `bicubic` (JoyImage's encoder).
    Bicubic,
}

impl VisionConfig {
    /// How an image becomes this tower's patches: its patch sizes, CLIP's mean and deviation.
    pub fn patching(&self) -> Patching {
        Patching {
            patch: self.patch,
            temporal_patch: self.temporal_patch,
            mean: CLIP_MEAN,
            std: CLIP_STD,
            min_pixels: MIN_PIXELS,
            max_pixels: MAX_PIXELS,
            resample: Resample::Bilinear,
        }
    }
}

/// One image as the vision tower's input.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionInput {
    /// `[grid_h · grid_w, 3 · frames · patch · patch]` row-major: the patches in merge order (each 2 × 2 group
    /// of neighbours consecutive, groups row by row), each flattened as (channel, frame, row, column).
    pub patches: Vec<f32>,
    /// Patch rows.
    pub grid_h: usize,
    /// Patch columns.
    pub grid_w: usize,
}

impl VisionInput {
    /// The patches of `image` (`[height, width, channels]` in `[0, 1]`, channels last; the first three are
    /// used) for Qwen2.5-VL's tower `cfg`: [`VisionInput::patched`] with CLIP's mean and deviation.
    pub fn of_image(
        cfg: &VisionConfig,
        image: &[f32],
        height: usize,
        width: usize,
        channels: usize,
    ) -> Result<VisionInput> {
        VisionInput::patched(&cfg.patching(), image, height, width, channels)
    }

    /// The patches of `image` (`[height, width, channels]` in `[0, 1]`, channels last; the first three are
    /// used): resized, keeping the aspect ratio, to multiples of two patches within `how`'s pixel bounds (by
    /// `how`'s resample, as torch's `interpolate` without antialiasing), normalised with `how`'s mean and
    /// deviation, the one frame repeated to fill a patch's frames.
    pub fn patched(
        how: &Patching,
        image: &[f32],
        height: usize,
        width: usize,
        channels: usize,
    ) -> Result<VisionInput> {
        if height == 0 || width == 0 || channels < 3 || image.len() != height * width * channels {
            return Err(Error::Invalid(format!(
                "the vision encoder needs an RGB image, got {width}×{height} with {channels} channel(s)"
            )));
        }
        if how.patch == 0 || how.temporal_patch == 0 {
            return Err(Error::Invalid(format!(
                "patches of {}×{} pixels and {} frames",
                how.patch, how.patch, how.temporal_patch
            )));
        }
        let (rows, cols) = resized_size(height, width, how.patch * MERGE, how);
        // Resized and normalised planes [3, rows, cols].
        let mut planes = Vec::with_capacity(3 * rows * cols);
        for c in 0..3 {
            let plane: Vec<f32> = (0..height * width).map(|i| image[i * channels + c]).collect();
            let resized = match how.resample {
                Resample::Bilinear => {
                    crate::interpolate::bilinear(&plane, [height, width], [rows, cols])
                }
                Resample::Bicubic => {
                    crate::interpolate::bicubic(&plane, [height, width], [rows, cols])
                }
            };
            planes.extend(resized.into_iter().map(|v| (v - how.mean[c]) / how.std[c]));
        }
        let p = how.patch;
        let (grid_h, grid_w) = (rows / p, cols / p);
        let mut patches = Vec::with_capacity(grid_h * grid_w * 3 * how.temporal_patch * p * p);
        for by in 0..grid_h / MERGE {
            for bx in 0..grid_w / MERGE {
                for my in 0..MERGE {
                    for mx in 0..MERGE {
                        let (py, px) = ((by * MERGE + my) * p, (bx * MERGE + mx) * p);
                        for plane in planes.chunks_exact(rows * cols) {
                            for _frame in 0..how.temporal_patch {
                                for y in py..py + p {
                                    patches.extend_from_slice(
                                        &plane[y * cols + px..y * cols + px + p],
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(VisionInput { patches, grid_h, grid_w })
    }

    /// Patches in the image.
    pub fn len(&self) -> usize {
        self.grid_h * self.grid_w
    }

    /// Whether there are no patches (never, for an input made by [`VisionInput::of_image`]).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Checks the input is a whole grid of merge units of `per_patch` values a patch (what a vision tower reads).
    pub(crate) fn check_grid(&self, per_patch: usize) -> Result<()> {
        if self.is_empty()
            || !self.grid_h.is_multiple_of(MERGE)
            || !self.grid_w.is_multiple_of(MERGE)
            || self.patches.len() != self.len() * per_patch
        {
            return Err(Error::Invalid(format!(
                "vision input of {} values for a {}×{} patch grid of {per_patch} values a patch",
                self.patches.len(),
                self.grid_w,
                self.grid_h
            )));
        }
        Ok(())
    }

    /// The language-model tokens the image becomes: one per 2 × 2 patches.
    pub fn tokens(&self) -> usize {
        self.len() / (MERGE * MERGE)
    }
}

/// The size an image of `height` × `width` is resized to: each side rounded (half to even, as Python) to a
/// multiple of `factor`, scaled down or up when the area leaves `how`'s pixel bounds.
fn resized_size(height: usize, width: usize, factor: usize, how: &Patching) -> (usize, usize) {
    let (min_pixels, max_pixels) = (how.min_pixels, how.max_pixels);
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    let round = |x: f64| (x / f).round_ties_even() as usize * factor;
    let (rows, cols) = (round(h), round(w));
    if rows * cols > max_pixels {
        let beta = (h * w / max_pixels as f64).sqrt();
        let fit = |x: f64| ((x / beta / f).floor() as usize * factor).max(factor);
        (fit(h), fit(w))
    } else if rows * cols < min_pixels {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        let fit = |x: f64| (x * beta / f).ceil() as usize * factor;
        (fit(h), fit(w))
    } else {
        (rows, cols)
    }
}

#[cfg(test)]
mod tests {
    use super::{CLIP_MEAN, CLIP_STD, MAX_PIXELS, MIN_PIXELS, Patching, Resample, resized_size};

    const DEFAULT: Patching = Patching {
        patch: 14,
        temporal_patch: 2,
        mean: CLIP_MEAN,
        std: CLIP_STD,
        min_pixels: MIN_PIXELS,
        max_pixels: MAX_PIXELS,
        resample: Resample::Bilinear,
    };

    #[test]
    fn sizes_round_to_merged_patches_within_bounds() {
        assert_eq!(resized_size(150, 260, 28, &DEFAULT), (140, 252));
        // 28 × 28 is under 56²: scaled up, then rounded up.
        assert_eq!(resized_size(20, 30, 28, &DEFAULT), (56, 84));
        // Half rounds to even: 42 / 28 = 1.5 → 2, 70 / 28 = 2.5 → 2.
        assert_eq!(resized_size(42, 70, 28, &DEFAULT), (56, 56));
        // An encoder's own bounds (JoyImage's 256² at least).
        let joy = Patching { min_pixels: 65_536, ..DEFAULT };
        assert_eq!(resized_size(100, 100, 32, &joy), (256, 256));
    }
}
