//! SD3's text encoders (ComfyUI's `sd3_clip.py`, `SD3ClipModel`): CLIP-L's and CLIP-G's next-to-last states side
//! by side, padded with zeros to T5-XXL's width, then T5-XXL's states after them along the tokens; the pooled
//! vector is CLIP-L's (unprojected) and CLIP-G's (projected) joined. Any of the three may be missing, as ComfyUI
//! allows: a missing CLIP's pooled vector is zeros, a missing CLIP-L's states too (CLIP-G's are shifted right
//! by CLIP-L's 768).

use kiln_compute::backend::PadMode;
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor};

use crate::clip_text::{self, ClipText};
use crate::error::{Error, Result};
use crate::prompt_weights::{self, Weighted};
use crate::t5::{self, T5};

use super::sdxl_text::{CLIP_G_LAYOUT, penultimate_states, side_by_side};
use super::text_encoder::{Encoded, weighted_states};

/// The width ComfyUI pads the CLIP states to, and of its all-zero conditioning without encoders (T5-XXL's).
const T5_XXL_WIDTH: usize = 4096;
/// CLIP-L's width, of its zero pooled vector and of the zeros before CLIP-G's states without it.
const CLIP_L_WIDTH: usize = 768;
/// CLIP-G's width, of its zero pooled vector.
const CLIP_G_WIDTH: usize = 1280;

/// T5-XXL's prompt layout in ComfyUI's SD3 tokenizer (`T5XXLTokenizer(min_length=77)`): no start token, EOS, one
/// section padded with 0 to at least 77 tokens.
const T5_PROMPT_LAYOUT: prompt_weights::Layout =
    prompt_weights::Layout { min_length: Some(77), ..t5::FLUX_PROMPT_LAYOUT };

/// SD3's encoders (any of them) and their tokenizers.
pub struct Sd3Encoders {
    /// CLIP-L.
    pub clip_l: Option<ClipText>,
    /// CLIP-G.
    pub clip_g: Option<ClipText>,
    /// T5-XXL.
    pub t5: Option<T5>,
    /// CLIP's tokenizer.
    pub clip_tokenizer: clip_text::Tokenizer,
    /// T5's tokenizer.
    pub t5_tokenizer: t5::Tokenizer,
}

/// A prompt as ComfyUI's `SD3Tokenizer` lays it out: each encoder's weighted sections.
#[derive(Debug, Clone, PartialEq)]
pub struct Sd3Tokens {
    /// CLIP-L's 77-token sections, padded with EOS.
    pub clip_l: Vec<Vec<Weighted>>,
    /// CLIP-G's, padded with 0.
    pub clip_g: Vec<Vec<Weighted>>,
    /// T5-XXL's one section, at least 77 tokens.
    pub t5: Vec<Vec<Weighted>>,
}

impl Sd3Encoders {
    /// SD3's encoder of the parts given, with the tokenizers; an error when none is.
    pub fn new(
        clip_l: Option<ClipText>,
        clip_g: Option<ClipText>,
        t5: Option<T5>,
    ) -> Result<Sd3Encoders> {
        if clip_l.is_none() && clip_g.is_none() && t5.is_none() {
            return Err(Error::Invalid(
                "SD3's text encoder needs at least one of its files".to_owned(),
            ));
        }
        Ok(Sd3Encoders {
            clip_l,
            clip_g,
            t5,
            clip_tokenizer: clip_text::Tokenizer::bundled()?,
            t5_tokenizer: t5::Tokenizer::bundled()?,
        })
    }

    /// The tokens of `prompt` for each encoder (`CLIPTextEncode` gives them all the same prompt).
    pub fn tokenize(&self, prompt: &str) -> Result<Sd3Tokens> {
        let clip_words = |w: &str| self.clip_tokenizer.word_ids(w);
        Ok(Sd3Tokens {
            clip_l: prompt_weights::tokenize(prompt, &clip_text::PROMPT_LAYOUT, clip_words)?,
            clip_g: prompt_weights::tokenize(prompt, &CLIP_G_LAYOUT, clip_words)?,
            t5: prompt_weights::tokenize(prompt, &T5_PROMPT_LAYOUT, |w| {
                self.t5_tokenizer.word_ids(w)
            })?,
        })
    }

    /// ComfyUI's `SD3ClipModel.encode_token_weights`.
    pub fn encode<B: Backend>(&self, b: &B, tokens: &Sd3Tokens) -> Result<Encoded<B>> {
        let f32 = DType::F32;
        let t5_out = match &self.t5 {
            Some(t5) => Some(weighted_states(b, &tokens.t5, &T5_PROMPT_LAYOUT, |ids| {
                t5.hidden_state(b, ids)
            })?),
            None => None,
        };
        // ComfyUI pads to 4096, T5-XXL's width; to a T5's own width here, the same for every released file.
        let width = match &t5_out {
            Some(t) => t.dim(2)?,
            None => T5_XXL_WIDTH,
        };
        let (l_out, l_pooled) = match &self.clip_l {
            Some(clip) => {
                let (states, pooled) =
                    penultimate_states(b, clip, &tokens.clip_l, &clip_text::PROMPT_LAYOUT)?;
                (Some(states), pooled)
            }
            None => (None, b.full(&[1, CLIP_L_WIDTH], 0.0, f32)?),
        };
        let (lg, g_pooled) = match &self.clip_g {
            Some(clip) => {
                let (g_out, pooled) = penultimate_states(b, clip, &tokens.clip_g, &CLIP_G_LAYOUT)?;
                let pooled = clip.project_pooled(b, &pooled)?;
                let lg = match l_out {
                    Some(l) => side_by_side(b, &l, &g_out)?,
                    None => b.pad(&g_out, 2, CLIP_L_WIDTH, 0, PadMode::Constant(0.0))?,
                };
                (Some(lg), pooled)
            }
            None => (l_out, b.full(&[1, CLIP_G_WIDTH], 0.0, f32)?),
        };
        let lg = match lg {
            Some(lg) => Some(pad_width(b, &lg, width)?),
            None => None,
        };
        let pooled = b.concat(&[&b.cast(&l_pooled, f32)?, &b.cast(&g_pooled, f32)?], 1)?;
        let cond = match (lg, t5_out) {
            (Some(lg), Some(t5)) => b.concat(&[&lg, &b.cast(&t5, f32)?], 1)?,
            (Some(lg), None) => lg,
            (None, Some(t5)) => b.cast(&t5, f32)?,
            (None, None) => b.full(&[1, 77, T5_XXL_WIDTH], 0.0, f32)?,
        };
        Ok(Encoded::new(cond, Some(pooled)))
    }

    /// The weights of the encoders given, the largest first.
    pub fn models(&self) -> Vec<&Model> {
        let t5 = self.t5.iter().map(|t| &t.weights);
        t5.chain([&self.clip_g, &self.clip_l].into_iter().flatten().map(|c| &c.weights)).collect()
    }
}

/// `x` `[1, N, D]` padded on the right with zeros to `width`; an error when it is wider.
fn pad_width<B: Backend>(b: &B, x: &Tensor<B>, width: usize) -> Result<Tensor<B>> {
    let d = x.dim(2)?;
    if d > width {
        return Err(Error::Invalid(format!(
            "SD3's CLIP states are {d} wide, wider than T5-XXL's {width} they are padded to"
        )));
    }
    Ok(b.pad(x, 2, 0, width - d, PadMode::Constant(0.0))?)
}
