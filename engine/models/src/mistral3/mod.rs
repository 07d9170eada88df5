//! FLUX.2 dev's text encoder: Mistral Small 3.x (24B), run by the Qwen3 decoder code as
//! [`crate::qwen3::Variant::Mistral3`], with the Tekken tokenizer its file carries (models-flux.md §3.6, §5.2); and
//! ERNIE-Image's, Ministral 3 3B, the same decoder at another size ([`Size`]).
//!
//! - [`detect`] recognises the file as ComfyUI does (`model.layers.0.post_attention_layernorm.weight` 5120 wide
//!   for Mistral Small, 3072 for Ministral, no q norm) or, at any width, a Llama-shaped file without q/k norms or
//!   biases that carries a `tekken_model` tensor (Ministral's when too shallow for FLUX.2's taps); every width but
//!   the head's (128, as ComfyUI fixes it) comes from the shapes.
//! - [`load_plan_for`] names the weights: for Mistral Small the embedding and layers 0–29 (a 40-layer file's last
//!   ten, its final norm and any vision tower are never read; `tekken_model` is not a weight); for Ministral
//!   everything (it generates text).
//! - [`Tokenizer`]: the tekken JSON of `tekken_model` rebuilt as ComfyUI rebuilds it, the FLUX.2 prompt and
//!   ERNIE-Image's plain one.
//!
//! FLUX.2 dev's conditioning is hidden states [`TAPS`] (10, 20, 30) side by side, never final-normed:
//! [`crate::qwen3::Qwen3::tapped_hidden_states`]; ERNIE-Image's the second-to-last layer's output.

pub mod family;
mod tokenizer;

use std::path::PathBuf;
use std::sync::OnceLock;

use kiln_compute::memory::{LoadPlan, SafetensorsFile, SlotPlan};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::qwen3::{self, Config, Variant};

pub use tokenizer::{BOS, PAD, Tokenizer, attended_keys};

/// The hidden states FLUX.2 dev conditions on, in Hugging Face's numbering (0 the embeddings, `i` the output of
/// layer `i − 1`): ComfyUI's `Mistral3_24BModel` `layer=[10, 20, 30]`.
pub const TAPS: [usize; 3] = [10, 20, 30];
/// Mistral Small 3.x's head width (ComfyUI's `Mistral3Small24BConfig.head_dim`; the shapes give heads × width).
pub const HEAD_DIM: usize = 128;
/// Mistral Small 3.x's RMSNorm ε.
pub const RMS_EPS: f32 = 1e-5;
/// Mistral Small 3.x's RoPE base θ.
pub const ROPE_THETA: f64 = 1e9;
/// Mistral Small 3.x's hidden width, by which ComfyUI recognises the file.
pub const HIDDEN: usize = 5120;
/// The uint8 tensor holding the tekken tokenizer's JSON.
pub const TEKKEN: &str = "tekken_model";
/// `</s>`: where Ministral 3 3B's generation stops (ComfyUI's `Ministral3_3BConfig.stop_tokens`).
pub const STOP_TOKENS: [u32; 1] = [2];
/// Ministral 3 3B's hidden width, by which ComfyUI recognises ERNIE-Image's text encoder (and its prompt
/// enhancer).
pub const MINISTRAL_3B_HIDDEN: usize = 3072;
/// Ministral 3 3B's RoPE base θ (ComfyUI's `Ministral3_3BConfig`, which reads no RoPE scaling).
pub const MINISTRAL_ROPE_THETA: f64 = 1e6;

/// Which Mistral decoder a file is, as ComfyUI's `detect_te_model` tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// Mistral Small 3.x 24B (FLUX.2 dev's encoder): 5120 wide, conditioning on hidden states [`TAPS`].
    Small24B,
    /// Ministral 3 3B (ERNIE-Image's encoder and prompt enhancer): 3072 wide, conditioning on the second-to-last
    /// layer's output, un-normed; it generates text too.
    Ministral3B,
}

/// The tekken JSON `kiln model synth` writes into its Mistral files: Mistral's 1000 special tokens (ranks 0-19
/// named as in Mistral Small 3.1's tokenizer, `<SPECIAL_n>` after them) and a vocabulary of the 256 single bytes
/// (rank = byte), so every text tokenises, byte by byte, below id 1256.
pub fn synth_tekken_json() -> &'static [u8] {
    static JSON: OnceLock<Vec<u8>> = OnceLock::new();
    JSON.get_or_init(|| {
        const NAMED: [&str; 20] = [
            "<unk>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[AVAILABLE_TOOLS]",
            "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
            "[TOOL_CALLS]",
            "[IMG]",
            "<pad>",
            "[IMG_BREAK]",
            "[IMG_END]",
            "[PREFIX]",
            "[MIDDLE]",
            "[SUFFIX]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[TOOL_CONTENT]",
        ];
        let specials: Vec<serde_json::Value> = (0..1000)
            .map(|rank| {
                let name = NAMED.get(rank).map_or_else(|| format!("<SPECIAL_{rank}>"), |n| (*n).to_owned());
                serde_json::json!({ "rank": rank, "token_str": name, "is_control": true })
            })
            .collect();
        let vocab: Vec<serde_json::Value> = (0..=255u8)
            .map(|b| {
                let text = String::from_utf8_lossy(&[b]).into_owned();
                serde_json::json!({ "rank": b, "token_bytes": tokenizer::base64_encode(&[b]), "token_str": text })
            })
            .collect();
        let config = serde_json::json!({
            "pattern": "",
            "num_vocab_tokens": 256,
            "default_vocab_size": 1256,
            "default_num_special_tokens": 1000,
            "version": "v7",
        });
        serde_json::json!({ "config": config, "vocab": vocab, "special_tokens": specials })
            .to_string()
            .into_bytes()
    })
}

