//! [`TextEncoderFamily`]: the text encoders (`CLIP`) Kiln runs, and [`TextEncoderNet`], one loaded with its
//! tokenizer.

use kiln_compute::memory::{LoadPlan, Model, SafetensorsFile, SlotPlan};
use kiln_compute::{Backend, Tensor};

use crate::error::Result;
use crate::header::Header;
use crate::lora::LoraPatches;
use crate::qwen_vl::{self, VisionConfig, VisionInput};
use crate::qwen3::{self, ImageTokens, Qwen3, Tokenizer};
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
            TextEncoderFamily::Qwen25Vl => match qwen3::detect_qwen25vl(h)? {
                Some(config) => Some(TextEncoderDetected::Qwen25Vl(config, qwen_vl::detect(h)?)),
                None => None,
            },
        })
    }
}

/// A text encoder found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum TextEncoderDetected {
    /// Qwen3.
    Qwen3(qwen3::Config),
    /// Qwen2.5-VL's language model, and its vision tower when the file has one.
    Qwen25Vl(qwen3::Config, Option<VisionConfig>),
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
            TextEncoderDetected::Qwen25Vl(..) => TextEncoderFamily::Qwen25Vl,
        }
    }

    /// The weights to load, named in the family's layout.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            TextEncoderDetected::Qwen3(config) => qwen3::load_plan(h, config),
            TextEncoderDetected::Qwen25Vl(config, vision) => {
                let mut plan = qwen3::load_plan(h, config);
                let tower = vision.iter().flat_map(VisionConfig::weight_names);
                plan.slots
                    .extend(tower.map(|name| SlotPlan::new(name.clone(), vec![(0, h.key(&name))])));
                plan
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
            TextEncoderDetected::Qwen25Vl(config, vision) => TextEncoderNet::Qwen25Vl {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
                vision,
            },
        })
    }
}

/// Which Qwen-Image Edit node's template a prompt takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditPrompt {
    /// `TextEncodeQwenImageEdit`: the edit template with one image slot when there is an image.
    Edit {
        /// Whether an image comes with the prompt.
        image: bool,
    },
    /// `TextEncodeQwenImageEditPlus`: `Picture i: ` and a slot per image, in the edit template.
    Plus {
        /// Which of the node's three image inputs are connected (a picture keeps its input's number).
        pictures: [bool; 3],
    },
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
    /// Qwen2.5-VL's language model (the same decoder code) with the same tokenizer, and the vision tower
    /// when the file has one (its weights are in `model`'s, as `visual.*`).
    Qwen25Vl {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
        /// The vision tower's widths.
        vision: Option<VisionConfig>,
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

    /// The token ids of a Qwen-Image Edit node's prompt, as ComfyUI's Qwen-Image tokenizer makes them for
    /// `edit`; an error for an encoder of another family.
    pub fn tokenize_edit(&self, prompt: &str, edit: EditPrompt) -> Result<Vec<u32>> {
        match (self, edit) {
            (TextEncoderNet::Qwen25Vl { tokenizer, .. }, EditPrompt::Edit { image }) => {
                tokenizer.qwen_image_edit_prompt(prompt, image)
            }
            (TextEncoderNet::Qwen25Vl { tokenizer, .. }, EditPrompt::Plus { pictures }) => {
                let numbers: Vec<usize> = (1..=3).filter(|&i| pictures[i - 1]).collect();
                tokenizer.qwen_image_edit_plus_prompt(prompt, &numbers)
            }
            (TextEncoderNet::Qwen3 { .. }, _) => Err(crate::Error::Invalid(format!(
                "a Qwen-Image Edit prompt needs Qwen-Image's Qwen2.5-VL text encoder, not {}",
                self.family().name()
            ))),
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
        self.encode_with_images(b, ids, &[])
    }

    /// `image` (`[height, width, channels]` in `[0, 1]`) as this encoder's vision tower reads it; an error for
    /// an encoder without one.
    pub fn vision_input(
        &self,
        image: &[f32],
        height: usize,
        width: usize,
        channels: usize,
    ) -> Result<VisionInput> {
        match self {
            TextEncoderNet::Qwen25Vl { vision: Some(vision), .. } => {
                VisionInput::of_image(vision, image, height, width, channels)
            }
            TextEncoderNet::Qwen25Vl { vision: None, .. } => Err(crate::Error::Invalid(
                "this Qwen2.5-VL file has no vision tower (`visual.*` weights), so it cannot read images"
                    .to_owned(),
            )),
            TextEncoderNet::Qwen3 { .. } => Err(crate::Error::Invalid(format!(
                "a {} text encoder reads no images; Qwen-Image Edit needs its Qwen2.5-VL encoder",
                self.family().name()
            ))),
        }
    }

    /// [`TextEncoderNet::encode`] with `images` (from [`TextEncoderNet::vision_input`]) in the prompt, each
    /// where one of `ids`' `<|image_pad|>` tokens is, in order, as ComfyUI encodes a Qwen-Image Edit prompt.
    pub fn encode_with_images<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        images: &[VisionInput],
    ) -> Result<Tensor<B>> {
        match self {
            TextEncoderNet::Qwen3 { model, .. } if images.is_empty() => model.hidden_state(b, ids),
            TextEncoderNet::Qwen3 { .. } => Err(crate::Error::Invalid(format!(
                "a {} text encoder reads no images",
                self.family().name()
            ))),
            // ComfyUI conditions Qwen-Image on the hidden states after the template's prefix (found in the
            // ids before the images take their place; they come after it).
            TextEncoderNet::Qwen25Vl { model, vision, .. } => {
                let mut tokens = Vec::with_capacity(images.len());
                for input in images {
                    let Some(vision) = vision else {
                        return Err(crate::Error::Invalid(
                            "this Qwen2.5-VL file has no vision tower (`visual.*` weights)"
                                .to_owned(),
                        ));
                    };
                    tokens.push(ImageTokens {
                        embeds: qwen_vl::embed_image(b, &model.weights, vision, input)?,
                        rows: input.grid_h / qwen_vl::MERGE,
                        cols: input.grid_w / qwen_vl::MERGE,
                    });
                }
                let hidden = model.hidden_state_with_images(b, ids, &tokens)?;
                let start = qwen3::qwen_image_conditioning_start(ids);
                let n = hidden.dim(1)?;
                Ok(b.slice(&hidden, 1, start, n - start)?)
            }
        }
    }
}
