//! [`Config`]: a CLIP text tower's widths, detected from a file's tensor shapes, and the [`LoadPlan`] of the
//! weights it runs on (models-flux.md §3.6, §5.1).
//!
//! Invariant: every width comes from the shapes (the token embedding gives vocabulary and hidden width, the
//! position embedding the positions, `fc1` the MLP width, the layer keys the depth); only the head width (64)
//! and the activation, which no shape shows, follow ComfyUI's configs.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;
use crate::qwen3::{check_shape, dims};

use super::family;

/// The width of one attention head in every CLIP text tower (CLIP-L 12 × 64, CLIP-H 16 × 64, CLIP-G 20 × 64).
pub const HEAD_DIM: usize = 64;
/// LayerNorm ε of every CLIP text tower (`layer_norm_eps` in ComfyUI's configs).
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// The token embedding table `[vocab, hidden]`.
pub(super) const TOKEN_EMBEDDING: &str = "text_model.embeddings.token_embedding.weight";
/// The learned position embedding `[positions, hidden]`.
pub(super) const POSITION_EMBEDDING: &str = "text_model.embeddings.position_embedding.weight";
/// The final LayerNorm's weight.
pub(super) const FINAL_NORM_WEIGHT: &str = "text_model.final_layer_norm.weight";
/// The final LayerNorm's bias.
pub(super) const FINAL_NORM_BIAS: &str = "text_model.final_layer_norm.bias";
/// The pooled vector's projection `[hidden, hidden]` (CLIPTextModelWithProjection's; ComfyUI's
/// `return_projected_pooled`).
pub(super) const TEXT_PROJECTION: &str = "text_projection.weight";

/// The key ComfyUI recognises a CLIP text file by (`FluxClipModel.load_sd`): layer 1's first MLP weight.
const MARKER: &str = "text_model.encoder.layers.1.mlp.fc1.weight";

/// OpenCLIP's names for the token embedding, the position embedding (a bare parameter), the final LayerNorm and
/// the projection (a bare `[hidden, projection]` matrix the pooled vector is multiplied by).
const OPEN_CLIP_TOKEN_EMBEDDING: &str = "token_embedding.weight";
const OPEN_CLIP_POSITION_EMBEDDING: &str = "positional_embedding";
const OPEN_CLIP_FINAL_NORM_WEIGHT: &str = "ln_final.weight";
const OPEN_CLIP_FINAL_NORM_BIAS: &str = "ln_final.bias";
const OPEN_CLIP_TEXT_PROJECTION: &str = "text_projection";
/// OpenCLIP's layer 1 first MLP weight, what tells its layout.
const OPEN_CLIP_MARKER: &str = "transformer.resblocks.1.mlp.c_fc.weight";
/// Where OpenCLIP's layers' keys start.
const OPEN_CLIP_LAYERS_PREFIX: &str = "transformer.resblocks.";
/// One OpenCLIP layer's tensors in the order the model fetches them: [`LAYER_TENSORS`]' with q, k and v as one
/// `in_proj` `[3·hidden, hidden]` (and its bias).
const OPEN_CLIP_LAYER_TENSORS: [&str; 12] = [
    "ln_1.weight",
    "ln_1.bias",
    "attn.in_proj_weight",
    "attn.in_proj_bias",
    "attn.out_proj.weight",
    "attn.out_proj.bias",
    "ln_2.weight",
    "ln_2.bias",
    "mlp.c_fc.weight",
    "mlp.c_fc.bias",
    "mlp.c_proj.weight",
    "mlp.c_proj.bias",
];

/// How a file names a CLIP text tower's tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// transformers' `CLIPTextModel` (`text_model.encoder.layers.N.self_attn.q_proj.weight`): ComfyUI's own.
    Transformers,
    /// OpenCLIP's (`transformer.resblocks.N.attn.in_proj_weight`, `text_projection` bare and transposed): SDXL
    /// checkpoints' CLIP-G, which ComfyUI converts on load (`clip_text_transformers_convert`).
    OpenClip,
}

