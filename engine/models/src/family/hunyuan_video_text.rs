//! HunyuanVideo 1.5's text encoders (ComfyUI's `hunyuan_image.py`, `HunyuanImageTEModel` under
//! `HunyuanVideo15Tokenizer`; `DualCLIPLoader` type `hunyuan_video_15`): Qwen2.5-VL 7B's output of its third
//! layer from the end (no final norm) over HunyuanVideo 1.5's template, cut as Qwen-Image's is, and ByT5's last
//! hidden state of the prompt's quoted passages beside it (`conditioning_byt5small`), which the DiT reads as
//! glyph tokens.

use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor};

use crate::error::Result;
use crate::prompt_weights::Weighted;
use crate::qwen3::{self, Qwen3};
use crate::t5::{self, T5};

use super::text_encoder::{Encoded, weighted_states};

/// Qwen's layers from the end whose output is the conditioning (ComfyUI's `layer_idx=-3`: the output of layer
/// `layers − 3`, Hugging Face's hidden state `layers − 2`).
const FROM_END: usize = 2;
/// Qwen2.5's `<` (ComfyUI's refiner check: a prompt whose first token it is and that is longer than
/// [`REFINER_TEMPLATE_END`] is cut there).
const LESS_THAN: u32 = 27;
/// Where ComfyUI cuts a prompt starting with [`LESS_THAN`] (`HunyuanImageTEModel`'s fixed `template_end`).
const REFINER_TEMPLATE_END: usize = 36;

/// HunyuanVideo 1.5's encoders and the Qwen tokenizer (ByT5's is a function of the text).
pub struct HunyuanVideo15Encoders {
    /// Qwen2.5-VL 7B's language model (the Qwen3 decoder code).
    pub qwen: Qwen3,
    /// ByT5 small (the glyph-trained T5 encoder).
    pub byt5: T5,
    /// The Qwen tokenizer.
    pub tokenizer: qwen3::Tokenizer,
}

/// A prompt as ComfyUI's `HunyuanVideo15Tokenizer` lays it out.
#[derive(Debug, Clone, PartialEq)]
pub struct HunyuanVideo15Tokens {
    /// Qwen2.5-VL's ids: the prompt in HunyuanVideo 1.5's template (no weighting).
    pub qwen: Vec<u32>,
    /// ByT5's weighted section of the prompt's quoted passages; `None` when it quotes nothing.
    pub byt5: Option<Vec<Vec<Weighted>>>,
}

impl HunyuanVideo15Encoders {
    /// The encoders of `qwen` and `byt5`, with the bundled Qwen tokenizer.
    pub fn new(qwen: Qwen3, byt5: T5) -> Result<HunyuanVideo15Encoders> {
        Ok(HunyuanVideo15Encoders { qwen, byt5, tokenizer: qwen3::Tokenizer::bundled()? })
    }

    /// The tokens of `prompt` for both encoders.
    pub fn tokenize(&self, prompt: &str) -> Result<HunyuanVideo15Tokens> {
        Ok(HunyuanVideo15Tokens {
            qwen: self.tokenizer.hunyuan_video15_prompt(prompt)?,
            byt5: t5::byt5_tokens(prompt)?,
        })
    }

    /// ComfyUI's `HunyuanImageTEModel.encode_token_weights`: Qwen's output of layer `layers − 3` from the
    /// prompt on (Qwen-Image's cut; a prompt starting with `<` cut after 36 tokens), and ByT5's weighted states
    /// of the quoted passages under its padding mask. (ComfyUI also hands the DiT the Qwen padding mask of a
    /// prompt with `<|endoftext|>` written in it; Kiln's HunyuanVideo DiT attends to every text token.)
    pub fn encode<B: Backend>(&self, b: &B, tokens: &HunyuanVideo15Tokens) -> Result<Encoded<B>> {
        let ids = &tokens.qwen;
        let tap = self.qwen.config.layers.saturating_sub(FROM_END);
        // Keys from a written `<|endoftext|>` on are masked, as ComfyUI's padding mask does (their rows kept).
        let attended = qwen3::attended_keys(ids);
        let hidden = self.qwen.tapped_hidden_states(b, ids, attended, &[tap])?;
        let start = conditioning_start(ids);
        let n = hidden.dim(1)?;
        let cond: Tensor<B> = b.slice(&hidden, 1, start, n - start)?;
        let byt5 = match &tokens.byt5 {
            Some(sections) => Some(weighted_states(b, sections, &t5::BYT5_PROMPT_LAYOUT, |ids| {
                self.byt5.masked_hidden_state(b, ids, &t5::attention_mask(ids))
            })?),
            None => None,
        };
        Ok(Encoded { byt5, ..Encoded::new(cond, None) })
    }

    /// Both files' weights, the larger first.
    pub fn models(&self) -> Vec<&Model> {
        vec![&self.qwen.weights, &self.byt5.weights]
    }
}

/// Where the conditioning starts in Qwen's output for `ids`: ComfyUI's fixed refiner cut when the first token
/// is `<` and there are more than 36, else Qwen-Image's.
fn conditioning_start(ids: &[u32]) -> usize {
    match ids.first() {
        Some(&LESS_THAN) if ids.len() > REFINER_TEMPLATE_END => REFINER_TEMPLATE_END,
        _ => qwen3::qwen_image_conditioning_start(ids),
    }
}
