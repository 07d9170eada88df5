//! The encoder's widths read from a file's shapes, its variant, its key layouts, and the weights to load.
//!
//! ComfyUI fixes the whole configuration by the width (`load_audio_encoder_from_sd`): 1024 is the large model
//! ([`Variant::Large`], 16 heads), 768 the base one ([`Variant::Base`], 12 heads), any other width an error.
//! Kiln reads the layer count, the widths and the convolution channels from the shapes, takes the heads as
//! the width over [`HEAD_DIM`] (16 and 12 for ComfyUI's two) and, for the two released widths, the variant
//! ComfyUI builds for them (a file whose norm weights say otherwise is refused). A narrower width that is a
//! multiple of [`HEAD_DIM`] is a test model (the fixtures, `kiln model synth`): its variant is the one its norm
//! weights show.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// The sample rate the encoder takes (ComfyUI's `encode_audio` resamples to it).
pub const SAMPLE_RATE: u32 = 16_000;
/// The width of one attention head (1024 / 16 and 768 / 12 in ComfyUI's two configurations).
pub const HEAD_DIM: usize = 64;
/// The positional convolution's kernel, hard-coded by ComfyUI whatever the width.
pub const POS_CONV_KERNEL: usize = 128;
/// The positional convolution's groups, hard-coded by ComfyUI whatever the width.
pub const POS_CONV_GROUPS: usize = 16;
/// The released widths' convolution channels (ComfyUI's hard-coded `conv_dim`).
pub const CONV_DIM: usize = 512;
/// The feature extractor's convolutions: (kernel, stride), 320 samples per frame in all.
pub(super) const CONV_LAYERS: [(usize, usize); 7] =
    [(10, 5), (3, 2), (3, 2), (3, 2), (3, 2), (2, 2), (2, 2)];
/// LayerNorm and GroupNorm ε (torch's default, as ComfyUI builds them).
pub(super) const NORM_EPS: f32 = 1e-5;
/// The ε of the large model's input normalisation, `(x − mean) / sqrt(var + ε)`.
pub(super) const NORMALIZE_EPS: f64 = 1e-7;

/// The two models ComfyUI builds, each a set of its `Wav2Vec2Model` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// 1024 wide (`wav2vec2_large_english_fp16.safetensors`, Wan 2.2 S2V's): a LayerNorm after every
    /// convolution, convolution biases, the input normalised over the whole batch, pre-LayerNorm layers
    /// (`conv_norm`, `conv_bias`, `do_normalize`, `do_stable_layer_norm` all true).
    Large,
    /// 768 wide (`wav2vec2-chinese-base_fp16.safetensors`, InfiniteTalk's): one per-channel GroupNorm after the
    /// first convolution, no convolution biases, the input as it comes, post-LayerNorm layers (all four false).
    Base,
}

/// The encoder's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Hidden width (1024 or 768); a multiple of [`HEAD_DIM`] and of [`POS_CONV_GROUPS`].
    pub width: usize,
    /// The feature extractor's channels ([`CONV_DIM`] in both released files).
    pub conv_dim: usize,
    /// Transformer layers (24 in the large model, 12 in the base one).
    pub layers: usize,
    /// Which of ComfyUI's two models.
    pub variant: Variant,
}

impl Config {
    /// The large model ComfyUI builds for a 1024-wide file.
    pub fn large() -> Config {
        Config { width: 1024, conv_dim: CONV_DIM, layers: 24, variant: Variant::Large }
    }

    /// The base model ComfyUI builds for a 768-wide file.
    pub fn base() -> Config {
        Config { width: 768, conv_dim: CONV_DIM, layers: 12, variant: Variant::Base }
    }

    /// Attention heads: the width over [`HEAD_DIM`].
    pub fn heads(&self) -> usize {
        self.width / HEAD_DIM
    }

    /// The MLP's hidden width (four times the width, as ComfyUI builds it).
    pub fn ffn(&self) -> usize {
        4 * self.width
    }
}

/// The frames the feature extractor makes of `samples` at [`SAMPLE_RATE`] (49 a second); 0 when the audio is
/// shorter than its 400-sample receptive field.
pub fn frames(samples: usize) -> usize {
    CONV_LAYERS.iter().fold(
        samples,
        |len, &(kernel, stride)| {
            if len < kernel { 0 } else { (len - kernel) / stride + 1 }
        },
    )
}

/// Where a file keeps the encoder's weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    /// Under `wav2vec2.` (Hugging Face's `Wav2Vec2For*` models, the released files), which ComfyUI strips.
    Wav2Vec2,
    /// At the top level (ComfyUI's own `state_dict`).
    Bare,
}

/// How a file names the positional convolution's weight norm (torch loads both into ComfyUI's
/// `parametrizations.weight_norm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightNorm {
    /// torch's legacy `weight_norm`: `conv.weight_g` and `conv.weight_v` (the released files).
    Legacy,
    /// torch's parametrization: `conv.parametrizations.weight.original0` and `original1` (ComfyUI's own
    /// `state_dict`, newer Hugging Face files).
    Parametrized,
}

