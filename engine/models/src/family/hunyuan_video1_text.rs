//! HunyuanVideo 1.0's text encoders (ComfyUI's `hunyuan_video.py`, `HunyuanVideoClipModel` under
//! `HunyuanVideoTokenizer`; `DualCLIPLoader` type `hunyuan_video`): LLaVA-Llama 3 8B's output of its third layer
//! from the end (no final norm) over HunyuanVideo's template, cut to the prompt and its closing `<|eot_id|>`, and
//! CLIP-L's pooled vector (unprojected), which joins the timestep in modulating the DiT.
//!
//! Llama 3 runs on the shared decoder code ([`Qwen3`] of [`qwen3::Variant::Llama3`]) with Kiln's Llama 3
//! tokenizer, whose special tokens are llava-llama-3's (ComfyUI's `llama_tokenizer`: `<pad>` is 128258).

use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor};

use crate::clip_text::{self, ClipText};
use crate::error::{Error, Result};
use crate::llama3;
use crate::prompt_weights::{self, Layout, Weighted};
use crate::qwen3::{self, Qwen3};

use super::text_encoder::{Encoded, clip_pooled, weighted_states};

/// ComfyUI's HunyuanVideo template before the prompt (`HunyuanVideoTokenizer.llama_template`, its "95 tokens"
/// with the start token): a system turn asking for a video description, then the user turn's header.
const TEMPLATE_START: &str = "<|start_header_id|>system<|end_header_id|>\n\nDescribe the video by detailing the \
     following aspects: 1. The main content and theme of the video.2. The color, shape, size, texture, quantity, \
     text, and spatial relationships of the objects.3. Actions, events, behaviors temporal relationships, physical \
     movement changes of the objects.4. background environment, light, style and atmosphere.5. camera angles, \
     movements, and transitions used in the video:<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n";
/// What follows the prompt in the template: the user turn's end.
const TEMPLATE_END: &str = "<|eot_id|>";

/// `<pad>` (llava-llama-3's): the pad of ComfyUI's HunyuanVideo Llama tokenizer, and where its attention mask
/// starts masking.
const PAD: u32 = 128_258;
/// `<|start_header_id|>`.
const START_HEADER: u32 = 128_006;
/// `user`.
const USER: u32 = 882;
/// `<|end_header_id|>`.
const END_HEADER: u32 = 128_007;
/// `\n\n`.
const DOUBLE_NEWLINE: u32 = 271;

/// ComfyUI's HunyuanVideo Llama layout (`LLAMA3Tokenizer(min_length=1)`): `<|begin_of_text|>`, the weighted
/// words; no end token, never padded nor cut (one section: a `max_length` of 99 999 999 is never reached).
const PROMPT_LAYOUT: Layout = Layout {
    start: Some(llama3::BOS),
    end: None,
    pad: PAD,
    max_length: 99_999_999,
    pad_to_max_length: false,
    min_length: Some(1),
    min_padding: None,
};

/// Llama's layers from the end whose output is the conditioning (ComfyUI's `layer_idx=-3`: the output of layer
/// `layers − 3`, Hugging Face's hidden state `layers − 2`).
const FROM_END: usize = 2;

/// HunyuanVideo 1.0's encoders and their tokenizers.
pub struct HunyuanVideo1Encoders {
    /// LLaVA-Llama 3 8B's language model (the Qwen3 decoder code, [`qwen3::Variant::Llama3`]).
    pub llama: Qwen3,
    /// CLIP-L.
    pub clip_l: ClipText,
    /// The Llama 3 tokenizer.
    pub tokenizer: llama3::Tokenizer,
    /// CLIP's tokenizer.
    pub clip_tokenizer: clip_text::Tokenizer,
}

/// A prompt as ComfyUI's `HunyuanVideoTokenizer` lays it out.
#[derive(Debug, Clone, PartialEq)]
pub struct HunyuanVideo1Tokens {
    /// Llama's weighted ids: the prompt in HunyuanVideo's template, the weights syntax applied to the whole
    /// templated text (one section, never padded).
    pub llama: Vec<Weighted>,
    /// CLIP-L's 77-token weighted sections of the prompt.
    pub clip_l: Vec<Vec<Weighted>>,
}

