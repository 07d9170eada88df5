//! USO's style projector (`uso-flux1-projector-v1.safetensors`, a `MODEL_PATCH`; ComfyUI's
//! `SigLIPMultiFeatProjModel` in `comfy_extras/nodes_model_patch.py`): three SigLIP hidden states of a style
//! image (layers −20, −11 and the penultimate one), each squeezed from the image's tokens to a few style tokens
//! by a linear layer across the tokens, layer-normed and projected to the FLUX.1 DiT's width. `USOStyleReference`
//! puts the resulting tokens before the prompt's after `txt_in` ([`super::FluxInput::text_prefix`]).
//!
//! Every width comes from the file (the release: 729 SigLIP tokens → 64 style tokens a level, 1152 → 3072).

use kiln_compute::backend::UnaryOp;
use kiln_compute::memory::{LoadPlan, Model, SlotPlan};
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};
use crate::header::Header;

/// Where the release keeps the projector's tensors (ComfyUI strips it on load).
pub const USO_PREFIX: &str = "feature_embedder.";
/// The three levels in the order their tokens are joined (the penultimate layer's first).
const LEVELS: [&str; 3] = ["high", "mid", "low"];
/// `nn.LayerNorm`'s default ε.
const LAYER_NORM_EPS: f32 = 1e-5;

/// The projector's widths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsoConfig {
    /// Tokens of the SigLIP hidden states it reads (729 for a 384² image at patch 14).
    pub siglip_tokens: usize,
    /// Style tokens it makes of each level (64).
    pub style_tokens: usize,
    /// SigLIP's hidden width (1152).
    pub siglip_dim: usize,
    /// The DiT's hidden width (3072).
    pub hidden: usize,
}

/// Every tensor of `cfg`: its slot name (ComfyUI's, without the release's prefix) and shape.
pub(crate) fn uso_expected(cfg: &UsoConfig) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::with_capacity(18);
    for level in LEVELS {
        out.push((
            format!("{level}_embedding_linear.0.weight"),
            vec![cfg.style_tokens, cfg.siglip_tokens],
        ));
        out.push((format!("{level}_embedding_linear.0.bias"), vec![cfg.style_tokens]));
        out.push((format!("{level}_layer_norm.weight"), vec![cfg.siglip_dim]));
        out.push((format!("{level}_layer_norm.bias"), vec![cfg.siglip_dim]));
        out.push((format!("{level}_projection.weight"), vec![cfg.hidden, cfg.siglip_dim]));
        out.push((format!("{level}_projection.bias"), vec![cfg.hidden]));
    }
    out
}

/// Recognises USO's projector (`feature_embedder.mid_layer_norm.bias`, as ComfyUI's `ModelPatchLoader`
/// does): its widths, every tensor checked against them. `Ok(None)` for another file.
pub fn detect_uso(h: &Header) -> Result<Option<UsoConfig>> {
    if !h.has(&format!("{USO_PREFIX}mid_layer_norm.bias")) {
        return Ok(None);
    }
    let matrix = |name: &str| -> Result<(usize, usize)> {
        let name = format!("{USO_PREFIX}{name}");
        match h.values_shape(&name).as_deref() {
            Some(&[rows, cols]) => Ok((rows, cols)),
            other => Err(h.unsupported(format!(
                "USO's projector: `{}` is {other:?}, not a matrix",
                h.key(&name)
            ))),
        }
    };
    let (style_tokens, siglip_tokens) = matrix("high_embedding_linear.0.weight")?;
    let (hidden, siglip_dim) = matrix("high_projection.weight")?;
    let cfg = UsoConfig { siglip_tokens, style_tokens, siglip_dim, hidden };
    for (name, shape) in uso_expected(&cfg) {
        let key = format!("{USO_PREFIX}{name}");
        if h.values_shape(&key).as_deref() != Some(shape.as_slice()) {
            return Err(h.unsupported(format!(
                "USO's projector: `{}` is {:?}, expected {shape:?} (it has no layer norm, or its levels \
                 differ)",
                h.key(&key),
                h.values_shape(&key)
            )));
        }
    }
    Ok(Some(cfg))
}

/// The projector's weights, by slot name.
pub fn uso_load_plan(h: &Header, cfg: &UsoConfig) -> LoadPlan {
    let slots = uso_expected(cfg)
        .into_iter()
        .map(|(name, _)| {
            let key = h.key(&format!("{USO_PREFIX}{name}"));
            SlotPlan::new(name, vec![(0, key)])
        })
        .collect();
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// A loaded USO projector.
pub struct UsoProjector {
    /// Its widths.
    pub config: UsoConfig,
    /// Its weights.
    pub weights: Model,
}

impl UsoProjector {
    /// The style tokens `[B, 3 · style_tokens, hidden]` of SigLIP's hidden states `[low, mid, high]` (layers −20,
    /// −11 and the penultimate one), each `[B, siglip_tokens, siglip_dim]`, in the compute type: the high
    /// level's tokens first, as ComfyUI joins them.
    pub fn forward<B: Backend>(
        &self,
        b: &B,
        [low, mid, high]: [&Tensor<B>; 3],
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let mut parts = Vec::with_capacity(3);
        for (level, states) in LEVELS.into_iter().zip([high, mid, low]) {
            match states.shape() {
                &[_, t, d] if t == cfg.siglip_tokens && d == cfg.siglip_dim => {}
                other => {
                    return Err(Error::Invalid(format!(
                        "USO's projector reads SigLIP states [B, {}, {}], got {other:?} (a SigLIP of \
                         another size or image resolution)",
                        cfg.siglip_tokens, cfg.siglip_dim
                    )));
                }
            }
            let names = ["embedding_linear.0.weight", "embedding_linear.0.bias"]
                .into_iter()
                .chain(["layer_norm.weight", "layer_norm.bias"])
                .chain(["projection.weight", "projection.bias"])
                .map(|n| format!("{level}_{n}"))
                .collect::<Vec<_>>();
            let layer =
                self.weights.fetch(b, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
            let w = |i: usize| layer.weight(i);
            let x = b.cast(states, b.compute_dtype())?;
            // Across the tokens: [B, T, D] → [B, D, T] → [B, D, S], SiLU, back to [B, S, D].
            let across = b.linear(&b.permute(&x, &[0, 2, 1])?, &w(0), Some(&w(1)))?;
            let across = b.permute(&b.unary(&across, UnaryOp::Silu)?, &[0, 2, 1])?;
            let normed = b.layer_norm(&across, Some(&w(2)), Some(&w(3)), LAYER_NORM_EPS)?;
            parts.push(b.linear(&normed, &w(4), Some(&w(5)))?);
        }
        let refs: Vec<&Tensor<B>> = parts.iter().collect();
        Ok(b.concat(&refs, 1)?)
    }
}