/// The key layout of a wav2vec2 file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The prefix of every weight.
    pub prefix: Prefix,
    /// The weight norm's names.
    pub weight_norm: WeightNorm,
}

impl Layout {
    /// The released files' layout: `wav2vec2.*`, with `weight_g` and `weight_v`.
    pub const RELEASED: Layout =
        Layout { prefix: Prefix::Wav2Vec2, weight_norm: WeightNorm::Legacy };

    /// The prefix of the encoder's weights in a file of this layout.
    pub fn prefix(self) -> &'static str {
        match self.prefix {
            Prefix::Wav2Vec2 => "wav2vec2.",
            Prefix::Bare => "",
        }
    }

    /// The file's name (under the header's prefix) of the weight Kiln names `name`.
    fn key(self, name: &str) -> String {
        let name = match (self.weight_norm, name) {
            (WeightNorm::Parametrized, POS_CONV_G) => PARAMETRIZED_G,
            (WeightNorm::Parametrized, POS_CONV_V) => PARAMETRIZED_V,
            (WeightNorm::Legacy | WeightNorm::Parametrized, name) => name,
        };
        format!("{}{name}", self.prefix())
    }
}

/// The weight norm's gain `g` `[1, 1, kernel]`, by its Kiln name.
pub(super) const POS_CONV_G: &str = "encoder.pos_conv_embed.conv.weight_g";
/// The weight norm's direction `v` `[width, width / groups, kernel]`, by its Kiln name.
pub(super) const POS_CONV_V: &str = "encoder.pos_conv_embed.conv.weight_v";
const PARAMETRIZED_G: &str = "encoder.pos_conv_embed.conv.parametrizations.weight.original0";
const PARAMETRIZED_V: &str = "encoder.pos_conv_embed.conv.parametrizations.weight.original1";
/// ComfyUI's test for a wav2vec2 file (after stripping `wav2vec2.`), whose length is the width.
const MARKER: &str = "encoder.layer_norm.bias";

/// The names of convolution `i`'s weights, in the order the model fetches them: the kernel, its bias (large),
/// the norm's gain and bias (every convolution of the large model, the first of the base one).
pub(super) fn conv_names(variant: Variant, i: usize) -> Vec<String> {
    let p = format!("feature_extractor.conv_layers.{i}.");
    let mut names = vec![format!("{p}conv.weight")];
    match variant {
        Variant::Large => names.extend(
            ["conv.bias", "layer_norm.weight", "layer_norm.bias"].map(|n| format!("{p}{n}")),
        ),
        Variant::Base if i == 0 => {
            names.extend(["layer_norm.weight", "layer_norm.bias"].map(|n| format!("{p}{n}")))
        }
        Variant::Base => {}
    }
    names
}

/// The names of layer `i`'s weights, in the order the model fetches them.
pub(super) fn layer_names(i: usize) -> Vec<String> {
    [
        "attention.q_proj.weight",
        "attention.q_proj.bias",
        "attention.k_proj.weight",
        "attention.k_proj.bias",
        "attention.v_proj.weight",
        "attention.v_proj.bias",
        "attention.out_proj.weight",
        "attention.out_proj.bias",
        "layer_norm.weight",
        "layer_norm.bias",
        "feed_forward.intermediate_dense.weight",
        "feed_forward.intermediate_dense.bias",
        "feed_forward.output_dense.weight",
        "feed_forward.output_dense.bias",
        "final_layer_norm.weight",
        "final_layer_norm.bias",
    ]
    .iter()
    .map(|name| format!("encoder.layers.{i}.{name}"))
    .collect()
}

/// Every weight the model reads, by its Kiln name (the name in ComfyUI's model, the weight norm's as the
/// legacy names), with its shape.
fn weight_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (w, c, ffn) = (cfg.width, cfg.conv_dim, cfg.ffn());
    let mut out = Vec::new();
    for (i, &(kernel, _)) in CONV_LAYERS.iter().enumerate() {
        let names = conv_names(cfg.variant, i);
        let input = if i == 0 { 1 } else { c };
        let shapes = std::iter::once(vec![c, input, kernel]).chain(std::iter::repeat(vec![c]));
        out.extend(names.into_iter().zip(shapes));
    }
    out.extend([
        ("feature_projection.layer_norm.weight".to_owned(), vec![c]),
        ("feature_projection.layer_norm.bias".to_owned(), vec![c]),
        ("feature_projection.projection.weight".to_owned(), vec![w, c]),
        ("feature_projection.projection.bias".to_owned(), vec![w]),
        (POS_CONV_G.to_owned(), vec![1, 1, POS_CONV_KERNEL]),
        (POS_CONV_V.to_owned(), vec![w, w / POS_CONV_GROUPS, POS_CONV_KERNEL]),
        ("encoder.pos_conv_embed.conv.bias".to_owned(), vec![w]),
    ]);
    for i in 0..cfg.layers {
        let shapes = [
            vec![w, w],
            vec![w],
            vec![w, w],
            vec![w],
            vec![w, w],
            vec![w],
            vec![w, w],
            vec![w],
            vec![w],
            vec![w],
            vec![ffn, w],
            vec![ffn],
            vec![w, ffn],
            vec![w],
            vec![w],
            vec![w],
        ];
        out.extend(layer_names(i).into_iter().zip(shapes));
    }
    out.push(("encoder.layer_norm.weight".to_owned(), vec![w]));
    out.push((MARKER.to_owned(), vec![w]));
    out
}

