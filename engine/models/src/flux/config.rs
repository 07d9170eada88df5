//! Detection of a FLUX.1 DiT in either key layout (ComfyUI's, which is Black Forest Labs', and diffusers'),
//! its [`Config`] derived from shapes, and the [`LoadPlan`] naming every weight in ComfyUI's layout
//! (models-flux.md §3.2–§3.4).
//!
//! ComfyUI reads the widths from the shapes too (hidden from `img_in`, heads = hidden / 128, block counts by
//! counting), so a shrunken model with the released structure (the test fixtures) loads in both. diffusers'
//! split projections become one slot of several parts joined along rows (`to_q`, `to_k`, `to_v` → `qkv`; with
//! `proj_mlp` → a single block's `linear1`), so nothing is copied; its final modulation stores (scale, shift)
//! where ComfyUI's stores (shift, scale), which [`Layout::final_scale_first`] tells the model.

use std::collections::BTreeSet;

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// Head width: the RoPE axes' sum (ComfyUI derives the head count as hidden / Σaxes).
pub const HEAD_DIM: usize = 128;
/// RoPE dims per axis (index, row, column).
pub const AXES_DIMS: [usize; 3] = [16, 56, 56];
/// RoPE base θ.
pub const ROPE_THETA: f64 = 10_000.0;
/// LayerNorm ε of every norm (the q/k RMS norms take the compute type's machine epsilon, as ComfyUI's
/// `RMSNorm` without an ε does).
pub const EPS: f32 = 1e-6;
/// Patch side.
pub const PATCH: usize = 2;
/// Latent channels (the output's; Fill's and the control models' inputs have more).
pub const LATENT_CHANNELS: usize = 16;
/// Sinusoid width of the timestep and guidance embeddings.
pub const T_FREQ_DIM: usize = 256;
/// The reference method where the conditioning names none (Kontext's, ComfyUI's `default_ref_method`).
pub const DEFAULT_REFERENCE_METHOD: &str = "offset";

/// A FLUX.1 DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Hidden width (rows of `img_in.weight`; 3072).
    pub dim: usize,
    /// Attention heads (hidden / [`HEAD_DIM`]; 24).
    pub heads: usize,
    /// Double-stream blocks (19).
    pub double_blocks: usize,
    /// Single-stream blocks (38).
    pub single_blocks: usize,
    /// MLP hidden width (rows of `img_mlp.0`; 4 × hidden).
    pub mlp_hidden: usize,
    /// Latent channels the model reads (columns of `img_in.weight` / 4): 16, Fill's 96, the control models' 32.
    pub in_channels: usize,
    /// Text feature width (columns of `txt_in.weight`; T5-XXL's 4096).
    pub text_dim: usize,
    /// Pooled vector width (CLIP-L's 768), where the model has `vector_in`.
    pub vec_dim: Option<usize>,
    /// Whether the model embeds the distilled guidance (`guidance_in`: dev, Kontext, Fill; not schnell).
    pub guidance: bool,
}

impl Config {
    /// The released variant this config is, in words (`FLUX.1 dev`, `FLUX.1 schnell`, `FLUX.1 Fill`).
    pub fn variant(&self) -> &'static str {
        match (self.guidance, self.in_channels) {
            (false, _) => "FLUX.1 schnell",
            (true, c) if c > 2 * LATENT_CHANNELS => "FLUX.1 Fill",
            (true, c) if c > LATENT_CHANNELS => "FLUX.1 Canny/Depth",
            (true, _) => "FLUX.1 dev",
        }
    }
}

/// The key layout of a FLUX.1 file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ComfyUI's and Black Forest Labs' (`double_blocks.0.img_attn.qkv`).
    Comfy,
    /// diffusers' `FluxTransformer2DModel` (`transformer_blocks.0.attn.to_q`).
    Diffusers,
}

impl Layout {
    /// Whether the final layer's modulation holds (scale, shift) rather than ComfyUI's (shift, scale).
    pub fn final_scale_first(self) -> bool {
        self == Layout::Diffusers
    }
}

