//! [`TextEncoderFamily`]: the text encoders (`CLIP`) Kiln runs, and [`TextEncoderNet`], one loaded with its
//! tokenizer.
//!
//! Most families are one file. FLUX.1's encoder is two, CLIP-L and T5-XXL (`DualCLIPLoader`, type `flux`):
//! each file is detected on its own ([`TextEncoderFamily::ClipL`], [`TextEncoderFamily::T5Xxl`]) and
//! [`TextEncoderNet::combine`] makes the pair ([`TextEncoderFamily::Flux`]). FLUX.2 Klein's encoder is a Qwen3
//! file that `CLIPLoader`'s type (or, for Qwen3-8B, its width) makes Klein's rather than Z-Image's
//! ([`TextEncoderDetected::for_clip_type`], [`TextEncoderFamily::Flux2Klein`]). FLUX.2 dev's is Mistral Small
//! 3.x ([`TextEncoderFamily::Mistral3`]), whose file carries its tokenizer. Wan's is umT5-XXL
//! ([`TextEncoderFamily::Umt5Xxl`], `CLIPLoader` type `wan`), T5's encoder with a position bias table per block,
//! whose file carries its SentencePiece tokenizer.

use kiln_compute::backend::PadMode;
use kiln_compute::memory::{LoadPlan, Model, SafetensorsFile, SlotPlan};
use kiln_compute::{Backend, Tensor};

use crate::anima;
use crate::clip_text::{self, ClipText};
use crate::error::{Error, Result};
use crate::gemma2;
use crate::header::Header;
use crate::llama3;
use crate::lora::LoraPatches;
use crate::mistral3;
use crate::prompt_weights::{self, Weighted};
use crate::qwen_vl::{self, VisionConfig, VisionInput};
use crate::qwen3::{self, ImageTokens, Qwen3, Tokenizer};
use crate::qwen3vl_vision;
use crate::t5::{self, T5};
use crate::textgen::{ChatOptions, Decoding, TokenPicker};

use super::anima_text::{self, AnimaTokens};
use super::hunyuan_video_text::{HunyuanVideo15Encoders, HunyuanVideo15Tokens};
use super::hunyuan_video1_text::{HunyuanVideo1Encoders, HunyuanVideo1Tokens};
use super::kandinsky5_text::{Kandinsky5Encoders, Kandinsky5Tokens};
use super::sd3_text::{Sd3Encoders, Sd3Tokens};
use super::sdxl_text::{SdxlEncoders, SdxlTokens};

/// A family of text encoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TextEncoderFamily {
    /// Qwen3 (4B for Z-Image), its hidden state with ComfyUI's Z-Image chat template.
    Qwen3,
    /// Qwen2.5-VL's language model (7B for Qwen-Image), its last hidden state after ComfyUI's Qwen-Image
    /// template with the template's prefix dropped.
    Qwen25Vl,
    /// A CLIP text tower (CLIP-L), one half of FLUX.1's encoder.
    ClipL,
    /// The T5 v1.1 encoder (T5-XXL), the other half.
    T5Xxl,
    /// FLUX.1's pair: T5-XXL's last hidden state as the conditioning, CLIP-L's pooled vector beside it, with
    /// ComfyUI's prompt weighting. Made by [`TextEncoderNet::combine`], never detected in one file.
    Flux,
    /// FLUX.2 Klein's: Qwen3 (4B or 8B), hidden states 9, 18 and 27 side by side over ComfyUI's Klein chat
    /// template padded to 512 tokens, no pooled vector. A Qwen3 file made Klein's by
    /// [`TextEncoderDetected::for_clip_type`], never detected as such.
    Flux2Klein,
    /// FLUX.2 dev's: Mistral Small 3.x, hidden states 10, 20 and 30 side by side over ComfyUI's FLUX.2 template
    /// (no padding), tokenised by the Tekken tokenizer its file carries; no pooled vector.
    Mistral3,
    /// ERNIE-Image's: Ministral 3 3B (a Mistral-shaped file of its width whatever `CLIPLoader`'s type, as ComfyUI's
    /// `detect_te_model`; Kiln also takes a tiny one too shallow for FLUX.2's taps, which ComfyUI would call Llama
    /// 3): the output of its second-to-last layer, un-normed,
    /// over the prompt as written after `<s>` (no template, weights disabled); no pooled vector. It generates text
    /// too (ERNIE-Image's prompt enhancer). Detected as a [`TextEncoderDetected::Mistral3`] of that size.
    Ernie,
    /// Wan's umT5-XXL (`CLIPLoader` type `wan`): its last hidden state under ComfyUI's attention mask with the
    /// rows after the first EOS zeroed, at least 512 tokens, prompt weights applied, tokenised by the
    /// SentencePiece model its file carries; no pooled vector.
    Umt5Xxl,
    /// Llama 3.1 8B Instruct, the fourth of HiDream's encoders; it conditions nothing on its own.
    Llama3,
    /// HiDream's four (`QuadrupleCLIPLoader`): T5-XXL's states of its first 128 tokens as the conditioning,
    /// every layer's output of Llama 3.1 beside them, CLIP-L's and CLIP-G's projected pooled vectors joined. Made
    /// by [`TextEncoderNet::combine`], never detected in one file.
    HiDream,
    /// SDXL's pair (`DualCLIPLoader` type `sdxl`, an SDXL checkpoint): CLIP-L's and CLIP-G's penultimate states
    /// side by side, CLIP-G's projected pooled vector; or the refiner's CLIP-G alone (also `CLIPLoader` with a
    /// CLIP-G file). Made by [`TextEncoderNet::combine`], never detected in one file.
    Sdxl,
    /// SD3's three (an SD3.5 checkpoint, `TripleCLIPLoader`, type `sd3`): CLIP-L's and CLIP-G's next-to-last
    /// states padded to T5-XXL's width, T5-XXL's after them; their pooled vectors joined. Any subset. Made by
    /// [`TextEncoderNet::combine`], never detected in one file.
    Sd3,
    /// Ovis-Image's: Ovis 2.5's language model (a Qwen3 2B, the Qwen3 decoder code), told by its width whatever
    /// `CLIPLoader`'s type (a tiny Qwen3 by type `ovis`): its last hidden state over ComfyUI's Ovis template padded
    /// to 284 tokens, the pads' rows zeroed, the template's prefix cut off. Never detected as such.
    Ovis,
    /// Kandinsky 5's pair (`DualCLIPLoader` type `kandinsky5_image` or `kandinsky5`): Qwen2.5-VL's last layer's
    /// output (no final norm) over Kandinsky 5's template, the prefix cut off, and CLIP-L's pooled vector. Made by
    /// [`TextEncoderNet::combine`], never detected in one file.
    Kandinsky5,
    /// HunyuanVideo 1.5's pair (`DualCLIPLoader` type `hunyuan_video_15`): Qwen2.5-VL 7B's output of its third
    /// layer from the end over HunyuanVideo 1.5's template, the prefix cut off, and ByT5's states of the prompt's
    /// quoted passages beside it. Made by [`TextEncoderNet::combine`], never detected in one file.
    HunyuanVideo15,
    /// HunyuanVideo 1.0's pair (`DualCLIPLoader` type `hunyuan_video`): LLaVA-Llama 3 8B's output of its third layer
    /// from the end over HunyuanVideo's template, cropped to the prompt, and CLIP-L's pooled vector. Made by
    /// [`TextEncoderNet::combine`], never detected in one file.
    HunyuanVideo,
    /// Anima's: Qwen3 0.6B (a Qwen3 file of its width, whatever `CLIPLoader`'s type, as ComfyUI's
    /// `detect_te_model`), its last hidden state of the prompt as it is, with the prompt's T5 tokens beside it for
    /// the model's LLM adapter. Never detected as such.
    Anima,
    /// Boogu-Image's: Qwen3-VL 8B's language model (a Qwen3 file made its by `CLIPLoader`'s type `boogu`, RoPE θ
    /// 5·10⁶): its last layer through the final norm over Boogu's template. Never detected as such.
    Boogu,
    /// Krea 2's: Qwen3-VL 4B's language model (a Qwen3 file made its by `CLIPLoader`'s type `krea2`, RoPE θ 5·10⁶):
    /// twelve of its hidden states side by side ([`qwen3::family::KREA2_TAPS`]) over Krea 2's template, the
    /// prefix cut off. Never detected as such.
    Krea2,
    /// Mage-Flow's: Qwen3-VL 4B's language model (type `mage`): its last layer through the final norm over
    /// Mage-Flow's template, the prefix cut off. Never detected as such.
    MageFlow,
    /// JoyAI Image Edit's: Qwen3-VL 8B (type `joyimage`): its last layer before the final norm over JoyImage's
    /// template, the first [`qwen3::JOYIMAGE_DROP`] states dropped. Never detected as such.
    JoyImage,
    /// A Qwen3-VL file (its language model and vision tower, told by the DeepStack mergers): as detected, and as
    /// ComfyUI's generic Qwen3-VL encoder once `CLIPLoader`'s type makes it no model's own (its last layer before
    /// the final norm over the plain chat template; `TextGenerate` with images).
    Qwen3Vl,
    /// Lumina 2's Gemma 2 2B (whatever `CLIPLoader`'s type but `pixeldit`, as ComfyUI's `detect_te_model`): layer
    /// `layers − 2`'s output over the prompt as it is after `<bos>`, prompt weights applied, tokenised by the
    /// SentencePiece model its file carries; no pooled vector.
    Gemma2,
    /// PixelDiT's Gemma 2 2B (`CLIPLoader` type `pixeldit`): the last layer through the final norm over PixelDiT's
    /// instruction and the prompt padded to its length, `<bos>`'s row and the last 299 kept. Never detected as
    /// such.
    PixelDit,
}

impl TextEncoderFamily {
    /// Every family, in the order detection tries them.
    pub const ALL: [TextEncoderFamily; 9] = [
        // Before Qwen3, whose layout its language model has.
        TextEncoderFamily::Qwen3Vl,
        TextEncoderFamily::Qwen3,
        // Before Llama 3, whose Llama-shaped files Gemma 2's sandwich norms set apart.
        TextEncoderFamily::Gemma2,
        TextEncoderFamily::Qwen25Vl,
        TextEncoderFamily::ClipL,
        // Before T5-XXL, whose detection refuses a umT5 file.
        TextEncoderFamily::Umt5Xxl,
        TextEncoderFamily::T5Xxl,
        TextEncoderFamily::Mistral3,
        // After Mistral, which claims the Llama-shaped files that are its own.
        TextEncoderFamily::Llama3,
    ];

