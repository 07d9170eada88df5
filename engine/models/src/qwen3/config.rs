//! [`Config`]: a Qwen3 text encoder's widths, detected from a file's tensor shapes, and the [`LoadPlan`] of the
//! weights the hidden state needs (models.md §2.4, §4.1, §4.2); the same for Qwen2.5-VL's language model
//! ([`detect_qwen25vl`], models-qwen-image.md §4.1), the decoder it shares everything with but q/k norms and
//! q/k/v biases.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// Qwen3's RMSNorm ε (every Qwen3 size).
pub const RMS_EPS: f32 = 1e-6;
/// Qwen3's RoPE base (every Qwen3 size).
pub const ROPE_THETA: f64 = 1e6;

/// The token embedding table.
pub(super) const EMBED: &str = "model.embed_tokens.weight";

/// The final norm (Qwen3's conditioning is taken before it; Qwen2.5-VL's after it).
pub(super) const NORM: &str = "model.norm.weight";

/// The output head of a Qwen3 whose embedding is not tied (Qwen3-8B), as Kiln loads it.
pub(super) const LM_HEAD: &str = "lm_head.weight";

/// The names a file may keep [`LM_HEAD`] under: Hugging Face's, and ComfyUI's (`model.lm_head.weight`).
const LM_HEAD_NAMES: [&str; 2] = ["lm_head.weight", "model.lm_head.weight"];

/// Qwen2.5-VL's head width (every released size; the shapes give only heads × width).
pub const QWEN25_HEAD_DIM: usize = 128;

/// Which decoder of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Qwen3: per-head RMS norms of q and k, no projection biases; its conditioning is layer `layers − 2`'s
    /// output (models.md §4.1).
    Qwen3,
    /// Qwen2.5-VL's language model: q, k and v projections with biases, no q/k norms; its conditioning is the
    /// final norm's output (models-qwen-image.md §4.1). Text positions only (M-RoPE with every position equal
    /// is plain RoPE).
    Qwen25Vl,
    /// Mistral Small 3.x (FLUX.2 dev's text encoder, [`crate::mistral3`]): no biases, no q/k norms; its
    /// conditioning is three hidden states, never through the final norm (models-flux.md §5.2).
    Mistral3,
    /// Llama 3.1 8B Instruct (HiDream's fourth text encoder, [`crate::llama3`]): Mistral's layer tensors; its
    /// conditioning is every layer's output, the last through the final norm.
    Llama3,
    /// Gemma 2 (Lumina 2's text encoder, [`crate::gemma2`]): no biases, no q/k norms; every RMSNorm scales by
    /// `1 + w`, attention and MLP outputs pass through their own norms before the residual (sandwich norms), the
    /// MLP is GeGLU with tanh GELU, the embeddings are scaled by √hidden; its conditioning is layer
    /// `layers − 2`'s output, un-normalised.
    Gemma2,
    /// Qwen3-VL's language model (Krea 2's, Mage-Flow's and Boogu's text encoder, [`detect_qwen3vl`]): Qwen3's
    /// layers; images in the prompt at interleaved M-RoPE positions (sections [24, 20, 20]: the row and column
    /// take every third frequency; text positions, equal on all three axes, make it plain RoPE), their DeepStack
    /// features added after the first layers; its hidden state is the last layer's output through the final
    /// norm (taps as [`crate::qwen3::Qwen3::tapped_hidden_states`] numbers them).
    Qwen3Vl,
}

impl Variant {
    /// The tensors of one decoder layer, after `model.layers.{i}.`, in the order the model fetches them.
    pub(super) fn layer_tensors(self) -> &'static [&'static str] {
        match self {
            Variant::Qwen3 | Variant::Qwen3Vl => &LAYER_TENSORS,
            Variant::Qwen25Vl => &QWEN25_LAYER_TENSORS,
            Variant::Mistral3 | Variant::Llama3 => &MISTRAL3_LAYER_TENSORS,
            Variant::Gemma2 => &GEMMA2_LAYER_TENSORS,
        }
    }
}

/// [`LAYER_TENSORS`] of Gemma 2: Mistral's with a norm after the attention and around the MLP.
const GEMMA2_LAYER_TENSORS: [&str; 11] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "pre_feedforward_layernorm.weight",
    "post_feedforward_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// [`LAYER_TENSORS`] of Mistral Small 3.x: Qwen3's without the q/k norms.