/// One weight: its ComfyUI name, the file tensors it is made of (names under the prefix, joined along rows)
/// and its shape.
struct Spec {
    name: String,
    parts: Vec<String>,
    shape: Vec<usize>,
    /// Each part's rows (one part: the whole).
    rows: Vec<usize>,
}

/// Pushes a linear layer's weight and bias named `name`, made of the file's `parts` (their row counts `rows`).
fn linear(out: &mut Vec<Spec>, name: &str, parts: &[String], rows: &[usize], cols: usize) {
    out.push(Spec {
        name: format!("{name}.weight"),
        parts: parts.iter().map(|p| format!("{p}.weight")).collect(),
        shape: vec![rows.iter().sum(), cols],
        rows: rows.to_vec(),
    });
    out.push(Spec {
        name: format!("{name}.bias"),
        parts: parts.iter().map(|p| format!("{p}.bias")).collect(),
        shape: vec![rows.iter().sum()],
        rows: rows.to_vec(),
    });
}

/// Pushes a q/k norm gain named `name`, the file's tensor `file`.
fn gain(out: &mut Vec<Spec>, name: String, file: String) {
    out.push(Spec { name, parts: vec![file], shape: vec![HEAD_DIM], rows: vec![HEAD_DIM] });
}

/// Every weight of `cfg` in `layout`, in load order. `qk_suffix` is how the file names the q/k norm gains
/// (`scale` in ComfyUI's and BFL's files, ComfyUI renaming it to `weight` on load; `weight` in diffusers').
fn specs(cfg: &Config, layout: Layout, qk_suffix: &str) -> Vec<Spec> {
    let (d, f) = (cfg.dim, cfg.mlp_hidden);
    let patch_in = cfg.in_channels * PATCH * PATCH;
    let patch_out = LATENT_CHANNELS * PATCH * PATCH;
    let diffusers = layout == Layout::Diffusers;
    let mut out = Vec::new();
    let pick = |comfy: &str, diff: &str| vec![if diffusers { diff } else { comfy }.to_owned()];
    linear(&mut out, "img_in", &pick("img_in", "x_embedder"), &[d], patch_in);
    let embedder = |comfy: &str, diff: &str| {
        [("in_layer", "linear_1"), ("out_layer", "linear_2")].map(|(c, df)| {
            (format!("{comfy}.{c}"), pick(&format!("{comfy}.{c}"), &format!("{diff}.{df}")))
        })
    };
    let [(t_in, t_in_file), (t_out, t_out_file)] =
        embedder("time_in", "time_text_embed.timestep_embedder");
    linear(&mut out, &t_in, &t_in_file, &[d], T_FREQ_DIM);
    linear(&mut out, &t_out, &t_out_file, &[d], d);
    if cfg.guidance {
        let [(g_in, g_in_file), (g_out, g_out_file)] =
            embedder("guidance_in", "time_text_embed.guidance_embedder");
        linear(&mut out, &g_in, &g_in_file, &[d], T_FREQ_DIM);
        linear(&mut out, &g_out, &g_out_file, &[d], d);
    }
    if let Some(vec_dim) = cfg.vec_dim {
        let [(v_in, v_in_file), (v_out, v_out_file)] =
            embedder("vector_in", "time_text_embed.text_embedder");
        linear(&mut out, &v_in, &v_in_file, &[d], vec_dim);
        linear(&mut out, &v_out, &v_out_file, &[d], d);
    }
    linear(&mut out, "txt_in", &pick("txt_in", "context_embedder"), &[d], cfg.text_dim);

    for i in 0..cfg.double_blocks {
        let p = format!("double_blocks.{i}");
        let q = format!("transformer_blocks.{i}");
        let parts =
            |names: &[&str]| -> Vec<String> { names.iter().map(|n| format!("{q}.{n}")).collect() };
        for (stream, ds) in [("img", ""), ("txt", "_context")] {
            let (qkv, proj, mlp) = if stream == "img" {
                (parts(&["attn.to_q", "attn.to_k", "attn.to_v"]), "attn.to_out.0", "ff")
            } else {
                (
                    parts(&["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]),
                    "attn.to_add_out",
                    "ff_context",
                )
            };
            let file = |comfy: &str, diff: Vec<String>| {
                if diffusers { diff } else { vec![format!("{p}.{comfy}")] }
            };
            linear(
                &mut out,
                &format!("{p}.{stream}_mod.lin"),
                &file(&format!("{stream}_mod.lin"), parts(&[&format!("norm1{ds}.linear")])),
                &[6 * d],
                d,
            );
            linear(
                &mut out,
                &format!("{p}.{stream}_attn.qkv"),
                &file(&format!("{stream}_attn.qkv"), qkv),
                &[d, d, d],
                d,
            );
            linear(
                &mut out,
                &format!("{p}.{stream}_attn.proj"),
                &file(&format!("{stream}_attn.proj"), parts(&[proj])),
                &[d],
                d,
            );
            linear(
                &mut out,
                &format!("{p}.{stream}_mlp.0"),
                &file(&format!("{stream}_mlp.0"), parts(&[&format!("{mlp}.net.0.proj")])),
                &[f],
                d,
            );
            linear(
                &mut out,
                &format!("{p}.{stream}_mlp.2"),
                &file(&format!("{stream}_mlp.2"), parts(&[&format!("{mlp}.net.2")])),
                &[d],
                f,
            );
        }
        for (norm, diff_q, diff_k) in [
            ("img_attn.norm", "attn.norm_q", "attn.norm_k"),
            ("txt_attn.norm", "attn.norm_added_q", "attn.norm_added_k"),
        ] {
            for (which, diff) in [("query_norm", diff_q), ("key_norm", diff_k)] {
                let file = if diffusers {
                    format!("{q}.{diff}.weight")
                } else {
                    format!("{p}.{norm}.{which}.{qk_suffix}")
                };
                gain(&mut out, format!("{p}.{norm}.{which}.weight"), file);
            }
        }
    }
    for i in 0..cfg.single_blocks {
        let p = format!("single_blocks.{i}");
        let q = format!("single_transformer_blocks.{i}");
        let file = |comfy: &str, diff: &[&str]| -> Vec<String> {
            if diffusers {
                diff.iter().map(|n| format!("{q}.{n}")).collect()
            } else {
                vec![format!("{p}.{comfy}")]
            }
        };
        linear(
            &mut out,
            &format!("{p}.linear1"),
            &file("linear1", &["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]),
            &[d, d, d, f],
            d,
        );
        linear(&mut out, &format!("{p}.linear2"), &file("linear2", &["proj_out"]), &[d], d + f);
        linear(
            &mut out,
            &format!("{p}.modulation.lin"),
            &file("modulation.lin", &["norm.linear"]),
            &[3 * d],
            d,
        );
        for (which, diff) in [("query_norm", "attn.norm_q"), ("key_norm", "attn.norm_k")] {
            let file = if diffusers {
                format!("{q}.{diff}.weight")
            } else {
                format!("{p}.norm.{which}.{qk_suffix}")
            };
            gain(&mut out, format!("{p}.norm.{which}.weight"), file);
        }
    }
    linear(
        &mut out,
        "final_layer.linear",
        &pick("final_layer.linear", "proj_out"),
        &[patch_out],
        d,
    );
    linear(
        &mut out,
        "final_layer.adaLN_modulation.1",
        &pick("final_layer.adaLN_modulation.1", "norm_out.linear"),
        &[2 * d],
        d,
    );
    out
}

/// How many consecutive blocks `prefix0.`, `prefix1.`, ... the header has (`prefix` ends in a dot).
fn count_blocks(h: &Header, prefix: &str) -> usize {
    let indices: BTreeSet<usize> =
        h.names().filter_map(|n| n.strip_prefix(prefix)?.split_once('.')?.0.parse().ok()).collect();
    indices.iter().zip(0..).take_while(|&(&i, want)| i == want).count()
}

/// A matrix's (rows, columns), the values' shape (an NVFP4 weight's columns are two per stored byte).
fn matrix(h: &Header, name: &str) -> Result<(usize, usize)> {
    h.require(name)?;
    match h.values_shape(name).as_deref() {
        Some(&[rows, cols]) => Ok((rows, cols)),
        other => Err(h.unsupported(format!("`{}` is {other:?}, not a matrix", h.key(name)))),
    }
}

/// The layout of `h` if it holds a FLUX-family DiT, and the name it would carry under the other family
/// members ComfyUI tells apart (FLUX.2, Chroma, Ovis, LongCat-Image) when Kiln does not run it.
fn family_of(h: &Header) -> Option<(Layout, Option<&'static str>)> {
    // Chroma's distilled guidance layer, with or without `img_in` (Chroma Radiance has none).
    let chroma = ["distilled_guidance_layer.norms.0", "distilled_guidance_layer.0.norms.0"]
        .iter()
        .any(|p| h.has(&format!("{p}.scale")) || h.has(&format!("{p}.weight")))
        || h.has("distilled_guidance_layer.in_proj.weight");
    if chroma {
        return Some((Layout::Comfy, Some("Chroma")));
    }
    let comfy = h.has("img_in.weight")
        && (h.has("double_blocks.0.img_attn.norm.key_norm.weight")
            || h.has("double_blocks.0.img_attn.norm.key_norm.scale"));
    if comfy {
        let other = if h.has("double_stream_modulation_img.lin.weight") {
            Some("FLUX.2 (dev or Klein)")
        } else if h.has("double_blocks.0.img_mlp.gate_proj.weight") {
            Some("Ovis-Image")
        } else {
            None
        };
        return Some((Layout::Comfy, other));
    }
    if h.has("x_embedder.weight") && h.has("single_transformer_blocks.0.attn.norm_k.weight") {
        let other = h
            .has("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight")
            .then_some("FLUX.2 in diffusers' layout (ComfyUI loads FLUX.2 only in its own layout)");
        return Some((Layout::Diffusers, other));
    }
    None
}

/// Recognises a FLUX.1 DiT (`Ok(None)` for files of no FLUX family): its config and key layout. A FLUX-family
/// file Kiln does not run (FLUX.2, Chroma, Ovis, LongCat-Image) is [`crate::Error::Unsupported`] naming it.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let Some((layout, other)) = family_of(h) else {
        return Ok(None);
    };
    if let Some(other) = other {
        return Err(
            h.unsupported(format!("a {other} diffusion model, which Kiln does not run yet"))
        );
    }
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let diffusers = layout == Layout::Diffusers;
    let name = |comfy: &'static str, diff: &'static str| if diffusers { diff } else { comfy };
    let (dim, patch_in) = matrix(h, name("img_in.weight", "x_embedder.weight"))?;
    let (_, text_dim) = matrix(h, name("txt_in.weight", "context_embedder.weight"))?;
    let vec_name =
        name("vector_in.in_layer.weight", "time_text_embed.text_embedder.linear_1.weight");
    let vec_dim = if h.has(vec_name) { Some(matrix(h, vec_name)?.1) } else { None };
    let guidance = h.has(name(
        "guidance_in.in_layer.weight",
        "time_text_embed.guidance_embedder.linear_1.weight",
    ));
    let mlp_name =
        name("double_blocks.0.img_mlp.0.weight", "transformer_blocks.0.ff.net.0.proj.weight");
    let (mlp_hidden, _) = matrix(h, mlp_name)?;
    let (double_blocks, single_blocks) = if diffusers {
        (count_blocks(h, "transformer_blocks."), count_blocks(h, "single_transformer_blocks."))
    } else {
        (count_blocks(h, "double_blocks."), count_blocks(h, "single_blocks."))
    };
    if vec_dim.is_none() && text_dim == 3584 {
        return Err(h.unsupported("a LongCat-Image diffusion model, which Kiln does not run yet"));
    }
    let channels = patch_in / (PATCH * PATCH);
    if dim == 0
        || !dim.is_multiple_of(HEAD_DIM)
        || patch_in % (PATCH * PATCH) != 0
        || channels < LATENT_CHANNELS
    {
        return Err(h.unsupported(format!(
            "a FLUX.1 layout with hidden width {dim} and {patch_in} patch features: the width must be a \
             multiple of {HEAD_DIM} and the patches 2×2 of at least {LATENT_CHANNELS} channels"
        )));
    }
    let cfg = Config {
        dim,
        heads: dim / HEAD_DIM,
        double_blocks,
        single_blocks,
        mlp_hidden,
        in_channels: channels,
        text_dim,
        vec_dim,
        guidance,
    };
    let qk = qk_suffix(h);
    for spec in specs(&cfg, layout, qk) {
        let mut rows = 0;
        for part in &spec.parts {
            let Some(shape) = h.values_shape(part) else {
                return Err(h.unsupported(format!(
                    "no tensor `{}` (a {} in {} layout has it)",
                    h.key(part),
                    cfg.variant(),
                    layout_name(layout)
                )));
            };
            if shape.len() != spec.shape.len() || shape[1..] != spec.shape[1..] {
                return Err(mismatch(h, part, &shape, &spec.shape, &cfg));
            }
            rows += shape[0];
        }
        if rows != spec.shape[0] {
            return Err(mismatch(h, &spec.parts.join(" + "), &[rows], &spec.shape, &cfg));
        }
    }
    Ok(Some((cfg, layout)))
}

/// How a ComfyUI-layout file names the q/k norm gains: `scale` (BFL's and ComfyUI's own) or `weight`.
fn qk_suffix(h: &Header) -> &'static str {
    if h.has("double_blocks.0.img_attn.norm.key_norm.scale") { "scale" } else { "weight" }
}

/// The layout's name in messages.
fn layout_name(layout: Layout) -> &'static str {
    match layout {
        Layout::Comfy => "ComfyUI's",
        Layout::Diffusers => "diffusers'",
    }
}

