//! The stems a LoRA file may name the Qwen3-4B (Qwen3-8B, Qwen2.5-VL-7B) text encoder's weights by, as ComfyUI's
//! `LoraLoader` reads them for the CLIP it loads from `qwen_3_4b.safetensors` (its `model_lora_keys_clip`;
//! ComfyUI's encoder holds the weights as `qwen3_4b.transformer.model.*`, `qwen25_7b.…` for Qwen-Image's);
//! [`crate::lora`] reads the adapters.
//!
//! For a weight `model.S.weight` of the file's layout: `text_encoders.qwen3_4b.transformer.model.S` (ComfyUI's
//! generic form), `text_encoders.transformer.model.S` (the same without the encoder's name) and `lora_te_S`
//! with dots as underscores (kohya, for a single-encoder CLIP).

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// The name ComfyUI keeps Qwen3-4B under in its CLIP.
pub const QWEN3_4B: &str = "qwen3_4b";
/// The name ComfyUI keeps Qwen3-8B under in its CLIP (FLUX.2 Klein 9B's encoder).
pub const QWEN3_8B: &str = "qwen3_8b";
/// The name ComfyUI keeps Qwen2.5-VL-7B under in its CLIP.
pub const QWEN25_7B: &str = "qwen25_7b";

/// Every stem a LoRA file may use for the weights `slots` of the encoder ComfyUI calls `clip_name`.
pub fn aliases(clip_name: &str, slots: &[(&str, &[usize])]) -> Aliases {
    let mut aliases = Aliases::new();
    for (i, (name, _)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else { continue };
        aliases.add(format!("text_encoders.{clip_name}.transformer.{stem}"), Target::Whole(i));
        aliases.add(format!("text_encoders.transformer.{stem}"), Target::Whole(i));
        if let Some(inner) = stem.strip_prefix("model.") {
            aliases.add(format!("lora_te_{}", inner.replace('.', "_")), Target::Whole(i));
        }
    }
    aliases
}

/// The patches the LoRA file `lora` makes at `strength` (ComfyUI's `strength_clip`) for the encoder ComfyUI
/// calls `clip_name` whose weights are `slots` (`(name, shape)` in the file's layout without prefix).
pub fn patches(
    lora: &SafetensorsFile,
    clip_name: &str,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(clip_name, slots))
}
