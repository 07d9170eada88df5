//! The stems a LoRA file may name a Wan DiT's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them (its
//! generic `model_lora_keys_unet`: Wan has no part of its own; models-wan-video.md §2.6); [`crate::lora`] reads
//! the adapters (`lora_{up,down}`, `lora_A`/`lora_B`, `.alpha`, LoHa, LoKr, `.diff`, `.diff_b`, ...).
//!
//! For a weight `S.weight` of ComfyUI's layout: `diffusion_model.S` and `lora_unet_S` with dots as underscores
//! (kohya); for a tensor without `.weight` (the modulation tables, `img_emb.emb_pos`, the biases) only
//! `diffusion_model.<name>` (a `.diff` then replaces it whole). Wan Fun's LoRAs write `lora_unet__blocks_…`
//! with a doubled underscore: ComfyUI reads them as `lora_unet_blocks_…` when the file has
//! `lora_unet__blocks_0_cross_attn_k.lora_down.weight`, and so does Kiln. diffusers-named Wan LoRAs
//! (`transformer.blocks.0.attn1.to_q`) adapt nothing in ComfyUI, and are left unmatched here too.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// The key whose presence makes ComfyUI read `lora_unet__` as `lora_unet_` (its `convert_lora_wan_fun`).
const WAN_FUN_MARKER: &str = "lora_unet__blocks_0_cross_attn_k.lora_down.weight";

/// Every stem a LoRA file may use for a Wan model's weights `slots`; with `wan_fun`, also the kohya stems with
/// Wan Fun's doubled underscore.
pub fn aliases(slots: &[(&str, &[usize])], wan_fun: bool) -> Aliases {
    let mut aliases = Aliases::new();
    for (i, (name, _)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else {
            aliases.add(format!("diffusion_model.{name}"), Target::Whole(i));
            continue;
        };
        let underscored = stem.replace('.', "_");
        aliases.add(format!("diffusion_model.{stem}"), Target::Whole(i));
        aliases.add(format!("lora_unet_{underscored}"), Target::Whole(i));
        if wan_fun {
            aliases.add(format!("lora_unet__{underscored}"), Target::Whole(i));
        }
    }
    aliases
}

/// The patches the LoRA file `file` makes at `strength` for a Wan model whose weights are `slots` (`(name,
/// shape)` in ComfyUI's layout without prefix: `blocks.3.self_attn.q.weight`, ...).
pub fn patches(
    file: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    let wan_fun = file.tensor(WAN_FUN_MARKER).is_ok();
    lora::patches(file, slots, strength, &aliases(slots, wan_fun))
}