const MISTRAL3_LAYER_TENSORS: [&str; 9] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// [`LAYER_TENSORS`] of Qwen2.5-VL's language model.
const QWEN25_LAYER_TENSORS: [&str; 12] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.o_proj.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// The tensors of one decoder layer, after `model.layers.{i}.`, in the order [`layer_names`] lists them.
const LAYER_TENSORS: [&str; 11] = [
    "input_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "post_attention_layernorm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

/// A Qwen3 decoder's hyperparameters (Qwen3-4B: vocab 151936, hidden 2560, 36 layers, 32 heads, 8 kv heads,
/// head dim 128, MLP 9728).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Rows of the embedding table.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Decoder layers in the file (the hidden state used is layer `layers − 2`'s output).
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention: `heads / kv_heads` query heads share one).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// MLP (SwiGLU) width.
    pub intermediate: usize,
    /// RMSNorm ε.
    pub rms_eps: f32,
    /// RoPE base θ.
    pub rope_theta: f64,
    /// Which decoder.
    pub variant: Variant,
}

/// The names of decoder layer `i`'s weights, in the order [`crate::qwen3::Qwen3`] fetches them: input norm,
/// q, k, v, o, q-norm, k-norm, post-attention norm, gate, up, down.
pub fn layer_names(i: usize) -> Vec<String> {
    LAYER_TENSORS.iter().map(|t| format!("model.layers.{i}.{t}")).collect()
}

impl Config {
    /// This Qwen3 decoder as Qwen3-VL's language model ([`Variant::Qwen3Vl`], RoPE θ
    /// [`super::family::QWEN3VL_ROPE_THETA`]).
    pub fn as_qwen3vl(self) -> Config {
        Config { rope_theta: super::family::QWEN3VL_ROPE_THETA, variant: Variant::Qwen3Vl, ..self }
    }

    /// The names of decoder layer `i`'s weights, in the order the model fetches them.
    pub fn layer_names(&self, i: usize) -> Vec<String> {
        let tensors = self.variant.layer_tensors();
        tensors.iter().map(|t| format!("model.layers.{i}.{t}")).collect()
    }

    /// The shapes of one layer's weights, in [`Config::layer_names`] order.
    pub(crate) fn layer_shapes(&self) -> Vec<Vec<usize>> {
        match self.variant {
            Variant::Qwen3 | Variant::Qwen3Vl => self.qwen3_layer_shapes().to_vec(),
            Variant::Qwen25Vl => {
                let (d, q, kv, f) = (
                    self.hidden,
                    self.heads * self.head_dim,
                    self.kv_heads * self.head_dim,
                    self.intermediate,
                );
                vec![
                    vec![d],
                    vec![q, d],
                    vec![q],
                    vec![kv, d],
                    vec![kv],
                    vec![kv, d],
                    vec![kv],
                    vec![d, q],
                    vec![d],
                    vec![f, d],
                    vec![f, d],
                    vec![d, f],
                ]
            }
            Variant::Mistral3 | Variant::Llama3 => {
                let [in_norm, q, k, v, o, _, _, post_norm, gate, up, down] =
                    self.qwen3_layer_shapes();
                vec![in_norm, q, k, v, o, post_norm, gate, up, down]
            }
            Variant::Gemma2 => {
                let [in_norm, q, k, v, o, _, _, post_norm, gate, up, down] =
                    self.qwen3_layer_shapes();
                let d = post_norm.clone();
                vec![in_norm, q, k, v, o, post_norm, d.clone(), d, gate, up, down]
            }
        }
    }

    /// Qwen3's layer shapes, in [`layer_names`] order.
    fn qwen3_layer_shapes(&self) -> [Vec<usize>; 11] {
        let (d, q, kv, f) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
            self.intermediate,
        );
        [
            vec![d],
            vec![q, d],
            vec![kv, d],
            vec![kv, d],
            vec![d, q],
            vec![self.head_dim],
            vec![self.head_dim],
            vec![d],
            vec![f, d],
            vec![f, d],
            vec![d, f],
        ]
    }
}