    /// The family's name in messages (`Qwen3`).
    pub fn name(self) -> &'static str {
        match self {
            TextEncoderFamily::Qwen3 => qwen3::family::NAME,
            TextEncoderFamily::Qwen25Vl => qwen3::family::QWEN25VL_NAME,
            TextEncoderFamily::ClipL => clip_text::family::NAME,
            TextEncoderFamily::T5Xxl => t5::family::NAME,
            TextEncoderFamily::Flux => "FLUX.1's CLIP-L + T5-XXL",
            TextEncoderFamily::Flux2Klein => qwen3::family::KLEIN_NAME,
            TextEncoderFamily::Mistral3 => mistral3::family::NAME,
            TextEncoderFamily::Ernie => mistral3::family::MINISTRAL_NAME,
            TextEncoderFamily::Umt5Xxl => t5::family::UMT5_NAME,
            TextEncoderFamily::Llama3 => llama3::NAME,
            TextEncoderFamily::HiDream => "HiDream's CLIP-L + CLIP-G + T5-XXL + Llama 3.1",
            TextEncoderFamily::Sdxl => "SDXL's CLIP-L + CLIP-G",
            TextEncoderFamily::Sd3 => "SD3's CLIP-L + CLIP-G + T5-XXL",
            TextEncoderFamily::Ovis => "Ovis 2.5",
            TextEncoderFamily::Boogu => "Boogu-Image's Qwen3-VL 8B",
            TextEncoderFamily::Krea2 => "Krea 2's Qwen3-VL 4B",
            TextEncoderFamily::MageFlow => "Mage-Flow's Qwen3-VL 4B",
            TextEncoderFamily::JoyImage => "JoyAI Image Edit's Qwen3-VL 8B",
            TextEncoderFamily::Qwen3Vl => "Qwen3-VL",
            TextEncoderFamily::Kandinsky5 => "Kandinsky 5's Qwen2.5-VL + CLIP-L",
            TextEncoderFamily::HunyuanVideo15 => "HunyuanVideo 1.5's Qwen2.5-VL + ByT5",
            TextEncoderFamily::HunyuanVideo => "HunyuanVideo's CLIP-L + LLaVA-Llama 3",
            TextEncoderFamily::Anima => "Anima's Qwen3 0.6B",
            TextEncoderFamily::Gemma2 => gemma2::NAME,
            TextEncoderFamily::PixelDit => "PixelDiT's Gemma 2 2B",
        }
    }

    /// The name `kiln model synth --family` writes the encoder under (`qwen3`).
    pub fn synth_name(self) -> &'static str {
        match self {
            TextEncoderFamily::Qwen3 => qwen3::family::SYNTH_NAME,
            TextEncoderFamily::Qwen25Vl => qwen3::family::QWEN25VL_SYNTH_NAME,
            TextEncoderFamily::ClipL => clip_text::family::SYNTH_NAME,
            TextEncoderFamily::T5Xxl => t5::family::SYNTH_NAME,
            // Written as its two files.
            TextEncoderFamily::Flux => "flux-text-encoders",
            // A Qwen3 file with at least 28 layers.
            TextEncoderFamily::Flux2Klein => qwen3::family::KLEIN_SYNTH_NAME,
            TextEncoderFamily::Mistral3 => mistral3::family::SYNTH_NAME,
            TextEncoderFamily::Ernie => mistral3::family::MINISTRAL_SYNTH_NAME,
            TextEncoderFamily::Umt5Xxl => t5::family::UMT5_SYNTH_NAME,
            TextEncoderFamily::Llama3 => llama3::SYNTH_NAME,
            // Written as its four files.
            TextEncoderFamily::HiDream => "hidream-text-encoders",
            // Written inside SDXL's checkpoints.
            TextEncoderFamily::Sdxl => "sdxl-text-encoders",
            // Written inside SD3.5's checkpoints.
            TextEncoderFamily::Sd3 => "sd3-text-encoders",
            // A Qwen3 file (CLIPLoader's type makes it Ovis-Image's).
            TextEncoderFamily::Ovis => qwen3::family::SYNTH_NAME,
            // A Qwen3 file (CLIPLoader's type makes it Boogu-Image's).
            TextEncoderFamily::Boogu => qwen3::family::SYNTH_NAME,
            // A Qwen3-VL 4B file in transformers' layout (CLIPLoader's type makes it Krea 2's, Mage-Flow's or, as
            // the stand-in for the 8B, JoyImage's).
            TextEncoderFamily::Krea2
            | TextEncoderFamily::MageFlow
            | TextEncoderFamily::JoyImage
            | TextEncoderFamily::Qwen3Vl => qwen3::family::QWEN3VL_4B_SYNTH_NAME,
            // Written as its two files.
            TextEncoderFamily::Kandinsky5 => "kandinsky5-text-encoders",
            TextEncoderFamily::HunyuanVideo15 => "hunyuan-video15-text-encoders",
            TextEncoderFamily::HunyuanVideo => "hunyuan-video-text-encoders",
            // A Qwen3 file of Qwen3 0.6B's width.
            TextEncoderFamily::Anima => qwen3::family::QWEN3_06B_SYNTH_NAME,
            // A Gemma 2 file (CLIPLoader's type makes it PixelDiT's).
            TextEncoderFamily::Gemma2 | TextEncoderFamily::PixelDit => gemma2::SYNTH_NAME,
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
            TextEncoderFamily::Flux2Klein => {
                // ComfyUI keeps Klein's encoder under its model type: `qwen3_8b` for Qwen3-8B's width.
                let hidden = slots.iter().find(|(name, _)| *name == "model.embed_tokens.weight");
                let clip_name = match hidden.and_then(|(_, shape)| shape.get(1)) {
                    Some(&qwen3::family::QWEN3_8B_HIDDEN) => qwen3::lora::QWEN3_8B,
                    _ => qwen3::lora::QWEN3_4B,
                };
                qwen3::lora::patches(file, clip_name, slots, strength)
            }
            // Kiln reads no LoRA keys for these encoders yet: every key is left unmatched (and logged).
            TextEncoderFamily::ClipL
            | TextEncoderFamily::T5Xxl
            | TextEncoderFamily::Flux
            | TextEncoderFamily::Mistral3
            | TextEncoderFamily::Ernie
            | TextEncoderFamily::Umt5Xxl
            | TextEncoderFamily::Llama3
            | TextEncoderFamily::HiDream
            | TextEncoderFamily::Sdxl
            | TextEncoderFamily::Sd3
            | TextEncoderFamily::Ovis
            | TextEncoderFamily::Boogu
            | TextEncoderFamily::Krea2
            | TextEncoderFamily::MageFlow
            | TextEncoderFamily::JoyImage
            | TextEncoderFamily::Qwen3Vl
            | TextEncoderFamily::Kandinsky5
            | TextEncoderFamily::HunyuanVideo15
            | TextEncoderFamily::HunyuanVideo
            | TextEncoderFamily::Anima
            | TextEncoderFamily::Gemma2
            | TextEncoderFamily::PixelDit => {
                let _ = (slots, strength);
                Ok(LoraPatches {
                    patches: Vec::new(),
                    unmatched: file.names().map(str::to_owned).collect(),
                })
            }
        }
    }

    /// This family's detection of `h`.
    fn detect(self, h: &Header) -> Result<Option<TextEncoderDetected>> {
        Ok(match self {
            TextEncoderFamily::Qwen3 => qwen3::detect(h)?.map(TextEncoderDetected::Qwen3),
            TextEncoderFamily::Qwen3Vl => match qwen3::detect_qwen3vl(h)? {
                Some(config) => {
                    Some(TextEncoderDetected::Qwen3Vl(config, qwen3vl_vision::detect(h)?, None))
                }
                None => None,
            },
            TextEncoderFamily::Qwen25Vl => match qwen3::detect_qwen25vl(h)? {
                Some(config) => Some(TextEncoderDetected::Qwen25Vl(
                    config,
                    qwen_vl::detect(h)?,
                    Qwen25Role::QwenImage,
                )),
                None => None,
            },
            TextEncoderFamily::ClipL => clip_text::detect(h)?.map(TextEncoderDetected::ClipL),
            TextEncoderFamily::T5Xxl => t5::detect(h)?.map(TextEncoderDetected::T5),
            TextEncoderFamily::Mistral3 => mistral3::detect(h)?.map(TextEncoderDetected::Mistral3),
            TextEncoderFamily::Umt5Xxl => t5::Umt5File::detect(h)?.map(TextEncoderDetected::Umt5),
            TextEncoderFamily::Llama3 => llama3::detect(h)?.map(TextEncoderDetected::Llama3),
            TextEncoderFamily::Gemma2 => {
                gemma2::Gemma2File::detect(h)?.map(TextEncoderDetected::Gemma2)
            }
            TextEncoderFamily::Flux
            | TextEncoderFamily::Flux2Klein
            | TextEncoderFamily::HiDream
            | TextEncoderFamily::Sdxl
            | TextEncoderFamily::Sd3
            | TextEncoderFamily::Ovis
            | TextEncoderFamily::Boogu
            | TextEncoderFamily::Krea2
            | TextEncoderFamily::MageFlow
            | TextEncoderFamily::JoyImage
            | TextEncoderFamily::Ernie
            | TextEncoderFamily::PixelDit
            | TextEncoderFamily::Kandinsky5
            | TextEncoderFamily::HunyuanVideo15
            | TextEncoderFamily::HunyuanVideo
            | TextEncoderFamily::Anima => None,
        })
    }
}

/// A text encoder found in a header, before any weight is read.
#[derive(Debug, Clone, PartialEq)]
pub enum TextEncoderDetected {
    /// Qwen3.
    Qwen3(qwen3::Config),
    /// Qwen2.5-VL's language model, its vision tower when the file has one, and whose encoder it is (by
    /// `CLIPLoader`'s type).
    Qwen25Vl(qwen3::Config, Option<VisionConfig>, Qwen25Role),
    /// A CLIP text tower.
    ClipL(clip_text::Config),
    /// A T5 encoder.
    T5(t5::Config),
    /// A T5-XXL file as the only text encoder (from [`TextEncoderDetected::for_clip_type`] with type `chroma` or
    /// `pixart`).
    T5Alone(t5::Config),
    /// A Qwen3 file as FLUX.2 Klein's encoder (from [`TextEncoderDetected::for_clip_type`]).
    Flux2Klein(qwen3::Config),
    /// A Mistral decoder (Mistral Small 3.x, FLUX.2 dev's encoder, or Ministral 3 3B, ERNIE-Image's, by
    /// [`mistral3::Detected::size`]), and where its tokenizer is.
    Mistral3(mistral3::Detected),
    /// umT5-XXL, Wan's encoder, and where its tokenizer is.
    Umt5(t5::Umt5File),
    /// Llama 3.x (HiDream's Llama 3.1 8B Instruct).
    Llama3(qwen3::Config),
    /// A Qwen3 file as Ovis-Image's encoder (from [`TextEncoderDetected::for_clip_type`] with type `ovis`).
    Ovis(qwen3::Config),
    /// A Qwen3-VL language model (a Qwen3-VL file, or a Qwen3 file made one by [`TextEncoderDetected::for_clip_type`]
    /// with type `boogu`, `krea2` or `mage`; RoPE θ Qwen3-VL's), its vision tower when the file has one, and whose
    /// encoder it is (`None` until `CLIPLoader`'s type says).
    Qwen3Vl(qwen3::Config, Option<qwen3vl_vision::Config>, Option<Qwen3VlRole>),
    /// A Qwen3 0.6B file as Anima's encoder (from [`TextEncoderDetected::for_clip_type`], by its width).
    Anima(qwen3::Config),
    /// Gemma 2 (Lumina 2's encoder), and where its tokenizer is.
    Gemma2(gemma2::Gemma2File),
    /// A Gemma 2 file as PixelDiT's encoder (from [`TextEncoderDetected::for_clip_type`] with type `pixeldit`).
    PixelDit(gemma2::Gemma2File),
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
            TextEncoderDetected::ClipL(_) => TextEncoderFamily::ClipL,
            TextEncoderDetected::T5(_) | TextEncoderDetected::T5Alone(_) => {
                TextEncoderFamily::T5Xxl
            }
            TextEncoderDetected::Flux2Klein(_) => TextEncoderFamily::Flux2Klein,
            TextEncoderDetected::Mistral3(found) => match found.size {
                mistral3::Size::Small24B => TextEncoderFamily::Mistral3,
                mistral3::Size::Ministral3B => TextEncoderFamily::Ernie,
            },
            TextEncoderDetected::Umt5(_) => TextEncoderFamily::Umt5Xxl,
            TextEncoderDetected::Llama3(_) => TextEncoderFamily::Llama3,
            TextEncoderDetected::Ovis(_) => TextEncoderFamily::Ovis,
            TextEncoderDetected::Qwen3Vl(_, _, Some(role)) => role.family(),
            TextEncoderDetected::Qwen3Vl(_, _, None) => TextEncoderFamily::Qwen3Vl,
            TextEncoderDetected::Anima(_) => TextEncoderFamily::Anima,
            TextEncoderDetected::Gemma2(_) => TextEncoderFamily::Gemma2,
            TextEncoderDetected::PixelDit(_) => TextEncoderFamily::PixelDit,
        }
    }

    /// What the file is, in messages (a CLIP text file by its variant: CLIP-L, CLIP-H, CLIP-G).
    pub fn name(&self) -> &'static str {
        match self {
            TextEncoderDetected::ClipL(config) => config.variant.name(),
            _ => self.family().name(),
        }
    }

    /// The weights to load, named in the family's layout.
    pub fn load_plan(&self, h: &Header) -> LoadPlan {
        match self {
            TextEncoderDetected::Qwen3(config)
            | TextEncoderDetected::Flux2Klein(config)
            | TextEncoderDetected::Ovis(config)
            | TextEncoderDetected::Anima(config) => qwen3::load_plan(h, config),
            TextEncoderDetected::Qwen3Vl(config, vision, _) => {
                let mut plan = qwen3::load_plan(h, config);
                if let Some(vision) = vision {
                    plan.slots.extend(qwen3vl_vision::load_plan(h, vision).slots);
                }
                plan
            }
            TextEncoderDetected::Qwen25Vl(config, vision, _) => {
                let mut plan = qwen3::load_plan(h, config);
                let tower = vision.iter().flat_map(VisionConfig::weight_names);
                plan.slots
                    .extend(tower.map(|name| SlotPlan::new(name.clone(), vec![(0, h.key(&name))])));
                plan
            }
            TextEncoderDetected::ClipL(config) => clip_text::load_plan(h, config),
            TextEncoderDetected::T5(config) | TextEncoderDetected::T5Alone(config) => {
                t5::load_plan(h, config)
            }
            TextEncoderDetected::Mistral3(found) => mistral3::load_plan_for(h, found),
            TextEncoderDetected::Umt5(found) => t5::umt5_load_plan(h, &found.config),
            TextEncoderDetected::Llama3(config) => llama3::load_plan(h, config),
            TextEncoderDetected::Gemma2(found) | TextEncoderDetected::PixelDit(found) => {
                gemma2::load_plan(h, &found.config)
            }
        }
    }

    /// What ComfyUI's `CLIPLoader` makes of this file with type `kind` (its `sd.py`): a Qwen3 becomes FLUX.2
    /// Klein's encoder with type `flux2` or `flux`, and at Qwen3-8B's width with any type but `ideogram4` (Ideogram
    /// 4's encoder, which Kiln lacks: an error); any other Qwen3 stays Z-Image's. Mistral Small 3.x is FLUX.2
    /// dev's encoder whatever the type (ComfyUI picks it by the file alone). umT5-XXL is Wan's encoder with type
    /// `wan` and an error with any other (ComfyUI loads a T5-XXL-shaped file as T5-XXL then, and fails on umT5's
    /// vocabulary); a T5-XXL file with type `wan` is an error too (ComfyUI fails on its vocabulary and missing
    /// tokenizer). Type `flux2` with any other file is an error naming what the file is, and so is a Qwen3 too
    /// shallow for Klein's taps (fewer than 27 layers). Qwen2.5-VL is LongCat-Image's encoder with type
    /// `longcat_image` and Qwen-Image's with any other; the other files are what they are.
    pub fn for_clip_type(self, kind: &str) -> Result<TextEncoderDetected> {
        let klein_type = matches!(kind, "flux2" | "flux");
        match self {
            // ComfyUI's `detect_te_model` names a Qwen3 of 0.6B's width Anima's encoder, whatever the type.
            TextEncoderDetected::Qwen3(config) | TextEncoderDetected::Anima(config)
                if config.hidden == anima::family::QWEN3_06B_HIDDEN =>
            {
                Ok(TextEncoderDetected::Anima(config))
            }
            TextEncoderDetected::Qwen3Vl(config, ..)
                if config.hidden == qwen3::family::QWEN3VL_32B_HIDDEN =>
            {
                Err(Error::Invalid(
                    "this is Qwen3-VL 32B, MiniMax H3's conditioning encoder, which Kiln does not run".to_owned(),
                ))
            }
            // A role's type makes a file of the role's size that model's encoder (ComfyUI: Boogu's and JoyImage's
            // on Qwen3-VL 8B, Krea 2's and Mage-Flow's on 4B); the other released size falls to the generic
            // encoder below, as in ComfyUI. A file of neither released width (a tiny stand-in) takes the role.
            TextEncoderDetected::Qwen3Vl(config, vision, _)
                if let Some(role) = Qwen3VlRole::of_clip_type(kind)
                    && role.fits_width(config.hidden) =>
            {
                Ok(TextEncoderDetected::Qwen3Vl(config, vision, Some(role)))
            }
            TextEncoderDetected::Qwen3Vl(..) if klein_type => Err(Error::Invalid(format!(
                "type `{kind}` makes a Qwen3-VL file FLUX.2 Klein's text encoder, which Kiln takes only as a \
                 Qwen3 file (qwen_3_4b / qwen_3_8b)"
            ))),
            TextEncoderDetected::Qwen3Vl(config, ..)
                if kind == "ideogram4" && config.hidden == qwen3::family::QWEN3_8B_HIDDEN =>
            {
                Err(Error::Invalid(
                    "type `ideogram4` makes Qwen3-VL 8B Ideogram 4's text encoder, which Kiln does not run"
                        .to_owned(),
                ))
            }
            // Any other type: ComfyUI's generic Qwen3-VL encoder.
            TextEncoderDetected::Qwen3Vl(config, vision, _) => {
                Ok(TextEncoderDetected::Qwen3Vl(config, vision, Some(Qwen3VlRole::Plain)))
            }
            // A Qwen3 file without a vision tower (the language model alone) of neither released width takes a
            // role's type; ComfyUI makes a released Qwen3-4B or 8B Z-Image's or FLUX.2 Klein's encoder whatever
            // the type (below).
            TextEncoderDetected::Qwen3(config)
                if let Some(role) = Qwen3VlRole::of_clip_type(kind)
                    && !Qwen3VlRole::is_released_width(config.hidden) =>
            {
                Ok(TextEncoderDetected::Qwen3Vl(config.as_qwen3vl(), None, Some(role)))
            }
            // ComfyUI tells Ovis 2.5's Qwen3 2B by its width, whatever the type; type `ovis` makes a file of no
            // released Qwen3 width (a tiny one) Ovis-Image's too, never a released 4B or 8B.
            TextEncoderDetected::Qwen3(config) | TextEncoderDetected::Ovis(config)
                if config.hidden == qwen3::family::QWEN3_2B_HIDDEN
                    || (kind == OVIS_CLIP_TYPE && !Qwen3VlRole::is_released_width(config.hidden)) =>
            {
                Ok(TextEncoderDetected::Ovis(config))
            }
            TextEncoderDetected::Qwen3(config)
                if config.hidden == qwen3::family::QWEN3_8B_HIDDEN =>
            {
                if kind == "ideogram4" {
                    return Err(Error::Invalid(
                        "type `ideogram4` makes Qwen3-8B Ideogram 4's text encoder, which Kiln does not \
                         run; FLUX.2 Klein 9B's encoder is the same file with type `flux2`"
                            .to_owned(),
                    ));
                }
                klein(config)
            }
            TextEncoderDetected::Qwen3(config) if klein_type => klein(config),
            TextEncoderDetected::Flux2Klein(config) => klein(config),
            TextEncoderDetected::Qwen25Vl(config, vision, _) if kind == LONGCAT_CLIP_TYPE => {
                Ok(TextEncoderDetected::Qwen25Vl(config, vision, Qwen25Role::LongCatImage))
            }
            // ComfyUI's `detect_te_model` names a Qwen2.5-VL whose key projection has 256 rows (the 3B) OmniGen2's
            // encoder, whatever the type (and a 7B Qwen-Image's with type `omnigen2`).
            TextEncoderDetected::Qwen25Vl(config, vision, _)
                if config.kv_heads * config.head_dim == OMNIGEN2_KV_ROWS =>
            {
                Ok(TextEncoderDetected::Qwen25Vl(config, vision, Qwen25Role::OmniGen2))
            }
            TextEncoderDetected::Mistral3(found) => Ok(TextEncoderDetected::Mistral3(found)),
            // ComfyUI makes Gemma 2 2B Lumina 2's encoder with any type but `pixeldit` (PixelDiT's, with its own
            // tokenizer options).
            TextEncoderDetected::Gemma2(found) | TextEncoderDetected::PixelDit(found)
                if kind == PIXELDIT_CLIP_TYPE =>
            {
                Ok(TextEncoderDetected::PixelDit(found))
            }
            TextEncoderDetected::Umt5(found) if kind == t5::family::WAN_CLIP_TYPE => {
                Ok(TextEncoderDetected::Umt5(found))
            }
            TextEncoderDetected::Umt5(_) => Err(Error::Invalid(format!(
                "type `{kind}` loads a T5-XXL-shaped file as T5-XXL, which this umT5-XXL file is not (another \
                 vocabulary, a position bias per block); umT5-XXL is Wan's text encoder: load it with type `wan`"
            ))),
            TextEncoderDetected::T5(config) if kind == CHROMA_CLIP_TYPE || kind == "pixart" => {
                Ok(TextEncoderDetected::T5Alone(config))
            }
            TextEncoderDetected::T5(_) if kind == t5::family::WAN_CLIP_TYPE => Err(Error::Invalid(
                "type `wan` takes Wan's umT5-XXL text encoder (umt5_xxl_*.safetensors); this file is T5-XXL, \
                 FLUX.1's encoder"
                    .to_owned(),
            )),
            other if kind == "flux2" => Err(Error::Invalid(format!(
                "type `flux2` takes FLUX.2 dev's Mistral Small 3 or FLUX.2 Klein's Qwen3-4B or Qwen3-8B text \
                 encoder; this file is {}",
                other.name()
            ))),
            other => Ok(other),
        }
    }

    /// What `CLIPLoader` with type `kind` makes of this file (after [`TextEncoderDetected::for_clip_type`]) and
    /// its `weights`: with type `hidream` a CLIP-L, CLIP-G or T5-XXL file is HiDream's encoder with that part alone
    /// (ComfyUI's `load_clip`; the other parts zeros); otherwise [`TextEncoderDetected::build`].
    pub fn build_for_clip_type(self, weights: Model, kind: &str) -> Result<TextEncoderNet> {
        match (kind, &self) {
            (
                HIDREAM_CLIP_TYPE | SD3_CLIP_TYPE,
                TextEncoderDetected::ClipL(_) | TextEncoderDetected::T5(_),
            ) => TextEncoderNet::combine(vec![(self, weights)], kind),
            // ComfyUI makes a lone CLIP-G SDXL's refiner's encoder with any type but these (`load_clip`).
            (_, TextEncoderDetected::ClipL(config))
                if config.variant == clip_text::Variant::G
                    && !matches!(kind, "sd3" | "stable_cascade") =>
            {
                TextEncoderNet::combine(vec![(self, weights)], SDXL_REFINER_CLIP_KIND)
            }
            _ => self.build(weights),
        }
    }

    /// The encoder with `weights` loaded from [`TextEncoderDetected::load_plan`], and its tokenizer. CLIP-L
    /// and T5-XXL condition nothing Kiln runs on their own: they are an error naming the loader that pairs
    /// them.
    pub fn build(self, weights: Model) -> Result<TextEncoderNet> {
        Ok(match self {
            TextEncoderDetected::ClipL(_) | TextEncoderDetected::T5(_) => {
                return Err(Error::Invalid(format!(
                    "a {} text encoder alone conditions no model Kiln runs with the CLIPLoader type given; FLUX.1 \
                     takes CLIP-L and T5-XXL together (DualCLIPLoader, type `flux`), Chroma T5-XXL with type \
                     `chroma`",
                    self.name()
                )));
            }
            // ComfyUI makes a Llama 3.1 file HiDream's encoder whatever the type (`load_clip`), its other parts
            // zeros.
            TextEncoderDetected::Llama3(config) => {
                HiDreamEncoders::net(None, None, None, Some(Qwen3::new(config, weights)))?
            }
            TextEncoderDetected::Qwen3(config) => TextEncoderNet::Qwen3 {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
            },
            TextEncoderDetected::Qwen25Vl(config, vision, role) => TextEncoderNet::Qwen25Vl {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
                vision,
                role,
            },
            TextEncoderDetected::Flux2Klein(config) => TextEncoderNet::Flux2Klein {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
            },
            TextEncoderDetected::Qwen3Vl(config, vision, Some(role)) => TextEncoderNet::Qwen3Vl {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
                vision,
                role,
            },
            TextEncoderDetected::Qwen3Vl(_, _, None) => {
                return Err(Error::Invalid(
                    "Kiln runs a Qwen3-VL file as Boogu-Image's, Krea 2's or Mage-Flow's text encoder: load it \
                     with CLIPLoader type boogu, krea2 or mage"
                        .to_owned(),
                ));
            }
            TextEncoderDetected::Ovis(config) => TextEncoderNet::Ovis {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
            },
            TextEncoderDetected::Anima(config) => TextEncoderNet::Anima {
                model: Qwen3::new(config, weights),
                tokenizer: Tokenizer::bundled()?,
                t5_tokenizer: t5::Tokenizer::bundled()?,
            },
            TextEncoderDetected::Mistral3(found) => TextEncoderNet::Mistral3 {
                tokenizer: found.tokenizer()?,
                size: found.size,
                model: Qwen3::new(found.config, weights),
            },
            TextEncoderDetected::Umt5(found) => TextEncoderNet::Umt5 {
                tokenizer: found.tokenizer()?,
                model: T5::umt5(found.config, weights),
            },
            TextEncoderDetected::Gemma2(found) => TextEncoderNet::Gemma2 {
                tokenizer: found.tokenizer()?,
                model: Qwen3::new(found.config, weights),
                pixeldit: false,
            },
            TextEncoderDetected::PixelDit(found) => TextEncoderNet::Gemma2 {
                tokenizer: found.tokenizer()?,
                model: Qwen3::new(found.config, weights),
                pixeldit: true,
            },
            TextEncoderDetected::T5Alone(config) => TextEncoderNet::T5Xxl {
                model: T5::new(config, weights),
                tokenizer: t5::Tokenizer::bundled()?,
            },
        })
    }
}

