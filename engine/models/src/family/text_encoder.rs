//! [`TextEncoderFamily`]: the text encoders (`CLIP`) Kiln runs, and [`TextEncoderNet`], one loaded with its
//! tokenizer.

use kiln_compute::memory::{LoadPlan, Model, SafetensorsFile};
use kiln_compute::{Backend, Tensor};

use crate::error::Result;
use crate::header::Header;
use crate::lora::LoraPatches;
use crate::qwen3::{self, Qwen3, Tokenizer};
use crate::textgen::{Decoding, TokenPicker};

/// A family of text encoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TextEncoderFamily {
    /// Qwen3 (4B for Z-Image), its hidden state with ComfyUI's Z-Image chat template.
    Qwen3,
    /// Qwen2.5-VL's language model (7B for Qwen-Image), its last hidden state after ComfyUI's Qwen-Image
    /// template with the template's prefix dropped.
    Qwen25Vl,
}

impl TextEncoderFamily {
    /// Every family, in the order detection tries them.
    pub const ALL: [TextEncoderFamily; 2] = [TextEncoderFamily::Qwen3, TextEncoderFamily::Qwen25Vl];

    /// The family's name in messages (`Qwen3`).
    pub fn name(self) -> &'static str {
        match self {
            TextEncoderFamily::Qwen3 => qwen3::family::NAME,
            TextEncoderFamily::Qwen25Vl => qwen3::family::QWEN25VL_NAME,
        }
    }

    /// The name `kiln model synth --family` writes the encoder under (`qwen3`).
    pub fn synth_name(self) -> &'static str {
        match self {
            TextEncoderFamily::Qwen3 => qwen3::family::SYNTH_NAME,
            TextEncoderFamily::Qwen25Vl => qwen3::family::QWEN25VL_SYNTH_NAME,
        }
    }

    /// The patches a LoRA file makes at `strength` (`strength_clip`) for an encoder of this family whose
    /// weights are `slots` (`(name, shape)` in the family's layout), with the file's keys that adapt none of them.
    pub fn lora(
        self,
        file: &SafetensorsFile,
        slots: &[(&str, &[usize])],
        strength: f32,
    ) -> Result<LoraPatches> {
        match self {
            TextEncoderFamily::Qwen3 => {
                qwen3::lora::patches(file, qwen3::lora::QWEN3_4B, slots, strength)
            }
            TextEncoderFamily::Qwen25Vl => {
                qwen3::lora::patches(file, qwen3::lora::QWEN25_7B, slots, strength)
            }
        }
    }

    /// This family's detection of `h`.
    fn detect(self, h: &Header) -> Result<Option<TextEncoderDetected>> {
        Ok(match self {
            TextEncoderFamily::Qwen3 => qwen3::detect(h)?.map(TextEncoderDetected::Qwen3),
            TextEncoderFamily::Qwen25Vl => {
                qwen3::detect_qwen25vl(h)?.map(TextEncoderDetected::Qwen25Vl)
            }
        })
    }
}

/// A text encoder found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum TextEncoderDetected {
    /// Qwen3.
    Qwen3(qwen3::Config),
    /// Qwen2.5-VL's language model.
    Qwen25Vl(qwen3::Config),
}

impl TextEncoderDetected {
    /// The encoder in `h`: `Ok(None)` when no family claims it; [`crate::Error::Unsupported`] for a file a
    /// family recognises but cannot run.
    pub fn detect(h: &Header) -> Result<Option<TextEncoderDetected>> {
        super::first_detected(&TextEncoderFamily::ALL, h, TextEncoderFamily::detect)
    }

    /// The family.
    pub fn family(&self) -> TextEncoderFamily {
        match self {
            TextEncoderDetected::Qwen3(_) => TextEncoderFamily::Qwen3,
            TextEncoderDetected::Qwen25Vl(_) => TextEncoderFamily::Qwen25Vl,
        }
    }

