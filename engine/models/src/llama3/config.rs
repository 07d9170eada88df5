//! Detection of a Llama 3.x decoder file (`llama_3.1_8b_instruct_*.safetensors`, ComfyUI's `Llama2` with
//! `Llama2Config`: θ 500000, RMS ε 1e-5, heads 128 wide, no RoPE scaling) as a [`qwen3::Config`] of
//! [`qwen3::Variant::Llama3`], run by the same decoder code, and its load plan.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;
use crate::qwen3::{self, Config, Variant};

/// Head width (ComfyUI's `Llama2Config.head_dim`).
pub const HEAD_DIM: usize = 128;
/// RMSNorm ε.
pub const RMS_EPS: f32 = 1e-5;
/// RoPE base θ (ComfyUI applies no Llama 3.1 frequency scaling).
pub const ROPE_THETA: f64 = 500_000.0;
/// The final norm: the last of the states HiDream reads passes through it.
pub const NORM: &str = "model.norm.weight";

/// The Llama 3 decoder in `h` (`None` when the file is not one: a Llama-shaped file, without q/k norms or
/// projection biases nor Gemma's sandwich norms, that is not Mistral Small's, which [`crate::mistral3::detect`] claims first), every width
/// but the head's read from the shapes. A tensor missing, of an unsupported dtype or of a disagreeing shape is
/// [`crate::Error::Unsupported`] naming it.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    let present = |name: &str| h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name);
    let llama_shaped = present("model.layers.0.post_attention_layernorm.weight")
        && present("model.layers.0.self_attn.k_proj.weight")
        && !present("model.layers.0.self_attn.q_norm.weight")
        && !present("model.layers.0.self_attn.q_proj.bias")
        && !present("model.layers.0.pre_feedforward_layernorm.weight");
    if !llama_shaped || crate::mistral3::detect(h)?.is_some() {
        return Ok(None);
    }
    let layers = qwen3::count_layers(h)?;
    let [vocab, hidden, heads, kv_heads, intermediate] =
        qwen3::fixed_head_dims(h, HEAD_DIM, "Llama")?;
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
        variant: Variant::Llama3,
    };
    qwen3::check_layers(h, &config)?;
    if !h.has(NORM) {
        return Err(h.unsupported(format!(
            "a Llama file without its final norm `{}`, which the last hidden state HiDream reads passes through",
            h.key(NORM)
        )));
    }
    Ok(Some(config))
}

/// What to load: the embedding table, every layer and the final norm, under the file's names without the
/// prefix (the output head is never read).
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot("model.embed_tokens.weight".to_owned())];
    for i in 0..cfg.layers {
        slots.extend(cfg.layer_names(i).into_iter().map(slot));
    }
    slots.push(slot(NORM.to_owned()));
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// The family's name in messages.
pub const NAME: &str = "Llama 3.1 8B";
/// The name `kiln model synth --family` writes the encoder under.
pub const SYNTH_NAME: &str = "llama3";
