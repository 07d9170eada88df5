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
    /// bias), q, k, v, out projections (weight, bias each), layer_norm2, fc1, fc2.
    pub fn layer_names(&self, i: usize) -> Vec<String> {
        LAYER_TENSORS.iter().map(|t| format!("{LAYERS_PREFIX}{i}.{t}")).collect()
    }

    /// Every weight with its shape, in load order (what `kiln model synth` writes).
    pub(crate) fn expected(&self) -> Vec<(String, Vec<usize>)> {
        let d = self.hidden;
        let mut all = vec![
            (TOKEN_EMBEDDING.to_owned(), vec![self.vocab, d]),
            (POSITION_EMBEDDING.to_owned(), vec![self.positions, d]),
        ];
        for i in 0..self.layers {
            all.extend(self.layer_names(i).into_iter().zip(self.layer_shapes()));
        }
        all.push((FINAL_NORM_WEIGHT.to_owned(), vec![d]));
        all.push((FINAL_NORM_BIAS.to_owned(), vec![d]));
        all.push((TEXT_PROJECTION.to_owned(), vec![d, d]));
        all
    }

    /// The shapes of one layer's weights, in [`Config::layer_names`] order.
    fn layer_shapes(&self) -> [Vec<usize>; 16] {
        layer_shapes(self.hidden, self.intermediate)
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
    if !present(MARKER) {
        return Ok(None);
    }
    let layers = count_layers(h)?;
    let [vocab, hidden] = dims(h, TOKEN_EMBEDDING)?;
    let [positions, _] = dims(h, POSITION_EMBEDDING)?;
    let [intermediate, _] = dims(h, "text_model.encoder.layers.0.mlp.fc1.weight")?;
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
    check_shape(h, POSITION_EMBEDDING, &[positions, hidden])?;
    for i in 0..layers {
        for (name, want) in config.layer_names(i).iter().zip(config.layer_shapes()) {
            check_shape(h, name, &want)?;
        }
    }
    check_shape(h, FINAL_NORM_WEIGHT, &[hidden])?;
    check_shape(h, FINAL_NORM_BIAS, &[hidden])?;
    Ok(Some(config))
}

/// What to load: both embeddings, every layer, the final LayerNorm and `text_projection.weight` when the file
/// has it, under the file's names without the prefix.
pub fn load_plan(h: &Header, config: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot(TOKEN_EMBEDDING.to_owned()), slot(POSITION_EMBEDDING.to_owned())];
    for i in 0..config.layers {
        slots.extend(config.layer_names(i).into_iter().map(slot));
    }
    slots.push(slot(FINAL_NORM_WEIGHT.to_owned()));
    slots.push(slot(FINAL_NORM_BIAS.to_owned()));
    if h.shape(TEXT_PROJECTION) == Some(&[config.hidden, config.hidden][..]) {
        slots.push(slot(TEXT_PROJECTION.to_owned()));
    }
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// The number of encoder layers: indices `text_model.encoder.layers.{i}.` must run 0, 1, … without a gap.
fn count_layers(h: &Header) -> Result<usize> {
    h.gapless_blocks(LAYERS_PREFIX, "a CLIP text layout whose layers")
}
