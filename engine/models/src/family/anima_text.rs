//! Anima's text encoder (ComfyUI's `anima.py`, `AnimaTEModel`): Qwen3 0.6B's last hidden state (through the final
//! norm) of the prompt as it is, no template, its weights parsed and dropped; beside it the prompt's T5 tokens
//! with their weights, which the model's LLM adapter reads (`t5xxl_ids`, `t5xxl_weights`).

use kiln_compute::Backend;

use crate::error::Result;
use crate::prompt_weights::{self, Weighted};
use crate::qwen3::{self, Qwen3};
use crate::t5;

use super::text_encoder::{Encoded, T5Options};

/// Qwen3's prompt layout in ComfyUI's Anima tokenizer (`Qwen3Tokenizer`): no start or end token, one section,
/// padded with `<|endoftext|>` to at least one token.
const QWEN_LAYOUT: prompt_weights::Layout = prompt_weights::Layout {
    start: None,
    end: None,
    pad: qwen3::ENDOFTEXT,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(1),
    min_padding: None,
};

/// T5's prompt layout in ComfyUI's Anima tokenizer (`T5XXLTokenizer` with `min_length=1`): no start token, EOS,
/// one section, no padding.
const T5_LAYOUT: prompt_weights::Layout = t5::CHROMA_PROMPT_LAYOUT;

/// A prompt as ComfyUI's `AnimaTokenizer` lays it out.
#[derive(Debug, Clone, PartialEq)]
pub struct AnimaTokens {
    /// Qwen3's ids (the prompt's weights dropped: ComfyUI sets them to 1).
    pub qwen: Vec<u32>,
    /// T5's weighted tokens, end token included.
    pub t5: Vec<Weighted>,
}

/// `prompt`'s tokens for Anima's encoder: Qwen3's ids and T5's weighted tokens, each through ComfyUI's weighting
/// syntax, `options` padding the T5 tokens (`T5TokenizerOptions`, whose `t5xxl` settings ComfyUI's Anima tokenizer
/// reads).
pub(super) fn tokenize(
    tokenizer: &qwen3::Tokenizer,
    t5_tokenizer: &t5::Tokenizer,
    prompt: &str,
    options: T5Options,
) -> Result<AnimaTokens> {
    let qwen = prompt_weights::tokenize(prompt, &QWEN_LAYOUT, |w| tokenizer.encode(w))?;
    let t5_layout = options.apply(&T5_LAYOUT);
    let t5 = prompt_weights::tokenize(prompt, &t5_layout, |w| t5_tokenizer.word_ids(w))?;
    Ok(AnimaTokens {
        qwen: qwen.into_iter().flatten().map(|(id, _)| id).collect(),
        // ComfyUI passes on the first section's (there is one: no length limit).
        t5: t5.into_iter().next().unwrap_or_default(),
    })
}

/// ComfyUI's `AnimaTEModel.encode_token_weights`: Qwen3's last layer through the final norm under the padding
/// mask, and the T5 tokens riding along.
pub(super) fn encode<B: Backend>(b: &B, model: &Qwen3, tokens: &AnimaTokens) -> Result<Encoded<B>> {
    let attended = qwen3::attended_keys(&tokens.qwen);
    let cond = model.tapped_hidden_states(b, &tokens.qwen, attended, &[model.config.layers])?;
    Ok(Encoded { t5_tokens: Some(tokens.t5.clone()), ..Encoded::new(cond, None) })
}