impl Layout {
    /// The token embedding table's name `[vocab, hidden]`.
    fn token_embedding(self) -> &'static str {
        match self {
            Layout::Transformers => TOKEN_EMBEDDING,
            Layout::OpenClip => OPEN_CLIP_TOKEN_EMBEDDING,
        }
    }

    /// The position embedding's name `[positions, hidden]`.
    fn position_embedding(self) -> &'static str {
        match self {
            Layout::Transformers => POSITION_EMBEDDING,
            Layout::OpenClip => OPEN_CLIP_POSITION_EMBEDDING,
        }
    }

    /// The final LayerNorm's weight and bias names.
    fn final_norm(self) -> [&'static str; 2] {
        match self {
            Layout::Transformers => [FINAL_NORM_WEIGHT, FINAL_NORM_BIAS],
            Layout::OpenClip => [OPEN_CLIP_FINAL_NORM_WEIGHT, OPEN_CLIP_FINAL_NORM_BIAS],
        }
    }

    /// The projection's name: transformers' `[projection, hidden]` Linear weight, OpenCLIP's
    /// `[hidden, projection]` matrix.
    fn text_projection(self) -> &'static str {
        match self {
            Layout::Transformers => TEXT_PROJECTION,
            Layout::OpenClip => OPEN_CLIP_TEXT_PROJECTION,
        }
    }
}

/// Where the layers' keys start.
const LAYERS_PREFIX: &str = "text_model.encoder.layers.";

/// The tensors of one encoder layer, after `text_model.encoder.layers.{i}.`, in the order the model fetches
/// them.
pub(crate) const LAYER_TENSORS: [&str; 16] = [
    "layer_norm1.weight",
    "layer_norm1.bias",
    "self_attn.q_proj.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.weight",
    "self_attn.k_proj.bias",
    "self_attn.v_proj.weight",
    "self_attn.v_proj.bias",
    "self_attn.out_proj.weight",
    "self_attn.out_proj.bias",
    "layer_norm2.weight",
    "layer_norm2.bias",
    "mlp.fc1.weight",
    "mlp.fc1.bias",
    "mlp.fc2.weight",
    "mlp.fc2.bias",
];

/// Which CLIP text tower a file is, by ComfyUI's rule (`detect_te_model`): a file with a layer 30 is CLIP-G,
/// one with a layer 22 CLIP-H, any other CLIP-L. The variant decides the MLP activation, the one thing the
/// shapes do not show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// OpenAI's ViT-L/14 text tower (SD1.x, Flux.1, SDXL's first encoder): 768 wide, 12 layers, quick-GELU.
    L,
    /// OpenCLIP ViT-H/14's text tower (SD2.x): 1024 wide, 24 layers, exact GELU.
    H,
    /// OpenCLIP ViT-bigG/14's text tower (SDXL's second encoder): 1280 wide, 32 layers, exact GELU.
    G,
}

impl Variant {
    /// The family's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Variant::L => family::NAME,
            Variant::H => family::H_NAME,
            Variant::G => family::G_NAME,
        }
    }

    /// The MLP activation ComfyUI's config for this variant names: `quick_gelu` in `sd1_clip_config.json`
    /// (CLIP-L), `gelu` in `sd2_clip_config.json` (CLIP-H) and `clip_config_bigg.json` (CLIP-G).
    pub fn activation(self) -> Activation {
        match self {
            Variant::L => Activation::QuickGelu,
            Variant::H | Variant::G => Activation::Gelu,
        }
    }
}

