//! SDXL's text encoders (ComfyUI's `sdxl_clip.py`): CLIP-L's and CLIP-G's penultimate states side by side and
//! CLIP-G's projected pooled vector (`SDXLClipModel`), or for the refiner CLIP-G's alone
//! (`SDXLRefinerClipModel`, also what `CLIPLoader` makes of a lone CLIP-G file).

use std::cell::RefCell;

use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::clip_text::{self, ClipText};
use crate::error::{Error, Result};
use crate::prompt_weights::{self, Weighted};

use super::text_encoder::{Encoded, weighted_states};

/// SDXL's encoders and CLIP's tokenizer.
pub struct SdxlEncoders {
    /// CLIP-L (`None` for the refiner's encoder).
    pub clip_l: Option<ClipText>,
    /// CLIP-G (OpenCLIP ViT-bigG's text tower).
    pub clip_g: ClipText,
    /// CLIP's tokenizer (both towers').
    pub tokenizer: clip_text::Tokenizer,
}

/// A prompt as ComfyUI's `SDXLTokenizer` lays it out: each tower's 77-token weighted sections.
#[derive(Debug, Clone, PartialEq)]
pub struct SdxlTokens {
    /// CLIP-L's sections, padded with EOS.
    pub clip_l: Vec<Vec<Weighted>>,
    /// CLIP-G's sections, padded with 0 (`SDXLClipGTokenizer`: `pad_with_end=False`).
    pub clip_g: Vec<Vec<Weighted>>,
}

/// CLIP-G's prompt layout: CLIP-L's with 0 as the padding.
pub(super) const CLIP_G_LAYOUT: prompt_weights::Layout =
    prompt_weights::Layout { pad: 0, ..clip_text::PROMPT_LAYOUT };

impl SdxlEncoders {
    /// SDXL's encoder of CLIP-L and CLIP-G (`clip_l` `None`: the refiner's, CLIP-G alone), with CLIP's tokenizer.
    pub fn new(clip_l: Option<ClipText>, clip_g: ClipText) -> Result<SdxlEncoders> {
        Ok(SdxlEncoders { clip_l, clip_g, tokenizer: clip_text::Tokenizer::bundled()? })
    }

    /// The tokens of prompt `l` for CLIP-L and `g` for CLIP-G (`CLIPTextEncode` gives both the same prompt).
    pub fn tokenize(&self, l: &str, g: &str) -> Result<SdxlTokens> {
        let words = |w: &str| self.tokenizer.word_ids(w);
        Ok(SdxlTokens {
            clip_l: prompt_weights::tokenize(l, &clip_text::PROMPT_LAYOUT, words)?,
            clip_g: prompt_weights::tokenize(g, &CLIP_G_LAYOUT, words)?,
        })
    }

    /// ComfyUI's `SDXLClipModel.encode_token_weights`: CLIP-L's and CLIP-G's penultimate states (each weighted,
    /// sections joined along the tokens) side by side, cut to the shorter, and CLIP-G's projected pooled vector
    /// of its first section; the refiner's: CLIP-G's alone.
    pub fn encode<B: Backend>(&self, b: &B, tokens: &SdxlTokens) -> Result<Encoded<B>> {
        let (g, pooled) = penultimate_states(b, &self.clip_g, &tokens.clip_g, &CLIP_G_LAYOUT)?;
        let pooled = self.clip_g.project_pooled(b, &pooled)?;
        let Some(clip_l) = &self.clip_l else {
            return Ok(Encoded::new(g, Some(pooled)));
        };
        let (l, _) = penultimate_states(b, clip_l, &tokens.clip_l, &clip_text::PROMPT_LAYOUT)?;
        Ok(Encoded::new(side_by_side(b, &l, &g)?, Some(pooled)))
    }

    /// The weights, CLIP-G's first.
    pub fn models(&self) -> Vec<&Model> {
        let mut models = vec![&self.clip_g.weights];
        models.extend(self.clip_l.iter().map(|c| &c.weights));
        models
    }
}

/// CLIP-L's states `l` and CLIP-G's `g` `[1, N, ·]` side by side along the width, both cut to the shorter
/// (`cut_to` in ComfyUI's SDXL and SD3 encoders).
pub(super) fn side_by_side<B: Backend>(b: &B, l: &Tensor<B>, g: &Tensor<B>) -> Result<Tensor<B>> {
    let n = l.dim(1)?.min(g.dim(1)?);
    Ok(b.concat(&[&b.slice(l, 1, 0, n)?, &b.slice(g, 1, 0, n)?], 2)?)
}

/// `clip`'s output of its next-to-last layer over `sections` (`layer_idx=-2`, not final-normed), weighted
/// against an empty prompt of `layout` and joined along the tokens, f32 `[1, N, hidden]`, and the final-normed
/// pooled vector of the first section `[1, hidden]` (ComfyUI's `first_pooled`).
pub(super) fn penultimate_states<B: Backend>(
    b: &B,
    clip: &ClipText,
    sections: &[Vec<Weighted>],
    layout: &prompt_weights::Layout,
) -> Result<(Tensor<B>, Tensor<B>)> {
    let layer = clip.config.layers.checked_sub(2).ok_or_else(|| {
        Error::Invalid(format!(
            "SDXL reads a CLIP text encoder's next-to-last layer; this one has {} layer(s)",
            clip.config.layers
        ))
    })?;
    let first: Vec<u32> = sections
        .first()
        .ok_or_else(|| Error::Invalid("no CLIP tokens".to_owned()))?
        .iter()
        .map(|&(t, _)| t)
        .collect();
    // The pooled vector comes from the first section's pass.
    let pooled = RefCell::new(None);
    let states = weighted_states(b, sections, layout, |ids| {
        let out = clip.encode(b, ids, Some(layer))?;
        if ids == first.as_slice() && pooled.borrow().is_none() {
            *pooled.borrow_mut() = Some(b.cast(&out.pooled, DType::F32)?);
        }
        out.hidden
            .ok_or_else(|| Error::Invalid("the CLIP text encoder gave no hidden state".to_owned()))
    })?;
    let pooled = pooled
        .into_inner()
        .ok_or_else(|| Error::Invalid("no pooled vector from the first CLIP section".to_owned()))?;
    Ok((states, pooled))
}
