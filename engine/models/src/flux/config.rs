//! Detection of a FLUX.1 DiT in either key layout (ComfyUI's, which is Black Forest Labs', and diffusers'),
//! its [`Config`] derived from shapes, and the [`LoadPlan`] naming every weight in ComfyUI's layout
//! (models-flux.md §3.2–§3.4).
//!
//! ComfyUI reads the widths from the shapes too (hidden from `img_in`, heads = hidden / 128, block counts by
//! counting), so a shrunken model with the released structure (the test fixtures) loads in both. diffusers'
//! split projections become one slot of several parts joined along rows (`to_q`, `to_k`, `to_v` → `qkv`; with
//! `proj_mlp` → a single block's `linear1`), so nothing is copied; its final modulation stores (scale, shift)
//! where ComfyUI's stores (shift, scale), which [`Layout::final_scale_first`] tells the model.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

/// Head width: the RoPE axes' sum (ComfyUI derives the head count as hidden / Σaxes).
pub const HEAD_DIM: usize = 128;
/// LayerNorm ε of every norm (the q/k RMS norms take the compute type's machine epsilon, as ComfyUI's
/// `RMSNorm` without an ε does).
pub const EPS: f32 = 1e-6;
/// FLUX.1's latent channels (the output's; Fill's and the control models' inputs have more).
pub const LATENT_CHANNELS: usize = 16;
/// Sinusoid width of the timestep and guidance embeddings.
pub const T_FREQ_DIM: usize = 256;
/// The text width that, with no pooled vector, makes a FLUX.1 DiT LongCat-Image's (Qwen2.5-VL 7B's hidden size).
pub const LONGCAT_TEXT_DIM: usize = 3584;
/// The weight that marks Ovis-Image (ComfyUI's `yak_mlp` rule).
const OVIS_GATE: &str = "double_blocks.0.img_mlp.gate_proj.weight";
/// The reference method where the conditioning names none for FLUX.1 (Kontext's, ComfyUI's
/// `default_ref_method`).
pub const DEFAULT_REFERENCE_METHOD: &str = "offset";

/// Which FLUX a DiT is: the two generations share the blocks' structure and differ in the details ComfyUI's
/// `FluxParams` lists (models-flux.md §3.2, §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Generation {
    /// FLUX.1: per-block biased modulation, GELU MLPs, 2×2 patches of 16 channels, 3 RoPE axes.
    One,
    /// FLUX.2 (dev, Klein): three modulations shared by all blocks, SwiGLU MLPs, no biases, 1×1 patches of the
    /// 128-channel latent, 4 RoPE axes with the text's position on the last.
    Two,
}

impl Generation {
    /// The generation's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Generation::One => "FLUX.1",
            Generation::Two => "FLUX.2",
        }
    }

    /// Patch side (FLUX.1 2; FLUX.2 1, its VAE having patchified already).
    pub fn patch(self) -> usize {
        match self {
            Generation::One => 2,
            Generation::Two => 1,
        }
    }

    /// The latent channels the model predicts.
    pub fn latent_channels(self) -> usize {
        match self {
            Generation::One => LATENT_CHANNELS,
            Generation::Two => 128,
        }
    }

    /// RoPE dims per axis (index, row, column, text position); FLUX.1 has no fourth axis (width 0).
    pub fn axes_dims(self) -> [usize; 4] {
        match self {
            Generation::One => [16, 56, 56, 0],
            Generation::Two => [32, 32, 32, 32],
        }
    }

    /// RoPE base θ.
    pub fn rope_theta(self) -> f64 {
        match self {
            Generation::One => 10_000.0,
            Generation::Two => 2_000.0,
        }
    }

    /// Whether the linear layers have biases.
    pub fn biases(self) -> bool {
        self == Generation::One
    }

    /// The reference method where the conditioning names none (`offset` for Kontext, `index` for FLUX.2).
    pub fn default_reference_method(self) -> &'static str {
        match self {
            Generation::One => DEFAULT_REFERENCE_METHOD,
            Generation::Two => "index",
        }
    }

    /// How far apart the `index` method places successive references on the first RoPE axis (ComfyUI's
    /// `ref_index_scale`).
    pub fn reference_index_scale(self) -> i64 {
        match self {
            Generation::One => 1,
            Generation::Two => 10,
        }
    }
}

