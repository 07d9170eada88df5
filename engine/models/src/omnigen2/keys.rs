//! The weights of an OmniGen2 or Boogu-Image DiT by their ComfyUI names (without prefix), with the shapes a
//! [`Config`] implies, and the [`LoadPlan`] that loads them (one file tensor per weight: ComfyUI's layout is the
//! only one).

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

use super::config::Config;

/// The refiners' block groups: noise (image), reference image, context.
pub(crate) const REFINERS: [&str; 3] = ["noise_refiner", "ref_image_refiner", "context_refiner"];

/// Boogu-Image's double-stream block group.
pub(crate) const DOUBLE_STREAM: &str = "double_stream_layers";

/// Whether a group's blocks are modulated by the t-embedding (all but the context refiner).
pub(crate) fn modulated(group: &str) -> bool {
    group != "context_refiner"
}

/// Every weight of the model with its shape, in load order.
fn specs(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (d, t) = (cfg.hidden, cfg.t_dim);
    let patch = cfg.patch_features();
    let mut out: Vec<(String, Vec<usize>)> = Vec::new();
    let mut push = |name: &str, shape: &[usize]| out.push((name.to_owned(), shape.to_vec()));
    for embedder in ["x_embedder", "ref_image_patch_embedder"] {
        push(&format!("{embedder}.weight"), &[d, patch]);
        push(&format!("{embedder}.bias"), &[d]);
    }
    push("image_index_embedding", &[cfg.max_references, d]);
    let te = "time_caption_embed.timestep_embedder";
    push(&format!("{te}.linear_1.weight"), &[t, cfg.t_freq_dim]);
    push(&format!("{te}.linear_1.bias"), &[t]);
    push(&format!("{te}.linear_2.weight"), &[t, t]);
    push(&format!("{te}.linear_2.bias"), &[t]);
    let ce = "time_caption_embed.caption_embedder";
    push(&format!("{ce}.0.weight"), &[cfg.text_feat_dim]);
    push(&format!("{ce}.1.weight"), &[d, cfg.text_feat_dim]);
    push(&format!("{ce}.1.bias"), &[d]);
    let groups = [cfg.variant.layers_group()].into_iter().chain(REFINERS);
    let counts = [cfg.layers, cfg.refiners, cfg.refiners, cfg.refiners];
    for (group, count) in groups.zip(counts) {
        for i in 0..count {
            out.extend(block(&format!("{group}.{i}"), cfg, modulated(group)));
        }
    }
    for i in 0..cfg.double_stream_layers {
        out.extend(double_block(&format!("{DOUBLE_STREAM}.{i}"), cfg));
    }
    for (name, shape) in [
        ("norm_out.linear_1.weight", vec![d, t]),
        ("norm_out.linear_1.bias", vec![d]),
        ("norm_out.linear_2.weight", vec![patch, d]),
        ("norm_out.linear_2.bias", vec![patch]),
    ] {
        out.push((name.to_owned(), shape));
    }
    out
}

/// The names of block `p`'s weights (`layers.3`, ...), in the order [`block`] lists them.
pub(crate) fn block_names(p: &str, modulated: bool) -> Vec<String> {
    let mut names: Vec<&str> = vec![
        "attn.to_q.weight",
        "attn.to_k.weight",
        "attn.to_v.weight",
        "attn.norm_q.weight",
        "attn.norm_k.weight",
        "attn.to_out.0.weight",
        "feed_forward.linear_1.weight",
        "feed_forward.linear_2.weight",
        "feed_forward.linear_3.weight",
        "norm2.weight",
        "ffn_norm1.weight",
        "ffn_norm2.weight",
    ];
    if modulated {
        names.extend(["norm1.norm.weight", "norm1.linear.weight", "norm1.linear.bias"]);
    } else {
        names.push("norm1.weight");
    }
    names.into_iter().map(|n| format!("{p}.{n}")).collect()
}

/// The weights of block `p` with their shapes.
fn block(p: &str, cfg: &Config, modulated: bool) -> Vec<(String, Vec<usize>)> {
    let (d, f, hd) = (cfg.hidden, cfg.ffn_hidden, cfg.head_dim);
    let (q, kv) = (cfg.heads * hd, cfg.kv_heads * hd);
    let mut shapes = vec![
        vec![q, d],
        vec![kv, d],
        vec![kv, d],
        vec![hd],
        vec![hd],
        vec![d, q],
        vec![f, d],
        vec![d, f],
        vec![f, d],
        vec![d],
        vec![d],
        vec![d],
    ];
    if modulated {
        shapes.extend([vec![d], vec![4 * d, cfg.t_dim], vec![4 * d]]);
    } else {
        shapes.push(vec![d]);
    }
    block_names(p, modulated).into_iter().zip(shapes).collect()
}