impl HunyuanVideo1Encoders {
    /// The encoders of `llama` (a [`qwen3::Variant::Llama3`] decoder) and `clip_l`, with the bundled tokenizers.
    pub fn new(llama: Qwen3, clip_l: ClipText) -> Result<HunyuanVideo1Encoders> {
        if llama.config.variant != qwen3::Variant::Llama3 {
            return Err(Error::Invalid(format!(
                "HunyuanVideo's text encoder is a Llama 3 decoder, not {:?}",
                llama.config.variant
            )));
        }
        Ok(HunyuanVideo1Encoders {
            llama,
            clip_l,
            tokenizer: llama3::Tokenizer::bundled()?,
            clip_tokenizer: clip_text::Tokenizer::bundled()?,
        })
    }

    /// The tokens of `prompt` for both encoders: CLIP-L's of the prompt, Llama's of the prompt in the template
    /// (a prompt starting with `<|start_header_id|>` too: ComfyUI's HunyuanVideo tokenizer has no "already
    /// templated" case).
    pub fn tokenize(&self, prompt: &str) -> Result<HunyuanVideo1Tokens> {
        let text = format!("{TEMPLATE_START}{prompt}{TEMPLATE_END}");
        let sections =
            prompt_weights::tokenize(&text, &PROMPT_LAYOUT, |w| self.tokenizer.word_ids(w))?;
        let [llama] = <[Vec<Weighted>; 1]>::try_from(sections).map_err(|sections| {
            Error::Invalid(format!(
                "HunyuanVideo's Llama prompt laid out in {} sections, not one",
                sections.len()
            ))
        })?;
        Ok(HunyuanVideo1Tokens {
            llama,
            clip_l: prompt_weights::tokenize(prompt, &clip_text::PROMPT_LAYOUT, |w| {
                self.clip_tokenizer.word_ids(w)
            })?,
        })
    }

    /// ComfyUI's `HunyuanVideoClipModel.encode_token_weights`: Llama's output of layer `layers − 3` (no final
    /// norm) over the templated ids, under the padding mask from a written `<pad>` on, the prompt's weights
    /// applied against an empty prompt's (`(z − z_empty)·w + z_empty`, `z_empty` the states of `<|begin_of_text|>`
    /// and pads), then cut to [`HunyuanVideo1Tokens::conditioning_window`]; and CLIP-L's pooled vector of its
    /// first section (weights do not touch it). (ComfyUI also hands the DiT the cut padding mask of a prompt with
    /// `<pad>` written in it: [`HunyuanVideo1Tokens::attention_mask`].)
    ///
    /// A decoder of fewer than 3 layers gives its embeddings (ComfyUI refuses fewer than 4).
    pub fn encode<B: Backend>(&self, b: &B, tokens: &HunyuanVideo1Tokens) -> Result<Encoded<B>> {
        let tap = self.llama.config.layers.saturating_sub(FROM_END);
        let states =
            weighted_states(b, std::slice::from_ref(&tokens.llama), &PROMPT_LAYOUT, |ids| {
                self.llama.tapped_hidden_states(b, ids, attended_keys(ids), &[tap])
            })?;
        let (start, end) = tokens.conditioning_window();
        if start >= end {
            return Err(Error::Invalid(
                "HunyuanVideo's Llama prompt leaves no conditioning after the template's cut"
                    .to_owned(),
            ));
        }
        let cond: Tensor<B> = b.slice(&states, 1, start, end - start)?;
        let pooled = clip_pooled(b, &self.clip_l, &tokens.clip_l)?;
        Ok(Encoded::new(cond, Some(pooled)))
    }

    /// Both files' weights, the larger first.
    pub fn models(&self) -> Vec<&Model> {
        vec![&self.llama.weights, &self.clip_l.weights]
    }
}

impl HunyuanVideo1Tokens {
    /// The Llama ids.
    fn llama_ids(&self) -> Vec<u32> {
        self.llama.iter().map(|&(id, _)| id).collect()
    }

    /// Where the conditioning lies in Llama's states, `(start, end)` (ComfyUI's `template_end`, `user_end`): from
    /// after the last `<|start_header_id|>user<|end_header_id|>` and the `\n\n` after it (from its
    /// `<|end_header_id|>` when no `\n\n` follows, as when the prompt starts with a newline) to the first
    /// `<|eot_id|>` after that header, included. With ComfyUI's template: the prompt's ids and the closing
    /// `<|eot_id|>`; a prompt writing its own user header, or an `<|eot_id|>`, moves the start or the end.
    pub fn conditioning_window(&self) -> (usize, usize) {
        conditioning_window(&self.llama_ids())
    }

