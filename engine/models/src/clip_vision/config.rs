//! [`Config`]: a CLIP or SigLIP vision tower's widths, detected from a file's tensor shapes in the Hugging Face
//! `vision_model.*` layout ComfyUI's `clip_vision` files have, and the [`LoadPlan`] of the weights it runs on
//! (ComfyUI's `comfy/clip_vision.py`, `comfy/clip_model.py`).
//!
//! Invariant: every width comes from the shapes (the patch embedding gives the width and the patch, the
//! position embedding the image size, `fc1` the MLP width, the layer keys the depth, `visual_projection` the
//! projection); the head count (16 in every one of ComfyUI's configs), the activation and the normalisation,
//! which no shape shows, follow ComfyUI's configs.

use kiln_compute::memory::LoadPlan;

use crate::clip_text::{self, Activation, LAYER_TENSORS};
use crate::error::Result;
use crate::header::Header;
use crate::qwen3::{check_shape, dims};

/// Attention heads of every vision tower ComfyUI configures (ViT-L, ViT-H, ViT-bigG, SigLIP).
pub const HEADS: usize = 16;
/// LayerNorm ε: torch's default, which ComfyUI's `CLIPVision` uses for every tower (SigLIP's own config says
/// 1e-6; ComfyUI does not read it).
pub const LAYER_NORM_EPS: f32 = 1e-5;
/// OpenAI CLIP's per-channel mean (ComfyUI's `clip_preprocess` default).
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// OpenAI CLIP's per-channel standard deviation (ComfyUI's 0.26130258 and 0.27577711 are the same f32s).
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];
/// SigLIP's mean and deviation (`image_mean`, `image_std` in `clip_vision_siglip_*.json`).
pub const SIGLIP_NORM: [f32; 3] = [0.5, 0.5, 0.5];

/// The class token `[hidden]` (CLIP only).
pub(super) const CLASS_EMBEDDING: &str = "vision_model.embeddings.class_embedding";
/// The patch embedding, a convolution `[hidden, 3, patch, patch]` (with a bias in SigLIP).
pub(super) const PATCH_WEIGHT: &str = "vision_model.embeddings.patch_embedding.weight";
/// The patch embedding's bias `[hidden]` (SigLIP only).
pub(super) const PATCH_BIAS: &str = "vision_model.embeddings.patch_embedding.bias";
/// The learned position embedding `[positions, hidden]`.
pub(super) const POSITION_EMBEDDING: &str = "vision_model.embeddings.position_embedding.weight";
/// The LayerNorm before the encoder (CLIP only; transformers' spelling).
pub(super) const PRE_NORM_WEIGHT: &str = "vision_model.pre_layrnorm.weight";
/// Its bias.
pub(super) const PRE_NORM_BIAS: &str = "vision_model.pre_layrnorm.bias";
/// The LayerNorm after the encoder (CLIP: of the class token; SigLIP: of every token).
pub(super) const POST_NORM_WEIGHT: &str = "vision_model.post_layernorm.weight";
/// Its bias.
pub(super) const POST_NORM_BIAS: &str = "vision_model.post_layernorm.bias";
/// The bias-free projection of the pooled class token `[projection, hidden]` (CLIP only).
pub(super) const PROJECTION: &str = "visual_projection.weight";

/// Where the layers' keys start.
const LAYERS_PREFIX: &str = "vision_model.encoder.layers.";
/// The key every vision tower's file has, whatever its depth: layer 0's first LayerNorm.
const MARKER: &str = "vision_model.encoder.layers.0.layer_norm1.weight";
/// The key of OpenCLIP's own layout, which ComfyUI converts on load and Kiln does not read.
const OPEN_CLIP_MARKER: &str = "visual.transformer.resblocks.0.attn.in_proj_weight";

/// Which vision tower a file is. ComfyUI picks a config by depth and width (`load_clipvision_from_sd`); Kiln
/// reads the kind from the keys (a class token is CLIP, none is SigLIP) and, for CLIP, the variant by
/// ComfyUI's depth rule. The variant decides the activation and the normalisation, which no shape shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// OpenAI's ViT-L/14 (224 or 336 px; 24 layers, 1024 wide): quick-GELU.
    L,
    /// OpenCLIP's ViT-H/14 (`clip_vision_h`: 32 layers, 1280 wide): exact GELU. A CLIP tower shallower than
    /// any released one (23 layers; ComfyUI loads none such) runs as this one.
    H,
    /// OpenCLIP's ViT-bigG/14 (48 layers, 1664 wide): exact GELU.
    G,
    /// SigLIP (`sigclip_vision_patch14_384`: so400m, 27 layers, 1152 wide): no class token, a patch bias, no
    /// LayerNorm before the encoder, the last one over every token, tanh GELU, mean and deviation 0.5.
    Siglip,
}