/// A FLUX DiT's hyperparameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// FLUX.1 or FLUX.2.
    pub generation: Generation,
    /// Hidden width (rows of `img_in.weight`; 3072 for FLUX.1 and Klein 4B).
    pub dim: usize,
    /// Attention heads (hidden / [`HEAD_DIM`]; 24).
    pub heads: usize,
    /// Double-stream blocks (19 for FLUX.1, 5 for Klein 4B).
    pub double_blocks: usize,
    /// Single-stream blocks (38 for FLUX.1, 20 for Klein 4B).
    pub single_blocks: usize,
    /// MLP hidden width: FLUX.1's 4 × hidden (rows of `img_mlp.0`); FLUX.2's 3 × hidden, the SwiGLU's output
    /// (half the rows of `img_mlp.0`).
    pub mlp_hidden: usize,
    /// Latent channels the model reads (columns of `img_in.weight` / patch²): FLUX.1's 16, Fill's 96, the
    /// control models' 32; FLUX.2's 128.
    pub in_channels: usize,
    /// Text feature width (columns of `txt_in.weight`; T5-XXL's 4096, Klein 4B's 3 × 2560).
    pub text_dim: usize,
    /// Pooled vector width (CLIP-L's 768), where the model has `vector_in` (FLUX.1 only).
    pub vec_dim: Option<usize>,
    /// Whether the model embeds the distilled guidance (`guidance_in`: FLUX.1 dev, Kontext, Fill and FLUX.2
    /// dev; not schnell or Klein).
    pub guidance: bool,
    /// LongCat-Image: a FLUX.1 DiT on Qwen2.5-VL's 3584-wide states with neither pooled vector nor guidance
    /// (ComfyUI's rule), the text's tokens positioned along rows and columns (`txt_ids_dims` [1, 2]) and the
    /// image's moved past them (`model_base.LongCatImage`'s RoPE shifts).
    pub longcat: bool,
    /// Chroma: no timestep, guidance or pooled embedders and no modulation weights in the blocks; one MLP (the
    /// "distilled guidance layer") gives every block its modulation from the timestep, the guidance and the
    /// block's index.
    pub approximator: Option<Approximator>,
    /// Ovis-Image (ComfyUI's `yak_mlp` and `txt_norm`): SwiGLU MLPs (a double block's `gate_proj`, `up_proj`,
    /// `down_proj`; a single block's `linear1` ending in the value and gate halves), an RMS norm over the text
    /// before `txt_in`, and the text's tokens positioned along rows and columns (`txt_ids_dims` [1, 2]).
    pub ovis: bool,
}

/// Chroma's distilled guidance MLP: [`CHROMA_IN_DIM`] features in, `hidden` wide through `layers` residual
/// `MLPEmbedder`s under RMS norms, the DiT's width out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Approximator {
    /// Its hidden width (5120 released).
    pub hidden: usize,
    /// Its residual layers (5 released).
    pub layers: usize,
}

/// What Chroma's guidance MLP reads per modulation: 16 timestep, 16 guidance and 32 index features.
pub const CHROMA_IN_DIM: usize = 64;
/// The rows of Chroma's modulation table (ComfyUI's `mod_index_length`): the released model's blocks use them
/// all, and every model reads its final layer's from the last two.
pub const CHROMA_MOD_ROWS: usize = 344;
/// Where Chroma's guidance MLP's weights are.
pub(super) const CHROMA_PREFIX: &str = "distilled_guidance_layer";