/// A Qwen3 of `config` as FLUX.2 Klein's encoder; an error when it is too shallow for Klein's deepest tap (ComfyUI
/// would fail only when encoding).
fn klein(config: qwen3::Config) -> Result<TextEncoderDetected> {
    let deepest = qwen3::KLEIN_TAPS[qwen3::KLEIN_TAPS.len() - 1];
    if config.layers < deepest {
        return Err(Error::Invalid(format!(
            "FLUX.2 Klein's text encoder takes Qwen3's hidden states {:?}; this Qwen3 has only {} layers",
            qwen3::KLEIN_TAPS,
            config.layers
        )));
    }
    Ok(TextEncoderDetected::Flux2Klein(config))
}

/// The `CLIPLoader`/`DualCLIPLoader` type of HiDream's encoders (`QuadrupleCLIPLoader` always makes them).
pub const HIDREAM_CLIP_TYPE: &str = "hidream";

/// The widths ComfyUI's `HiDreamTEModel` gives a missing encoder's zeros: CLIP-L's and CLIP-G's pooled vectors, T5-XXL's
/// 128 states and Llama's, one state of one token for each of 32 layers.
const HIDREAM_ZEROS: (usize, usize, [usize; 3], [usize; 4]) =
    (768, 1280, [1, 128, 4096], [1, 32, 1, 4096]);

/// `DualCLIPLoader`'s type of SDXL's CLIP-L + CLIP-G.
pub const SDXL_CLIP_TYPE: &str = "sdxl";
/// `DualCLIPLoader`'s type for HunyuanVideo 1.0's CLIP-L and LLaVA-Llama 3 8B.
pub const HUNYUAN_VIDEO_CLIP_TYPE: &str = "hunyuan_video";
/// `DualCLIPLoader`'s type for HunyuanVideo 1.5's Qwen2.5-VL 7B and ByT5 (also Capybara's).
pub const HUNYUAN_VIDEO15_CLIP_TYPE: &str = "hunyuan_video_15";

/// `CLIPLoader`'s type that makes a Qwen3 file (Qwen3-VL 8B's language model) Boogu-Image's text encoder.
pub const BOOGU_CLIP_TYPE: &str = "boogu";

/// `CLIPLoader`'s type that makes a Qwen3 file (Qwen3-VL 4B's language model) Krea 2's text encoder.
pub const KREA2_CLIP_TYPE: &str = "krea2";

/// `CLIPLoader`'s type that makes a Qwen3 file (Qwen3-VL 4B's language model) Mage-Flow's text encoder.
pub const MAGE_CLIP_TYPE: &str = "mage";

/// `CLIPLoader`'s type that makes a Qwen3-VL 8B file JoyAI Image Edit's text encoder.
pub const JOYIMAGE_CLIP_TYPE: &str = "joyimage";

/// Whose text encoder a Qwen3-VL language model is (by `CLIPLoader`'s type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen3VlRole {
    /// Boogu-Image's (type `boogu`, Qwen3-VL 8B).
    Boogu,
    /// Krea 2's (type `krea2`, Qwen3-VL 4B).
    Krea2,
    /// Mage-Flow's (type `mage`, Qwen3-VL 4B).
    MageFlow,
    /// JoyAI Image Edit's (type `joyimage`, Qwen3-VL 8B).
    JoyImage,
    /// ComfyUI's generic Qwen3-VL encoder (a Qwen3-VL file under any other type Kiln takes it with).
    Plain,
}

impl Qwen3VlRole {
    /// The role `CLIPLoader`'s type `kind` gives a Qwen3-VL file, if it gives one.
    pub fn of_clip_type(kind: &str) -> Option<Qwen3VlRole> {
        match kind {
            BOOGU_CLIP_TYPE => Some(Qwen3VlRole::Boogu),
            KREA2_CLIP_TYPE => Some(Qwen3VlRole::Krea2),
            MAGE_CLIP_TYPE => Some(Qwen3VlRole::MageFlow),
            JOYIMAGE_CLIP_TYPE => Some(Qwen3VlRole::JoyImage),
            _ => None,
        }
    }

    /// Whether `hidden` is the width of a released Qwen3 (-VL) 4B or 8B.
    pub fn is_released_width(hidden: usize) -> bool {
        matches!(hidden, qwen3::family::QWEN3_4B_HIDDEN | qwen3::family::QWEN3_8B_HIDDEN)
    }

    /// Whether ComfyUI gives this role to a Qwen3-VL language model `hidden` wide: Boogu and JoyImage to 8B,
    /// Krea 2 and Mage-Flow to 4B; a width of neither released size (a tiny stand-in) fits every role.
    pub fn fits_width(self, hidden: usize) -> bool {
        let released = match self {
            Qwen3VlRole::Boogu | Qwen3VlRole::JoyImage => qwen3::family::QWEN3_8B_HIDDEN,
            Qwen3VlRole::Krea2 | Qwen3VlRole::MageFlow => qwen3::family::QWEN3_4B_HIDDEN,
            Qwen3VlRole::Plain => return true,
        };
        hidden == released || !Self::is_released_width(hidden)
    }

    /// The text encoder family it makes the file.
    pub fn family(self) -> TextEncoderFamily {
        match self {
            Qwen3VlRole::Boogu => TextEncoderFamily::Boogu,
            Qwen3VlRole::Krea2 => TextEncoderFamily::Krea2,
            Qwen3VlRole::MageFlow => TextEncoderFamily::MageFlow,
            Qwen3VlRole::JoyImage => TextEncoderFamily::JoyImage,
            Qwen3VlRole::Plain => TextEncoderFamily::Qwen3Vl,
        }
    }
}

/// `CLIPLoader`'s type that makes a Qwen3 file Ovis-Image's text encoder.
pub const OVIS_CLIP_TYPE: &str = "ovis";

/// `TripleCLIPLoader`'s (and `DualCLIPLoader`'s, `CLIPLoader`'s) type of SD3's encoders.
pub const SD3_CLIP_TYPE: &str = "sd3";

/// `DualCLIPLoader`'s type of Kandinsky 5 Lite's image model's encoders (Qwen2.5-VL 7B + CLIP-L).
pub const KANDINSKY5_IMAGE_CLIP_TYPE: &str = "kandinsky5_image";

/// `CLIPLoader`'s type that makes Gemma 2 2B PixelDiT's text encoder (which Kiln does not run) rather than
/// Lumina 2's.
pub const PIXELDIT_CLIP_TYPE: &str = "pixeldit";

/// `DualCLIPLoader`'s type of Kandinsky 5's video models' encoders (the same files under the video template).
pub const KANDINSKY5_CLIP_TYPE: &str = "kandinsky5";

/// How SDXL's refiner's CLIP-G is combined: its encoder alone (ComfyUI's `SDXLRefinerClipModel`).
pub const SDXL_REFINER_CLIP_KIND: &str = "sdxl_refiner";

/// `CLIPLoader`'s type that makes a T5-XXL file Chroma's text encoder on its own (`pixart` does the same).
pub const CHROMA_CLIP_TYPE: &str = "chroma";

/// `T5TokenizerOptions`' settings for a prompt's T5 tokens (ComfyUI's `t5xxl_min_padding`, `t5xxl_min_length`
/// tokenizer options): `None` leaves the tokenizer's own.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct T5Options {
    /// Pads added after the end token.
    pub min_padding: Option<usize>,
    /// The length padded to.
    pub min_length: Option<usize>,
}

impl T5Options {
    /// `layout` with these options in place of its own.
    pub fn apply(self, layout: &prompt_weights::Layout) -> prompt_weights::Layout {
        prompt_weights::Layout {
            min_padding: self.min_padding.or(layout.min_padding),
            min_length: self.min_length.or(layout.min_length),
            ..*layout
        }
    }
}