/// The config of a Qwen3 text encoder (`None` when the file is not one: it lacks
/// `model.layers.0.post_attention_layernorm.weight` or `model.layers.0.self_attn.q_norm.weight`), every
/// width derived from the tensor shapes. A Qwen3 layout with a tensor missing, of an unsupported dtype
/// or of a shape that disagrees with the others is [`crate::Error::Unsupported`] naming it.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    let q_norm = "model.layers.0.self_attn.q_norm.weight";
    let looks_like_qwen3 = |name: &str| present(h, name);
    // Gemma 3 and 4 have q/k norms too, and Gemma's sandwich norms ([`crate::gemma2`] names them).
    if !looks_like_qwen3("model.layers.0.post_attention_layernorm.weight")
        || !looks_like_qwen3(q_norm)
        || looks_like_qwen3("model.layers.0.pre_feedforward_layernorm.weight")
    {
        return Ok(None);
    }
    let layers = count_layers(h)?;
    let [vocab, hidden] = dims(h, EMBED)?;
    let [head_dim] = dims(h, q_norm)?;
    let [q_rows, _] = dims(h, "model.layers.0.self_attn.q_proj.weight")?;
    let [kv_rows, _] = dims(h, "model.layers.0.self_attn.k_proj.weight")?;
    let [intermediate, _] = dims(h, "model.layers.0.mlp.gate_proj.weight")?;
    if head_dim == 0 || head_dim % 2 == 1 || q_rows % head_dim != 0 || kv_rows % head_dim != 0 {
        return Err(h.unsupported(format!(
            "a Qwen3 layout whose q_norm width {head_dim} does not divide q_proj's {q_rows} and \
             k_proj's {kv_rows} rows into even-width heads"
        )));
    }
    let (heads, kv_heads) = (q_rows / head_dim, kv_rows / head_dim);
    if kv_heads == 0 || heads % kv_heads != 0 {
        return Err(h.unsupported(format!(
            "a Qwen3 layout with {heads} query heads and {kv_heads} key/value heads (not a multiple)"
        )));
    }
    let config = Config {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        rms_eps: RMS_EPS,
        rope_theta: ROPE_THETA,
        variant: Variant::Qwen3,
    };
    check_layers(h, &config)?;
    Ok(Some(config))
}

/// The config of Qwen3-VL's language model ([`Variant::Qwen3Vl`], RoPE θ
/// [`super::family::QWEN3VL_ROPE_THETA`]): a Qwen3 layout ([`detect`]) in a file that also holds Qwen3-VL's vision
/// tower (`visual.deepstack_merger_list.0.norm.weight`, ComfyUI's own test; the file's
/// `model.visual.deepstack_merger_list.0.norm.weight` in transformers' layout). `None` for any other file.
pub fn detect_qwen3vl(h: &Header) -> Result<Option<Config>> {
    if !present(h, "visual.deepstack_merger_list.0.norm.weight") {
        return Ok(None);
    }
    Ok(detect(h)?.map(Config::as_qwen3vl))
}

/// The config of Qwen2.5-VL's language model (`None` when the file is not one: it lacks
/// `model.layers.0.self_attn.q_proj.bias`, or has Qwen3's q norm), every width but the head's (128, as ComfyUI's
/// `Qwen25_7BVLI` fixes it) derived from the tensor shapes. The vision tower (`visual.*`) is not read. A tensor
/// missing, of an unsupported dtype or of a disagreeing shape is [`crate::Error::Unsupported`] naming it.
pub fn detect_qwen25vl(h: &Header) -> Result<Option<Config>> {
    if !present(h, "model.layers.0.self_attn.q_proj.bias")
        || present(h, "model.layers.0.self_attn.q_norm.weight")
    {
        return Ok(None);
    }
    let layers = count_layers(h)?;
    let [vocab, hidden] = dims(h, EMBED)?;
    let [q_rows, _] = dims(h, "model.layers.0.self_attn.q_proj.weight")?;
    let [kv_rows, _] = dims(h, "model.layers.0.self_attn.k_proj.weight")?;
    let [intermediate, _] = dims(h, "model.layers.0.mlp.gate_proj.weight")?;
    let head_dim = QWEN25_HEAD_DIM;
    let (heads, kv_heads) = (q_rows / head_dim, kv_rows / head_dim);
    if q_rows % head_dim != 0 || kv_rows % head_dim != 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(h.unsupported(format!(
            "a Qwen2.5 layout whose q_proj ({q_rows} rows) and k_proj ({kv_rows} rows) are not whole \
             {head_dim}-wide heads, query heads a multiple of key/value heads"
        )));
    }
    let config = Config {
        vocab,
        hidden,
        layers,
        heads,
        kv_heads,
        head_dim,
        intermediate,
        rms_eps: RMS_EPS,
        rope_theta: ROPE_THETA,
        variant: Variant::Qwen25Vl,
    };
    check_layers(h, &config)?;
    require(h, NORM)?;
    Ok(Some(config))
}

