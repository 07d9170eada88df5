//! The stems a LoRA file may name Anima's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them (its generic
//! `model_lora_keys_unet`, Anima having no branch of its own: for a weight `S.weight`, `lora_unet_S` with dots as
//! underscores and `diffusion_model.S`); [`crate::lora`] reads the adapters.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// Every stem a LoRA file may use for Anima's weights `slots`.
pub fn aliases(slots: &[(&str, &[usize])]) -> Aliases {
    let mut aliases = Aliases::new();
    for (i, (name, _)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else { continue };
        aliases.add(format!("lora_unet_{}", stem.replace('.', "_")), Target::Whole(i));
        aliases.add(format!("diffusion_model.{stem}"), Target::Whole(i));
    }
    aliases
}

/// The patches the LoRA file `lora` makes at `strength` for an Anima model whose weights are `slots`.
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(slots))
}