/// `CLIPLoader`'s type that makes a Qwen2.5-VL file LongCat-Image's text encoder.
pub const LONGCAT_CLIP_TYPE: &str = "longcat_image";

/// Whose text encoder a Qwen2.5-VL file is: the same network under another template and output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Qwen25Role {
    /// Qwen-Image's (and its Edit models'): ComfyUI's Qwen-Image chat templates, the prefix cut off.
    QwenImage,
    /// LongCat-Image's (`CLIPLoader` type `longcat_image`): its templates around a prompt padded to 512 tokens,
    /// the prefix and suffix cut off.
    LongCatImage,
    /// OmniGen2's (Qwen2.5-VL 3B, by its width, as ComfyUI tells it): its template, prompt weights applied, the last
    /// layer's output through the final norm over every token.
    OmniGen2,
}

/// `CLIPLoader`'s type of OmniGen2's text encoder (a Qwen2.5-VL 3B file is OmniGen2's whatever the type).
pub const OMNIGEN2_CLIP_TYPE: &str = "omnigen2";

/// The key projection's rows that make a Qwen2.5-VL file the 3B, OmniGen2's encoder (ComfyUI's `detect_te_model`:
/// `k_proj.bias` of 256).
const OMNIGEN2_KV_ROWS: usize = 256;

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
    /// A Qwen3-VL encoder's prompt with images, as its tokenizer lays them out: `Image j: ` and a slot per image in
    /// the edit template (Mage-Flow's, `TextEncodeMageFlowEdit`), or a slot per image in Boogu's image template
    /// (`TextEncodeBooguEdit`).
    Numbered {
        /// How many images come with the prompt.
        images: usize,
    },
}

/// A prompt as an encoder's tokenizer lays it out.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptTokens {
    /// One sequence of ids (the Qwen families' templates, Klein's padded; no weighting).
    Ids(Vec<u32>),
    /// FLUX.1's: CLIP-L's and T5-XXL's weighted sections, as ComfyUI's `FluxTokenizer` makes them.
    Flux {
        /// CLIP-L's 77-token sections.
        clip_l: Vec<Vec<Weighted>>,
        /// T5-XXL's one section, padded to 256.
        t5: Vec<Vec<Weighted>>,
    },
    /// One encoder's weighted sections, as ComfyUI's `SDTokenizer` lays them out (umT5's: one section padded to
    /// 512).
    Weighted(Vec<Vec<Weighted>>),
    /// HiDream's four encoders' weighted sections, as ComfyUI's `HiDreamTokenizer` makes them.
    HiDream(Box<HiDreamTokens>),
    /// SDXL's CLIP-L and CLIP-G weighted sections, as ComfyUI's `SDXLTokenizer` makes them.
    Sdxl(Box<SdxlTokens>),
    /// SD3's CLIP-L, CLIP-G and T5-XXL weighted sections, as ComfyUI's `SD3Tokenizer` makes them.
    Sd3(Box<Sd3Tokens>),
    /// Kandinsky 5's Qwen2.5-VL ids and CLIP-L sections, as ComfyUI's `Kandinsky5Tokenizer` makes them.
    Kandinsky5(Box<Kandinsky5Tokens>),
    /// HunyuanVideo 1.5's Qwen2.5-VL ids and ByT5 section, as ComfyUI's `HunyuanVideo15Tokenizer` makes them.
    HunyuanVideo15(Box<HunyuanVideo15Tokens>),
    /// HunyuanVideo 1.0's Llama and CLIP-L tokens, as ComfyUI's `HunyuanVideoTokenizer` makes them.
    HunyuanVideo1(Box<HunyuanVideo1Tokens>),
    /// Anima's Qwen3 ids and T5 tokens, as ComfyUI's `AnimaTokenizer` makes them.
    Anima(Box<AnimaTokens>),
}

/// HiDream's tokens: each encoder's weighted sections.
#[derive(Debug, Clone, PartialEq)]
pub struct HiDreamTokens {
    /// CLIP-L's sections of its position count (77, or a long CLIP's 248), EOS-padded.
    pub clip_l: Vec<Vec<Weighted>>,
    /// CLIP-G's, padded with 0.
    pub clip_g: Vec<Vec<Weighted>>,
    /// T5-XXL's first section of 128 tokens.
    pub t5: Vec<Weighted>,
    /// Llama's one section, BOS first, padded with `<|eot_id|>` to 128.
    pub llama: Vec<Weighted>,
}

/// What an encoder gives for a prompt: the conditioning `[1, N, D]` and, for families that have one, the
/// pooled vector `[1, D']`.
pub struct Encoded<B: Backend> {
    /// The token states the model attends to.
    pub cond: Tensor<B>,
    /// The pooled vector (FLUX.1: CLIP-L's).
    pub pooled: Option<Tensor<B>>,
    /// HiDream's Llama states `[1, L, M, D]` (ComfyUI's `conditioning_llama3`: each layer's output, the last
    /// through the final norm); `None` for the other families.
    pub llama: Option<Tensor<B>>,
    /// Anima's T5 tokens with their weights (ComfyUI's `t5xxl_ids`, `t5xxl_weights`), which its model's LLM
    /// adapter reads; `None` for the other families.
    pub t5_tokens: Option<Vec<Weighted>>,
    /// HunyuanVideo 1.5's ByT5 states of the prompt's quoted passages `[1, M, D]` (ComfyUI's
    /// `conditioning_byt5small`); `None` for the other families and prompts that quote nothing.
    pub byt5: Option<Tensor<B>>,
}

impl<B: Backend> Encoded<B> {
    /// The states `cond` and the pooled vector `pooled`, nothing else riding along (every family's but HiDream's
    /// and Anima's).
    pub fn new(cond: Tensor<B>, pooled: Option<Tensor<B>>) -> Encoded<B> {
        Encoded { cond, pooled, llama: None, t5_tokens: None, byt5: None }
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
    /// Qwen2.5-VL's language model (the same decoder code) with the same tokenizer, and the vision tower
    /// when the file has one (its weights are in `model`'s, as `visual.*`).
    Qwen25Vl {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
        /// The vision tower's widths.
        vision: Option<VisionConfig>,
        /// Whose encoder it is: the template and the part of the output it conditions on.
        role: Qwen25Role,
    },
    /// FLUX.2 Klein's Qwen3 (the same decoder code as [`TextEncoderNet::Qwen3`]) with the same tokenizer.
    Flux2Klein {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
    },
    /// FLUX.2 dev's Mistral Small 3.x or ERNIE-Image's Ministral 3 3B (the Qwen3 decoder code) with the Tekken
    /// tokenizer of its file.
    Mistral3 {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: mistral3::Tokenizer,
        /// Which of the two it is.
        size: mistral3::Size,
    },
    /// FLUX.1's CLIP-L and T5-XXL, with their tokenizers.
    Flux {
        /// CLIP-L.
        clip_l: ClipText,
        /// T5-XXL.
        t5: T5,
        /// CLIP's tokenizer.
        clip_tokenizer: clip_text::Tokenizer,
        /// T5's tokenizer.
        t5_tokenizer: t5::Tokenizer,
    },
    /// T5-XXL alone (Chroma's, CLIPLoader type `chroma`), with ComfyUI's PixArt prompt layout.
    T5Xxl {
        /// The encoder.
        model: T5,
        /// Its tokenizer.
        tokenizer: t5::Tokenizer,
    },
    /// Wan's umT5-XXL with the SentencePiece tokenizer of its file.
    Umt5 {
        /// The encoder.
        model: T5,
        /// Its tokenizer.
        tokenizer: t5::SentencePiece,
    },
    /// HiDream's four encoders with their tokenizers.
    HiDream(Box<HiDreamEncoders>),
    /// SDXL's CLIP-L and CLIP-G (the refiner's: CLIP-G alone) with CLIP's tokenizer.
    Sdxl(Box<SdxlEncoders>),
    /// SD3's CLIP-L, CLIP-G and T5-XXL (any of them) with their tokenizers.
    Sd3(Box<Sd3Encoders>),
    /// A Qwen3-VL language model (the Qwen3 decoder code) with the Qwen tokenizer: Boogu-Image's, Krea 2's or
    /// Mage-Flow's.
    Qwen3Vl {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
        /// The vision tower, when the file has one.
        vision: Option<qwen3vl_vision::Config>,
        /// Whose encoder it is.
        role: Qwen3VlRole,
    },
    /// Ovis-Image's Qwen3 (the Qwen3 decoder code) with the Qwen tokenizer.
    Ovis {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
    },
    /// Kandinsky 5's Qwen2.5-VL and CLIP-L with their tokenizers.
    Kandinsky5(Box<Kandinsky5Encoders>),
    /// HunyuanVideo 1.5's Qwen2.5-VL and ByT5 with the Qwen tokenizer.
    HunyuanVideo15(Box<HunyuanVideo15Encoders>),
    /// HunyuanVideo 1.0's LLaVA-Llama 3 and CLIP-L with their tokenizers.
    HunyuanVideo1(Box<HunyuanVideo1Encoders>),
    /// Lumina 2's or PixelDiT's Gemma 2 (the Qwen3 decoder code) with the SentencePiece tokenizer of its file.
    Gemma2 {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: gemma2::Tokenizer,
        /// PixelDiT's (`CLIPLoader` type `pixeldit`) rather than Lumina 2's.
        pixeldit: bool,
    },
    /// Anima's Qwen3 0.6B (the Qwen3 decoder code) with the Qwen tokenizer, and T5's for the adapter's tokens.
    Anima {
        /// The network.
        model: Qwen3,
        /// Its tokenizer.
        tokenizer: Tokenizer,
        /// T5's tokenizer.
        t5_tokenizer: t5::Tokenizer,
    },
}

/// HiDream's encoders (`QuadrupleCLIPLoader`'s four, or as ComfyUI allows, any of them: `DualCLIPLoader` or
/// `CLIPLoader` with type `hidream`, a Llama 3.1 file alone) and their tokenizers. A missing encoder's part of
/// the conditioning is zeros of its released shape, as ComfyUI's `HiDreamTEModel` fills it.
pub struct HiDreamEncoders {
    /// CLIP-L (HiDream's long CLIP-L: 248 positions), for its projected pooled vector.
    pub clip_l: Option<ClipText>,
    /// CLIP-G, for its projected pooled vector.
    pub clip_g: Option<ClipText>,
    /// T5-XXL.
    pub t5: Option<T5>,
    /// Llama 3.1 8B Instruct (the Qwen3 decoder code).
    pub llama: Option<Qwen3>,
    /// CLIP's tokenizer (both towers').
    pub clip_tokenizer: clip_text::Tokenizer,
    /// T5's tokenizer.
    pub t5_tokenizer: t5::Tokenizer,
    /// Llama 3's tokenizer.
    pub llama_tokenizer: llama3::Tokenizer,
}

impl TextEncoderNet {
    /// The family.
    pub fn family(&self) -> TextEncoderFamily {
        match self {
            TextEncoderNet::Qwen3 { .. } => TextEncoderFamily::Qwen3,
            TextEncoderNet::Qwen25Vl { .. } => TextEncoderFamily::Qwen25Vl,
            TextEncoderNet::Flux { .. } => TextEncoderFamily::Flux,
            TextEncoderNet::Flux2Klein { .. } => TextEncoderFamily::Flux2Klein,
            TextEncoderNet::Mistral3 { size: mistral3::Size::Small24B, .. } => {
                TextEncoderFamily::Mistral3
            }
            TextEncoderNet::Mistral3 { size: mistral3::Size::Ministral3B, .. } => {
                TextEncoderFamily::Ernie
            }
            TextEncoderNet::Umt5 { .. } => TextEncoderFamily::Umt5Xxl,
            TextEncoderNet::T5Xxl { .. } => TextEncoderFamily::T5Xxl,
            TextEncoderNet::HiDream(_) => TextEncoderFamily::HiDream,
            TextEncoderNet::Sdxl(_) => TextEncoderFamily::Sdxl,
            TextEncoderNet::Sd3(_) => TextEncoderFamily::Sd3,
            TextEncoderNet::Ovis { .. } => TextEncoderFamily::Ovis,
            TextEncoderNet::Qwen3Vl { role, .. } => role.family(),
            TextEncoderNet::Kandinsky5(_) => TextEncoderFamily::Kandinsky5,
            TextEncoderNet::HunyuanVideo15(_) => TextEncoderFamily::HunyuanVideo15,
            TextEncoderNet::HunyuanVideo1(_) => TextEncoderFamily::HunyuanVideo,
            TextEncoderNet::Anima { .. } => TextEncoderFamily::Anima,
            TextEncoderNet::Gemma2 { pixeldit: false, .. } => TextEncoderFamily::Gemma2,
            TextEncoderNet::Gemma2 { pixeldit: true, .. } => TextEncoderFamily::PixelDit,
        }
    }

    /// The weights, under the memory manager (FLUX.1's: T5-XXL's, the larger; [`TextEncoderNet::models`]
    /// lists both).
    pub fn weights(&self) -> &Model {
        match self {
            TextEncoderNet::Qwen3 { model, .. }
            | TextEncoderNet::Qwen25Vl { model, .. }
            | TextEncoderNet::Flux2Klein { model, .. }
            | TextEncoderNet::Ovis { model, .. }
            | TextEncoderNet::Qwen3Vl { model, .. }
            | TextEncoderNet::Anima { model, .. }
            | TextEncoderNet::Gemma2 { model, .. }
            | TextEncoderNet::Mistral3 { model, .. } => &model.weights,
            TextEncoderNet::Flux { t5, .. } => &t5.weights,
            TextEncoderNet::Umt5 { model, .. } | TextEncoderNet::T5Xxl { model, .. } => {
                &model.weights
            }
            TextEncoderNet::HiDream(e) => e.models()[0],
            TextEncoderNet::Sdxl(e) => &e.clip_g.weights,
            TextEncoderNet::Sd3(e) => e.models()[0],
            TextEncoderNet::Kandinsky5(e) => &e.qwen.weights,
            TextEncoderNet::HunyuanVideo15(e) => &e.qwen.weights,
            TextEncoderNet::HunyuanVideo1(e) => &e.llama.weights,
        }
    }

    /// Every file's weights.
    pub fn models(&self) -> Vec<&Model> {
        match self {
            TextEncoderNet::Flux { clip_l, t5, .. } => vec![&t5.weights, &clip_l.weights],
            TextEncoderNet::HiDream(e) => e.models(),
            TextEncoderNet::Sdxl(e) => e.models(),
            TextEncoderNet::Sd3(e) => e.models(),
            TextEncoderNet::Kandinsky5(e) => e.models(),
            TextEncoderNet::HunyuanVideo15(e) => e.models(),
            TextEncoderNet::HunyuanVideo1(e) => e.models(),
            _ => vec![self.weights()],
        }
    }

