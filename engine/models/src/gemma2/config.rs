//! Detection of a Gemma 2 decoder file (`gemma_2_2b_fp16.safetensors`, ComfyUI's `Gemma2_2B_Config`: heads 256
//! wide, RMS ε 1e-6, θ 10000) as a [`qwen3::Config`] of [`qwen3::Variant::Gemma2`], its load plan, and the
//! SentencePiece model it carries.

use std::path::PathBuf;

use kiln_compute::memory::{LoadPlan, SafetensorsFile, SlotPlan};

use crate::error::{Error, Result};
use crate::header::Header;
use crate::qwen3::{self, Config, Variant};
use crate::t5::{SPIECE_MODEL, file_spiece};

use super::Tokenizer;

/// Head width (ComfyUI's `Gemma2_2B_Config.head_dim`; no tensor tells it).
pub const HEAD_DIM: usize = 256;
/// RMSNorm ε.
pub const RMS_EPS: f32 = 1e-6;
/// RoPE base θ.
pub const ROPE_THETA: f64 = 10_000.0;
/// The final norm (the conditioning is taken before it; loaded for completeness of the decoder).
pub const NORM: &str = "model.norm.weight";
/// Where a combined checkpoint keeps the SentencePiece model: beside the text encoder's prefix, as ComfyUI saves
/// a `CLIP`'s tokenizer state (`text_encoders.` + `spiece_model`).
pub const CHECKPOINT_SPIECE_MODEL: &str = "text_encoders.spiece_model";
/// The family's name in messages.
pub const NAME: &str = "Gemma 2 2B";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "gemma2-2b";

/// A Gemma 2 encoder file as detected.
#[derive(Debug, Clone, PartialEq)]
pub struct Gemma2File {
    /// The decoder's widths.
    pub config: Config,
    /// The file.
    pub path: PathBuf,
    /// The full keys its SentencePiece model may be under, in the order they are tried.
    pub spiece_keys: Vec<String>,
}

impl Gemma2File {
    /// The Gemma 2 decoder in `h` (`None` when the file is not one: it lacks `pre_feedforward_layernorm`, or has
    /// Gemma 3's q/k norms), every width but the head's read from the shapes. A tensor missing, of an unsupported
    /// dtype or of a disagreeing shape is [`crate::Error::Unsupported`] naming it; so is a Gemma 3.
    pub fn detect(h: &Header) -> Result<Option<Gemma2File>> {
        let present = |name: &str| h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name);
        if !present("model.layers.0.pre_feedforward_layernorm.weight") {
            return Ok(None);
        }
        if present("model.layers.0.self_attn.q_norm.weight") {
            return Err(h.unsupported(
                "a Gemma 3 or 4 text encoder (it has q/k norms: NewBie's, LTX-2's), which Kiln does not run; \
                 Lumina 2 takes Gemma 2 2B",
            ));
        }
        let layers = qwen3::count_layers(h)?;
        let [vocab, hidden, heads, kv_heads, intermediate] =
            qwen3::fixed_head_dims(h, HEAD_DIM, "Gemma 2")?;
        let config = Config {
            vocab,
            hidden,
            layers,
            heads,
            kv_heads,
            head_dim: HEAD_DIM,
            intermediate,
            rms_eps: RMS_EPS,
            rope_theta: ROPE_THETA,
            variant: Variant::Gemma2,
        };
        qwen3::check_layers(h, &config)?;
        if layers < 2 {
            return Err(h.unsupported(format!(
                "a Gemma 2 file of {layers} layer: Lumina 2 conditions on the output of the second-to-last"
            )));
        }
        Ok(Some(Gemma2File::of(h, config)))
    }

    /// The file of `h` holding a Gemma 2 of `config` (built from a config in tests: tiny reference encoders have
    /// other head widths).
    pub fn of(h: &Header, config: Config) -> Gemma2File {
        let mut spiece_keys = vec![h.key(SPIECE_MODEL)];
        if !h.prefix().is_empty() {
            spiece_keys.push(CHECKPOINT_SPIECE_MODEL.to_owned());
        }
        Gemma2File { config, path: h.path().to_path_buf(), spiece_keys }
    }

    /// The tokenizer the file's SentencePiece model describes; an error naming the file when it carries none, a
    /// malformed one, or one with more pieces than the embedding table has rows.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        let unsupported = |msg: String| Error::Unsupported { path: self.path.clone(), msg };
        let file = SafetensorsFile::open(&self.path)?;
        let Some(key) = self.spiece_keys.iter().find(|key| file.tensor(key).is_ok()) else {
            return Err(unsupported(format!(
                "this Gemma 2 file has no `{SPIECE_MODEL}` tensor, the SentencePiece tokenizer ComfyUI reads from \
                 it (ComfyUI's repackaged Gemma 2 files carry it)"
            )));
        };
        Ok(Tokenizer::new(file_spiece(&file, key, self.config.vocab)?))
    }
}

/// What to load: the embedding table, every layer and the final norm when the file has it, under the file's
/// names without the prefix.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot("model.embed_tokens.weight".to_owned())];
    for i in 0..cfg.layers {
        slots.extend(cfg.layer_names(i).into_iter().map(slot));
    }
    if h.has(NORM) {
        slots.push(slot(NORM.to_owned()));
    }
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}
