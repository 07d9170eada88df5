//! The encoder's widths read from a file's shapes, its two key layouts, and the weights to load.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// Attention heads: ComfyUI's `WhisperLargeV3` always builds 20, whatever the file's width.
pub const HEADS: usize = 20;
/// Positions of the encoder's 30-second window (3000 mel frames halved by the second convolution).
pub const POSITIONS: usize = 1500;
/// LayerNorm ε (torch's default, as ComfyUI builds them).
pub(super) const LAYER_NORM_EPS: f32 = 1e-5;

/// The encoder's hyperparameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Mel bands of the input features (128 in large-v3).
    pub mels: usize,
    /// Hidden width (1280 in large-v3); a multiple of [`HEADS`].
    pub width: usize,
    /// Encoder layers (32 in large-v3).
    pub layers: usize,
}

impl Config {
    /// Whisper large-v3's encoder, ComfyUI's only configuration: 128 mels, width 1280, 32 layers.
    pub const fn large_v3() -> Config {
        Config { mels: 128, width: 1280, layers: 32 }
    }

    /// The width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.width / HEADS
    }

    /// The MLP's hidden width (four times the width, as ComfyUI builds it).
    pub fn ffn(&self) -> usize {
        4 * self.width
    }
}

/// The key layout of a Whisper encoder file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Hugging Face's `WhisperModel`, the released ComfyUI file's: `model.encoder.*` (the decoder's
    /// `model.decoder.*` beside it is not read).
    Hf,
    /// The encoder alone: `encoder.*`.
    Bare,
}

impl Layout {
    /// The prefix of the encoder's weights in a file of this layout.
    pub fn prefix(self) -> &'static str {
        match self {
            Layout::Hf => "model.encoder.",
            Layout::Bare => "encoder.",
        }
    }
}

/// The names of layer `i`'s weights (without the encoder's prefix), in the order the model fetches them.
pub(super) fn layer_names(i: usize) -> Vec<String> {
    [
        "self_attn_layer_norm.weight",
        "self_attn_layer_norm.bias",
        "self_attn.q_proj.weight",
        "self_attn.q_proj.bias",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.v_proj.bias",
        "self_attn.out_proj.weight",
        "self_attn.out_proj.bias",
        "final_layer_norm.weight",
        "final_layer_norm.bias",
        "fc1.weight",
        "fc1.bias",
        "fc2.weight",
        "fc2.bias",
    ]
    .iter()
    .map(|name| format!("layers.{i}.{name}"))
    .collect()
}

/// Every weight of `cfg` by its name without the encoder's prefix, with its shape.
fn weight_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (w, ffn) = (cfg.width, cfg.ffn());
    let mut out = vec![
        ("conv1.weight".to_owned(), vec![w, cfg.mels, 3]),
        ("conv1.bias".to_owned(), vec![w]),
        ("conv2.weight".to_owned(), vec![w, w, 3]),
        ("conv2.bias".to_owned(), vec![w]),
        ("embed_positions.weight".to_owned(), vec![POSITIONS, w]),
    ];
    for i in 0..cfg.layers {
        let shapes = [
            vec![w],
            vec![w],
            vec![w, w],
            vec![w],
            vec![w, w],
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
        ];
        out.extend(layer_names(i).into_iter().zip(shapes));
    }
    out.push(("layer_norm.weight".to_owned(), vec![w]));
    out.push(("layer_norm.bias".to_owned(), vec![w]));
    out
}

/// Every weight of `cfg` by its name in the released file (`model.encoder.*`), with its shape (what `kiln
/// model synth` writes; a loaded model names them without the `model.encoder.` prefix).
pub fn expected_shapes(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    weight_shapes(cfg)
        .into_iter()
        .map(|(name, shape)| (format!("{}{name}", Layout::Hf.prefix()), shape))
        .collect()
}

/// Recognises a Whisper encoder (`Ok(None)` for another file, ComfyUI's test: `embed_positions` under the
/// encoder): its config from the shapes and its key layout. A width that does not split into [`HEADS`]
/// heads, a position table other than [`POSITIONS`] rows, or a missing or misshapen weight is
/// [`crate::Error::Unsupported`].
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let layout = if h.has("model.encoder.embed_positions.weight") {
        Layout::Hf
    } else if h.has("encoder.embed_positions.weight") {
        Layout::Bare
    } else {
        return Ok(None);
    };
    let prefix = layout.prefix();
    let key = |name: &str| format!("{prefix}{name}");
    let (width, mels) = match h.shape(&key("conv1.weight")) {
        Some(&[w, m, 3]) => (w, m),
        Some(other) => {
            return Err(h.unsupported(format!(
                "`{}` is {other:?}, not a Whisper encoder's first convolution [width, mels, 3]",
                h.key(&key("conv1.weight"))
            )));
        }
        None => return Err(h.unsupported(format!("no tensor `{}`", h.key(&key("conv1.weight"))))),
    };
    if width == 0 || width % HEADS != 0 {
        return Err(h.unsupported(format!(
            "a Whisper encoder {width} wide: ComfyUI's WhisperLargeV3 always splits the width into {HEADS} \
             attention heads, and {width} is not a multiple of {HEADS}"
        )));
    }
    if let Some(&[rows, _]) = h.shape(&key("embed_positions.weight"))
        && rows != POSITIONS
    {
        return Err(h.unsupported(format!(
            "`{}` has {rows} positions; the encoder's 30-second window has {POSITIONS}",
            h.key(&key("embed_positions.weight"))
        )));
    }
    let layers = h.gapless_blocks(&key("layers."), "a Whisper encoder whose layers")?;
    if layers == 0 {
        return Err(h.unsupported("a Whisper encoder without layers"));
    }
    let cfg = Config { mels, width, layers };
    let what = format!("a Whisper encoder {width} wide with {mels} mels");
    for (name, want) in weight_shapes(&cfg) {
        h.expect_shape(&key(&name), &want, &what)?;
    }
    Ok(Some((cfg, layout)))
}

/// Every weight by its name without the encoder's prefix, read from the file's tensor in `layout`.
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    let slots = weight_shapes(cfg)
        .into_iter()
        .map(|(name, _)| {
            let key = h.key(&format!("{}{name}", layout.prefix()));
            SlotPlan::new(name, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}