    /// Whether `parts` (detected, not yet loaded) make an encoder ComfyUI's `DualCLIPLoader` or
    /// `QuadrupleCLIPLoader` combines by `kind` (its `type`): `flux` takes one CLIP-L and one T5-XXL, `hidream`
    /// any of CLIP-L, CLIP-G, T5-XXL and Llama 3.1, each at most once (`QuadrupleCLIPLoader`: all four), in any
    /// order. An error says what they are.
    pub fn check_combination(parts: &[&TextEncoderDetected], kind: &str) -> Result<()> {
        let found: Vec<&str> = parts.iter().map(|d| d.name()).collect();
        let found = found.join(" + ");
        fn count(
            parts: &[&TextEncoderDetected],
            want: impl Fn(&TextEncoderDetected) -> bool,
        ) -> usize {
            parts.iter().filter(|d| want(d)).count()
        }
        let clip = |variant: clip_text::Variant| move |d: &TextEncoderDetected| matches!(d, TextEncoderDetected::ClipL(c) if c.variant == variant);
        let clip_l = count(parts, clip(clip_text::Variant::L));
        let clip_g = count(parts, clip(clip_text::Variant::G));
        let t5 = count(parts, |d| matches!(d, TextEncoderDetected::T5(_)));
        let llama = count(parts, |d| matches!(d, TextEncoderDetected::Llama3(_)));
        let qwen25 = count(parts, |d| matches!(d, TextEncoderDetected::Qwen25Vl(..)));
        match kind {
            KANDINSKY5_IMAGE_CLIP_TYPE | KANDINSKY5_CLIP_TYPE
                if parts.len() == 2 && qwen25 == 1 && clip_l == 1 =>
            {
                Ok(())
            }
            KANDINSKY5_IMAGE_CLIP_TYPE | KANDINSKY5_CLIP_TYPE => Err(Error::Invalid(format!(
                "type `{kind}` takes Kandinsky 5's text encoders, a Qwen2.5-VL 7B and a CLIP-L; these files are \
                 {found}"
            ))),
            HUNYUAN_VIDEO_CLIP_TYPE if parts.len() == 2 && clip_l == 1 && llama == 1 => Ok(()),
            HUNYUAN_VIDEO_CLIP_TYPE => Err(Error::Invalid(format!(
                "type `{kind}` takes HunyuanVideo's text encoders, a CLIP-L and a LLaVA-Llama 3 8B; these files are \
                 {found}"
            ))),
            HUNYUAN_VIDEO15_CLIP_TYPE if parts.len() == 2 && qwen25 == 1 && t5 == 1 => Ok(()),
            HUNYUAN_VIDEO15_CLIP_TYPE => Err(Error::Invalid(format!(
                "type `{kind}` takes HunyuanVideo 1.5's text encoders, a Qwen2.5-VL 7B and a ByT5; these files are \
                 {found}"
            ))),
            SDXL_CLIP_TYPE if parts.len() == 2 && clip_l == 1 && clip_g == 1 => Ok(()),
            SDXL_CLIP_TYPE => Err(Error::Invalid(format!(
                "type `sdxl` takes a CLIP-L and a CLIP-G text encoder; these files are {found}"
            ))),
            SDXL_REFINER_CLIP_KIND if parts.len() == 1 && clip_g == 1 => Ok(()),
            SD3_CLIP_TYPE
                if !parts.is_empty()
                    && [clip_l, clip_g, t5].iter().all(|&n| n <= 1)
                    && clip_l + clip_g + t5 == parts.len() =>
            {
                Ok(())
            }
            SD3_CLIP_TYPE => Err(Error::Invalid(format!(
                "type `sd3` takes SD3's text encoders, at most one each of CLIP-L, CLIP-G and T5-XXL; these files \
                 are {found}"
            ))),
            SDXL_REFINER_CLIP_KIND => Err(Error::Invalid(format!(
                "SDXL's refiner takes a CLIP-G text encoder alone; these files are {found}"
            ))),
            "flux" if parts.len() == 2 && clip_l == 1 && t5 == 1 => Ok(()),
            "flux" => Err(Error::Invalid(format!(
                "type `flux` takes a CLIP-L and a T5-XXL text encoder; these files are {found}"
            ))),
            HIDREAM_CLIP_TYPE
                if !parts.is_empty()
                    && [clip_l, clip_g, t5, llama].iter().all(|&n| n <= 1)
                    && clip_l + clip_g + t5 + llama == parts.len() =>
            {
                Ok(())
            }
            HIDREAM_CLIP_TYPE => Err(Error::Invalid(format!(
                "type `hidream` (QuadrupleCLIPLoader) takes HiDream's text encoders, at most one each of CLIP-L, \
                 CLIP-G, T5-XXL and Llama 3.1 8B (QuadrupleCLIPLoader: all four); these files are {found}"
            ))),
            _ => Err(Error::Invalid(format!(
                "type `{kind}` of {found}: Kiln combines text encoders only as FLUX.1's (type `flux`: \
                 CLIP-L + T5-XXL), SDXL's (type `sdxl`: CLIP-L + CLIP-G), SD3's (type `sd3`: any of CLIP-L, \
                 CLIP-G, T5-XXL), Kandinsky 5's (types `kandinsky5_image`, `kandinsky5`: Qwen2.5-VL + CLIP-L), \
                 HunyuanVideo's (type `hunyuan_video`: CLIP-L + LLaVA-Llama 3), HunyuanVideo 1.5's (type \
                 `hunyuan_video_15`: Qwen2.5-VL + ByT5) and HiDream's (QuadrupleCLIPLoader: CLIP-L + CLIP-G + \
                 T5-XXL + Llama 3.1)"
            ))),
        }
    }

    /// The encoder `parts` make together, loaded, once [`TextEncoderNet::check_combination`] accepted them.
    pub fn combine(parts: Vec<(TextEncoderDetected, Model)>, kind: &str) -> Result<TextEncoderNet> {
        let detected: Vec<&TextEncoderDetected> = parts.iter().map(|(d, _)| d).collect();
        TextEncoderNet::check_combination(&detected, kind)?;
        let (mut clip_l, mut clip_g, mut t5, mut llama, mut qwen25) =
            (None, None, None, None, None);
        for (detected, weights) in parts {
            match detected {
                TextEncoderDetected::ClipL(config) if config.variant == clip_text::Variant::G => {
                    clip_g = Some(ClipText::new(config, weights))
                }
                TextEncoderDetected::ClipL(config) => clip_l = Some(ClipText::new(config, weights)),
                TextEncoderDetected::T5(config) => t5 = Some(T5::new(config, weights)),
                TextEncoderDetected::Llama3(config) => llama = Some(Qwen3::new(config, weights)),
                TextEncoderDetected::Qwen25Vl(config, ..) => {
                    qwen25 = Some(Qwen3::new(config, weights))
                }
                TextEncoderDetected::Qwen3(_)
                | TextEncoderDetected::Ovis(_)
                | TextEncoderDetected::Qwen3Vl(..)
                | TextEncoderDetected::Anima(_)
                | TextEncoderDetected::Flux2Klein(_)
                | TextEncoderDetected::Mistral3(_)
                | TextEncoderDetected::T5Alone(_)
                | TextEncoderDetected::Gemma2(_)
                | TextEncoderDetected::PixelDit(_)
                | TextEncoderDetected::Umt5(_) => {}
            }
        }
        if kind == HIDREAM_CLIP_TYPE {
            return HiDreamEncoders::net(clip_l, clip_g, t5, llama);
        }
        if kind == KANDINSKY5_IMAGE_CLIP_TYPE || kind == KANDINSKY5_CLIP_TYPE {
            let (Some(qwen), Some(clip_l)) = (qwen25, clip_l) else {
                return Err(Error::Invalid(format!(
                    "type `{kind}` is missing one of its text encoders (Qwen2.5-VL 7B, CLIP-L)"
                )));
            };
            let video = kind == KANDINSKY5_CLIP_TYPE;
            return Ok(TextEncoderNet::Kandinsky5(Box::new(Kandinsky5Encoders::new(
                qwen, clip_l, video,
            )?)));
        }
        if kind == HUNYUAN_VIDEO_CLIP_TYPE {
            let (Some(llama), Some(clip_l)) = (llama, clip_l) else {
                return Err(Error::Invalid(format!(
                    "type `{kind}` is missing one of its text encoders (CLIP-L, LLaVA-Llama 3 8B)"
                )));
            };
            return Ok(TextEncoderNet::HunyuanVideo1(Box::new(HunyuanVideo1Encoders::new(
                llama, clip_l,
            )?)));
        }
        if kind == HUNYUAN_VIDEO15_CLIP_TYPE {
            let (Some(qwen), Some(byt5)) = (qwen25, t5) else {
                return Err(Error::Invalid(format!(
                    "type `{kind}` is missing one of its text encoders (Qwen2.5-VL 7B, ByT5)"
                )));
            };
            return Ok(TextEncoderNet::HunyuanVideo15(Box::new(HunyuanVideo15Encoders::new(
                qwen, byt5,
            )?)));
        }
        if kind == SD3_CLIP_TYPE {
            return Ok(TextEncoderNet::Sd3(Box::new(Sd3Encoders::new(clip_l, clip_g, t5)?)));
        }
        if kind == SDXL_CLIP_TYPE || kind == SDXL_REFINER_CLIP_KIND {
            let clip_g = clip_g.ok_or_else(|| {
                Error::Invalid(format!("type `{kind}` is missing its CLIP-G text encoder"))
            })?;
            return Ok(TextEncoderNet::Sdxl(Box::new(SdxlEncoders::new(clip_l, clip_g)?)));
        }
        let missing =
            || Error::Invalid(format!("type `{kind}` is missing one of its text encoders"));
        let clip_l = clip_l.ok_or_else(missing)?;
        let t5 = t5.ok_or_else(missing)?;
        Ok(TextEncoderNet::Flux {
            clip_l,
            t5,
            clip_tokenizer: clip_text::Tokenizer::bundled()?,
            t5_tokenizer: t5::Tokenizer::bundled()?,
        })
    }

    /// The tokens ComfyUI feeds the encoder for `prompt` (its template and weighting syntax applied).
    pub fn tokenize(&self, prompt: &str) -> Result<PromptTokens> {
        self.tokenize_with(prompt, T5Options::default())
    }

    /// [`TextEncoderNet::tokenize`] with `T5TokenizerOptions`' settings for the T5 tokens (FLUX.1's and Chroma's
    /// T5-XXL, Wan's umT5-XXL, Anima's adapter's T5 ids; the other families have none).
    pub fn tokenize_with(&self, prompt: &str, options: T5Options) -> Result<PromptTokens> {
        match self {
            TextEncoderNet::T5Xxl { tokenizer, .. } => Ok(PromptTokens::Weighted(
                prompt_weights::tokenize(prompt, &options.apply(&t5::CHROMA_PROMPT_LAYOUT), |w| {
                    tokenizer.word_ids(w)
                })?,
            )),
            TextEncoderNet::Flux { .. } => self.tokenize_flux_with(prompt, prompt, options),
            TextEncoderNet::HiDream(e) => Ok(PromptTokens::HiDream(Box::new(
                e.tokenize([prompt, prompt, prompt, prompt], options)?,
            ))),
            TextEncoderNet::Sdxl(e) => {
                Ok(PromptTokens::Sdxl(Box::new(e.tokenize(prompt, prompt)?)))
            }
            TextEncoderNet::Sd3(e) => Ok(PromptTokens::Sd3(Box::new(e.tokenize(prompt)?))),
            TextEncoderNet::HunyuanVideo15(e) => {
                Ok(PromptTokens::HunyuanVideo15(Box::new(e.tokenize(prompt)?)))
            }
            TextEncoderNet::HunyuanVideo1(e) => {
                Ok(PromptTokens::HunyuanVideo1(Box::new(e.tokenize(prompt)?)))
            }
            TextEncoderNet::Kandinsky5(e) => {
                Ok(PromptTokens::Kandinsky5(Box::new(e.tokenize(prompt)?)))
            }
            TextEncoderNet::Anima { tokenizer, t5_tokenizer, .. } => Ok(PromptTokens::Anima(
                Box::new(anima_text::tokenize(tokenizer, t5_tokenizer, prompt, options)?),
            )),
            TextEncoderNet::Qwen3Vl { tokenizer, role: Qwen3VlRole::Boogu, .. } => {
                Ok(PromptTokens::Ids(tokenizer.boogu_prompt(prompt)?))
            }
            TextEncoderNet::Qwen3Vl { tokenizer, role: Qwen3VlRole::JoyImage, .. } => {
                Ok(PromptTokens::Ids(tokenizer.joyimage_prompt(prompt, 0, true)?))
            }
            TextEncoderNet::Qwen3Vl { tokenizer, role: Qwen3VlRole::Plain, .. } => {
                Ok(PromptTokens::Ids(tokenizer.qwen3vl_plain_prompt(
                    prompt,
                    0,
                    ChatOptions::default(),
                )?))
            }
            TextEncoderNet::Qwen3Vl { tokenizer, .. } => {
                Ok(PromptTokens::Ids(tokenizer.qwen3vl_image_prompt(prompt)?))
            }
            TextEncoderNet::Ovis { tokenizer, .. } => {
                Ok(PromptTokens::Ids(tokenizer.ovis_prompt(prompt)?))
            }
            TextEncoderNet::Qwen3 { tokenizer, .. } => {
                Ok(PromptTokens::Ids(tokenizer.zimage_prompt(prompt)?))
            }
            TextEncoderNet::Qwen25Vl { tokenizer, role: Qwen25Role::QwenImage, .. } => {
                Ok(PromptTokens::Ids(tokenizer.qwen_image_prompt(prompt)?))
            }
            TextEncoderNet::Qwen25Vl { tokenizer, role: Qwen25Role::LongCatImage, .. } => {
                Ok(PromptTokens::Ids(tokenizer.longcat_prompt(prompt, false)?))
            }
            TextEncoderNet::Qwen25Vl { tokenizer, role: Qwen25Role::OmniGen2, .. } => {
                Ok(PromptTokens::Weighted(tokenizer.omnigen2_prompt(prompt)?))
            }
            TextEncoderNet::Flux2Klein { tokenizer, .. } => {
                Ok(PromptTokens::Ids(tokenizer.klein_prompt(prompt)?))
            }
            TextEncoderNet::Mistral3 { tokenizer, size: mistral3::Size::Small24B, .. } => {
                Ok(PromptTokens::Ids(tokenizer.flux2_prompt(prompt)?))
            }
            TextEncoderNet::Mistral3 { tokenizer, size: mistral3::Size::Ministral3B, .. } => {
                Ok(PromptTokens::Ids(tokenizer.plain_prompt(prompt)?))
            }
            TextEncoderNet::Gemma2 { tokenizer, pixeldit: false, .. } => {
                Ok(PromptTokens::Weighted(tokenizer.tokens(prompt)?))
            }
            TextEncoderNet::Gemma2 { tokenizer, pixeldit: true, .. } => {
                Ok(PromptTokens::Ids(tokenizer.pixeldit_prompt(prompt)?))
            }
            TextEncoderNet::Umt5 { tokenizer, .. } => {
                let layout = options.apply(&t5::UMT5_PROMPT_LAYOUT);
                Ok(PromptTokens::Weighted(t5::umt5_tokens_in(prompt, &layout, |w| {
                    tokenizer.word_ids(w)
                })?))
            }
        }
    }

