//! Detection of an Anima DiT (ComfyUI's key names) and its [`Config`], every width read from tensor shapes, and the
//! [`LoadPlan`].

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

/// The weight that marks Anima's LLM adapter (ComfyUI's detection key beside Cosmos Predict2's).
pub const MARKER: &str = "llm_adapter.blocks.0.cross_attn.q_proj.weight";
/// The weight that marks a Cosmos Predict2 DiT.
const COSMOS_MARKER: &str = "blocks.0.mlp.layer1.weight";
/// Patch side on rows and columns (one frame deep).
pub(super) const PATCH: usize = 2;
/// The rows the adapter's output is zero-padded to (`preprocess_text_embeds`).
pub const TEXT_ROWS: usize = 512;
/// The latent channels Anima reads (ComfyUI's text-to-image Cosmos Predict2; 17 would be image-to-video).
const LATENT_CHANNELS: usize = 16;

/// Anima's LLM adapter's hyperparameters (ComfyUI's `LLMAdapter`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterConfig {
    /// Rows of the T5 token embedding (32128).
    pub vocab: usize,
    /// Width of the token embedding and of the output: the DiT's context width (1024).
    pub target_dim: usize,
    /// Width of the blocks (1024; an `in_proj` maps the embedding to it when it differs).
    pub model_dim: usize,
    /// Width of the text encoder's states the blocks cross-attend to (Qwen3 0.6B's 1024).
    pub source_dim: usize,
    /// Blocks (6).
    pub layers: usize,
    /// Head width (64).
    pub head_dim: usize,
}

impl AdapterConfig {
    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.model_dim / self.head_dim
    }

    /// Whether an `in_proj` maps the token embedding to the blocks' width.
    pub fn in_proj(&self) -> bool {
        self.model_dim != self.target_dim
    }
}

/// An Anima DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Hidden width (`model_channels`: 2048).
    pub dim: usize,
    /// Head width (128).
    pub head_dim: usize,
    /// Blocks (28).
    pub blocks: usize,
    /// Latent channels in and out (16).
    pub channels: usize,
    /// Width of the cross-attention context (the adapter's output: 1024).
    pub context_dim: usize,
    /// Rank of the adaLN-LoRA modulations (256).
    pub adaln_lora_dim: usize,
    /// Width of the MLP's hidden layer (`4 · dim`).
    pub mlp_dim: usize,
    /// The RoPE's extrapolation ratios on the frame, row and column axes (ComfyUI's detection: (1, 4, 4) for a
    /// 16-channel model), which stretch each axis' θ by NTK.
    pub rope_extrapolation: [f64; 3],
    /// The LLM adapter.
    pub adapter: AdapterConfig,
}

impl Config {
    /// Attention heads.
    pub fn heads(&self) -> usize {
        self.dim / self.head_dim
    }
}

/// Whether `h` holds an Anima DiT, and its config. `Ok(None)`: not one. `Err(Unsupported)`: a Cosmos Predict2 DiT
/// without Anima's adapter (Kiln runs Anima), an image-to-video one, or tensors missing or misshapen.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !h.has(COSMOS_MARKER) || !h.has("x_embedder.proj.1.weight") {
        return Ok(None);
    }
    if !h.has(MARKER) {
        return Err(h.unsupported(
            "a Cosmos Predict2 DiT without Anima's LLM adapter (Cosmos on T5-XXL), which Kiln does not run; Kiln \
             runs Anima",
        ));
    }
    let dims = |name: &str, rank: usize| h.shape_of_rank(name, rank, "an Anima DiT");
    let embed = dims("x_embedder.proj.1.weight", 2)?;
    let dim = embed[0];
    // The latent's channels and the padding mask's, in 2×2 patches.
    let channels = (embed[1] / (PATCH * PATCH)).saturating_sub(1);
    if channels != LATENT_CHANNELS {
        return Err(h.unsupported(format!(
            "a Cosmos Predict2 DiT reading {channels} latent channels (image to video reads 17); Kiln runs Anima's \
             {LATENT_CHANNELS}"
        )));
    }
    let head_dim = dims("blocks.0.self_attn.q_norm.weight", 1)?[0];
    let adapter_head = dims("llm_adapter.blocks.0.self_attn.q_norm.weight", 1)?[0];
    let adapter_embed = dims("llm_adapter.embed.weight", 2)?;
    let adapter_model = dims("llm_adapter.blocks.0.norm_self_attn.weight", 1)?[0];
    if head_dim == 0
        || !dim.is_multiple_of(head_dim)
        || adapter_head == 0
        || !adapter_model.is_multiple_of(adapter_head)
    {
        return Err(h.unsupported(format!(
            "an Anima DiT {dim} wide with {head_dim}-wide heads, its adapter {adapter_model} wide with \
             {adapter_head}-wide heads: not whole heads"
        )));
    }
    let config = Config {
        dim,
        head_dim,
        blocks: h.gapless_blocks("blocks.", "an Anima DiT whose blocks")?,
        channels,
        context_dim: dims("blocks.0.cross_attn.k_proj.weight", 2)?[1],
        adaln_lora_dim: dims("blocks.0.adaln_modulation_self_attn.1.weight", 2)?[0],
        mlp_dim: dims(COSMOS_MARKER, 2)?[0],
        rope_extrapolation: [1.0, 4.0, 4.0],
        adapter: AdapterConfig {
            vocab: adapter_embed[0],
            target_dim: adapter_embed[1],
            model_dim: adapter_model,
            source_dim: dims("llm_adapter.blocks.0.cross_attn.k_proj.weight", 2)?[1],
            layers: h.gapless_blocks("llm_adapter.blocks.", "an Anima LLM adapter whose blocks")?,
            head_dim: adapter_head,
        },
    };
    for (name, shape) in expected(&config) {
        h.expect_shape(&name, &shape, "the Anima DiT")?;
    }
    Ok(Some(config))
}

