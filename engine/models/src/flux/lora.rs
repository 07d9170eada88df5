//! The stems a LoRA file may name a FLUX DiT's weights by (FLUX.1's and FLUX.2's alike), as ComfyUI's `LoraLoaderModelOnly` reads them (its
//! generic `model_lora_keys_unet` and the Flux part, models-flux.md §8); [`crate::lora`] reads the adapters.
//!
//! For a weight `S.weight` of ComfyUI's (Black Forest Labs') layout: `lora_unet_S` with dots as underscores
//! (kohya, ai-toolkit), `diffusion_model.S` and the bare `S`. For its diffusers name `N` (one stem, or the row
//! blocks of a fused weight: `to_q`, `to_k`, `to_v` of `qkv`; and FLUX.1's `proj_mlp` of a single block's
//! `linear1`, which FLUX.2's `to_qkv_mlp_proj` is whole):
//! `transformer.N`, `N`, `lycoris_N` and `lora_transformer_N` (OneTrainer; dots as underscores).
//!
//! Not read: diffusers' `norm_out.linear`, whose halves ComfyUI swaps into `final_layer.adaLN_modulation.1`
//! (a patch here cannot swap rows), is left unmatched and so named in the loader's warning.

use kiln_compute::memory::SafetensorsFile;

use super::config::{Config, diffusers_stems};
use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// Every stem a LoRA file may use for a FLUX model of `cfg` whose weights are `slots`.
pub fn aliases(cfg: &Config, slots: &[(&str, &[usize])]) -> Aliases {
    let mut aliases = Aliases::new();
    let slot_of = |name: &str| slots.iter().position(|(n, _)| *n == name);
    for (name, stems) in diffusers_stems(cfg) {
        let Some(slot) = slot_of(&name) else { continue };
        let Some(stem) = name.strip_suffix(".weight") else { continue };
        for alias in [
            format!("lora_unet_{}", stem.replace('.', "_")),
            format!("diffusion_model.{stem}"),
            stem.to_owned(),
        ] {
            aliases.add(alias, Target::Whole(slot));
        }
        if stem == "final_layer.adaLN_modulation.1" {
            continue;
        }
        if stems.len() > 1 {
            aliases.split(slot, stems.iter().map(|(_, rows)| *rows).collect());
        }
        for (index, (diffusers, _)) in stems.iter().enumerate() {
            let target =
                if stems.len() > 1 { Target::Part { slot, index } } else { Target::Whole(slot) };
            let underscored = diffusers.replace('.', "_");
            for alias in [
                format!("transformer.{diffusers}"),
                diffusers.clone(),
                format!("lycoris_{underscored}"),
                format!("lora_transformer_{underscored}"),
            ] {
                aliases.add(alias, target);
            }
        }
    }
    aliases
}

/// The patches the LoRA file `lora` makes at `strength` for a FLUX model of `cfg` whose weights are `slots`.
pub fn patches(
    lora: &SafetensorsFile,
    cfg: &Config,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(cfg, slots))
}