    /// The padding mask ComfyUI hands the DiT with the conditioning (`attention_mask`: true where attended), or
    /// `None` where it drops it because nothing in the window is masked: the keys from the first `<pad>` written
    /// in the prompt on are masked.
    pub fn attention_mask(&self) -> Option<Vec<bool>> {
        let ids = self.llama_ids();
        let first_pad = ids.iter().position(|&id| id == PAD)?;
        let (start, end) = conditioning_window(&ids);
        (first_pad < end).then(|| (start..end).map(|i| i < first_pad).collect())
    }
}

/// How many of `ids` are attended to as keys (ComfyUI's mask: up to the first `<pad>`, which is masked too).
fn attended_keys(ids: &[u32]) -> usize {
    ids.iter().position(|&id| id == PAD).unwrap_or(ids.len()).max(1)
}

/// ComfyUI's cut of `ids`' states (`HunyuanVideoClipModel.encode_token_weights`), its Python slice resolved.
fn conditioning_window(ids: &[u32]) -> (usize, usize) {
    /// ComfyUI's `user_end`: its start value (to the end), `-1` (a user header, no `<|eot_id|>` yet: all but
    /// the last), or an index.
    enum UserEnd {
        Unset,
        Open,
        At(usize),
    }
    let n = ids.len();
    let (mut template_end, mut user_end) = (0, UserEnd::Unset);
    for (i, &id) in ids.iter().enumerate() {
        if id == START_HEADER
            && ids.get(i + 1) == Some(&USER)
            && ids.get(i + 2) == Some(&END_HEADER)
        {
            template_end = i + 2;
            user_end = UserEnd::Open;
        }
        if id == llama3::EOT && matches!(user_end, UserEnd::Open) {
            user_end = UserEnd::At(i + 1);
        }
    }
    if n > template_end + 2 && ids[template_end + 1] == DOUBLE_NEWLINE {
        template_end += 2;
    }
    let end = match user_end {
        UserEnd::Unset => n,
        UserEnd::Open => n.saturating_sub(1),
        UserEnd::At(end) => end.min(n),
    };
    (template_end.min(end), end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_the_last_user_header_to_its_eot() {
        let template = [llama3::BOS, 9, START_HEADER, USER, END_HEADER, DOUBLE_NEWLINE];
        let with = |prompt: &[u32]| -> Vec<u32> {
            template.iter().chain(prompt).chain(&[llama3::EOT]).copied().collect()
        };
        assert_eq!(conditioning_window(&with(&[])), (6, 7));
        assert_eq!(conditioning_window(&with(&[5, 6])), (6, 9));
        // No `\n\n` after the header: from the `<|end_header_id|>`.
        let newline = [llama3::BOS, START_HEADER, USER, END_HEADER, 1432, 5, llama3::EOT];
        assert_eq!(conditioning_window(&newline), (3, 7));
        // A second user header moves the start; a written `<|eot_id|>` ends the window.
        let again = with(&[START_HEADER, USER, END_HEADER, DOUBLE_NEWLINE, 5]);
        assert_eq!(conditioning_window(&again), (10, 12));
        assert_eq!(conditioning_window(&with(&[5, llama3::EOT, 6])), (6, 8));
        // Without a user header: everything; with one and no `<|eot_id|>`: all but the last.
        assert_eq!(conditioning_window(&[llama3::BOS, 5]), (0, 2));
        assert_eq!(conditioning_window(&[START_HEADER, USER, END_HEADER, 5]), (2, 3));
    }

    #[test]
    fn the_mask_is_kept_only_with_a_pad_in_the_window() {
        let tokens = |ids: &[u32]| HunyuanVideo1Tokens {
            llama: ids.iter().map(|&id| (id, 1.0)).collect(),
            clip_l: Vec::new(),
        };
        let head = [llama3::BOS, START_HEADER, USER, END_HEADER, DOUBLE_NEWLINE];
        let plain: Vec<u32> = head.iter().chain(&[5, 6, llama3::EOT]).copied().collect();
        assert_eq!(tokens(&plain).attention_mask(), None);
        let pad: Vec<u32> = head.iter().chain(&[5, PAD, 6, llama3::EOT]).copied().collect();
        assert_eq!(tokens(&pad).attention_mask(), Some(vec![true, false, false, false]));
        assert_eq!(attended_keys(&pad), 6);
        assert_eq!(attended_keys(&plain), 8);
    }
}