    /// `CLIPTextEncodeFlux`'s tokens: `clip_l` through CLIP-L's tokenizer, `t5xxl` through T5-XXL's (T5-XXL alone,
    /// Chroma's: `t5xxl` only); an error for an encoder of another family.
    pub fn tokenize_flux(&self, clip_l: &str, t5xxl: &str) -> Result<PromptTokens> {
        self.tokenize_flux_with(clip_l, t5xxl, T5Options::default())
    }

    /// [`TextEncoderNet::tokenize_flux`] with `T5TokenizerOptions`' settings for the T5-XXL tokens.
    pub fn tokenize_flux_with(
        &self,
        clip_l: &str,
        t5xxl: &str,
        options: T5Options,
    ) -> Result<PromptTokens> {
        if let TextEncoderNet::T5Xxl { .. } = self {
            // ComfyUI's CLIPTextEncodeFlux keeps the T5-XXL tokens of `t5xxl` and drops the rest: with T5-XXL
            // alone, that prompt is the whole of it.
            return self.tokenize_with(t5xxl, options);
        }
        let TextEncoderNet::Flux { clip_tokenizer, t5_tokenizer, .. } = self else {
            return Err(Error::Invalid(format!(
                "CLIPTextEncodeFlux needs FLUX.1's CLIP-L + T5-XXL text encoder (DualCLIPLoader, type \
                 `flux`), not {}",
                self.family().name()
            )));
        };
        Ok(PromptTokens::Flux {
            clip_l: prompt_weights::tokenize(clip_l, &clip_text::PROMPT_LAYOUT, |w| {
                clip_tokenizer.word_ids(w)
            })?,
            t5: prompt_weights::tokenize(t5xxl, &options.apply(&t5::FLUX_PROMPT_LAYOUT), |w| {
                t5_tokenizer.word_ids(w)
            })?,
        })
    }

    /// `CLIPTextEncodeHiDream`'s tokens: each of HiDream's four encoders its own prompt; an error for an encoder
    /// of another family.
    pub fn tokenize_hidream(&self, prompts: [&str; 4], options: T5Options) -> Result<PromptTokens> {
        match self {
            TextEncoderNet::HiDream(e) => {
                Ok(PromptTokens::HiDream(Box::new(e.tokenize(prompts, options)?)))
            }
            _ => Err(Error::Invalid(format!(
                "CLIPTextEncodeHiDream needs HiDream's four text encoders (QuadrupleCLIPLoader: CLIP-L, CLIP-G, \
                 T5-XXL, Llama 3.1 8B), not {}",
                self.family().name()
            ))),
        }
    }

    /// The token ids of a Qwen-Image Edit node's prompt, as ComfyUI's Qwen-Image tokenizer (or, for
    /// LongCat-Image's encoder, its LongCat-Image tokenizer) makes them for `edit`; an error for an encoder of
    /// another family.
    pub fn tokenize_edit(&self, prompt: &str, edit: EditPrompt) -> Result<Vec<u32>> {
        match (self, edit) {
            (
                TextEncoderNet::Qwen25Vl { tokenizer, role: Qwen25Role::LongCatImage, .. },
                EditPrompt::Edit { image },
            ) => tokenizer.longcat_prompt(prompt, image),
            (
                TextEncoderNet::Qwen25Vl { tokenizer, role: Qwen25Role::LongCatImage, .. },
                EditPrompt::Plus { pictures },
            ) => {
                // ComfyUI's LongCat tokenizer takes the edit node's `Picture i: ` slots as prompt text, after the
                // edit template's own slot, which the first image fills.
                let slots: String = (1..=3)
                    .filter(|&i| pictures[i - 1])
                    .map(|i| format!("Picture {i}: {}", qwen3::IMAGE_SLOT))
                    .collect();
                tokenizer.longcat_prompt(&format!("{slots}{prompt}"), pictures.contains(&true))
            }
            (TextEncoderNet::Qwen25Vl { tokenizer, .. }, EditPrompt::Edit { image }) => {
                tokenizer.qwen_image_edit_prompt(prompt, image)
            }
            (TextEncoderNet::Qwen25Vl { tokenizer, .. }, EditPrompt::Plus { pictures }) => {
                let numbers: Vec<usize> = (1..=3).filter(|&i| pictures[i - 1]).collect();
                tokenizer.qwen_image_edit_plus_prompt(prompt, &numbers)
            }
            // ComfyUI's Qwen3-VL tokenizers take the node's `Picture i: ` slots as prompt text in its template.
            (TextEncoderNet::Qwen3Vl { tokenizer, .. }, EditPrompt::Plus { pictures }) => {
                let slots: String = (1..=3)
                    .filter(|&i| pictures[i - 1])
                    .map(|i| format!("Picture {i}: {}", qwen3::IMAGE_SLOT))
                    .collect();
                tokenizer.qwen3vl_edit_prompt(&format!("{slots}{prompt}"))
            }
            (
                TextEncoderNet::Qwen3Vl { tokenizer, role: Qwen3VlRole::Boogu, .. },
                EditPrompt::Numbered { images },
            ) => tokenizer.boogu_edit_prompt(prompt, images),
            (
                TextEncoderNet::Qwen3Vl { tokenizer, role: Qwen3VlRole::JoyImage, .. },
                EditPrompt::Numbered { images },
            ) => tokenizer.joyimage_prompt(prompt, images, true),
            (
                TextEncoderNet::Qwen3Vl { tokenizer, role: Qwen3VlRole::Plain, .. },
                EditPrompt::Numbered { images },
            ) => tokenizer.qwen3vl_plain_prompt(prompt, images, ChatOptions::default()),
            (TextEncoderNet::Qwen3Vl { tokenizer, .. }, EditPrompt::Numbered { images }) => {
                tokenizer.mage_edit_prompt(prompt, images)
            }
            (TextEncoderNet::Qwen3Vl { .. }, EditPrompt::Edit { .. }) => {
                Err(crate::Error::Invalid(format!(
                    "TextEncodeQwenImageEdit with {}'s encoder is not supported yet; \
                     TextEncodeQwenImageEditPlus takes its images",
                    self.family().name()
                )))
            }
            (TextEncoderNet::Qwen25Vl { .. }, EditPrompt::Numbered { .. }) => {
                Err(crate::Error::Invalid(format!(
                    "numbered edit images (TextEncodeMageFlowEdit) need a Qwen3-VL text encoder, not {}",
                    self.family().name()
                )))
            }
            (
                TextEncoderNet::Qwen3 { .. }
                | TextEncoderNet::Flux2Klein { .. }
                | TextEncoderNet::Mistral3 { .. }
                | TextEncoderNet::Flux { .. }
                | TextEncoderNet::T5Xxl { .. }
                | TextEncoderNet::Umt5 { .. }
                | TextEncoderNet::HiDream(_)
                | TextEncoderNet::Sdxl(_)
                | TextEncoderNet::Sd3(_)
                | TextEncoderNet::Ovis { .. }
                | TextEncoderNet::Anima { .. }
                | TextEncoderNet::Gemma2 { .. }
                | TextEncoderNet::Kandinsky5(_)
                | TextEncoderNet::HunyuanVideo15(_)
                | TextEncoderNet::HunyuanVideo1(_),
                _,
            ) => Err(crate::Error::Invalid(format!(
                "a Qwen-Image Edit prompt needs Qwen-Image's Qwen2.5-VL text encoder, not {}",
                self.family().name()
            ))),
        }
    }

    /// Whether ComfyUI puts an edit node's images into `prompt`'s image slots: always, but for LongCat-Image's
    /// encoder with a prompt already templated (starting with `<|im_start|>` or `<|start_header_id|>`), whose
    /// `<|image_pad|>` tokens stay plain tokens.
    pub fn reads_edit_images(&self, prompt: &str) -> bool {
        !(qwen3::is_templated(prompt)
            && matches!(self, TextEncoderNet::Qwen25Vl { role: Qwen25Role::LongCatImage, .. }))
    }

    /// Text generated after `prompt` (`TextGenerate`), as token ids (the stop token included when one was
    /// reached), with ComfyUI's chat template for the family around the prompt (framed by `chat` where the
    /// family's tokenizer reads it: the Qwen3-VL encoders'); at most `max_new` tokens. `images` (from
    /// [`TextEncoderNet::vision_input`]) go in the prompt's image slots, for the encoders whose tokenizer takes
    /// them in `TextGenerate` (the generic Qwen3-VL's and JoyImage's); an error for the others.
    #[allow(clippy::too_many_arguments)]
    pub fn generate<B: Backend>(
        &self,
        b: &B,
        prompt: &str,
        images: &[VisionInput],
        chat: ChatOptions,
        max_new: usize,
        decoding: Decoding,
        on_token: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<Vec<u32>> {
        let mut picker = TokenPicker::new(decoding);
        if let TextEncoderNet::Qwen3Vl {
            model,
            tokenizer,
            vision,
            role: role @ (Qwen3VlRole::Plain | Qwen3VlRole::JoyImage),
        } = self
        {
            // ComfyUI's generic encoder generates with the images on their M-RoPE grid and DeepStack;
            // JoyImage's goes through `SDClipModel.generate`, which takes the image tokens inline.
            let (ids, layout) = match role {
                Qwen3VlRole::JoyImage => (
                    tokenizer.joyimage_prompt(prompt, images.len(), chat.default_template)?,
                    qwen3::ImageLayout::Inline,
                ),
                _ => (
                    tokenizer.qwen3vl_plain_prompt(prompt, images.len(), chat)?,
                    qwen3::ImageLayout::Grid,
                ),
            };
            let images = placed_images(&ids, images);
            let tokens = qwen3vl_image_tokens(b, model, vision.as_ref(), images)?;
            let pick = &mut |logits| picker.pick(logits);
            return model.generate_with_images(
                b,
                &ids,
                &tokens,
                layout,
                max_new,
                &qwen3::STOP_TOKENS,
                pick,
                on_token,
            );
        }
        if !images.is_empty() {
            return Err(Error::Invalid(format!(
                "TextGenerate with an image and {}'s encoder is not supported yet (Kiln generates from the prompt \
                 alone with it)",
                self.family().name()
            )));
        }
        match self {
            TextEncoderNet::Qwen3 { model, tokenizer } => {
                // ComfyUI's Z-Image tokenizer: a Qwen3-4B's with any CLIPLoader type but `flux2`/`flux`.
                let ids = tokenizer.zimage_prompt(prompt)?;
                let pick = &mut |logits| picker.pick(logits);
                model.generate(b, &ids, max_new, &qwen3::STOP_TOKENS, pick, on_token)
            }
            TextEncoderNet::Flux2Klein { model, tokenizer } => {
                // ComfyUI's Klein tokenizer with `min_length=1`: the Klein template, no padding.
                let ids = tokenizer.klein_unpadded(prompt)?;
                let pick = &mut |logits| picker.pick(logits);
                model.generate(b, &ids, max_new, &qwen3::STOP_TOKENS, pick, on_token)
            }
            TextEncoderNet::Qwen25Vl { .. } => Err(crate::Error::Invalid(
                "TextGenerate with Qwen-Image's Qwen2.5-VL encoder is not supported yet".to_owned(),
            )),
            TextEncoderNet::Ovis { .. } => Err(crate::Error::Invalid(
                "TextGenerate with Ovis-Image's encoder is not supported yet".to_owned(),
            )),
            TextEncoderNet::Qwen3Vl { role: Qwen3VlRole::Boogu, .. } => Err(crate::Error::Invalid(
                "TextGenerate with Boogu-Image's Qwen3-VL 8B encoder is not supported yet".to_owned(),
            )),
            TextEncoderNet::Qwen3Vl { model, tokenizer, .. } => {
                // Krea 2's and Mage-Flow's tokenizers with `min_length=1`: their template, no padding.
                let ids = tokenizer.qwen3vl_chat_prompt(prompt, chat)?;
                let pick = &mut |logits| picker.pick(logits);
                model.generate(b, &ids, max_new, &qwen3::STOP_TOKENS, pick, on_token)
            }
            TextEncoderNet::Anima { .. } => Err(crate::Error::Invalid(
                "TextGenerate with Anima's Qwen3 0.6B encoder is not supported yet".to_owned(),
            )),
            TextEncoderNet::Gemma2 { .. } => Err(crate::Error::Invalid(format!(
                "TextGenerate with {} encoder is not supported yet",
                self.family().name()
            ))),
            TextEncoderNet::Mistral3 { model, tokenizer, size: mistral3::Size::Ministral3B } => {
                // ComfyUI's ERNIE tokenizer reads no template: the prompt as written after `<s>`.
                let ids = tokenizer.plain_prompt(prompt)?;
                let pick = &mut |logits| picker.pick(logits);
                model.generate(b, &ids, max_new, &mistral3::STOP_TOKENS, pick, on_token)
            }
            // ComfyUI's `Mistral3Small24B` generates nothing either (it is no `BaseGenerate`).
            TextEncoderNet::Mistral3 { .. } => Err(crate::Error::Invalid(
                "TextGenerate with FLUX.2 dev's Mistral Small encoder is not supported".to_owned(),
            )),
            TextEncoderNet::Flux { .. } => Err(crate::Error::Invalid(
                "TextGenerate needs a language model (Qwen3); FLUX.1's CLIP-L + T5-XXL generate no text"
                    .to_owned(),
            )),
            TextEncoderNet::Umt5 { .. }
            | TextEncoderNet::T5Xxl { .. }
            | TextEncoderNet::HiDream(_)
            | TextEncoderNet::Sdxl(_)
            | TextEncoderNet::Sd3(_)
            | TextEncoderNet::Kandinsky5(_)
            | TextEncoderNet::HunyuanVideo15(_)
            | TextEncoderNet::HunyuanVideo1(_) => {
                Err(crate::Error::Invalid(format!(
                    "TextGenerate needs a language model (Qwen3); a {} encoder generates no text",
                    self.family().name()
                )))
            }
        }
    }

    /// The text of generated `ids` (special tokens left out), as ComfyUI's `decode`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match self {
            TextEncoderNet::Qwen3 { tokenizer, .. }
            | TextEncoderNet::Qwen25Vl { tokenizer, .. }
            | TextEncoderNet::Flux2Klein { tokenizer, .. }
            | TextEncoderNet::Qwen3Vl { tokenizer, .. } => tokenizer.decode(ids),
            TextEncoderNet::Mistral3 { tokenizer, .. } => tokenizer.decode(ids),
            TextEncoderNet::Flux { .. }
            | TextEncoderNet::T5Xxl { .. }
            | TextEncoderNet::Umt5 { .. }
            | TextEncoderNet::HiDream(_)
            | TextEncoderNet::Sdxl(_)
            | TextEncoderNet::Sd3(_)
            | TextEncoderNet::Ovis { .. }
            | TextEncoderNet::Anima { .. }
            | TextEncoderNet::Gemma2 { .. }
            | TextEncoderNet::Kandinsky5(_)
            | TextEncoderNet::HunyuanVideo15(_)
            | TextEncoderNet::HunyuanVideo1(_) => Err(Error::Invalid(format!(
                "{}'s text encoder decodes no generated text",
                self.family().name()
            ))),
        }
    }