impl Config {
    /// The released variant this config is, in words (`FLUX.1 dev`, `FLUX.1 schnell`, `FLUX.2 Klein`).
    pub fn variant(&self) -> &'static str {
        if self.longcat {
            return "LongCat-Image";
        }
        if self.approximator.is_some() {
            return "Chroma";
        }
        if self.ovis {
            return "Ovis-Image";
        }
        match (self.generation, self.guidance, self.in_channels) {
            (Generation::Two, true, _) => "FLUX.2 dev",
            (Generation::Two, false, _) => "FLUX.2 Klein",
            (Generation::One, false, _) => "FLUX.1 schnell",
            (Generation::One, true, c) if c > 2 * LATENT_CHANNELS => "FLUX.1 Fill",
            (Generation::One, true, c) if c > LATENT_CHANNELS => "FLUX.1 Canny/Depth",
            (Generation::One, true, _) => "FLUX.1 dev",
        }
    }

    /// Whether this is FLUX.1 Fill: 96 latent channels, what ComfyUI's `FluxInpaint` config matches.
    pub fn is_fill(&self) -> bool {
        self.generation == Generation::One && self.in_channels == 6 * LATENT_CHANNELS
    }

    /// The width of the text encoder's features it reads, in words for messages.
    pub fn text_encoder(&self) -> &'static str {
        match self.generation {
            Generation::One if self.longcat => {
                "Qwen2.5-VL's hidden states (CLIPLoader type `longcat_image`)"
            }
            Generation::One if self.ovis => "Ovis 2.5's hidden states (CLIPLoader type `ovis`)",
            Generation::One => "T5-XXL's features",
            Generation::Two if self.guidance => "Mistral Small's three hidden states",
            Generation::Two => "Qwen3's three hidden states",
        }
    }
}

/// The key layout of a FLUX file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// ComfyUI's and Black Forest Labs' (`double_blocks.0.img_attn.qkv`).
    Comfy,
    /// diffusers' `FluxTransformer2DModel` / `Flux2Transformer2DModel` (`transformer_blocks.0.attn.to_q`).
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
    weight(out, name, parts, rows, cols);
    out.push(Spec {
        name: format!("{name}.bias"),
        parts: parts.iter().map(|p| format!("{p}.bias")).collect(),
        shape: vec![rows.iter().sum()],
        rows: rows.to_vec(),
    });
}

/// Pushes a linear layer's weight alone (FLUX.2's layers have no biases).
fn weight(out: &mut Vec<Spec>, name: &str, parts: &[String], rows: &[usize], cols: usize) {
    out.push(Spec {
        name: format!("{name}.weight"),
        parts: parts.iter().map(|p| format!("{p}.weight")).collect(),
        shape: vec![rows.iter().sum(), cols],
        rows: rows.to_vec(),
    });
}

/// Pushes a q/k norm gain named `name`, the file's tensor `file`.
fn gain(out: &mut Vec<Spec>, name: String, file: String) {
    out.push(Spec { name, parts: vec![file], shape: vec![HEAD_DIM], rows: vec![HEAD_DIM] });
}

/// Pushes a block's q and k norm gains: ComfyUI's `{p}.{norm}.{query,key}_norm.weight`, from the file's
/// `{p}.{norm}.…_norm.{qk_suffix}` or diffusers' `{q}.{diff_q,diff_k}.weight` (`layout`: whether the file is
/// diffusers', and ComfyUI's suffix).
fn qk_gains(
    out: &mut Vec<Spec>,
    p: &str,
    q: &str,
    norm: &str,
    (diff_q, diff_k): (&str, &str),
    (diffusers, qk_suffix): (bool, &str),
) {
    for (which, diff) in [("query_norm", diff_q), ("key_norm", diff_k)] {
        let file = if diffusers {
            format!("{q}.{diff}.weight")
        } else {
            format!("{p}.{norm}.{which}.{qk_suffix}")
        };
        gain(out, format!("{p}.{norm}.{which}.weight"), file);
    }
}

