//! The stems a LoRA file may name Anima's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them (its generic
//! `model_lora_keys_unet`: for a weight `S.weight`, `lora_unet_S` with dots as underscores and
//! `diffusion_model.S`; Kiln also takes the SimpleTuner forms its other DiTs take); [`crate::lora`] reads the
//! adapters.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, LoraPatches};

/// The patches the LoRA file `lora` makes at `strength` for an Anima model whose weights are `slots`.
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &lora::dit_aliases(slots, false))
}
