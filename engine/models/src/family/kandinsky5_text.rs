//! Kandinsky 5's text encoders (ComfyUI's `kandinsky5.py`, `Kandinsky5TEModel`): Qwen2.5-VL's last layer's output
//! (no final norm) over Kandinsky 5's template, cut as Qwen-Image's is, and CLIP-L's pooled vector (unprojected),
//! which joins the timestep in modulating every block.

use kiln_compute::memory::Model;
use kiln_compute::{Backend, Tensor};

use crate::clip_text::{self, ClipText};
use crate::error::Result;
use crate::prompt_weights::{self, Weighted};
use crate::qwen3::{self, Qwen3};

use super::text_encoder::{Encoded, clip_pooled};

/// Kandinsky 5's encoders and their tokenizers.
pub struct Kandinsky5Encoders {
    /// Qwen2.5-VL 7B's language model (the Qwen3 decoder code).
    pub qwen: Qwen3,
    /// CLIP-L.
    pub clip_l: ClipText,
    /// The Qwen tokenizer.
    pub tokenizer: qwen3::Tokenizer,
    /// CLIP's tokenizer.
    pub clip_tokenizer: clip_text::Tokenizer,
    /// Whether prompts take the video models' template (`DualCLIPLoader` type `kandinsky5`) rather than the image
    /// model's (`kandinsky5_image`).
    pub video: bool,
}

/// A prompt as ComfyUI's `Kandinsky5Tokenizer` lays it out.
#[derive(Debug, Clone, PartialEq)]
pub struct Kandinsky5Tokens {
    /// Qwen2.5-VL's ids: the prompt in Kandinsky 5's template (no weighting).
    pub qwen: Vec<u32>,
    /// CLIP-L's 77-token weighted sections.
    pub clip_l: Vec<Vec<Weighted>>,
}

impl Kandinsky5Encoders {
    /// Kandinsky 5's encoder of `qwen` and `clip_l`, with the tokenizers; `video` picks the video template.
    pub fn new(qwen: Qwen3, clip_l: ClipText, video: bool) -> Result<Kandinsky5Encoders> {
        Ok(Kandinsky5Encoders {
            qwen,
            clip_l,
            tokenizer: qwen3::Tokenizer::bundled()?,
            clip_tokenizer: clip_text::Tokenizer::bundled()?,
            video,
        })
    }

    /// The tokens of `prompt` for both encoders.
    pub fn tokenize(&self, prompt: &str) -> Result<Kandinsky5Tokens> {
        Ok(Kandinsky5Tokens {
            qwen: self.tokenizer.kandinsky5_prompt(prompt, self.video)?,
            clip_l: prompt_weights::tokenize(prompt, &clip_text::PROMPT_LAYOUT, |w| {
                self.clip_tokenizer.word_ids(w)
            })?,
        })
    }

    /// ComfyUI's `Kandinsky5TEModel.encode_token_weights`: Qwen2.5-VL's last layer's output without the final
    /// norm, from the prompt on (`QwenImageTEModel`'s cut: the template's system turn and `user` header off, its
    /// closing `<|im_end|>` kept), and CLIP-L's pooled vector of its first section.
    pub fn encode<B: Backend>(&self, b: &B, tokens: &Kandinsky5Tokens) -> Result<Encoded<B>> {
        let hidden = self.qwen.last_layer_output(b, &tokens.qwen)?;
        let start = qwen3::qwen_image_conditioning_start(&tokens.qwen);
        let n = hidden.dim(1)?;
        let cond: Tensor<B> = b.slice(&hidden, 1, start, n - start)?;
        let pooled = clip_pooled(b, &self.clip_l, &tokens.clip_l)?;
        Ok(Encoded::new(cond, Some(pooled)))
    }

    /// Both files' weights, the larger first.
    pub fn models(&self) -> Vec<&Model> {
        vec![&self.qwen.weights, &self.clip_l.weights]
    }
}