/// Every weight of `cfg` in `layout`, in load order. `qk_suffix` is how the file names the q/k norm gains
/// (`scale` in ComfyUI's and BFL's files, ComfyUI renaming it to `weight` on load; `weight` in diffusers').
fn specs(cfg: &Config, layout: Layout, qk_suffix: &str) -> Vec<Spec> {
    match cfg.generation {
        Generation::One => specs_one(cfg, layout, qk_suffix),
        Generation::Two => specs_two(cfg, layout, qk_suffix),
    }
}

/// FLUX.1's weights (see [`specs`]).
fn specs_one(cfg: &Config, layout: Layout, qk_suffix: &str) -> Vec<Spec> {
    let (d, f) = (cfg.dim, cfg.mlp_hidden);
    let patch = Generation::One.patch();
    let patch_in = cfg.in_channels * patch * patch;
    let patch_out = LATENT_CHANNELS * patch * patch;
    let diffusers = layout == Layout::Diffusers;
    let mut out = Vec::new();
    let pick = |comfy: &str, diff: &str| vec![if diffusers { diff } else { comfy }.to_owned()];
    linear(&mut out, "img_in", &pick("img_in", "x_embedder"), &[d], patch_in);
    let embedder = |comfy: &str, diff: &str| {
        [("in_layer", "linear_1"), ("out_layer", "linear_2")].map(|(c, df)| {
            (format!("{comfy}.{c}"), pick(&format!("{comfy}.{c}"), &format!("{diff}.{df}")))
        })
    };
    // diffusers' LongCat-Image model names its timestep embedder apart (ComfyUI's diffusers mapping knows only
    // FLUX's `time_text_embed`, so it loads no LongCat-Image file in this layout; Kiln does).
    let time = if cfg.longcat {
        "time_embed.timestep_embedder"
    } else {
        "time_text_embed.timestep_embedder"
    };
    let [(t_in, t_in_file), (t_out, t_out_file)] = embedder("time_in", time);
    if let Some(a) = cfg.approximator {
        approximator_specs(&mut out, a, d, qk_suffix);
    } else {
        linear(&mut out, &t_in, &t_in_file, &[d], T_FREQ_DIM);
        linear(&mut out, &t_out, &t_out_file, &[d], d);
    }
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
    if cfg.ovis {
        let suffix = if qk_suffix == "scale" { "scale" } else { "weight" };
        out.push(Spec {
            name: "txt_norm.weight".to_owned(),
            parts: vec![format!("txt_norm.{suffix}")],
            shape: vec![cfg.text_dim],
            rows: vec![cfg.text_dim],
        });
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
            if cfg.approximator.is_none() {
                linear(
                    &mut out,
                    &format!("{p}.{stream}_mod.lin"),
                    &file(&format!("{stream}_mod.lin"), parts(&[&format!("norm1{ds}.linear")])),
                    &[6 * d],
                    d,
                );
            }
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
            if cfg.ovis {
                // The SwiGLU's gate and up projections as one `mlp.0` (gate rows first), `down_proj` as `mlp.2`.
                let m = format!("{p}.{stream}_mlp");
                let (gate, up) = (format!("{m}.gate_proj"), format!("{m}.up_proj"));
                linear(&mut out, &format!("{m}.0"), &[gate, up], &[f, f], d);
                linear(&mut out, &format!("{m}.2"), &[format!("{m}.down_proj")], &[d], f);
                continue;
            }
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
        let layout = (diffusers, qk_suffix);
        qk_gains(&mut out, &p, &q, "img_attn.norm", ("attn.norm_q", "attn.norm_k"), layout);
        let added = ("attn.norm_added_q", "attn.norm_added_k");
        qk_gains(&mut out, &p, &q, "txt_attn.norm", added, layout);
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
        // Ovis-Image's single blocks end `linear1` in the SwiGLU's two halves.
        let mlp_in = if cfg.ovis { 2 * f } else { f };
        linear(
            &mut out,
            &format!("{p}.linear1"),
            &file("linear1", &["attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp"]),
            &[d, d, d, mlp_in],
            d,
        );
        linear(&mut out, &format!("{p}.linear2"), &file("linear2", &["proj_out"]), &[d], d + f);
        if cfg.approximator.is_none() {
            linear(
                &mut out,
                &format!("{p}.modulation.lin"),
                &file("modulation.lin", &["norm.linear"]),
                &[3 * d],
                d,
            );
        }
        qk_gains(&mut out, &p, &q, "norm", ("attn.norm_q", "attn.norm_k"), (diffusers, qk_suffix));
    }
    linear(
        &mut out,
        "final_layer.linear",
        &pick("final_layer.linear", "proj_out"),
        &[patch_out],
        d,
    );
    if cfg.approximator.is_none() {
        linear(
            &mut out,
            "final_layer.adaLN_modulation.1",
            &pick("final_layer.adaLN_modulation.1", "norm_out.linear"),
            &[2 * d],
            d,
        );
    }
    out
}