impl Variant {
    /// The tower's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Variant::L => "CLIP ViT-L vision",
            Variant::H => "CLIP ViT-H vision",
            Variant::G => "CLIP ViT-bigG vision",
            Variant::Siglip => "SigLIP vision",
        }
    }

    /// The MLP activation ComfyUI's config names (`hidden_act`).
    pub fn activation(self) -> Activation {
        match self {
            Variant::L => Activation::QuickGelu,
            Variant::H | Variant::G => Activation::Gelu,
            Variant::Siglip => Activation::GeluTanh,
        }
    }

    /// Whether the tower has a class token (and with it a LayerNorm before the encoder and a pooled output).
    pub fn has_class_token(self) -> bool {
        match self {
            Variant::L | Variant::H | Variant::G => true,
            Variant::Siglip => false,
        }
    }

    /// The per-channel mean and deviation `clip_preprocess` normalises with.
    pub fn normalisation(self) -> ([f32; 3], [f32; 3]) {
        match self {
            Variant::L | Variant::H | Variant::G => (CLIP_MEAN, CLIP_STD),
            Variant::Siglip => (SIGLIP_NORM, SIGLIP_NORM),
        }
    }
}

/// A vision tower's hyperparameters (ViT-H/14: 1280 wide, 32 layers, 16 heads of 80, MLP 5120, patch 14,
/// image 224, projection 1024; SigLIP so400m: 1152 wide, 27 layers, MLP 4304, patch 14, image 384).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Which tower.
    pub variant: Variant,
    /// Hidden width.
    pub hidden: usize,
    /// Encoder layers.
    pub layers: usize,
    /// Attention heads ([`HEADS`]).
    pub heads: usize,
    /// MLP width.
    pub intermediate: usize,
    /// Patch side in pixels.
    pub patch: usize,
    /// Image side in pixels the tower takes (patches per side × patch; SigLIP 384's 27 × 14 patches are
    /// taken from a 384-pixel image, the last 6 rows and columns unread, as ComfyUI's config says).
    pub image_size: usize,
    /// The projection's width, when the file has `visual_projection.weight` (CLIP only; ComfyUI's
    /// `image_embeds` is the pooled vector itself without it).
    pub projection: Option<usize>,
    /// LayerNorm ε.
    pub eps: f32,
}

impl Config {
    /// Patches per side.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch
    }

    /// Tokens through the encoder: the patches, and the class token first where the tower has one.
    pub fn tokens(&self) -> usize {
        self.grid() * self.grid() + usize::from(self.variant.has_class_token())
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// The names of encoder layer `i`'s weights, in CLIP's layer order ([`clip_text::Config::layer_names`]).
    pub fn layer_names(&self, i: usize) -> Vec<String> {
        LAYER_TENSORS.iter().map(|t| format!("{LAYERS_PREFIX}{i}.{t}")).collect()
    }

    /// The weights before the encoder, in load order: (CLIP) class token, patch embedding, positions, the
    /// LayerNorm; (SigLIP) patch embedding and its bias, positions.
    pub(super) fn embedding_names(&self) -> Vec<&'static str> {
        if self.variant.has_class_token() {
            vec![CLASS_EMBEDDING, PATCH_WEIGHT, POSITION_EMBEDDING, PRE_NORM_WEIGHT, PRE_NORM_BIAS]
        } else {
            vec![PATCH_WEIGHT, PATCH_BIAS, POSITION_EMBEDDING]
        }
    }

    /// Every weight Kiln reads with its shape, in load order (what `kiln model synth` writes; a released SigLIP
    /// file also has the attention-pooling head `vision_model.head.*`, which ComfyUI does not read).
    pub fn expected(&self) -> Vec<(String, Vec<usize>)> {
        let d = self.hidden;
        let patch = vec![d, 3, self.patch, self.patch];
        let positions = vec![self.tokens(), d];
        let mut all: Vec<(String, Vec<usize>)> = if self.variant.has_class_token() {
            vec![
                (CLASS_EMBEDDING.to_owned(), vec![d]),
                (PATCH_WEIGHT.to_owned(), patch),
                (POSITION_EMBEDDING.to_owned(), positions),
                (PRE_NORM_WEIGHT.to_owned(), vec![d]),
                (PRE_NORM_BIAS.to_owned(), vec![d]),
            ]
        } else {
            vec![
                (PATCH_WEIGHT.to_owned(), patch),
                (PATCH_BIAS.to_owned(), vec![d]),
                (POSITION_EMBEDDING.to_owned(), positions),
            ]
        };
        for i in 0..self.layers {
            let shapes = clip_text::layer_shapes(d, self.intermediate);
            all.extend(self.layer_names(i).into_iter().zip(shapes));
        }
        all.push((POST_NORM_WEIGHT.to_owned(), vec![d]));
        all.push((POST_NORM_BIAS.to_owned(), vec![d]));
        if let Some(p) = self.projection {
            all.push((PROJECTION.to_owned(), vec![p, d]));
        }
        all
    }
}

