//! The stems a LoRA file may name HiDream's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them (its
//! generic `model_lora_keys_unet` and the HiDream part): for a weight `S.weight`, `lora_unet_S` with dots as
//! underscores (kohya), `diffusion_model.S`, and SimpleTuner's `transformer.S` and `lycoris_S` with underscores;
//! [`crate::lora`] reads the adapters.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches};

/// Every stem a LoRA file may use for HiDream's weights `slots`.
pub fn aliases(slots: &[(&str, &[usize])]) -> Aliases {
    lora::dit_aliases(slots, false)
}

/// The patches the LoRA file `lora` makes at `strength` for a HiDream model whose weights are `slots`.
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(slots))
}