/// Chroma's guidance MLP `a` (ComfyUI's `distilled_guidance_layer`) out to width `d`; its RMS norms' gains are
/// `.{norm_suffix}` in the file (`scale` released, `weight` after ComfyUI's renaming), as the blocks' q/k norms'.
fn approximator_specs(out: &mut Vec<Spec>, a: Approximator, d: usize, norm_suffix: &str) {
    let p = CHROMA_PREFIX;
    linear(out, &format!("{p}.in_proj"), &[format!("{p}.in_proj")], &[a.hidden], CHROMA_IN_DIM);
    for l in 0..a.layers {
        for half in ["in_layer", "out_layer"] {
            let name = format!("{p}.layers.{l}.{half}");
            linear(out, &name, std::slice::from_ref(&name), &[a.hidden], a.hidden);
        }
        out.push(Spec {
            name: format!("{p}.norms.{l}.weight"),
            parts: vec![format!("{p}.norms.{l}.{norm_suffix}")],
            shape: vec![a.hidden],
            rows: vec![a.hidden],
        });
    }
    linear(out, &format!("{p}.out_proj"), &[format!("{p}.out_proj")], &[d], a.hidden);
}

/// FLUX.2's weights (see [`specs`]): no biases, the three shared modulations, SwiGLU MLPs of 2 × `mlp_hidden`
/// rows in, single blocks whose `linear1` is one tensor in both layouts.
fn specs_two(cfg: &Config, layout: Layout, qk_suffix: &str) -> Vec<Spec> {
    let (d, f) = (cfg.dim, cfg.mlp_hidden);
    let diffusers = layout == Layout::Diffusers;
    let mut out = Vec::new();
    let pick = |comfy: &str, diff: &str| vec![if diffusers { diff } else { comfy }.to_owned()];
    let embedder = |out: &mut Vec<Spec>, comfy: &str, diff: &str| {
        let inner = pick(&format!("{comfy}.in_layer"), &format!("{diff}.linear_1"));
        weight(out, &format!("{comfy}.in_layer"), &inner, &[d], T_FREQ_DIM);
        let outer = pick(&format!("{comfy}.out_layer"), &format!("{diff}.linear_2"));
        weight(out, &format!("{comfy}.out_layer"), &outer, &[d], d);
    };
    weight(&mut out, "img_in", &pick("img_in", "x_embedder"), &[d], cfg.in_channels);
    embedder(&mut out, "time_in", "time_guidance_embed.timestep_embedder");
    if cfg.guidance {
        embedder(&mut out, "guidance_in", "time_guidance_embed.guidance_embedder");
    }
    weight(&mut out, "txt_in", &pick("txt_in", "context_embedder"), &[d], cfg.text_dim);
    for (name, sets) in [
        ("double_stream_modulation_img", 2),
        ("double_stream_modulation_txt", 2),
        ("single_stream_modulation", 1),
    ] {
        let file = pick(&format!("{name}.lin"), &format!("{name}.linear"));
        weight(&mut out, &format!("{name}.lin"), &file, &[3 * sets * d], d);
    }
    for i in 0..cfg.double_blocks {
        let p = format!("double_blocks.{i}");
        let q = format!("transformer_blocks.{i}");
        let file = |comfy: &str, diff: &[&str]| -> Vec<String> {
            if diffusers {
                diff.iter().map(|n| format!("{q}.{n}")).collect()
            } else {
                vec![format!("{p}.{comfy}")]
            }
        };
        for stream in ["img", "txt"] {
            let img = stream == "img";
            let qkv: &[&str] = if img {
                &["attn.to_q", "attn.to_k", "attn.to_v"]
            } else {
                &["attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"]
            };
            let (proj, ff) =
                if img { ("attn.to_out.0", "ff") } else { ("attn.to_add_out", "ff_context") };
            let name = |t: &str| format!("{p}.{stream}_{t}");
            weight(
                &mut out,
                &name("attn.qkv"),
                &file(&format!("{stream}_attn.qkv"), qkv),
                &[d, d, d],
                d,
            );
            weight(
                &mut out,
                &name("attn.proj"),
                &file(&format!("{stream}_attn.proj"), &[proj]),
                &[d],
                d,
            );
            let mlp_in = format!("{ff}.linear_in");
            weight(
                &mut out,
                &name("mlp.0"),
                &file(&format!("{stream}_mlp.0"), &[&mlp_in]),
                &[2 * f],
                d,
            );
            let mlp_out = format!("{ff}.linear_out");
            weight(
                &mut out,
                &name("mlp.2"),
                &file(&format!("{stream}_mlp.2"), &[&mlp_out]),
                &[d],
                f,
            );
        }
        let layout = (diffusers, qk_suffix);
        qk_gains(&mut out, &p, &q, "img_attn.norm", ("attn.norm_q", "attn.norm_k"), layout);
        let added = ("attn.norm_added_q", "attn.norm_added_k");
        qk_gains(&mut out, &p, &q, "txt_attn.norm", added, layout);
    }
    for i in 0..cfg.single_blocks {
        let p = format!("single_blocks.{i}");
        let q = format!("single_transformer_blocks.{i}");
        let pick_block =
            |comfy: &str, diff: &str| pick(&format!("{p}.{comfy}"), &format!("{q}.{diff}"));
        let linear1 = pick_block("linear1", "attn.to_qkv_mlp_proj");
        weight(&mut out, &format!("{p}.linear1"), &linear1, &[3 * d + 2 * f], d);
        weight(
            &mut out,
            &format!("{p}.linear2"),
            &pick_block("linear2", "attn.to_out"),
            &[d],
            d + f,
        );
        qk_gains(&mut out, &p, &q, "norm", ("attn.norm_q", "attn.norm_k"), (diffusers, qk_suffix));
    }
    let latent = Generation::Two.latent_channels();
    weight(&mut out, "final_layer.linear", &pick("final_layer.linear", "proj_out"), &[latent], d);
    let ada = pick("final_layer.adaLN_modulation.1", "norm_out.linear");
    weight(&mut out, "final_layer.adaLN_modulation.1", &ada, &[2 * d], d);
    out
}