/// The config of a vision tower (`None` when the file is not one: it lacks
/// `vision_model.encoder.layers.0.layer_norm1.weight`), every width derived from the tensor shapes, the variant
/// as [`Variant`] says. A file in OpenCLIP's own layout, SigLIP 2's NaFlex tower (a linear patch embedding), a
/// position table that is not a square grid (plus the class token), a width that is not 16 heads, missing
/// tensors or shapes that disagree are [`crate::Error::Unsupported`] naming the problem.
pub fn detect(h: &Header) -> Result<Option<Config>> {
    detect_vision(h).map_err(|e| match e {
        crate::Error::Unsupported { path, msg } if !msg.contains("vision") => {
            crate::Error::Unsupported { path, msg: format!("a CLIP vision file, but {msg}") }
        }
        e => e,
    })
}

/// [`detect`] before its errors are worded.
fn detect_vision(h: &Header) -> Result<Option<Config>> {
    let present = |name: &str| h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name);
    if present(OPEN_CLIP_MARKER) {
        return Err(h.unsupported(
            "a CLIP vision tower in OpenCLIP's own layout (`visual.transformer.resblocks.*`), which Kiln does not \
             read yet: use the file in the Hugging Face `vision_model.*` layout",
        ));
    }
    if !present(MARKER) {
        return Ok(None);
    }
    let layers = count_layers(h)?;
    let patch_shape = h.values_shape(PATCH_WEIGHT).unwrap_or_default();
    if patch_shape.len() == 2 {
        return Err(h.unsupported(
            "a SigLIP 2 NaFlex vision tower (a linear patch embedding), which Kiln does not run yet",
        ));
    }
    let [hidden, channels, patch, patch_w] = dims(h, PATCH_WEIGHT)?;
    if channels != 3 || patch != patch_w || patch == 0 {
        return Err(h.unsupported(format!(
            "a vision tower whose patch embedding is {patch_shape:?}, not [width, 3, p, p]"
        )));
    }
    if hidden == 0 || !hidden.is_multiple_of(HEADS) {
        return Err(h.unsupported(format!(
            "a vision tower {hidden} wide, not a whole number of {HEADS} heads"
        )));
    }
    let variant = if !present(CLASS_EMBEDDING) {
        Variant::Siglip
    } else if layers >= 48 {
        Variant::G
    } else if (23..=30).contains(&layers) {
        Variant::L
    } else {
        Variant::H
    };
    let [positions, _] = dims(h, POSITION_EMBEDDING)?;
    let patches = positions - usize::from(variant.has_class_token()).min(positions);
    let grid = patches.isqrt();
    if grid == 0 || grid * grid != patches {
        return Err(h.unsupported(format!(
            "a vision tower with {positions} positions, not a square grid of patches{}",
            if variant.has_class_token() { " and the class token" } else { "" }
        )));
    }
    // ComfyUI's SigLIP 384 config resizes to 384 px, whose 27 patches of 14 cover 378 (the stride drops the
    // rest); every other config's size is a whole number of patches.
    let image_size = match (variant, grid, patch) {
        (Variant::Siglip, 27, 14) => 384,
        _ => grid * patch,
    };
    let [intermediate, _] = dims(h, "vision_model.encoder.layers.0.mlp.fc1.weight")?;
    let projection = match variant {
        Variant::Siglip => None,
        Variant::L | Variant::H | Variant::G if present(PROJECTION) => {
            let [p, _] = dims(h, PROJECTION)?;
            Some(p)
        }
        Variant::L | Variant::H | Variant::G => None,
    };
    let config = Config {
        variant,
        hidden,
        layers,
        heads: HEADS,
        intermediate,
        patch,
        image_size,
        projection,
        eps: LAYER_NORM_EPS,
    };
    for (name, want) in config.expected() {
        check_shape(h, &name, &want)?;
    }
    Ok(Some(config))
}

/// What to load: the embeddings, every layer, the final LayerNorm and the projection, under the file's names
/// without the prefix (SigLIP's pooling head is not loaded).
pub fn load_plan(h: &Header, config: &Config) -> LoadPlan {
    h.plan_by_name(config.expected().into_iter().map(|(name, _)| name))
}

/// The number of encoder layers: indices `vision_model.encoder.layers.{i}.` must run 0, 1, … without a gap.
fn count_layers(h: &Header) -> Result<usize> {
    h.gapless_blocks(LAYERS_PREFIX, "a vision tower whose layers")
}