/// A shape that does not fit the config.
fn mismatch(h: &Header, name: &str, found: &[usize], want: &[usize], cfg: &Config) -> crate::Error {
    h.unsupported(format!(
        "`{}` is {found:?}, expected {want:?} for a {} of width {}",
        h.key(name),
        cfg.variant(),
        cfg.dim
    ))
}

/// Every weight by its ComfyUI name, made of the file's tensors in `layout`.
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    let slots = specs(cfg, layout, qk_suffix(h))
        .into_iter()
        .map(|spec| SlotPlan::new(spec.name, spec.parts.iter().map(|p| (0, h.key(p))).collect()))
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// Every weight of `cfg` with its shape, ComfyUI's names (what `kiln model synth` writes).
pub(crate) fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    specs(cfg, Layout::Comfy, "scale").into_iter().map(|s| (s.parts.concat(), s.shape)).collect()
}

/// For each weight of `cfg` (ComfyUI's name, `.weight` included), the diffusers stems it is made of with their
/// rows (one stem for a whole weight; `to_q`, `to_k`, `to_v`, `proj_mlp` for a fused one): the names LoRA files
/// in diffusers' layout adapt it by.
pub(crate) fn diffusers_stems(cfg: &Config) -> Vec<(String, Vec<(String, usize)>)> {
    specs(cfg, Layout::Diffusers, "weight")
        .into_iter()
        .filter(|spec| spec.name.ends_with(".weight"))
        .map(|spec| {
            let stems = spec
                .parts
                .iter()
                .map(|p| p.strip_suffix(".weight").unwrap_or(p).to_owned())
                .zip(spec.rows.iter().copied())
                .collect();
            (spec.name, stems)
        })
        .collect()
}