/// A matrix's (rows, columns), the values' shape (an NVFP4 weight's columns are two per stored byte).
fn matrix(h: &Header, name: &str) -> Result<(usize, usize)> {
    h.require(name)?;
    match h.values_shape(name).as_deref() {
        Some(&[rows, cols]) => Ok((rows, cols)),
        other => Err(h.unsupported(format!("`{}` is {other:?}, not a matrix", h.key(name)))),
    }
}

/// What [`family_of`] finds: the layout and generation of a FLUX DiT, or the name of a FLUX-family member
/// Kiln does not run.
enum Found {
    /// A FLUX.1 or FLUX.2 DiT in `Layout`.
    Flux(Layout, Generation),
    /// Chroma, in ComfyUI's layout.
    Chroma,
    /// Another member ComfyUI tells apart (Chroma, Ovis-Image).
    Other(&'static str),
}

/// What `h` holds of the FLUX family, if anything.
fn family_of(h: &Header) -> Option<Found> {
    // Chroma's distilled guidance layer, with or without `img_in` (Chroma Radiance has none).
    let chroma = ["distilled_guidance_layer.norms.0", "distilled_guidance_layer.0.norms.0"]
        .iter()
        .any(|p| h.has(&format!("{p}.scale")) || h.has(&format!("{p}.weight")))
        || h.has("distilled_guidance_layer.in_proj.weight");
    if chroma {
        let norms =
            ["scale", "weight"].iter().any(|s| h.has(&format!("{CHROMA_PREFIX}.norms.0.{s}")));
        return Some(match (h.has("img_in.weight"), norms) {
            (true, true) => Found::Chroma,
            (false, _) if h.has("x_embedder.weight") => Found::Other("Chroma in diffusers' layout"),
            (false, _) => Found::Other("Chroma Radiance (pixel-space)"),
            (true, false) => Found::Other("Chroma with an older guidance-layer layout"),
        });
    }
    let comfy = h.has("img_in.weight")
        && (h.has("double_blocks.0.img_attn.norm.key_norm.weight")
            || h.has("double_blocks.0.img_attn.norm.key_norm.scale"));
    if comfy {
        return Some(if h.has("double_stream_modulation_img.lin.weight") {
            Found::Flux(Layout::Comfy, Generation::Two)
        } else {
            Found::Flux(Layout::Comfy, Generation::One)
        });
    }
    if h.has("x_embedder.weight") && h.has("single_transformer_blocks.0.attn.norm_k.weight") {
        let generation = if h.has("single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight") {
            Generation::Two
        } else {
            Generation::One
        };
        return Some(Found::Flux(Layout::Diffusers, generation));
    }
    None
}

/// Recognises a FLUX.1 or FLUX.2 DiT (`Ok(None)` for files of no FLUX family): its config and key layout. A
/// FLUX-family file Kiln does not run (Chroma, Ovis-Image) is [`crate::Error::Unsupported`] naming
/// it.
pub fn detect(h: &Header) -> Result<Option<(Config, Layout)>> {
    let (layout, generation, chroma) = match family_of(h) {
        None => return Ok(None),
        Some(Found::Other(other)) => {
            return Err(
                h.unsupported(format!("a {other} diffusion model, which Kiln does not run yet"))
            );
        }
        Some(Found::Flux(layout, generation)) => (layout, generation, false),
        Some(Found::Chroma) => (Layout::Comfy, Generation::One, true),
    };
    if let Some((name, dtype)) = h.unsupported_dtypes().next() {
        return Err(h.unsupported(format!(
            "`{}` is {dtype}, a type Kiln cannot compute with",
            h.key(name)
        )));
    }
    let two = generation == Generation::Two;
    let diffusers = layout == Layout::Diffusers;
    let name = |comfy: &'static str, diff: &'static str| if diffusers { diff } else { comfy };
    let (dim, patch_in) = matrix(h, name("img_in.weight", "x_embedder.weight"))?;
    let (_, text_dim) = matrix(h, name("txt_in.weight", "context_embedder.weight"))?;
    let vec_name =
        name("vector_in.in_layer.weight", "time_text_embed.text_embedder.linear_1.weight");
    let vec_dim = if !two && h.has(vec_name) { Some(matrix(h, vec_name)?.1) } else { None };
    let guidance = h.has(match (generation, diffusers) {
        (_, false) => "guidance_in.in_layer.weight",
        (Generation::One, true) => "time_text_embed.guidance_embedder.linear_1.weight",
        (Generation::Two, true) => "time_guidance_embed.guidance_embedder.linear_1.weight",
    });
    let ovis = !two && !diffusers && h.has(OVIS_GATE);
    if ovis && !["weight", "scale"].iter().any(|s| h.has(&format!("txt_norm.{s}"))) {
        return Err(h.unsupported(
            "a FLUX.1 DiT with SwiGLU MLPs but no `txt_norm`: not an Ovis-Image model Kiln knows",
        ));
    }
    let mlp_name = match (generation, diffusers) {
        _ if ovis => OVIS_GATE,
        (_, false) => "double_blocks.0.img_mlp.0.weight",
        (Generation::One, true) => "transformer_blocks.0.ff.net.0.proj.weight",
        (Generation::Two, true) => "transformer_blocks.0.ff.linear_in.weight",
    };
    let (mlp_rows, _) = matrix(h, mlp_name)?;
    // FLUX.2's SwiGLU takes twice its output width in.
    let mlp_hidden = if two { mlp_rows / 2 } else { mlp_rows };
    let (double_blocks, single_blocks) = if diffusers {
        (h.count_blocks("transformer_blocks."), h.count_blocks("single_transformer_blocks."))
    } else {
        (h.count_blocks("double_blocks."), h.count_blocks("single_blocks."))
    };
    // ComfyUI's rule (`model_detection`): a FLUX.1 on 3584-wide text without a pooled vector is LongCat-Image.
    let longcat = !two && !chroma && !ovis && vec_dim.is_none() && text_dim == LONGCAT_TEXT_DIM;
    let approximator = if chroma {
        let (hidden, in_dim) = matrix(h, &format!("{CHROMA_PREFIX}.in_proj.weight"))?;
        if in_dim != CHROMA_IN_DIM {
            return Err(h.unsupported(format!(
                "Chroma's guidance layer reads {in_dim} features; ComfyUI's reads {CHROMA_IN_DIM}"
            )));
        }
        Some(Approximator { hidden, layers: h.count_blocks(&format!("{CHROMA_PREFIX}.layers.")) })
    } else {
        None
    };
    if longcat && guidance {
        return Err(h.unsupported(
            "a LongCat-Image-shaped DiT with a guidance embedding, which no LongCat-Image release has",
        ));
    }
    let (patch, latent) = (generation.patch(), generation.latent_channels());
    let channels = patch_in / (patch * patch);
    if dim == 0
        || !dim.is_multiple_of(HEAD_DIM)
        || patch_in % (patch * patch) != 0
        || channels < latent
    {
        return Err(h.unsupported(format!(
            "a {} layout with hidden width {dim} and {patch_in} patch features: the width must be a \
             multiple of {HEAD_DIM} and the patches {patch}×{patch} of at least {latent} channels",
            generation.name()
        )));
    }
    let cfg = Config {
        generation,
        dim,
        heads: dim / HEAD_DIM,
        double_blocks,
        single_blocks,
        mlp_hidden,
        in_channels: channels,
        text_dim,
        vec_dim,
        guidance,
        longcat,
        approximator,
        ovis,
    };
    if chroma && 3 * single_blocks + 12 * double_blocks + 2 > CHROMA_MOD_ROWS {
        return Err(h.unsupported(format!(
            "a Chroma of {double_blocks} double and {single_blocks} single blocks: ComfyUI's modulation table \
             has {CHROMA_MOD_ROWS} rows, fewer than those blocks take"
        )));
    }
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

/// Every tensor of a ComfyUI-layout file of `cfg` with its shape (what `kiln model synth` writes): a weight
/// made of several tensors (Ovis-Image's gate and up projections) as each of them.
pub(crate) fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let mut all = Vec::new();
    for spec in specs(cfg, Layout::Comfy, "scale") {
        if spec.parts.len() == 1 {
            all.push((spec.parts.concat(), spec.shape));
            continue;
        }
        for (part, rows) in spec.parts.into_iter().zip(spec.rows) {
            let mut shape = spec.shape.clone();
            shape[0] = rows;
            all.push((part, shape));
        }
    }
    all
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