    /// The weights to load, named in the family's layout.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            TextEncoderDetected::Qwen3(config) | TextEncoderDetected::Qwen25Vl(config) => {
                qwen3::load_plan(h, config)
            }
        }
    }

    /// The encoder with `weights` loaded from [`TextEncoderDetected::load_plan`], and its tokenizer.
    pub fn build(self, weights: Model) -> Result<TextEncoderNet> {
        Ok(match self {
            TextEncoderDetected::Qwen3(config) => TextEncoderNet::Qwen3 {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
            },
            TextEncoderDetected::Qwen25Vl(config) => TextEncoderNet::Qwen25Vl {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
            },
        })
    }
}

/// A loaded text encoder with its tokenizer.
pub enum TextEncoderNet {
    /// Qwen3.
    Qwen3 {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
    },
    /// Qwen2.5-VL's language model (the same decoder code) with the same tokenizer.
    Qwen25Vl {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
    },
}

impl TextEncoderNet {
    /// The family.
    pub fn family(&self) -> TextEncoderFamily {
        match self {
            TextEncoderNet::Qwen3 { .. } => TextEncoderFamily::Qwen3,
            TextEncoderNet::Qwen25Vl { .. } => TextEncoderFamily::Qwen25Vl,
        }
    }

    /// The weights, under the memory manager.
    pub fn weights(&self) -> &Model {
        match self {
            TextEncoderNet::Qwen3 { model, .. } | TextEncoderNet::Qwen25Vl { model, .. } => {
                &model.weights
            }
        }
    }

    /// The token ids ComfyUI feeds the encoder for `prompt` (its template and weighting syntax applied).
    pub fn tokenize(&self, prompt: &str) -> Result<Vec<u32>> {
        match self {
            TextEncoderNet::Qwen3 { tokenizer, .. } => tokenizer.zimage_prompt(prompt),
            TextEncoderNet::Qwen25Vl { tokenizer, .. } => tokenizer.qwen_image_prompt(prompt),
        }
    }

    /// Text generated after `prompt` (`TextGenerate`), as token ids (the stop token included when one was
    /// reached), with ComfyUI's chat template for the family around the prompt; at most `max_new` tokens.
    pub fn generate<B: Backend>(
        &self,
        b: &B,
        prompt: &str,
        max_new: usize,
        decoding: Decoding,
        on_token: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<u32>> {
        let mut picker = TokenPicker::new(decoding);
        match self {
            TextEncoderNet::Qwen3 { model, tokenizer } => {
                // ComfyUI's Z-Image tokenizer, whichever CLIPLoader type but `flux2` (refused at load).
                let ids = tokenizer.zimage_prompt(prompt)?;
                let pick = &mut |logits| picker.pick(logits);
                model.generate(b, &ids, max_new, &qwen3::STOP_TOKENS, pick, on_token)
            }
            TextEncoderNet::Qwen25Vl { .. } => Err(crate::Error::Invalid(
                "TextGenerate with Qwen-Image's Qwen2.5-VL encoder is not supported yet".to_owned(),
            )),
        }
    }

    /// The text of generated `ids` (special tokens left out), as ComfyUI's `decode`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            TextEncoderNet::Qwen3 { tokenizer, .. }
            | TextEncoderNet::Qwen25Vl { tokenizer, .. } => tokenizer.decode(ids),
        }
    }

    /// The conditioning ComfyUI takes from the encoder for `ids`: `[1, N, D]`.
    pub fn encode<B: Backend>(&self, b: &B, ids: &[u32]) -> Result<Tensor<B>> {
        match self {
            TextEncoderNet::Qwen3 { model, .. } => model.hidden_state(b, ids),
            // ComfyUI conditions Qwen-Image on the hidden states after the template's prefix.
            TextEncoderNet::Qwen25Vl { model, .. } => {
                let hidden = model.hidden_state(b, ids)?;
                let start = qwen3::qwen_image_conditioning_start(ids);
                Ok(b.slice(&hidden, 1, start, ids.len() - start)?)
            }
        }
    }
}