/// The names of Boogu-Image's double-stream block `p` (`double_stream_layers.3`), in the order
/// [`double_block`] lists them: the joint attention (per-stream projections under `processor`, the shared q/k
/// norms and output), the image self-attention, the two FFNs, the five `LuminaRMSNormZero`s, the sandwich norms.
pub(crate) fn double_block_names(p: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let joint = "img_instruct_attn";
    for stream in ["img", "instruct"] {
        for proj in ["to_q", "to_k", "to_v"] {
            names.push(format!("{joint}.processor.{stream}_{proj}.weight"));
        }
    }
    for name in ["processor.instruct_out", "processor.img_out", "norm_q", "norm_k", "to_out.0"] {
        names.push(format!("{joint}.{name}.weight"));
    }
    for name in ["to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0"] {
        names.push(format!("img_self_attn.{name}.weight"));
    }
    for ffn in ["img_feed_forward", "instruct_feed_forward"] {
        names.extend((1..=3).map(|k| format!("{ffn}.linear_{k}.weight")));
    }
    for norm in ["img_norm1", "img_norm2", "img_norm3", "instruct_norm1", "instruct_norm2"] {
        names
            .extend(["norm.weight", "linear.weight", "linear.bias"].map(|n| format!("{norm}.{n}")));
    }
    for norm in [
        "img_attn_norm",
        "img_self_attn_norm",
        "img_ffn_norm1",
        "img_ffn_norm2",
        "instruct_attn_norm",
        "instruct_ffn_norm1",
        "instruct_ffn_norm2",
    ] {
        names.push(format!("{norm}.weight"));
    }
    names.into_iter().map(|n| format!("{p}.{n}")).collect()
}

/// The weights of double-stream block `p` with their shapes. The per-stream projections take the hidden states
/// (ComfyUI declares them `heads · head_dim` wide on both sides, which is D whenever the model runs).
fn double_block(p: &str, cfg: &Config) -> Vec<(String, Vec<usize>)> {
    let (d, f, hd) = (cfg.hidden, cfg.ffn_hidden, cfg.head_dim);
    let (q, kv) = (cfg.heads * hd, cfg.kv_heads * hd);
    let mut shapes: Vec<Vec<usize>> = Vec::new();
    for _stream in 0..2 {
        shapes.extend([vec![q, d], vec![kv, d], vec![kv, d]]);
    }
    shapes.extend([vec![q, q], vec![q, q], vec![hd], vec![hd], vec![d, q]]);
    shapes.extend([vec![q, d], vec![kv, d], vec![kv, d], vec![hd], vec![hd], vec![d, q]]);
    for _ffn in 0..2 {
        shapes.extend([vec![f, d], vec![d, f], vec![f, d]]);
    }
    for _norm in 0..5 {
        shapes.extend([vec![d], vec![4 * d, cfg.t_dim], vec![4 * d]]);
    }
    shapes.extend(std::iter::repeat_n(vec![d], 7));
    let names = double_block_names(p);
    debug_assert_eq!(names.len(), shapes.len());
    names.into_iter().zip(shapes).collect()
}

/// Checks that every tensor the model needs is in `h` with the shape `cfg` implies, in a dtype Kiln computes
/// with; else [`crate::Error::Unsupported`] naming the first offender.
pub(crate) fn check(h: &Header, cfg: &Config) -> Result<()> {
    let unsupported: std::collections::BTreeMap<&str, &str> = h.unsupported_dtypes().collect();
    for (name, shape) in specs(cfg) {
        if let Some(dtype) = unsupported.get(name.as_str()) {
            return Err(h.unsupported(format!(
                "`{}` is {dtype}, a type Kiln cannot compute with",
                h.key(&name)
            )));
        }
        h.require(&name)?;
        let got = h.values_shape(&name).unwrap_or_default();
        if got != shape {
            return Err(h.unsupported(format!(
                "`{}` is {got:?}, expected {shape:?} for {} of hidden width {}",
                h.key(&name),
                cfg.variant.what(),
                cfg.hidden
            )));
        }
    }
    Ok(())
}

/// The plan that loads the model [`super::detect`] found in `h`: one slot per weight, named as in ComfyUI's
/// layout without prefix, read from the file's tensor of that name (prefix included).
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(specs(cfg).into_iter().map(|(name, _)| name))
}

/// Every weight of a model of `cfg` with its shape, ComfyUI's names (for synth).
pub fn expected(cfg: &Config) -> Vec<(String, Vec<usize>)> {
    specs(cfg)
}