/// The MLP's activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x · sigmoid(1.702 x)` (OpenAI's CLIP).
    QuickGelu,
    /// GELU with erf (torch's default; OpenCLIP's towers).
    Gelu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`: SigLIP's vision tower).
    GeluTanh,
}

/// A CLIP text tower's hyperparameters (CLIP-L: vocab 49408, hidden 768, 12 layers, 12 heads of 64, MLP 3072,
/// 77 positions, quick-GELU).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Which tower (decides the activation).
    pub variant: Variant,
    /// How the file names the tensors.
    pub layout: Layout,
    /// Rows of the token embedding.
    pub vocab: usize,
    /// Hidden width.
    pub hidden: usize,
    /// Encoder layers in the file.
    pub layers: usize,
    /// Attention heads (`hidden / 64`).
    pub heads: usize,
    /// Width of one head ([`HEAD_DIM`]).
    pub head_dim: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Rows of the position embedding: the longest input.
    pub positions: usize,
    /// The MLP activation.
    pub activation: Activation,
    /// LayerNorm ε.
    pub eps: f32,
    /// The end-of-text id: the pooled vector is taken at its first occurrence ([`super::EOS`] for every
    /// released tower; a test model may use another).
    pub eos: u32,
}

impl Config {
    /// The names of encoder layer `i`'s weights, in the order the model fetches them: layer_norm1 (weight,
    /// bias), q, k, v (OpenCLIP: one in_proj), out projections (weight, bias each), layer_norm2, fc1, fc2.
    pub fn layer_names(&self, i: usize) -> Vec<String> {
        match self.layout {
            Layout::Transformers => {
                LAYER_TENSORS.iter().map(|t| format!("{LAYERS_PREFIX}{i}.{t}")).collect()
            }
            Layout::OpenClip => OPEN_CLIP_LAYER_TENSORS
                .iter()
                .map(|t| format!("{OPEN_CLIP_LAYERS_PREFIX}{i}.{t}"))
                .collect(),
        }
    }

    /// The token embedding table's name `[vocab, hidden]`.
    pub(super) fn token_embedding(&self) -> &'static str {
        self.layout.token_embedding()
    }

    /// The position embedding's name `[positions, hidden]`.
    pub(super) fn position_embedding(&self) -> &'static str {
        self.layout.position_embedding()
    }

    /// The final LayerNorm's weight and bias names.
    pub(super) fn final_norm(&self) -> [&'static str; 2] {
        self.layout.final_norm()
    }

    /// The projection's name: transformers' `[projection, hidden]` Linear weight, OpenCLIP's
    /// `[hidden, projection]` matrix.
    pub(super) fn text_projection(&self) -> &'static str {
        self.layout.text_projection()
    }

    /// Every weight with its shape, in load order (what `kiln model synth` writes).
    pub(crate) fn expected(&self) -> Vec<(String, Vec<usize>)> {
        let d = self.hidden;
        let mut all = vec![
            (self.token_embedding().to_owned(), vec![self.vocab, d]),
            (self.position_embedding().to_owned(), vec![self.positions, d]),
        ];
        for i in 0..self.layers {
            all.extend(self.layer_names(i).into_iter().zip(self.layer_shapes()));
        }
        let [norm_weight, norm_bias] = self.final_norm();
        all.push((norm_weight.to_owned(), vec![d]));
        all.push((norm_bias.to_owned(), vec![d]));
        all.push((self.text_projection().to_owned(), vec![d, d]));
        all
    }

    /// The shapes of one layer's weights, in [`Config::layer_names`] order.
    fn layer_shapes(&self) -> Vec<Vec<usize>> {
        let shapes = layer_shapes(self.hidden, self.intermediate);
        match self.layout {
            Layout::Transformers => shapes.to_vec(),
            Layout::OpenClip => {
                let d = self.hidden;
                let mut fused =
                    vec![shapes[0].clone(), shapes[1].clone(), vec![3 * d, d], vec![3 * d]];
                fused.extend(shapes[8..].iter().cloned());
                fused
            }
        }
    }
}

/// The shapes of one CLIP encoder layer's weights `hidden` wide with an MLP of `intermediate`, in
/// [`LAYER_TENSORS`] order (the text and the vision towers' alike).
pub(crate) fn layer_shapes(d: usize, f: usize) -> [Vec<usize>; 16] {
    [
        vec![d],
        vec![d],
        vec![d, d],
        vec![d],
        vec![d, d],
        vec![d],
        vec![d, d],
        vec![d],
        vec![d, d],
        vec![d],
        vec![d],
        vec![d],
        vec![f, d],
        vec![f],
        vec![d, f],
        vec![d],
    ]
}

/// The config of a CLIP text tower (`None` when the file is not one: it lacks
/// `text_model.encoder.layers.1.mlp.fc1.weight`, the key ComfyUI routes a CLIP text file by), every width
/// derived from the tensor shapes, the variant (and so the activation) by ComfyUI's layer-count rule
/// ([`Variant`]). A file with that key whose other tensors are missing, of an unsupported dtype or of shapes
/// that disagree is [`crate::Error::Unsupported`] naming the tensor. `text_projection.weight`, when present, is
/// loaded for the projected pooled vector (HiDream's; Flux uses the unprojected one).
pub fn detect(h: &Header) -> Result<Option<Config>> {
    // Once the file looks like one, what is wrong with it is said as such.
    detect_clip(h).map_err(|e| match e {
        crate::Error::Unsupported { path, msg } if !msg.contains("a CLIP text encoder") => {
            crate::Error::Unsupported { path, msg: format!("a CLIP text encoder file, but {msg}") }
        }
        e => e,
    })
}

/// [`detect`] before its errors are worded.
fn detect_clip(h: &Header) -> Result<Option<Config>> {
    let present = |name: &str| h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name);
    let layout = if present(MARKER) {
        Layout::Transformers
    } else if present(OPEN_CLIP_MARKER) && present(OPEN_CLIP_TOKEN_EMBEDDING) {
        Layout::OpenClip
    } else {
        return Ok(None);
    };
    let (layers, fc1) = match layout {
        Layout::Transformers => (count_layers(h)?, "text_model.encoder.layers.0.mlp.fc1.weight"),
        Layout::OpenClip => (
            h.gapless_blocks(OPEN_CLIP_LAYERS_PREFIX, "an OpenCLIP text layout whose layers")?,
            "transformer.resblocks.0.mlp.c_fc.weight",
        ),
    };
    let [vocab, hidden] = dims(h, layout.token_embedding())?;
    let [positions, _] = dims(h, layout.position_embedding())?;
    let [intermediate, _] = dims(h, fc1)?;
    if hidden == 0 || !hidden.is_multiple_of(HEAD_DIM) {
        return Err(h.unsupported(format!(
            "a CLIP text layout {hidden} wide, not a whole number of {HEAD_DIM}-wide heads"
        )));
    }
    let variant = if layers > 30 {
        Variant::G
    } else if layers > 22 {
        Variant::H
    } else {
        Variant::L
    };
    let config = Config {
        variant,
        layout,
        vocab,
        hidden,
        layers,
        heads: hidden / HEAD_DIM,
        head_dim: HEAD_DIM,
        intermediate,
        positions,
        activation: variant.activation(),
        eps: LAYER_NORM_EPS,
        eos: super::EOS,
    };
    check_shape(h, config.position_embedding(), &[positions, hidden])?;
    for i in 0..layers {
        for (name, want) in config.layer_names(i).iter().zip(config.layer_shapes()) {
            check_shape(h, name, &want)?;
        }
    }
    for name in config.final_norm() {
        check_shape(h, name, &[hidden])?;
    }
    Ok(Some(config))
}

/// What to load: both embeddings, every layer, the final LayerNorm and `text_projection.weight` when the file
/// has it, under the file's names without the prefix.
pub fn load_plan(h: &Header, config: &Config) -> LoadPlan {
    let slot = |name: &str| SlotPlan::new(name, vec![(0, h.key(name))]);
    let mut slots = vec![slot(config.token_embedding()), slot(config.position_embedding())];
    for i in 0..config.layers {
        slots.extend(config.layer_names(i).iter().map(|n| slot(n)));
    }
    slots.extend(config.final_norm().map(slot));
    if h.shape(config.text_projection()) == Some(&[config.hidden, config.hidden][..]) {
        slots.push(slot(config.text_projection()));
    }
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// The number of encoder layers: indices `text_model.encoder.layers.{i}.` must run 0, 1, … without a gap.
fn count_layers(h: &Header) -> Result<usize> {
    h.gapless_blocks(LAYERS_PREFIX, "a CLIP text layout whose layers")
}
