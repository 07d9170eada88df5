//! The weights of a Z-Image NextDiT by their ComfyUI names (without prefix), the file tensors each is made of
//! in either [`Layout`] (models.md §2.3), and the [`LoadPlan`] that loads them. diffusers' `to_q`, `to_k`,
//! `to_v` become one `attention.qkv.weight` slot of three parts, joined along rows, so nothing is copied.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;

use super::config::{Config, Layout};

/// The block groups, in the order [`Config`] counts them: main, noise refiner, context refiner.
pub(crate) const GROUPS: [&str; 3] = ["layers", "noise_refiner", "context_refiner"];

/// One weight: its ComfyUI name, its file tensors (names under the prefix, joined along rows) and its shape.
struct Spec {
    name: String,
    parts: Vec<String>,
    shape: Vec<usize>,
}

impl Spec {
    /// A weight stored under one tensor, whose file name is `file`.
    fn one(name: impl Into<String>, file: impl Into<String>, shape: &[usize]) -> Spec {
        Spec { name: name.into(), parts: vec![file.into()], shape: shape.to_vec() }
    }

    /// A weight with the same name in both layouts.
    fn same(name: &str, shape: &[usize]) -> Spec {
        Spec::one(name, name, shape)
    }
}

/// Whether a group's blocks carry adaLN modulation (all but the context refiner).
pub(crate) fn modulated(group: &str) -> bool {
    group != "context_refiner"
}

/// Every weight of the model, in load order.
fn specs(cfg: &Config, layout: Layout) -> Vec<Spec> {
    let d = cfg.dim;
    let patch = cfg.patch_size * cfg.patch_size * cfg.in_channels;
    let diffusers = layout == Layout::Diffusers;
    let mut out = Vec::new();
    let (x_emb, final_layer) = if diffusers {
        ("all_x_embedder.2-1", "all_final_layer.2-1")
    } else {
        ("x_embedder", "final_layer")
    };
    out.push(Spec::one("x_embedder.weight", format!("{x_emb}.weight"), &[d, patch]));
    out.push(Spec::one("x_embedder.bias", format!("{x_emb}.bias"), &[d]));
    if cfg.pad_multiple > 1 {
        out.push(Spec::same("x_pad_token", &[1, d]));
        out.push(Spec::same("cap_pad_token", &[1, d]));
    }
    out.push(Spec::same("t_embedder.mlp.0.weight", &[cfg.t_hidden, cfg.t_freq_dim]));
    out.push(Spec::same("t_embedder.mlp.0.bias", &[cfg.t_hidden]));
    out.push(Spec::same("t_embedder.mlp.2.weight", &[cfg.adaln_dim, cfg.t_hidden]));
    out.push(Spec::same("t_embedder.mlp.2.bias", &[cfg.adaln_dim]));
    out.push(Spec::same("cap_embedder.0.weight", &[cfg.cap_feat_dim]));
    out.push(Spec::same("cap_embedder.1.weight", &[d, cfg.cap_feat_dim]));
    out.push(Spec::same("cap_embedder.1.bias", &[d]));
    let counts = [cfg.layers, cfg.noise_refiners, cfg.context_refiners];
    for (group, count) in GROUPS.into_iter().zip(counts) {
        for i in 0..count {
            block(&mut out, &format!("{group}.{i}"), cfg, layout, modulated(group));
        }
    }
    for (name, shape) in [
        ("linear.weight", vec![patch, d]),
        ("linear.bias", vec![patch]),
        ("adaLN_modulation.1.weight", vec![d, cfg.adaln_dim]),
        ("adaLN_modulation.1.bias", vec![d]),
    ] {
        out.push(Spec::one(format!("final_layer.{name}"), format!("{final_layer}.{name}"), &shape));
    }
    out
}

/// The weights of block `p` (`layers.3`, ...).
fn block(out: &mut Vec<Spec>, p: &str, cfg: &Config, layout: Layout, modulated: bool) {
    let (d, f, hd) = (cfg.dim, cfg.ffn_hidden, cfg.head_dim);
    let a = format!("{p}.attention");
    match layout {
        Layout::Comfy => {
            out.push(Spec::same(&format!("{a}.qkv.weight"), &[cfg.qkv_rows(), d]));
            out.push(Spec::same(&format!("{a}.out.weight"), &[d, d]));
            out.push(Spec::same(&format!("{a}.q_norm.weight"), &[hd]));
            out.push(Spec::same(&format!("{a}.k_norm.weight"), &[hd]));
        }
        Layout::Diffusers => {
            out.push(Spec {
                name: format!("{a}.qkv.weight"),
                parts: ["to_q", "to_k", "to_v"].map(|n| format!("{a}.{n}.weight")).to_vec(),
                shape: vec![3 * d, d],
            });
            out.push(Spec::one(format!("{a}.out.weight"), format!("{a}.to_out.0.weight"), &[d, d]));
            out.push(Spec::one(format!("{a}.q_norm.weight"), format!("{a}.norm_q.weight"), &[hd]));
            out.push(Spec::one(format!("{a}.k_norm.weight"), format!("{a}.norm_k.weight"), &[hd]));
        }
    }
    for norm in ["attention_norm1", "attention_norm2", "ffn_norm1", "ffn_norm2"] {
        out.push(Spec::same(&format!("{p}.{norm}.weight"), &[d]));
    }
    out.push(Spec::same(&format!("{p}.feed_forward.w1.weight"), &[f, d]));
    out.push(Spec::same(&format!("{p}.feed_forward.w2.weight"), &[d, f]));
    out.push(Spec::same(&format!("{p}.feed_forward.w3.weight"), &[f, d]));
    if modulated {
        let m = format!("{p}.adaLN_modulation.{}", cfg.variant.adaln_index());
        out.push(Spec::same(&format!("{m}.weight"), &[4 * d, cfg.adaln_dim]));
        out.push(Spec::same(&format!("{m}.bias"), &[4 * d]));
    }
}

