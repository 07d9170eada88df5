//! The weights of a HunyuanVideo DiT by their ComfyUI names (without prefix), with the shapes a [`Config`]
//! implies, and the [`LoadPlan`] that loads them (one file tensor per weight: ComfyUI's layout is the only one
//! Kiln reads).
//!
//! Every block's names are listed here once, in the order the model code fetches them: [`double_block_names`],
//! [`single_block_names`] and [`refiner_block_names`] are what a block's layer holds.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;

use super::config::{Config, WHAT};

/// The token refiner's block group, with the dot.
pub(crate) const REFINER_BLOCKS: &str = "txt_in.individual_token_refiner.blocks.";

/// The timestep sinusoid's width (ComfyUI's `timestep_embedding(.., 256)`).
pub(crate) const T_FREQ_DIM: usize = 256;

/// A list of weights with their shapes.
type Specs = Vec<(String, Vec<usize>)>;

/// `stem.weight` `[rows, cols]` and `stem.bias` `[rows]`.
fn linear(out: &mut Specs, stem: &str, rows: usize, cols: usize) {
    out.push((format!("{stem}.weight"), vec![rows, cols]));
    out.push((format!("{stem}.bias"), vec![rows]));
}

/// `stem.weight` and `stem.bias`, both `[width]` (an affine LayerNorm).
fn norm(out: &mut Specs, stem: &str, width: usize) {
    out.push((format!("{stem}.weight"), vec![width]));
    out.push((format!("{stem}.bias"), vec![width]));
}

/// An `MLPEmbedder` `stem` from `in_dim` features to D.
fn embedder(out: &mut Specs, stem: &str, in_dim: usize, d: usize) {
    linear(out, &format!("{stem}.in_layer"), d, in_dim);
    linear(out, &format!("{stem}.out_layer"), d, d);
}

/// The names of an `MLPEmbedder` `stem`, in the order [`embedder`] lists them.
pub(crate) fn embedder_names(stem: &str) -> Vec<String> {
    ["in_layer.weight", "in_layer.bias", "out_layer.weight", "out_layer.bias"]
        .map(|n| format!("{stem}.{n}"))
        .to_vec()
}

/// A block's names with their shapes (the two lists are built side by side, of one length).
fn paired(names: Vec<String>, shapes: Vec<Vec<usize>>) -> Specs {
    debug_assert_eq!(names.len(), shapes.len());
    names.into_iter().zip(shapes).collect()
}

/// Every weight of the model with its shape, in load order.
fn specs(cfg: &Config) -> Specs {
    let (d, p) = (cfg.hidden, cfg.patch);
    let mut out: Specs = Vec::new();
    out.push(("img_in.proj.weight".to_owned(), vec![d, cfg.in_channels, 1, p, p]));
    out.push(("img_in.proj.bias".to_owned(), vec![d]));
    embedder(&mut out, "time_in", T_FREQ_DIM, d);
    if cfg.meanflow {
        embedder(&mut out, "time_r_in", T_FREQ_DIM, d);
    }
    if let Some(vec_dim) = cfg.vec_dim {
        embedder(&mut out, "vector_in", vec_dim, d);
    }
    if cfg.guidance {
        embedder(&mut out, "guidance_in", T_FREQ_DIM, d);
    }
    text_in(&mut out, cfg);
    for i in 0..cfg.double_blocks {
        out.extend(paired(double_block_names(i), double_block_shapes(cfg)));
    }
    for i in 0..cfg.single_blocks {
        out.extend(paired(single_block_names(i), single_block_shapes(cfg)));
    }
    linear(&mut out, "final_layer.linear", p * p * cfg.out_channels, d);
    linear(&mut out, "final_layer.adaLN_modulation.1", 2 * d, d);
    out
}

/// The text side: the token refiner (`txt_in`), the byT5 mapper, the vision projection and the condition-type
/// embedding, where the config has them.
fn text_in(out: &mut Specs, cfg: &Config) {
    let (d, c) = (cfg.hidden, cfg.context_dim);
    linear(out, "txt_in.input_embedder", d, c);
    embedder(out, "txt_in.t_embedder", T_FREQ_DIM, d);
    embedder(out, "txt_in.c_embedder", c, d);
    for i in 0..cfg.refiner_blocks {
        out.extend(paired(refiner_block_names(i), refiner_block_shapes(cfg)));
    }
    if let Some(byt5) = cfg.byt5 {
        norm(out, "byt5_in.layernorm", byt5.in_dim);
        linear(out, "byt5_in.fc1", byt5.hidden, byt5.in_dim);
        linear(out, "byt5_in.fc2", byt5.out, byt5.hidden);
        linear(out, "byt5_in.fc3", d, byt5.out);
    }
    if let Some(v) = cfg.vision_dim {
        norm(out, "vision_in.proj.0", v);
        linear(out, "vision_in.proj.1", v, v);
        linear(out, "vision_in.proj.3", d, v);
        norm(out, "vision_in.proj.4", d);
    }
    if cfg.cond_type_embedding {
        out.push(("cond_type_embedding.weight".to_owned(), vec![3, d]));
    }
}

