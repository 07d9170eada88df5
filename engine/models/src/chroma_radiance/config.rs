//! Detection of a Chroma Radiance DiT, its [`Config`] derived from shapes and marker keys, and the [`LoadPlan`]
//! naming every weight as ComfyUI's module names it.
//!
//! A Radiance file carries Chroma's whole trunk (the double and single blocks without modulation weights, the
//! distilled guidance layer, `txt_in`), so it also looks like Chroma. What tells it apart (ComfyUI's
//! `model_detection` rule) is a NeRF block's norm, `nerf_blocks.0.norm.{scale,weight}`; it also has
//! `img_in_patch.weight` (a strided convolution over pixels) where Chroma has `img_in.weight`, and no
//! `final_layer`. ComfyUI hard-codes the NeRF head's widths; Kiln reads them from the shapes, which give the
//! released values for the released file and the right ones for any other.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::flux::{self, Approximator, CHROMA_IN_DIM, CHROMA_MOD_ROWS, Generation, HEAD_DIM};
use crate::header::Header;

/// The marker key of a model that predicts x₀ (ComfyUI's `__x0__` buffer): its output is turned into a velocity
/// `(noisy − x₀) / σ`.
pub const X0_MARKER: &str = "__x0__";
/// The marker key of a model trained with sequential text positions (ComfyUI's `__sequential__` buffer).
pub const SEQUENTIAL_MARKER: &str = "__sequential__";
/// The NeRF tile ComfyUI's detection sets (`nerf_tile_size` 512 patches); tiling changes no value.
pub const DEFAULT_NERF_TILE: usize = 512;
/// The image channels (RGB).
pub const CHANNELS: usize = 3;
/// The tensor whose presence marks Radiance (without the gain suffix, `scale` or `weight`).
const NERF_NORM: &str = "nerf_blocks.0.norm";
/// Chroma's guidance-layer norm, which ComfyUI's FLUX rule needs where there is no `img_in`.
const GUIDANCE_NORM: &str = "distilled_guidance_layer.norms.0";

/// How the NeRF head turns its per-pixel features into RGB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinalHead {
    /// RMS norm, then a linear layer per pixel (`nerf_final_layer`, the first releases).
    Linear,
    /// RMS norm, then a 3×3 convolution over the image (`nerf_final_layer_conv`).
    Conv,
}

impl FinalHead {
    /// The module's name in the file.
    pub fn prefix(self) -> &'static str {
        match self {
            FinalHead::Linear => "nerf_final_layer",
            FinalHead::Conv => "nerf_final_layer_conv",
        }
    }
}

/// A Chroma Radiance DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Chroma's trunk (blocks, guidance MLP, text input) as a FLUX.1 config with an approximator; its
    /// `in_channels` are the image's 3.
    pub trunk: flux::Config,
    /// Pixels per patch side (the last dimension of `img_in_patch.weight`; 16 released).
    pub patch: usize,
    /// The NeRF head's per-pixel width (rows of the embedder; 64 released).
    pub nerf_hidden: usize,
    /// The NeRF blocks' MLP ratio (the generated parameters are 3 · hidden² · ratio per patch; 4 released).
    pub nerf_mlp_ratio: usize,
    /// NeRF blocks (4 released).
    pub nerf_depth: usize,
    /// DCT frequencies per axis of the pixel embedder (its columns are 3 + freqs²; 8 released).
    pub nerf_max_freqs: usize,
    /// The final head.
    pub head: FinalHead,
    /// Whether the model predicts x₀ ([`X0_MARKER`]).
    pub x0: bool,
    /// Whether text tokens take sequential positions on the first RoPE axis ([`SEQUENTIAL_MARKER`]) rather than
    /// zeros.
    pub sequential_txt_ids: bool,
}

/// Whether `h` is a Chroma Radiance file by ComfyUI's rule (a NeRF block norm beside Chroma's guidance-layer
/// norm).
pub fn is_radiance(h: &Header) -> bool {
    has_gain(h, NERF_NORM) && has_gain(h, GUIDANCE_NORM)
}