/// Every tensor of ComfyUI's model for `cfg` by its name in the released files ([`Layout::RELEASED`]), with
/// its shape: what `kiln model synth` writes. Besides the weights Kiln loads, it holds ComfyUI's
/// `masked_spec_embed` `[width]` (a training-time parameter the forward pass never reads).
pub fn expected_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut out: Vec<(String, Vec<usize>)> = weight_shapes(cfg)
        .into_iter()
        .map(|(name, shape)| (Layout::RELEASED.key(&name), shape))
        .collect();
    out.push((format!("{}masked_spec_embed", Layout::RELEASED.prefix()), vec![cfg.width]));
    out
}

/// Recognises a wav2vec2 encoder (`Ok(None)` for another file; ComfyUI's test: `encoder.layer_norm.bias`
/// with or without `wav2vec2.`, less a bare Whisper encoder's, which has `encoder.embed_positions.weight`
/// beside it): its config from the shapes and its key layout. Tensors the model does not read (a CTC
/// `lm_head`, the pretraining `quantizer`, `project_q`, `project_hid`, `masked_spec_embed`) are ignored, as
/// ComfyUI's non-strict load does. A width ComfyUI does not build, norm weights of the other variant, or a
/// missing or misshapen weight is [`crate::Error::Unsupported`].
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let prefix = if h.has(&format!("wav2vec2.{MARKER}")) {
        Prefix::Wav2Vec2
    } else if h.has(MARKER) && !h.has("encoder.embed_positions.weight") {
        Prefix::Bare
    } else {
        return Ok(None);
    };
    let mut layout = Layout { prefix, weight_norm: WeightNorm::Legacy };
    let width = match h.shape(&layout.key(MARKER)) {
        Some(&[w]) => w,
        other => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, not a wav2vec2 encoder's final LayerNorm bias [width]",
                h.key(&layout.key(MARKER))
            )));
        }
    };
    // ComfyUI's variant for the width; a test model's from its norm weights.
    let conv_norms = h.has(&layout.key("feature_extractor.conv_layers.1.layer_norm.weight"));
    let found = if conv_norms { Variant::Large } else { Variant::Base };
    let variant = match width {
        1024 => Variant::Large,
        768 => Variant::Base,
        w if w > 0 && w < 768 && w % HEAD_DIM == 0 => found,
        w => {
            return Err(h.unsupported(format!(
                "a wav2vec2 encoder {w} wide: ComfyUI builds only 1024 (the large model, 16 heads) and 768 \
                 (the base model, 12 heads)"
            )));
        }
    };
    if variant != found {
        let (what, has) = match variant {
            Variant::Large => ("a LayerNorm after every convolution", "has none after the second"),
            Variant::Base => {
                ("a GroupNorm after the first convolution alone", "has one after the second")
            }
        };
        return Err(h.unsupported(format!(
            "ComfyUI builds a {width}-wide wav2vec2 encoder as its {variant:?} model, with {what}; this file {has} \
             (`{}`)",
            h.key(&layout.key("feature_extractor.conv_layers.1.layer_norm.weight"))
        )));
    }
    let first_conv = layout.key("feature_extractor.conv_layers.0.conv.weight");
    let conv_dim = match h.shape(&first_conv) {
        Some(&[c, 1, 10]) => c,
        Some(other) => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, not a wav2vec2 encoder's first convolution [channels, 1, 10]",
                h.key(&first_conv)
            )));
        }
        None => return Err(h.unsupported(format!("no tensor `{}`", h.key(&first_conv)))),
    };
    let layers =
        h.gapless_blocks(&layout.key("encoder.layers."), "a wav2vec2 encoder whose layers")?;
    if layers == 0 {
        return Err(h.unsupported("a wav2vec2 encoder without layers"));
    }
    if !h.has(&layout.key(POS_CONV_G)) {
        let parametrized = Layout { weight_norm: WeightNorm::Parametrized, ..layout };
        if h.has(&parametrized.key(POS_CONV_G)) {
            layout = parametrized;
        }
    }
    let cfg = Config { width, conv_dim, layers, variant };
    let what = format!("a wav2vec2 encoder {width} wide with {conv_dim} convolution channels");
    for (name, want) in weight_shapes(&cfg) {
        h.expect_shape(&layout.key(&name), &want, &what)?;
    }
    Ok(Some((cfg, layout)))
}

/// Every weight the model reads by its Kiln name (the released name without `wav2vec2.`), read from the
/// file's tensor in `layout`.
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    let slots = weight_shapes(cfg)
        .into_iter()
        .map(|(name, _)| {
            let key = h.key(&layout.key(&name));
            SlotPlan::new(name, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}
