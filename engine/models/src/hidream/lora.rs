//! The stems a LoRA file may name HiDream's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them (its
//! generic `model_lora_keys_unet` and the HiDream part): for a weight `S.weight`, `lora_unet_S` with dots as
//! underscores (kohya), `diffusion_model.S`, and SimpleTuner's `transformer.S` and `lycoris_S` with underscores;
//! [`crate::lora`] reads the adapters.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// Every stem a LoRA file may use for HiDream's weights `slots`.
pub fn aliases(slots: &[(&str, &[usize])]) -> Aliases {
    let mut aliases = Aliases::new();
    for (i, (name, _)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else { continue };
        let underscored = stem.replace('.', "_");
        for alias in [
            format!("lora_unet_{underscored}"),
            format!("diffusion_model.{stem}"),
            format!("transformer.{stem}"),
            format!("lycoris_{underscored}"),
        ] {
            aliases.add(alias, Target::Whole(i));
        }
    }
    aliases
}

/// The patches the LoRA file `lora` makes at `strength` for a HiDream model whose weights are `slots`.
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(slots))
}