/// The names of the byT5 mapper's weights, in the order [`text_in`] lists them.
pub(crate) fn byt5_names() -> Vec<String> {
    let mut names =
        vec!["byt5_in.layernorm.weight".to_owned(), "byt5_in.layernorm.bias".to_owned()];
    for fc in ["fc1", "fc2", "fc3"] {
        names.extend([format!("byt5_in.{fc}.weight"), format!("byt5_in.{fc}.bias")]);
    }
    names
}

/// The names of the vision projection's weights (Wan's `MLPProj`: LayerNorm, Linear, GELU, Linear,
/// LayerNorm), in the order [`text_in`] lists them.
pub(crate) fn vision_names() -> Vec<String> {
    ["0", "1", "3", "4"]
        .into_iter()
        .flat_map(|k| [format!("vision_in.proj.{k}.weight"), format!("vision_in.proj.{k}.bias")])
        .collect()
}

/// The names of the token refiner's embedders (`input_embedder`, `t_embedder`, `c_embedder`), in order.
pub(crate) fn refiner_embedder_names() -> Vec<String> {
    let mut names =
        vec!["txt_in.input_embedder.weight".to_owned(), "txt_in.input_embedder.bias".to_owned()];
    names.extend(embedder_names("txt_in.t_embedder"));
    names.extend(embedder_names("txt_in.c_embedder"));
    names
}

/// The names of refiner block `i` (`TokenRefinerBlock`): norm1, the attention's qkv and proj, norm2, the MLP's
/// two linears, the two-gate modulation.
pub(crate) fn refiner_block_names(i: usize) -> Vec<String> {
    ["norm1", "self_attn.qkv", "self_attn.proj", "norm2", "mlp.0", "mlp.2", "adaLN_modulation.1"]
        .into_iter()
        .flat_map(|n| {
            [format!("{REFINER_BLOCKS}{i}.{n}.weight"), format!("{REFINER_BLOCKS}{i}.{n}.bias")]
        })
        .collect()
}

/// The shapes of a refiner block's weights, in [`refiner_block_names`]' order.
fn refiner_block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, f) = (cfg.hidden, cfg.mlp_hidden());
    vec![
        vec![d],
        vec![d],
        vec![3 * d, d],
        vec![3 * d],
        vec![d, d],
        vec![d],
        vec![d],
        vec![d],
        vec![f, d],
        vec![f],
        vec![d, f],
        vec![d],
        vec![2 * d, d],
        vec![2 * d],
    ]
}

/// The names of double block `i` (`DoubleStreamBlock`), the image stream's then the text stream's, each:
/// modulation, qkv, the q/k RMSNorms, proj, the MLP's two linears.
pub(crate) fn double_block_names(i: usize) -> Vec<String> {
    let mut names = Vec::with_capacity(24);
    for stream in ["img", "txt"] {
        let p = format!("double_blocks.{i}.{stream}");
        for stem in ["_mod.lin", "_attn.qkv"] {
            names.extend([format!("{p}{stem}.weight"), format!("{p}{stem}.bias")]);
        }
        names.push(format!("{p}_attn.norm.query_norm.weight"));
        names.push(format!("{p}_attn.norm.key_norm.weight"));
        for stem in ["_attn.proj", "_mlp.0", "_mlp.2"] {
            names.extend([format!("{p}{stem}.weight"), format!("{p}{stem}.bias")]);
        }
    }
    names
}

/// The shapes of a double block's weights, in [`double_block_names`]' order.
fn double_block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, f, hd) = (cfg.hidden, cfg.mlp_hidden(), cfg.head_dim());
    let stream = [
        vec![6 * d, d],
        vec![6 * d],
        vec![3 * d, d],
        vec![3 * d],
        vec![hd],
        vec![hd],
        vec![d, d],
        vec![d],
        vec![f, d],
        vec![f],
        vec![d, f],
        vec![d],
    ];
    [stream.clone(), stream].concat()
}

/// The names of single block `i` (`SingleStreamBlock`): linear1 (qkv and MLP in), linear2 (attention and MLP
/// out), the q/k RMSNorms, the modulation.
pub(crate) fn single_block_names(i: usize) -> Vec<String> {
    let p = format!("single_blocks.{i}");
    let mut names = Vec::with_capacity(8);
    for stem in ["linear1", "linear2"] {
        names.extend([format!("{p}.{stem}.weight"), format!("{p}.{stem}.bias")]);
    }
    names.push(format!("{p}.norm.query_norm.weight"));
    names.push(format!("{p}.norm.key_norm.weight"));
    names.extend([format!("{p}.modulation.lin.weight"), format!("{p}.modulation.lin.bias")]);
    names
}

/// The shapes of a single block's weights, in [`single_block_names`]' order.
fn single_block_shapes(cfg: &Config) -> Vec<Vec<usize>> {
    let (d, f, hd) = (cfg.hidden, cfg.mlp_hidden(), cfg.head_dim());
    vec![
        vec![3 * d + f, d],
        vec![3 * d + f],
        vec![d, d + f],
        vec![d],
        vec![hd],
        vec![hd],
        vec![3 * d, d],
        vec![3 * d],
    ]
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
                "`{}` is {got:?}, expected {shape:?} for {WHAT} of hidden width {}",
                h.key(&name),
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
