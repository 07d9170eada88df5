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
    let mut splits = Vec::new();
    for (i, (name, shape)) in slots.iter().enumerate() {
        if name.ends_with(".attention.qkv.weight")
            && let Some(rows) = qkv_rows(shape)
        {
            splits.push((i, rows));
        }
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
    for (slot, rows) in splits {
        map.split(slot, rows);
    }
    map
}

/// The row blocks of a fused `attention.qkv` of `shape` `[rows, dim]`: the queries' `dim` rows, then the keys' and
/// the values' equal shares of the rest (Lumina 2's grouped-query 2304 + 768 + 768; Z-Image's three equal blocks);
/// `None` for a shape that is no such split.
fn qkv_rows(shape: &[usize]) -> Option<Vec<usize>> {
    let &[rows, dim] = shape else { return None };
    let kv = rows.checked_sub(dim)?;
    (kv > 0 && kv.is_multiple_of(2)).then(|| vec![dim, kv / 2, kv / 2])
}

/// The diffusers names (without `.weight`) of the ComfyUI weight `stem` (slot `slot`), models.md §2.3.
fn diffusers_names(stem: &str, slot: usize, shape: &[usize]) -> Vec<(String, Target)> {
    if let Some(block) = stem.strip_suffix(".attention.qkv") {
        if qkv_rows(shape).is_some() {
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

#[cfg(test)]
mod tests {
    use super::qkv_rows;

    #[test]
    fn the_fused_qkv_splits_by_the_query_width() {
        // Z-Image's three equal blocks; Lumina 2's grouped-query 2304 + 768 + 768.
        assert_eq!(qkv_rows(&[11520, 3840]), Some(vec![3840, 3840, 3840]));
        assert_eq!(qkv_rows(&[3840, 2304]), Some(vec![2304, 768, 768]));
        assert_eq!(qkv_rows(&[2304, 2304]), None);
        assert_eq!(qkv_rows(&[3840]), None);
    }
}