/// Every weight with its shape, in the order the model reads them: the adapter's, then the DiT's.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut all = Shapes::default();
    let a = &cfg.adapter;
    let m = a.model_dim;
    all.weight("llm_adapter.embed.weight", vec![a.vocab, a.target_dim]);
    if a.in_proj() {
        all.linear("llm_adapter.in_proj", m, a.target_dim);
    }
    for i in 0..a.layers {
        let p = format!("llm_adapter.blocks.{i}");
        all.weight(&format!("{p}.norm_self_attn.weight"), vec![m]);
        all.attention(
            &format!("{p}.self_attn"),
            ["q_proj", "k_proj", "v_proj", "o_proj"],
            m,
            m,
            a.head_dim,
        );
        all.weight(&format!("{p}.norm_cross_attn.weight"), vec![m]);
        all.attention(
            &format!("{p}.cross_attn"),
            ["q_proj", "k_proj", "v_proj", "o_proj"],
            m,
            a.source_dim,
            a.head_dim,
        );
        all.weight(&format!("{p}.norm_mlp.weight"), vec![m]);
        all.linear(&format!("{p}.mlp.0"), 4 * m, m);
        all.linear(&format!("{p}.mlp.2"), m, 4 * m);
    }
    all.linear("llm_adapter.out_proj", a.target_dim, m);
    all.weight("llm_adapter.norm.weight", vec![a.target_dim]);

    let (d, r) = (cfg.dim, cfg.adaln_lora_dim);
    all.weight("x_embedder.proj.1.weight", vec![d, (cfg.channels + 1) * PATCH * PATCH]);
    all.weight("t_embedder.1.linear_1.weight", vec![d, d]);
    all.weight("t_embedder.1.linear_2.weight", vec![3 * d, d]);
    all.weight("t_embedding_norm.weight", vec![d]);
    for i in 0..cfg.blocks {
        let p = format!("blocks.{i}");
        let parts = ["q_proj", "k_proj", "v_proj", "output_proj"];
        all.attention(&format!("{p}.self_attn"), parts, d, d, cfg.head_dim);
        all.attention(&format!("{p}.cross_attn"), parts, d, cfg.context_dim, cfg.head_dim);
        all.weight(&format!("{p}.mlp.layer1.weight"), vec![cfg.mlp_dim, d]);
        all.weight(&format!("{p}.mlp.layer2.weight"), vec![d, cfg.mlp_dim]);
        for part in ["self_attn", "cross_attn", "mlp"] {
            all.weight(&format!("{p}.adaln_modulation_{part}.1.weight"), vec![r, d]);
            all.weight(&format!("{p}.adaln_modulation_{part}.2.weight"), vec![3 * d, r]);
        }
    }
    all.weight("final_layer.adaln_modulation.1.weight", vec![r, d]);
    all.weight("final_layer.adaln_modulation.2.weight", vec![2 * d, r]);
    all.weight("final_layer.linear.weight", vec![PATCH * PATCH * cfg.channels, d]);
    all.0
}

/// Weight names with their shapes, gathered module by module.
#[derive(Default)]
struct Shapes(Vec<(String, Vec<usize>)>);

impl Shapes {
    /// One weight.
    fn weight(&mut self, name: &str, shape: Vec<usize>) {
        self.0.push((name.to_owned(), shape));
    }

    /// A Linear's weight `[out, inp]` and bias.
    fn linear(&mut self, name: &str, out: usize, inp: usize) {
        self.weight(&format!("{name}.weight"), vec![out, inp]);
        self.weight(&format!("{name}.bias"), vec![out]);
    }

    /// An attention's bias-free projections (`parts`: q, k, v, out) and per-head q/k RMS norms: queries from
    /// `dim`, keys and values from `context`.
    fn attention(
        &mut self,
        p: &str,
        parts: [&str; 4],
        dim: usize,
        context: usize,
        head_dim: usize,
    ) {
        let [q, k, v, o] = parts;
        self.weight(&format!("{p}.{q}.weight"), vec![dim, dim]);
        self.weight(&format!("{p}.{k}.weight"), vec![dim, context]);
        self.weight(&format!("{p}.{v}.weight"), vec![dim, context]);
        self.weight(&format!("{p}.{o}.weight"), vec![dim, dim]);
        self.weight(&format!("{p}.q_norm.weight"), vec![head_dim]);
        self.weight(&format!("{p}.k_norm.weight"), vec![head_dim]);
    }
}

/// The weights to load, under the file's names.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(expected(cfg).into_iter().map(|(name, _)| name))
}