/// The widths of a decoder whose heads are `head_dim` wide, which no tensor tells (Mistral's, Llama's): `[vocab,
/// hidden, heads, kv_heads, intermediate]` from the shapes; an error naming the `what` layout when q_proj and
/// k_proj are not whole heads, or query heads not a multiple of key/value heads.
pub(crate) fn fixed_head_dims(h: &Header, head_dim: usize, what: &str) -> Result<[usize; 5]> {
    let [vocab, hidden] = dims(h, EMBED)?;
    let [q_rows, _] = dims(h, "model.layers.0.self_attn.q_proj.weight")?;
    let [kv_rows, _] = dims(h, "model.layers.0.self_attn.k_proj.weight")?;
    let [intermediate, _] = dims(h, "model.layers.0.mlp.gate_proj.weight")?;
    let (heads, kv_heads) = (q_rows / head_dim, kv_rows / head_dim);
    if q_rows % head_dim != 0 || kv_rows % head_dim != 0 || kv_heads == 0 || heads % kv_heads != 0 {
        return Err(h.unsupported(format!(
            "a {what} layout whose q_proj ({q_rows} rows) and k_proj ({kv_rows} rows) are not whole \
             {head_dim}-wide heads, query heads a multiple of key/value heads"
        )));
    }
    Ok([vocab, hidden, heads, kv_heads, intermediate])
}

/// Checks every layer's tensors against `config`.
pub(crate) fn check_layers(h: &Header, config: &Config) -> Result<()> {
    for i in 0..config.layers {
        for (name, want) in config.layer_names(i).iter().zip(config.layer_shapes()) {
            check_shape(h, name, &want)?;
        }
    }
    Ok(())
}

/// What to load: the embedding table, every layer and `model.norm` (when the file has it), under the file's
/// names without the prefix. The conditioning uses layers `0..=layers − 2` (Z-Image's) or `0..27` (Klein's);
/// text generation runs them all, the norm, and an output head: the embedding (Qwen3-4B ties them, and ComfyUI's
/// Qwen3-4B ignores any `lm_head`), or at Qwen3-8B's width the file's `lm_head` when it has one of
/// `[vocab, hidden]` (ComfyUI's `Qwen3_8BConfig` has an untied head), loaded as `lm_head.weight`.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot(EMBED.to_owned())];
    for i in 0..cfg.layers {
        slots.extend(cfg.layer_names(i).into_iter().map(slot));
    }
    if h.has(NORM) {
        slots.push(slot(NORM.to_owned()));
    }
    let untied = matches!(cfg.variant, Variant::Qwen3 | Variant::Qwen3Vl)
        && cfg.hidden == super::family::QWEN3_8B_HIDDEN;
    let head_shape = Some(vec![cfg.vocab, cfg.hidden]);
    if let Some(name) = LM_HEAD_NAMES.iter().find(|&&n| untied && h.values_shape(n) == head_shape) {
        slots.push(SlotPlan::new(LM_HEAD.to_owned(), vec![(0, h.key(name))]));
    }
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// The number of decoder layers: indices `model.layers.{i}.` must run 0, 1, … without a gap.
pub(crate) fn count_layers(h: &Header) -> Result<usize> {
    h.gapless_blocks("model.layers.", "a Qwen3 layout whose layers")
}

/// The shape of a tensor that must exist with rank `N`.
pub(crate) fn dims<const N: usize>(h: &Header, name: &str) -> Result<[usize; N]> {
    require(h, name)?;
    let shape = h.values_shape(name).unwrap_or_default();
    shape.clone().try_into().map_err(|_| {
        h.unsupported(format!("tensor `{}` has shape {shape:?}, not rank {N}", h.key(name)))
    })
}

/// Checks a tensor exists with shape `want`.
pub(crate) fn check_shape(h: &Header, name: &str, want: &[usize]) -> Result<()> {
    require(h, name)?;
    match h.values_shape(name) {
        Some(shape) if shape == want => Ok(()),
        shape => Err(h.unsupported(format!(
            "tensor `{}` has shape {:?}, expected {want:?} for this layout",
            h.key(name),
            shape.unwrap_or_default()
        ))),
    }
}

/// Whether tensor `name` is in the file, in any dtype.
fn present(h: &Header, name: &str) -> bool {
    h.has(name) || unsupported_dtype(h, name).is_some()
}

/// The dtype of tensor `name` when it is one Kiln cannot compute with (matched by its key in the file, so a
/// nested language model's names count).
fn unsupported_dtype<'f>(h: &Header<'f>, name: &str) -> Option<&'f str> {
    let key = h.key(name);
    let name = key.strip_prefix(h.prefix()).unwrap_or(&key);
    h.unsupported_dtypes().find(|&(n, _)| n == name).map(|(_, dtype)| dtype)
}

/// A tensor that must exist in a dtype Kiln computes with.
fn require(h: &Header, name: &str) -> Result<()> {
    if let Some(dtype) = unsupported_dtype(h, name) {
        return Err(h.unsupported(format!(
            "tensor `{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    h.require(name).map(|_| ())
}
