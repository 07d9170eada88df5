//! Where in the latent a prompt applies and how much it weighs there: what ComfyUI's area and mask nodes
//! (`ConditioningSetArea`, `ConditioningSetAreaPercentage`, `ConditioningSetAreaPercentageVideo`,
//! `ConditioningSetAreaStrength`, `ConditioningSetMask`) put on a prompt, and the sampler honours.

use crate::tensor::Tensor;

/// The block of the latent a prompt covers: sizes, then offsets, outermost dimension first (ComfyUI's `area`
/// tuple). Fewer dimensions than the latent has leave the leading ones whole.
#[derive(Debug, Clone, PartialEq)]
pub enum Area {
    /// In latent cells (`ConditioningSetArea`: its pixels ÷ 8, `(h, w, y, x)`; a mask's bounds).
    Cells(Vec<usize>),
    /// In fractions of the latent's dimensions (`("percentage", h, w, y, x)`; the video node's
    /// `(t, h, w, z, y, x)`), turned into cells when sampling starts.
    Fraction(Vec<f64>),
}

/// A prompt's region: ComfyUI's `area`, `strength`, `mask`, `mask_strength` and `set_area_to_bounds`. The
/// default covers the whole latent at weight 1.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PromptRegion {
    /// The block the model is run on for this prompt; `None`: the whole latent.
    pub area: Option<Area>,
    /// The prompt's weight among the prompts of its side (`strength`); `None`: 1.
    pub strength: Option<f64>,
    /// Per-pixel weights `[B, H, W]` (resized to the latent when sampling starts).
    pub mask: Option<Tensor>,
    /// Scales the mask (`mask_strength`); `None`: 1.
    pub mask_strength: Option<f64>,
    /// Whether the area is the mask's bounding box (`ConditioningSetMask`'s "mask bounds").
    pub area_from_mask: bool,
}

impl PromptRegion {
    /// Whether the prompt covers the whole latent at weight 1 (what a prompt without a region does).
    pub fn is_whole(&self) -> bool {
        self.area.is_none() && self.mask.is_none() && self.strength.is_none_or(|s| s == 1.0)
    }

    /// Bytes held by the mask.
    pub(crate) fn byte_size(&self) -> usize {
        self.mask.as_ref().map_or(0, Tensor::byte_size)
    }
}
