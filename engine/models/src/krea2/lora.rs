//! The stems a LoRA file may name Krea 2's weights by, as ComfyUI's `LoraLoaderModelOnly` reads them: its generic
//! `model_lora_keys_unet` names (for a weight `S.weight`: `lora_unet_S` with dots as underscores, `diffusion_model.S`,
//! `transformer.S`, `lycoris_S` with underscores), and the diffusers names of its `krea2_to_diffusers` map
//! (`transformer_blocks.i.attn.to_q`, `ff.gate`, `img_in`, `time_embed.linear_1`, …), bare and under
//! `diffusion_model.`, `transformer.` and `lycoris_`; [`crate::lora`] reads the adapters.

use kiln_compute::memory::SafetensorsFile;

use crate::error::Result;
use crate::lora::{self, Aliases, LoraPatches, Target};

/// A block's diffusers names and Krea 2's (ComfyUI's `krea2_to_diffusers`; some tools drop `.0` from `to_out`).
const BLOCK_NAMES: [(&str, &str); 9] = [
    ("attn.to_q", "attn.wq"),
    ("attn.to_k", "attn.wk"),
    ("attn.to_v", "attn.wv"),
    ("attn.to_gate", "attn.gate"),
    ("attn.to_out.0", "attn.wo"),
    ("attn.to_out", "attn.wo"),
    ("ff.gate", "mlp.gate"),
    ("ff.up", "mlp.up"),
    ("ff.down", "mlp.down"),
];

/// The blocks' prefixes: diffusers' and Krea 2's.
const BLOCK_PREFIXES: [(&str, &str); 3] = [
    ("transformer_blocks.", "blocks."),
    ("text_fusion.layerwise_blocks.", "txtfusion.layerwise_blocks."),
    ("text_fusion.refiner_blocks.", "txtfusion.refiner_blocks."),
];

/// The other layers' diffusers names and Krea 2's.
const LAYER_NAMES: [(&str, &str); 8] = [
    ("img_in", "first"),
    ("time_embed.linear_1", "tmlp.0"),
    ("time_embed.linear_2", "tmlp.2"),
    ("time_mod_proj", "tproj.1"),
    ("txt_in.linear_1", "txtmlp.1"),
    ("txt_in.linear_2", "txtmlp.3"),
    ("text_fusion.projector", "txtfusion.projector"),
    ("final_layer.linear", "last.linear"),
];

/// The diffusers names of Krea 2's layer `stem` (a weight's name without `.weight`).
fn diffusers_names(stem: &str) -> Vec<String> {
    let mut names: Vec<String> =
        LAYER_NAMES.iter().filter(|&&(_, k)| k == stem).map(|&(d, _)| d.to_owned()).collect();
    for (diffusers_prefix, prefix) in BLOCK_PREFIXES {
        let Some((index, layer)) = stem.strip_prefix(prefix).and_then(|rest| rest.split_once('.'))
        else {
            continue;
        };
        names.extend(
            BLOCK_NAMES
                .iter()
                .filter(|&&(_, k)| k == layer)
                .map(|&(d, _)| format!("{diffusers_prefix}{index}.{d}")),
        );
    }
    names
}

/// Every stem a LoRA file may use for Krea 2's weights `slots`.
pub fn aliases(slots: &[(&str, &[usize])]) -> Aliases {
    let mut aliases = lora::dit_aliases(slots, false);
    for (i, (name, _)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else { continue };
        for d in diffusers_names(stem) {
            let underscored = d.replace('.', "_");
            for alias in [
                format!("diffusion_model.{d}"),
                format!("transformer.{d}"),
                format!("lycoris_{underscored}"),
                d,
            ] {
                aliases.add(alias, Target::Whole(i));
            }
        }
    }
    aliases
}

/// The patches the LoRA file `lora` makes at `strength` for a Krea 2 model whose weights are `slots`.
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
) -> Result<LoraPatches> {
    lora::patches(lora, slots, strength, &aliases(slots))
}

#[cfg(test)]
mod tests {
    use super::diffusers_names;

    #[test]
    fn krea2_weights_have_comfyuis_diffusers_names() {
        assert_eq!(diffusers_names("blocks.3.attn.wq"), ["transformer_blocks.3.attn.to_q"]);
        assert_eq!(
            diffusers_names("blocks.0.attn.wo"),
            ["transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.to_out"]
        );
        assert_eq!(
            diffusers_names("txtfusion.refiner_blocks.1.mlp.down"),
            ["text_fusion.refiner_blocks.1.ff.down"]
        );
        assert_eq!(diffusers_names("tproj.1"), ["time_mod_proj"]);
        assert!(diffusers_names("blocks.0.attn.qknorm.qnorm.scale").is_empty());
    }
}