/// A Mistral file as detected: Mistral Small 3.x or Ministral 3 3B ([`Detected::size`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Detected {
    /// The decoder's widths ([`Variant::Mistral3`]).
    pub config: Config,
    /// The file.
    pub path: PathBuf,
    /// The full key of its [`TEKKEN`] tensor, when it carries one.
    pub tekken_key: Option<String>,
    /// Which decoder it is.
    pub size: Size,
}

impl Detected {
    /// The tokenizer the file's [`TEKKEN`] JSON describes; an error naming the file when it carries none.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let Some(key) = &self.tekken_key else {
            return Err(Error::Unsupported {
                path: self.path.clone(),
                msg: format!(
                    "this {} file has no `{TEKKEN}` tensor, the tokenizer ComfyUI reads from it",
                    match self.size {
                        Size::Small24B => "Mistral Small",
                        Size::Ministral3B => "Ministral 3 3B",
                    }
                ),
            });
        };
        let file = SafetensorsFile::open(&self.path)?;
        Tokenizer::from_tekken_json(&file.raw_bytes(key)?)
    }
}

/// The Mistral text encoder in `h` (`None` when the file is not one): Mistral Small 3.x or Ministral 3 3B, every
/// width derived from the shapes but the head's. A Mistral Small file (5120 wide) with fewer layers than the
/// deepest tap, or a tensor missing, of an unsupported dtype or of a disagreeing shape, is
/// [`crate::Error::Unsupported`] naming it; a file of neither released width that is too shallow for the taps is
/// taken as Ministral's (Kiln's rule for tiny files; ComfyUI calls such a file Llama 3).
pub fn detect(h: &Header) -> Result<Option<Detected>> {
    let present = |name: &str| h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name);
    let norm = "model.layers.0.post_attention_layernorm.weight";
    let llama_shaped = present(norm)
        && !present("model.layers.0.self_attn.q_norm.weight")
        && !present("model.layers.0.self_attn.q_proj.bias");
    let width = h.shape(norm).and_then(|s| s.first().copied());
    let ours = matches!(width, Some(HIDDEN | MINISTRAL_3B_HIDDEN)) || h.has(TEKKEN);
    if !llama_shaped || !ours {
        return Ok(None);
    }
    let layers = qwen3::count_layers(h)?;
    let [vocab, hidden, heads, kv_heads, intermediate] =
        qwen3::fixed_head_dims(h, HEAD_DIM, "Mistral")?;
    let deepest = TAPS[TAPS.len() - 1];
    // Ministral 3 3B by its width; a file of neither released width (a tiny one) by its depth: one too shallow
    // for FLUX.2's taps can only be Ministral's.
    let size = match hidden {
        HIDDEN => Size::Small24B,
        MINISTRAL_3B_HIDDEN => Size::Ministral3B,
        _ if layers < deepest => Size::Ministral3B,
        _ => Size::Small24B,
    };
    if size == Size::Small24B && layers < deepest {
        return Err(h.unsupported(format!(
            "FLUX.2 dev's Mistral text encoder takes hidden states {TAPS:?}; this file has only {layers} layers"
        )));
    }
    let rope_theta = match size {
        Size::Small24B => ROPE_THETA,
        Size::Ministral3B => MINISTRAL_ROPE_THETA,
    };
    let config = Config {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim: HEAD_DIM,
        intermediate,
        rms_eps: RMS_EPS,
        rope_theta,
        variant: Variant::Mistral3,
    };
    qwen3::check_layers(h, &config)?;
    let tekken_key = h.has(TEKKEN).then(|| h.key(TEKKEN));
    Ok(Some(Detected { config, path: h.path().to_path_buf(), tekken_key, size }))
}

/// What to load for `found`: FLUX.2 dev's the embedding table and the layers the deepest tap needs; Ministral
/// 3 3B's everything (it generates text), under the file's names without the prefix.
pub fn load_plan_for(h: &Header, found: &Detected) -> LoadPlan {
    match found.size {
        Size::Small24B => load_plan(h, &found.config),
        Size::Ministral3B => qwen3::load_plan(h, &found.config),
    }
}

/// What to load: the embedding table and the layers the deepest tap needs, under the file's names without the
/// prefix.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot("model.embed_tokens.weight".to_owned())];
    let needed = TAPS[TAPS.len() - 1].min(cfg.layers);
    for i in 0..needed {
        slots.extend(cfg.layer_names(i).into_iter().map(slot));
    }
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}
