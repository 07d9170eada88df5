//! The stems a LoRA file may name Z-Image's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them (its
//! `model_lora_keys_unet`, generic part and Lumina 2 part); [`crate::lora`] reads the adapters.
//!
//! For a weight `S.weight` of ComfyUI's layout:
//!
//! - `lora_unet_S` with dots as underscores (kohya), `diffusion_model.S`; a weight without `.weight`
//!   (`x_pad_token`) only as `diffusion_model.x_pad_token`;
//! - for the diffusers name `N` of the weight (models.md §2.3: `attention.to_out.0`, `attention.norm_q`,
//!   `all_x_embedder.2-1`, `all_final_layer.2-1.*`, identical elsewhere): `N`, `diffusion_model.N`,
//!   `transformer.N`, `lycoris_N` (underscores); diffusers' `to_q`/`to_k`/`to_v` name row blocks of the fused
//!   `attention.qkv`.
//!
//! Kiln also accepts, where ComfyUI ignores them (no name means two weights, so this only adds): the bare
//! ComfyUI name `S`, and `lora_unet_N` (kohya-style underscores over the diffusers name, as musubi-tuner
//! writes). Like ComfyUI (its TwinFlow conversion renames them to `t_embedder_2.`, which Z-Image lacks), bare
//! `t_embedder.*` keys adapt nothing.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// The patches the LoRA file `lora` makes at `strength` for a Z-Image model whose weights are `slots`
/// (`(name, shape)` in ComfyUI's Z-Image layout without prefix: `layers.3.attention.qkv.weight`, ...).
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(slots))
}

/// Every stem a LoRA file may use for Z-Image's weights, and the weight it adapts.
pub fn aliases(slots: &[(&str, &[usize])]) -> Aliases {
    let mut map = Aliases::new();
    let mut add = |alias: String, target: Target| {
        // Bare `t_embedder.*` stems adapt nothing, as in ComfyUI (see the module comment).
        if !alias.starts_with("t_embedder.") {
            map.add(alias, target);
        }
    };
    for (i, (name, shape)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else {
            add(format!("diffusion_model.{name}"), Target::Whole(i));
            continue;
        };
        add(format!("lora_unet_{}", stem.replace('.', "_")), Target::Whole(i));
        add(format!("diffusion_model.{stem}"), Target::Whole(i));
        add(stem.to_owned(), Target::Whole(i));
        for (diffusers, target) in diffusers_names(stem, i, shape) {
            let underscored = diffusers.replace('.', "_");
            add(format!("diffusion_model.{diffusers}"), target);
            add(format!("transformer.{diffusers}"), target);
            add(format!("lycoris_{underscored}"), target);
            add(format!("lora_unet_{underscored}"), target);
            add(diffusers, target);
        }
    }
    map
}

/// The diffusers names (without `.weight`) of the ComfyUI weight `stem` (slot `slot`), models.md §2.3.
fn diffusers_names(stem: &str, slot: usize, shape: &[usize]) -> Vec<(String, Target)> {
    if let Some(block) = stem.strip_suffix(".attention.qkv") {
        if shape.first().is_some_and(|rows| rows % 3 == 0) {
            return ["to_q", "to_k", "to_v"]
                .into_iter()
                .enumerate()
                .map(|(index, n)| (format!("{block}.attention.{n}"), Target::Part { slot, index }))
                .collect();
        }
        return Vec::new();
    }
    let whole = Target::Whole(slot);
    let renamed = if let Some(block) = stem.strip_suffix(".attention.out") {
        format!("{block}.attention.to_out.0")
    } else if let Some(block) = stem.strip_suffix(".attention.q_norm") {
        format!("{block}.attention.norm_q")
    } else if let Some(block) = stem.strip_suffix(".attention.k_norm") {
        format!("{block}.attention.norm_k")
    } else if stem == "x_embedder" {
        "all_x_embedder.2-1".to_owned()
    } else if let Some(rest) = stem.strip_prefix("final_layer.") {
        format!("all_final_layer.2-1.{rest}")
    } else {
        stem.to_owned()
    };
    vec![(renamed, whole)]
}