/// Whether the norm `stem` has its gain as `.scale` or `.weight`.
fn has_gain(h: &Header, stem: &str) -> bool {
    ["scale", "weight"].iter().any(|s| h.has(&format!("{stem}.{s}")))
}

/// Recognises a Chroma Radiance DiT (`Ok(None)` for any other file, plain Chroma included) and derives its
/// config from shapes and the marker keys. A file with the NeRF head whose other parts do not fit is
/// [`crate::Error::Unsupported`].
pub fn detect(h: &Header) -> Result<Option<Config>> {
    if !has_gain(h, NERF_NORM) {
        return Ok(None);
    }
    if !has_gain(h, GUIDANCE_NORM) {
        return Err(h.unsupported(
            "a NeRF head without Chroma's `distilled_guidance_layer.norms`: not a Chroma Radiance Kiln knows",
        ));
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let cfg = derive(h)?;
    check_shapes(h, &cfg)?;
    Ok(Some(cfg))
}

/// The config the shapes give, checked for what the model needs.
fn derive(h: &Header) -> Result<Config> {
    let patch_shape = h.shape_of_rank("img_in_patch.weight", 4, "a Chroma Radiance")?;
    let (dim, patch) = (patch_shape[0], patch_shape[3]);
    let (_, text_dim) = matrix(h, "txt_in.weight")?;
    let (mlp_hidden, _) = matrix(h, "double_blocks.0.img_mlp.0.weight")?;
    let (approx_hidden, in_dim) = matrix(h, "distilled_guidance_layer.in_proj.weight")?;
    let (nerf_hidden, embed_in) = matrix(h, "nerf_image_embedder.embedder.0.weight")?;
    let (generated, _) = matrix(h, "nerf_blocks.0.param_generator.weight")?;
    let (double_blocks, single_blocks) =
        (h.count_blocks("double_blocks."), h.count_blocks("single_blocks."));
    let freqs = (embed_in.saturating_sub(CHANNELS) as f64).sqrt().round() as usize;
    let per_ratio = 3 * nerf_hidden * nerf_hidden;
    let fits = dim > 0
        && dim.is_multiple_of(HEAD_DIM)
        && patch > 0
        && in_dim == CHROMA_IN_DIM
        && nerf_hidden > 0
        && freqs > 0
        && CHANNELS + freqs * freqs == embed_in
        && generated > 0
        && generated.is_multiple_of(per_ratio)
        && 3 * single_blocks + 12 * double_blocks + 2 <= CHROMA_MOD_ROWS;
    if !fits {
        return Err(h.unsupported(format!(
            "a Chroma Radiance of width {dim}, {patch}-pixel patches, a guidance MLP reading {in_dim} features, \
             a NeRF embedder {nerf_hidden}×{embed_in}, {generated} generated parameters per patch and \
             {double_blocks} + {single_blocks} blocks: Kiln needs a width that is a multiple of {HEAD_DIM}, \
             {CHROMA_IN_DIM} guidance features, 3 + n² embedder inputs, 3 · hidden² · ratio generated \
             parameters and at most {CHROMA_MOD_ROWS} modulation rows"
        )));
    }
    let head =
        if has_gain(h, "nerf_final_layer_conv.norm") { FinalHead::Conv } else { FinalHead::Linear };
    let trunk = flux::Config {
        generation: Generation::One,
        dim,
        heads: dim / HEAD_DIM,
        double_blocks,
        single_blocks,
        mlp_hidden,
        in_channels: CHANNELS,
        text_dim,
        vec_dim: None,
        guidance: false,
        longcat: false,
        approximator: Some(Approximator {
            hidden: approx_hidden,
            layers: h.count_blocks("distilled_guidance_layer.layers."),
        }),
        ovis: false,
    };
    Ok(Config {
        trunk,
        patch,
        nerf_hidden,
        nerf_mlp_ratio: generated / per_ratio,
        nerf_depth: h.count_blocks("nerf_blocks."),
        nerf_max_freqs: freqs,
        head,
        x0: h.has(X0_MARKER),
        sequential_txt_ids: h.has(SEQUENTIAL_MARKER),
    })
}

/// A matrix's (rows, columns), the values' shape.
fn matrix(h: &Header, name: &str) -> Result<(usize, usize)> {
    h.require(name)?;
    match h.values_shape(name).as_deref() {
        Some(&[rows, cols]) => Ok((rows, cols)),
        other => Err(h.unsupported(format!("`{}` is {other:?}, not a matrix", h.key(name)))),
    }
}

/// Checks every weight [`expected`] lists against the file.
fn check_shapes(h: &Header, cfg: &Config) -> Result<()> {
    for (name, want) in expected(cfg) {
        let file = file_name(h, &name);
        let Some(found) = h.values_shape(&file) else {
            return Err(h.unsupported(format!(
                "no tensor `{}` (a Chroma Radiance of width {} has it)",
                h.key(&file),
                cfg.trunk.dim
            )));
        };
        if found != want {
            return Err(h.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for a Chroma Radiance of width {}",
                h.key(&file),
                cfg.trunk.dim
            )));
        }
    }
    Ok(())
}