    /// The conditioning ComfyUI takes from the encoder for `tokens`: `[1, N, D]`, and the pooled vector of
    /// families that have one.
    pub fn encode<B: Backend>(&self, b: &B, tokens: &PromptTokens) -> Result<Encoded<B>> {
        self.encode_with_images(b, tokens, &[])
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
            TextEncoderNet::Qwen3Vl { vision: Some(vision), role, .. } => {
                let how = match role {
                    // JoyImage's `preprocess_embed`: its own pixel bounds, bicubic.
                    Qwen3VlRole::JoyImage => qwen_vl::Patching {
                        min_pixels: JOYIMAGE_MIN_PIXELS,
                        max_pixels: JOYIMAGE_MAX_PIXELS,
                        resample: qwen_vl::Resample::Bicubic,
                        ..vision.patching()
                    },
                    _ => vision.patching(),
                };
                VisionInput::patched(&how, image, height, width, channels)
            }
            TextEncoderNet::Qwen3Vl { vision: None, .. } => {
                Err(crate::Error::Invalid(QWEN3VL_WITHOUT_TOWER.to_owned()))
            }
            TextEncoderNet::Qwen3 { .. }
            | TextEncoderNet::Flux2Klein { .. }
            | TextEncoderNet::Mistral3 { .. }
            | TextEncoderNet::Flux { .. }
            | TextEncoderNet::T5Xxl { .. }
            | TextEncoderNet::Umt5 { .. }
            | TextEncoderNet::HiDream(_)
            | TextEncoderNet::Sdxl(_)
            | TextEncoderNet::Sd3(_)
            | TextEncoderNet::Ovis { .. }
            | TextEncoderNet::Anima { .. }
            | TextEncoderNet::Gemma2 { .. }
            | TextEncoderNet::Kandinsky5(_)
            | TextEncoderNet::HunyuanVideo15(_)
            | TextEncoderNet::HunyuanVideo1(_) => Err(crate::Error::Invalid(format!(
                "a {} text encoder reads no images; Qwen-Image Edit needs its Qwen2.5-VL encoder",
                self.family().name()
            ))),
        }
    }

    /// [`TextEncoderNet::encode`] with `images` (from [`TextEncoderNet::vision_input`]) in the prompt, each
    /// where one of the ids' `<|image_pad|>` tokens is, in order, as ComfyUI encodes a Qwen-Image Edit prompt.
    pub fn encode_with_images<B: Backend>(
        &self,
        b: &B,
        tokens: &PromptTokens,
        images: &[VisionInput],
    ) -> Result<Encoded<B>> {
        let reads_no_images = || {
            Err(Error::Invalid(format!("a {} text encoder reads no images", self.family().name())))
        };
        match (self, tokens) {
            (TextEncoderNet::Flux { clip_l, t5, .. }, PromptTokens::Flux { clip_l: l, t5: t }) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                encode_flux(b, clip_l, t5, l, t)
            }
            (TextEncoderNet::Qwen3 { model, .. }, PromptTokens::Ids(ids)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                Ok(Encoded::new(model.hidden_state(b, ids)?, None))
            }
            (TextEncoderNet::Qwen3Vl { model, vision, role, .. }, PromptTokens::Ids(ids)) => {
                // Boogu's and Mage-Flow's: the last layer through the final norm (`layer="hidden", layer_idx=-1`
                // with `layer_norm_hidden_state=True`): Hugging Face's state `layers`. Krea 2's: twelve inner
                // states, none normed.
                // ComfyUI's padding mask: a written `<|endoftext|>` (the pad) and the text after it are not attended
                // to.
                let images = placed_images(ids, images);
                let tokens = qwen3vl_image_tokens(b, model, vision.as_ref(), images)?;
                let attended = Some(qwen3::attended_keys(ids));
                let last = [model.config.layers];
                let taps: &[usize] = match role {
                    Qwen3VlRole::Krea2 => &qwen3::family::KREA2_TAPS,
                    Qwen3VlRole::Boogu | Qwen3VlRole::MageFlow => &last,
                    // The last layer's output before the final norm (`layer_norm_hidden_state=False`).
                    Qwen3VlRole::JoyImage | Qwen3VlRole::Plain => {
                        let states = model
                            .last_hidden_state_unnormed_with_images(b, ids, &tokens, attended)?;
                        if *role == Qwen3VlRole::Plain {
                            return Ok(Encoded::new(states, None));
                        }
                        return Ok(Encoded::new(joyimage_cut(b, &states)?, None));
                    }
                };
                let states =
                    model.tapped_hidden_states_with_images(b, ids, &tokens, attended, taps)?;
                if *role == Qwen3VlRole::Boogu {
                    return Ok(Encoded::new(states, None));
                }
                // Krea 2's and Mage-Flow's `encode_token_weights` cut the system turn and the user header off.
                let start = qwen3::qwen_image_conditioning_start(ids);
                let n = states.dim(1)?;
                Ok(Encoded::new(b.slice(&states, 1, start, n - start)?, None))
            }
            (TextEncoderNet::Ovis { model, .. }, PromptTokens::Ids(ids)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                Ok(Encoded::new(ovis_states(b, model, ids)?, None))
            }
            (TextEncoderNet::Flux2Klein { model, .. }, PromptTokens::Ids(ids)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                let cond = model.tapped_hidden_states(
                    b,
                    ids,
                    qwen3::attended_keys(ids),
                    &qwen3::KLEIN_TAPS,
                )?;
                Ok(Encoded::new(cond, None))
            }
            (TextEncoderNet::Mistral3 { model, size, .. }, PromptTokens::Ids(ids)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                let attended = mistral3::attended_keys(ids);
                let cond = match size {
                    mistral3::Size::Small24B => {
                        model.tapped_hidden_states(b, ids, attended, &mistral3::TAPS)?
                    }
                    // ComfyUI's `layer_idx=-2`: the output of the second-to-last layer, before the final norm.
                    mistral3::Size::Ministral3B => {
                        let tap = [model.config.layers - 1];
                        model.tapped_hidden_states(b, ids, attended, &tap)?
                    }
                };
                Ok(Encoded::new(cond, None))
            }
            (TextEncoderNet::Qwen25Vl { model, vision, role, .. }, PromptTokens::Ids(ids)) => {
                let cond = match role {
                    Qwen25Role::QwenImage => {
                        qwen_image_states(b, model, vision.as_ref(), ids, images)?
                    }
                    Qwen25Role::LongCatImage => {
                        longcat_image_states(b, model, vision.as_ref(), ids, images)?
                    }
                    Qwen25Role::OmniGen2 => {
                        return Err(Error::Invalid(
                            "OmniGen2's encoder takes weighted sections, not one id sequence"
                                .to_owned(),
                        ));
                    }
                };
                Ok(Encoded::new(cond, None))
            }
            (
                TextEncoderNet::Qwen25Vl { model, role: Qwen25Role::OmniGen2, .. },
                PromptTokens::Weighted(sections),
            ) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                // Every token through the last layer and the final norm (`layer="last"`). ComfyUI measures weights
                // against a prompt of pads alone (no start token), every one of them masked.
                let layout = &qwen3::OMNIGEN2_PROMPT_LAYOUT;
                let cond = weighted_states(b, sections, layout, |ids| {
                    if ids.iter().all(|&id| id == layout.pad) {
                        model.masked_hidden_state_with_images(b, ids, &[], 0)
                    } else {
                        model.hidden_state(b, ids)
                    }
                })?;
                Ok(Encoded::new(cond, None))
            }
            (TextEncoderNet::T5Xxl { model, .. }, PromptTokens::Weighted(sections)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                // ComfyUI's PixArt encoder weighs against an empty prompt of pads alone (no end token).
                let empty = prompt_weights::Layout { end: None, ..t5::CHROMA_PROMPT_LAYOUT };
                let cond = weighted_states(b, sections, &empty, |ids| model.hidden_state(b, ids))?;
                Ok(Encoded::new(cond, None))
            }
            (TextEncoderNet::Gemma2 { model, pixeldit: true, .. }, PromptTokens::Ids(ids)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                // The last layer through the final norm (`layer="last"`) under the padding mask, then `<bos>`'s
                // row and the last 299 (`PixelDiTGemma2TE.encode_token_weights`).
                let attended = gemma2::attended_keys(ids);
                let states =
                    model.tapped_hidden_states(b, ids, attended, &[model.config.layers])?;
                let n = states.dim(1)?;
                let keep = gemma2::PIXELDIT_MAX_LENGTH;
                if n <= keep {
                    return Ok(Encoded::new(states, None));
                }
                let first = b.slice(&states, 1, 0, 1)?;
                let last = b.slice(&states, 1, n - (keep - 1), keep - 1)?;
                Ok(Encoded::new(b.concat(&[&first, &last], 1)?, None))
            }
            (TextEncoderNet::Gemma2 { model, .. }, PromptTokens::Weighted(sections)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                let cond = weighted_states(b, sections, &gemma2::PROMPT_LAYOUT, |ids| {
                    match gemma2::attended_keys(ids) {
                        n if n == ids.len() => model.hidden_state(b, ids),
                        n => model.masked_hidden_state_with_images(b, ids, &[], n),
                    }
                })?;
                Ok(Encoded::new(cond, None))
            }
            (TextEncoderNet::Umt5 { model, .. }, PromptTokens::Weighted(sections)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                let cond = weighted_states(b, sections, &t5::UMT5_PROMPT_LAYOUT, |ids| {
                    model.masked_hidden_state(b, ids, &t5::attention_mask(ids))
                })?;
                Ok(Encoded::new(cond, None))
            }
            (TextEncoderNet::HiDream(e), PromptTokens::HiDream(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                e.encode(b, tokens)
            }
            (TextEncoderNet::Sdxl(e), PromptTokens::Sdxl(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                e.encode(b, tokens)
            }
            (TextEncoderNet::Sd3(e), PromptTokens::Sd3(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                e.encode(b, tokens)
            }
            (TextEncoderNet::HunyuanVideo15(e), PromptTokens::HunyuanVideo15(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                e.encode(b, tokens)
            }
            (TextEncoderNet::HunyuanVideo1(e), PromptTokens::HunyuanVideo1(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                e.encode(b, tokens)
            }
            (TextEncoderNet::HunyuanVideo1(_), _) | (_, PromptTokens::HunyuanVideo1(_)) => {
                Err(Error::Invalid(format!(
                    "HunyuanVideo's encoders take HunyuanVideo's tokens; {} and these tokens do not go together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::HunyuanVideo15(_), _) | (_, PromptTokens::HunyuanVideo15(_)) => {
                Err(Error::Invalid(format!(
                    "HunyuanVideo 1.5's encoders take HunyuanVideo 1.5's tokens; {} and these tokens do not go \
                     together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::Kandinsky5(e), PromptTokens::Kandinsky5(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                e.encode(b, tokens)
            }
            (TextEncoderNet::Anima { model, .. }, PromptTokens::Anima(tokens)) => {
                if !images.is_empty() {
                    return reads_no_images();
                }
                anima_text::encode(b, model, tokens)
            }
            (TextEncoderNet::Anima { .. }, _) | (_, PromptTokens::Anima(_)) => {
                Err(Error::Invalid(format!(
                    "Anima's encoder takes Anima's tokens; {} and these tokens do not go together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::Kandinsky5(_), _) | (_, PromptTokens::Kandinsky5(_)) => {
                Err(Error::Invalid(format!(
                    "Kandinsky 5's encoders take Kandinsky 5's tokens; {} and these tokens do not go together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::Sd3(_), _) | (_, PromptTokens::Sd3(_)) => {
                Err(Error::Invalid(format!(
                    "SD3's encoders take SD3's tokens; {} and these tokens do not go together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::Sdxl(_), _) | (_, PromptTokens::Sdxl(_)) => {
                Err(Error::Invalid(format!(
                    "SDXL's encoders take SDXL's tokens; {} and these tokens do not go together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::HiDream(_), _) | (_, PromptTokens::HiDream(_)) => {
                Err(Error::Invalid(format!(
                    "HiDream's four encoders take HiDream's tokens; {} and these tokens do not go together",
                    self.family().name()
                )))
            }
            (TextEncoderNet::Flux { .. }, PromptTokens::Ids(_)) => Err(Error::Invalid(
                "FLUX.1's text encoder takes CLIP-L and T5-XXL tokens, not one id sequence"
                    .to_owned(),
            )),
            (
                TextEncoderNet::Umt5 { .. }
                | TextEncoderNet::T5Xxl { .. }
                | TextEncoderNet::Gemma2 { .. },
                PromptTokens::Ids(_),
            ) => Err(Error::Invalid(format!(
                "a {} text encoder takes weighted sections, not one id sequence",
                self.family().name()
            ))),
            (_, PromptTokens::Flux { .. }) => Err(Error::Invalid(format!(
                "FLUX.1's CLIP-L and T5-XXL tokens for a {} text encoder",
                self.family().name()
            ))),
            (_, PromptTokens::Weighted(_)) => Err(Error::Invalid(format!(
                "umT5-XXL's weighted sections for a {} text encoder",
                self.family().name()
            ))),
        }
    }
}

/// The states ComfyUI conditions Ovis-Image on (`OvisTEModel`): the last hidden state of `ids` under the padding
/// mask, the masked rows zeroed (`zero_out_masked`), from [`qwen3::ovis_conditioning_start`] on.
fn ovis_states<B: Backend>(b: &B, model: &Qwen3, ids: &[u32]) -> Result<Tensor<B>> {
    let attended = qwen3::attended_keys(ids);
    // The last layer's output through the final norm (`layer="last"`): Hugging Face's state `layers`.
    let hidden = model.tapped_hidden_states(b, ids, attended, &[model.config.layers])?;
    let n = hidden.dim(1)?;
    let kept = b.slice(&hidden, 1, 0, attended)?;
    let hidden = b.pad(&kept, 1, 0, n - attended, PadMode::Constant(0.0))?;
    let start = qwen3::ovis_conditioning_start(ids);
    Ok(b.slice(&hidden, 1, start, n - start)?)
}

/// The states ComfyUI conditions LongCat-Image on (`LongCatImageTEModel`): Qwen2.5-VL's last hidden states of
/// `ids` with `images` in their `<|image_pad|>` slots (as many as the ids have: ComfyUI fills no more), under the
/// padding mask from the first pad, the template's prefix and suffix cut off
/// ([`qwen3::longcat_conditioning_window`]); the pads' rows stay.
fn longcat_image_states<B: Backend>(
    b: &B,
    model: &Qwen3,
    vision: Option<&VisionConfig>,
    ids: &[u32],
    images: &[VisionInput],
) -> Result<Tensor<B>> {
    let slots = ids.iter().filter(|&&id| id == qwen3::IMAGE_PAD).count();
    let tokens = image_tokens(b, model, vision, &images[..images.len().min(slots)])?;
    let hidden =
        model.masked_hidden_state_with_images(b, ids, &tokens, qwen3::attended_keys(ids))?;
    let n = hidden.dim(1)?;
    let (start, end) = qwen3::longcat_conditioning_window(ids, n - ids.len());
    Ok(b.slice(&hidden, 1, start, n - start - end)?)
}

/// `images` through the vision tower, as the language model takes them.
fn image_tokens<B: Backend>(
    b: &B,
    model: &Qwen3,
    vision: Option<&VisionConfig>,
    images: &[VisionInput],
) -> Result<Vec<ImageTokens<B>>> {
    let mut tokens = Vec::with_capacity(images.len());
    for input in images {
        let Some(vision) = vision else {
            return Err(Error::Invalid(
                "this Qwen2.5-VL file has no vision tower (`visual.*` weights)".to_owned(),
            ));
        };
        tokens.push(ImageTokens {
            embeds: qwen_vl::embed_image(b, &model.weights, vision, input)?,
            deepstack: Vec::new(),
            rows: input.grid_h / qwen_vl::MERGE,
            cols: input.grid_w / qwen_vl::MERGE,
        });
    }
    Ok(tokens)
}

/// The refusal of an image by a Qwen3-VL file without its vision tower.
/// Fewest pixels JoyImage's encoder resizes an image to (256²).
const JOYIMAGE_MIN_PIXELS: usize = 65_536;
/// Most pixels JoyImage's encoder resizes an image to (4096²).
const JOYIMAGE_MAX_PIXELS: usize = 16_777_216;

const QWEN3VL_WITHOUT_TOWER: &str =
    "this Qwen3-VL file has no vision tower (`model.visual.*` weights), so it cannot read images";

/// The `images` a Qwen3-VL prompt `ids` shows: ComfyUI's tokenizer puts them in its first `<|image_pad|>` tokens
/// in order and drops those without one (a prompt written with fewer slots than images).
fn placed_images<'i>(ids: &[u32], images: &'i [VisionInput]) -> &'i [VisionInput] {
    let slots = ids.iter().filter(|&&id| id == qwen3::IMAGE_PAD).count();
    &images[..images.len().min(slots)]
}

/// JoyAI Image Edit's conditioning: `states` `[1, N, hidden]` without their first [`qwen3::JOYIMAGE_DROP`]
/// (its template's system turn and user header; ComfyUI's `JoyImageTEModel`), an error for a shorter prompt.
fn joyimage_cut<B: Backend>(b: &B, states: &Tensor<B>) -> Result<Tensor<B>> {
    let n = states.dim(1)?;
    let drop = qwen3::JOYIMAGE_DROP;
    if n <= drop {
        return Err(Error::Invalid(format!(
            "JoyAI Image Edit's encoder drops the first {drop} states (its template's prefix), but the prompt has \
             {n} tokens: a prompt written with its own `<|im_start|>` template must keep that prefix"
        )));
    }
    Ok(b.slice(states, 1, drop, n - drop)?)
}

/// Qwen3-VL's tokens of each of `images` (the merged patches with their DeepStack features), from the vision
/// tower `vision` among `model`'s weights (none needed without images).
fn qwen3vl_image_tokens<B: Backend>(
    b: &B,
    model: &Qwen3,
    vision: Option<&qwen3vl_vision::Config>,
    images: &[VisionInput],
) -> Result<Vec<ImageTokens<B>>> {
    let mut tokens = Vec::with_capacity(images.len());
    for input in images {
        let vision = vision.ok_or_else(|| Error::Invalid(QWEN3VL_WITHOUT_TOWER.to_owned()))?;
        let out = qwen3vl_vision::embed_image(b, &model.weights, vision, input)?;
        tokens.push(ImageTokens {
            embeds: out.merged,
            deepstack: out.deepstack,
            rows: input.grid_h / qwen_vl::MERGE,
            cols: input.grid_w / qwen_vl::MERGE,
        });
    }
    Ok(tokens)
}

/// The states ComfyUI conditions Qwen-Image on: Qwen2.5-VL's last hidden states of `ids` with `images` in
/// their `<|image_pad|>` slots, after the template's prefix (found in the ids before the images take their
/// place; they come after it).
fn qwen_image_states<B: Backend>(
    b: &B,
    model: &Qwen3,
    vision: Option<&VisionConfig>,
    ids: &[u32],
    images: &[VisionInput],
) -> Result<Tensor<B>> {
    let tokens = image_tokens(b, model, vision, images)?;
    let hidden = model.hidden_state_with_images(b, ids, &tokens)?;
    let start = qwen3::qwen_image_conditioning_start(ids);
    let n = hidden.dim(1)?;
    Ok(b.slice(&hidden, 1, start, n - start)?)
}

/// ComfyUI's `FluxClipModel.encode_token_weights`: T5-XXL's states of its one section with the prompt's
/// weights applied against an empty prompt's (`(z − z_empty)·w + z_empty`, f32), and CLIP-L's pooled vector
/// of its first section (weights do not touch it).
fn encode_flux<B: Backend>(
    b: &B,
    clip_l: &ClipText,
    t5: &T5,
    clip_sections: &[Vec<Weighted>],
    t5_sections: &[Vec<Weighted>],
) -> Result<Encoded<B>> {
    let pooled = clip_pooled(b, clip_l, clip_sections)?;
    let cond =
        weighted_states(b, t5_sections, &t5::FLUX_PROMPT_LAYOUT, |ids| t5.hidden_state(b, ids))?;
    Ok(Encoded::new(cond, Some(pooled)))
}

/// CLIP-L's pooled vector (unprojected) of the first of `sections`, f32 `[1, D]`; the weights do not touch it
/// (ComfyUI's `ClipTokenWeightEncoder` keeps the first section's).
pub(super) fn clip_pooled<B: Backend>(
    b: &B,
    clip_l: &ClipText,
    sections: &[Vec<Weighted>],
) -> Result<Tensor<B>> {
    let first = sections.first().ok_or_else(|| Error::Invalid("no CLIP-L tokens".to_owned()))?;
    let ids: Vec<u32> = first.iter().map(|&(t, _)| t).collect();
    Ok(b.cast(&clip_l.encode(b, &ids, None)?.pooled, kiln_compute::DType::F32)?)
}

/// `sections` encoded by `encode` and joined along the tokens, f32, each weighted token moved from an empty
/// prompt's state (laid out by `layout` to the longest section's length) by its weight, as ComfyUI's
/// `ClipTokenWeightEncoder` does.
pub(super) fn weighted_states<B: Backend>(
    b: &B,
    sections: &[Vec<Weighted>],
    layout: &prompt_weights::Layout,
    encode: impl Fn(&[u32]) -> Result<Tensor<B>>,
) -> Result<Tensor<B>> {
    let longest = sections.iter().map(Vec::len).max().unwrap_or(0);
    let empty = if prompt_weights::has_weights(sections) {
        let z = encode(&prompt_weights::empty_tokens(layout, longest))?;
        Some(b.to_f32(&b.cast(&z, kiln_compute::DType::F32)?)?)
    } else {
        None
    };
    let mut joined = Vec::new();
    let mut width = 0;
    for section in sections {
        let ids: Vec<u32> = section.iter().map(|&(t, _)| t).collect();
        let z = b.cast(&encode(&ids)?, kiln_compute::DType::F32)?;
        width = z.dim(2)?;
        let mut values = b.to_f32(&z)?;
        if let Some(empty) = &empty {
            for (j, &(_, w)) in section.iter().enumerate() {
                if w != 1.0 {
                    let row = j * width..(j + 1) * width;
                    for (v, e) in values[row.clone()].iter_mut().zip(&empty[row]) {
                        *v = (*v - e) * w + e;
                    }
                }
            }
        }
        joined.extend(values);
    }
    let tokens = joined.len() / width.max(1);
    Ok(b.from_f32(&[1, tokens, width], &joined, kiln_compute::DType::F32)?)
}

impl HiDreamEncoders {
    /// ComfyUI's `HiDreamTokenizer` tokens for the four prompts (CLIP-L's, CLIP-G's, T5-XXL's, Llama's; one prompt
    /// for all four with `CLIPTextEncode`), `options` setting the T5 tokens' padding (`T5TokenizerOptions`).
    pub fn tokenize(
        &self,
        [l, g, t, llama]: [&str; 4],
        options: T5Options,
    ) -> Result<HiDreamTokens> {
        // A long CLIP's sections are as long as its position table (ComfyUI's `model_options_long_clip`).
        let clip_layout = |clip: &Option<ClipText>, pad: u32| prompt_weights::Layout {
            max_length: clip
                .as_ref()
                .map_or(clip_text::PROMPT_LAYOUT.max_length, |c| c.config.positions),
            pad,
            ..clip_text::PROMPT_LAYOUT
        };
        let clip_words = |w: &str| self.clip_tokenizer.word_ids(w);
        let clip_l =
            prompt_weights::tokenize(l, &clip_layout(&self.clip_l, clip_text::EOS), clip_words)?;
        // CLIP-G pads with 0 (`SDXLClipGTokenizer`: `pad_with_end=False`).
        let clip_g = prompt_weights::tokenize(g, &clip_layout(&self.clip_g, 0), clip_words)?;
        // ComfyUI keeps T5-XXL's first section alone.
        let t5_layout = options.apply(&t5::HIDREAM_PROMPT_LAYOUT);
        let mut t5 = prompt_weights::tokenize(t, &t5_layout, |w| self.t5_tokenizer.word_ids(w))?;
        let llama = self.llama_tokenizer.hidream_prompt(llama)?;
        let [llama] = <[Vec<Weighted>; 1]>::try_from(llama).map_err(|sections| {
            Error::Invalid(format!(
                "HiDream's Llama prompt laid out in {} sections, not one",
                sections.len()
            ))
        })?;
        Ok(HiDreamTokens { clip_l, clip_g, t5: t5.swap_remove(0), llama })
    }

    /// ComfyUI's `HiDreamTEModel.encode_token_weights`: T5-XXL's states (its first section under the padding
    /// mask, weighted), the Llama states (every layer's output, weighted as ComfyUI weighs them: see
    /// [`llama_states`]), and CLIP-L's and CLIP-G's projected pooled vectors of their first sections joined.
    fn encode<B: Backend>(&self, b: &B, tokens: &HiDreamTokens) -> Result<Encoded<B>> {
        let f32 = kiln_compute::DType::F32;
        let (l_width, g_width, t5_zeros, llama_zeros) = HIDREAM_ZEROS;
        let pooled_of =
            |clip: &Option<ClipText>, sections: &[Vec<Weighted>], width| -> Result<Tensor<B>> {
                let Some(clip) = clip else { return Ok(b.full(&[1, width], 0.0, f32)?) };
                let first =
                    sections.first().ok_or_else(|| Error::Invalid("no CLIP tokens".to_owned()))?;
                let ids: Vec<u32> = first.iter().map(|&(t, _)| t).collect();
                clip.project_pooled(b, &clip.encode(b, &ids, None)?.pooled)
            };
        let l = pooled_of(&self.clip_l, &tokens.clip_l, l_width)?;
        let g = pooled_of(&self.clip_g, &tokens.clip_g, g_width)?;
        let pooled = b.concat(&[&l, &g], 1)?;
        let cond = match &self.t5 {
            Some(t5) => weighted_states(
                b,
                std::slice::from_ref(&tokens.t5),
                &t5::HIDREAM_PROMPT_LAYOUT,
                |ids| t5.key_masked_hidden_state(b, ids, &t5::attention_mask(ids)),
            )?,
            None => b.full(&t5_zeros, 0.0, f32)?,
        };
        let llama = match &self.llama {
            Some(llama) => llama_states(b, llama, &tokens.llama)?,
            None => b.full(&llama_zeros, 0.0, f32)?,
        };
        Ok(Encoded { llama: Some(llama), ..Encoded::new(cond, Some(pooled)) })
    }

    /// HiDream's encoder of the parts given, with the tokenizers; an error when none is.
    fn net(
        clip_l: Option<ClipText>,
        clip_g: Option<ClipText>,
        t5: Option<T5>,
        llama: Option<Qwen3>,
    ) -> Result<TextEncoderNet> {
        if clip_l.is_none() && clip_g.is_none() && t5.is_none() && llama.is_none() {
            return Err(Error::Invalid(
                "HiDream's text encoder needs at least one of its files".to_owned(),
            ));
        }
        Ok(TextEncoderNet::HiDream(Box::new(HiDreamEncoders {
            clip_l,
            clip_g,
            t5,
            llama,
            clip_tokenizer: clip_text::Tokenizer::bundled()?,
            t5_tokenizer: t5::Tokenizer::bundled()?,
            llama_tokenizer: llama3::Tokenizer::bundled()?,
        })))
    }

    /// The weights of the encoders given, the largest first (Llama's, T5-XXL's, CLIP-G's, CLIP-L's).
    fn models(&self) -> Vec<&Model> {
        let clips = [&self.clip_g, &self.clip_l].into_iter().flatten().map(|c| &c.weights);
        let llama = self.llama.iter().map(|l| &l.weights);
        llama.chain(self.t5.iter().map(|t| &t.weights)).chain(clips).collect()
    }
}

/// The Llama states ComfyUI conditions HiDream on (`LLAMAModel` with `layer="all"`, the embeddings dropped):
/// for each decoder layer its output over `tokens` under the padding mask from the first `<|eot_id|>` (the last
/// layer's through the final norm), `[1, layers, N, D]` f32.
///
/// Prompt weights are applied as ComfyUI's `encode_token_weights` applies them to this 4-D output: its loop over
/// "tokens" runs over the layers, so layer j (counting the embeddings as 0) moves from the empty prompt's by the
/// weight of token j. Kiln does the same, so weighted prompts give ComfyUI's conditioning.
fn llama_states<B: Backend>(b: &B, model: &Qwen3, tokens: &[Weighted]) -> Result<Tensor<B>> {
    let layers = model.config.layers;
    let taps: Vec<usize> = (1..=layers).collect();
    let encode = |ids: &[u32]| -> Result<Vec<f32>> {
        let attended = ids.iter().position(|&t| t == llama3::EOT).unwrap_or(ids.len()).max(1);
        let states = model.tapped_hidden_states(b, ids, attended, &taps)?;
        Ok(b.to_f32(&b.cast(&states, kiln_compute::DType::F32)?)?)
    };
    let ids: Vec<u32> = tokens.iter().map(|&(t, _)| t).collect();
    let (n, width) = (ids.len(), model.config.hidden);
    // [1, N, layers·D]: token-major; rearranged to [layers, N, D] below.
    let mut values = encode(&ids)?;
    if prompt_weights::has_weights(std::slice::from_ref(&tokens.to_vec())) {
        let empty = encode(&prompt_weights::empty_tokens(&llama3::HIDREAM_LAYOUT, n))?;
        for (j, &(_, w)) in tokens.iter().enumerate().take(layers + 1).skip(1) {
            if w == 1.0 {
                continue;
            }
            let layer = j - 1;
            for token in 0..n {
                let at = (token * layers + layer) * width;
                for (v, e) in values[at..at + width].iter_mut().zip(&empty[at..at + width]) {
                    *v = (*v - e) * w + e;
                }
            }
        }
    }
    let states = b.from_f32(&[1, n, layers, width], &values, kiln_compute::DType::F32)?;
    Ok(b.permute(&states, &[0, 2, 1, 3])?)
}