/// Every weight of a Fun ControlNet (`control_all_x_embedder.2-1` over `in_features`, `refiners` plain
/// noise-refiner blocks, `layers` control layers with `after_proj`, the first with `before_proj`) of `cfg`'s
/// widths, its attention named as in `layout`.
fn control_specs(
    cfg: &Config,
    layout: Layout,
    layers: usize,
    refiners: usize,
    in_features: usize,
) -> Vec<Spec> {
    let d = cfg.dim;
    let mut out = vec![
        Spec::same("control_all_x_embedder.2-1.weight", &[d, in_features]),
        Spec::same("control_all_x_embedder.2-1.bias", &[d]),
    ];
    for i in 0..refiners {
        block(&mut out, &format!("{}.{i}", CONTROL_GROUPS[1]), cfg, layout, true);
    }
    for i in 0..layers {
        let p = format!("{}.{i}", CONTROL_GROUPS[0]);
        block(&mut out, &p, cfg, layout, true);
        let projections: &[&str] =
            if i == 0 { &["before_proj", "after_proj"] } else { &["after_proj"] };
        for proj in projections {
            out.push(Spec::same(&format!("{p}.{proj}.weight"), &[d, d]));
            out.push(Spec::same(&format!("{p}.{proj}.bias"), &[d]));
        }
    }
    out
}

/// The block groups of a Fun ControlNet: its control layers, its noise-refiner blocks.
pub(crate) const CONTROL_GROUPS: [&str; 2] = ["control_layers", "control_noise_refiner"];

/// Checks that every tensor the model needs is in `h` with the shape `cfg` implies, in a dtype Kiln computes
/// with; else [`crate::Error::Unsupported`] naming the first offender.
pub(crate) fn check(h: &Header, cfg: &Config, layout: Layout) -> Result<()> {
    check_specs(h, specs(cfg, layout), cfg.dim)
}

/// [`check`] for a Fun ControlNet of `layers` control layers and `refiners` refiner blocks.
pub(crate) fn check_control(
    h: &Header,
    cfg: &Config,
    layout: Layout,
    (layers, refiners, in_features): (usize, usize, usize),
) -> Result<()> {
    check_specs(h, control_specs(cfg, layout, layers, refiners, in_features), cfg.dim)
}

/// Checks that each of `specs` is in `h` in a dtype Kiln computes with and of its shape.
fn check_specs(h: &Header, specs: Vec<Spec>, dim: usize) -> Result<()> {
    let unsupported: std::collections::BTreeMap<&str, &str> = h.unsupported_dtypes().collect();
    for spec in specs {
        let mut part_shape = spec.shape.clone();
        part_shape[0] /= spec.parts.len();
        for part in &spec.parts {
            if let Some(dtype) = unsupported.get(part.as_str()) {
                return Err(h.unsupported(format!(
                    "`{}` is {dtype}, a type Kiln cannot compute with",
                    h.key(part)
                )));
            }
            h.require(part)?;
            let got = &h.values_shape(part).unwrap_or_default();
            if *got != part_shape {
                return Err(h.unsupported(format!(
                    "`{}` is {got:?}, expected {part_shape:?} for a NextDiT (Z-Image, Lumina 2) of dim {dim}",
                    h.key(part),
                )));
            }
        }
    }
    Ok(())
}

/// The plan that loads the model `detect` found in `h`: one slot per weight, named as in ComfyUI's layout
/// without prefix, made of the file's tensors (full keys, prefix included).
pub fn load_plan(h: &Header, cfg: &Config, layout: Layout) -> LoadPlan {
    plan_of(h, specs(cfg, layout))
}

/// [`load_plan`] for a Fun ControlNet of `layers` control layers and `refiners` refiner blocks.
pub(crate) fn control_load_plan(
    h: &Header,
    cfg: &Config,
    layout: Layout,
    (layers, refiners, in_features): (usize, usize, usize),
) -> LoadPlan {
    plan_of(h, control_specs(cfg, layout, layers, refiners, in_features))
}

/// One slot per spec, made of the file's tensors.
fn plan_of(h: &Header, specs: Vec<Spec>) -> LoadPlan {
    let slots = specs
        .into_iter()
        .map(|spec| {
            SlotPlan::new(spec.name, spec.parts.iter().map(|part| (0, h.key(part))).collect())
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// Every weight of a model of `cfg` with its shape, ComfyUI's names (for synth).
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    specs(cfg, Layout::Comfy).into_iter().map(|spec| (spec.name, spec.shape)).collect()
}

/// Every weight of a Fun ControlNet with its shape, ComfyUI's names (for synth).
pub(crate) fn control_expected(
    cfg: &Config,
    layout: Layout,
    (layers, refiners, in_features): (usize, usize, usize),
) -> Vec<(Vec<String>, Vec<usize>)> {
    control_specs(cfg, layout, layers, refiners, in_features)
        .into_iter()
        .map(|spec| {
            let mut shape = spec.shape;
            shape[0] /= spec.parts.len();
            (spec.parts, shape)
        })
        .collect()
}