/// The file's name of weight `name` as [`expected`] lists it: an RMS norm gain listed as `.scale` is the file's
/// `.weight` where the file has that instead (ComfyUI renames every `.scale` to `.weight` on load).
fn file_name(h: &Header, name: &str) -> String {
    match name.strip_suffix(".scale") {
        Some(stem) if !h.has(name) && h.has(&format!("{stem}.weight")) => format!("{stem}.weight"),
        _ => name.to_owned(),
    }
}

/// The name a loaded model fetches weight `name` of [`expected`] by (ComfyUI's: `.scale` becomes `.weight`).
fn model_name(name: &str) -> String {
    match name.strip_suffix(".scale") {
        Some(stem) => format!("{stem}.weight"),
        None => name.to_owned(),
    }
}

/// Every tensor of a Chroma Radiance file of `cfg` with its shape, RMS norm gains as `.scale` (what `kiln model
/// synth` writes; the marker keys are not weights and are not listed): Chroma's trunk without `img_in` and
/// `final_layer`, then the patch convolution and the NeRF head.
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut all: Vec<(String, Vec<usize>)> = flux::expected(&cfg.trunk)
        .into_iter()
        .filter(|(name, _)| !name.starts_with("img_in.") && !name.starts_with("final_layer."))
        .collect();
    let (d, p, nh) = (cfg.trunk.dim, cfg.patch, cfg.nerf_hidden);
    let mut push = |name: String, shape: Vec<usize>| all.push((name, shape));
    push("img_in_patch.weight".into(), vec![d, CHANNELS, p, p]);
    push("img_in_patch.bias".into(), vec![d]);
    let embed_in = CHANNELS + cfg.nerf_max_freqs * cfg.nerf_max_freqs;
    push("nerf_image_embedder.embedder.0.weight".into(), vec![nh, embed_in]);
    push("nerf_image_embedder.embedder.0.bias".into(), vec![nh]);
    for i in 0..cfg.nerf_depth {
        let generated = 3 * nh * nh * cfg.nerf_mlp_ratio;
        push(format!("nerf_blocks.{i}.param_generator.weight"), vec![generated, d]);
        push(format!("nerf_blocks.{i}.param_generator.bias"), vec![generated]);
        push(format!("nerf_blocks.{i}.norm.scale"), vec![nh]);
    }
    let head = cfg.head.prefix();
    push(format!("{head}.norm.scale"), vec![nh]);
    match cfg.head {
        FinalHead::Linear => {
            push(format!("{head}.linear.weight"), vec![CHANNELS, nh]);
            push(format!("{head}.linear.bias"), vec![CHANNELS]);
        }
        FinalHead::Conv => {
            push(format!("{head}.conv.weight"), vec![CHANNELS, nh, 3, 3]);
            push(format!("{head}.conv.bias"), vec![CHANNELS]);
        }
    }
    all
}

/// Every weight by the name the model fetches it by (ComfyUI's, norm gains as `.weight`), each the file's tensor
/// of that name or its `.scale` spelling.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slots = expected(cfg)
        .into_iter()
        .map(|(name, _)| SlotPlan::new(model_name(&name), vec![(0, h.key(&file_name(h, &name)))]))
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}
