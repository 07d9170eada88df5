//! Values that flow along links between nodes, and the literal values a prompt can hold.

use std::sync::Arc;

use kiln_models::sampling::Sampler;

use crate::models::{Conditioning, DiffusionModel, Guider, Noise, TextEncoder, Vae};
use crate::tensor::Tensor;

/// A value on a link or a node input.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `INT`. One above i64::MAX (a 64-bit seed) is held as its two's-complement bits: read it with `as u64`.
    Int(i64),
    /// `FLOAT`.
    Float(f64),
    /// `STRING` (and combo choices).
    String(String),
    /// `BOOLEAN`.
    Bool(bool),
    /// `IMAGE`: `[B, H, W, C]` in `0..=1`.
    Image(Tensor),
    /// `MASK`: `[B, H, W]` in `0..=1`.
    Mask(Tensor),
    /// `LATENT`: `samples` `[B, C, H, W]`.
    Latent(Tensor),
    /// Any other JSON value a widget accepts.
    Json(Arc<serde_json::Value>),
    /// `MODEL`: a diffusion model with its sampling settings (and patches).
    Model(Arc<DiffusionModel>),
    /// `CLIP`: a text encoder with its tokenizer.
    Clip(Arc<TextEncoder>),
    /// `VAE`: an autoencoder between images and latents.
    Vae(Arc<Vae>),
    /// `CONDITIONING`: encoded prompts.
    Conditioning(Arc<Conditioning>),
    /// `SAMPLER`: a sampling method (`KSamplerSelect`).
    Sampler(Sampler),
    /// `SIGMAS`: the noise levels a sampler steps through, descending.
    Sigmas(Arc<[f32]>),
    /// `NOISE`: where the starting noise comes from.
    Noise(Noise),
    /// `GUIDER`: the model, conditioning and CFG a sampler denoises with.
    Guider(Arc<Guider>),
}

impl Value {
    /// The type name as object_info spells it (`INT`, `IMAGE`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Int(_) => "INT",
            Value::Float(_) => "FLOAT",
            Value::String(_) => "STRING",
            Value::Bool(_) => "BOOLEAN",
            Value::Image(_) => "IMAGE",
            Value::Mask(_) => "MASK",
            Value::Latent(_) => "LATENT",
            Value::Json(_) => "*",
            Value::Model(_) => "MODEL",
            Value::Clip(_) => "CLIP",
            Value::Vae(_) => "VAE",
            Value::Conditioning(_) => "CONDITIONING",
            Value::Sampler(_) => "SAMPLER",
            Value::Sigmas(_) => "SIGMAS",
            Value::Noise(_) => "NOISE",
            Value::Guider(_) => "GUIDER",
        }
    }

    /// Bytes held by tensors (what RAM-pressure eviction counts).
    pub fn byte_size(&self) -> usize {
        match self {
            Value::Image(t) | Value::Mask(t) | Value::Latent(t) => t.byte_size(),
            Value::Int(_)
            | Value::Float(_)
            | Value::Bool(_)
            | Value::String(_)
            | Value::Json(_)
            | Value::Sampler(_)
            | Value::Noise(_) => 0,
            Value::Sigmas(s) => std::mem::size_of_val(&**s),
            // The guider's conditioning is held by the node that made it, whose output the cache counts.
            Value::Guider(_) => 0,
            // Weights live in the memory manager, which accounts for them; a cached model costs the cache
            // nothing of its own.
            Value::Model(_) | Value::Clip(_) | Value::Vae(_) => 0,
            Value::Conditioning(c) => c.byte_size(),
        }
    }

    /// A short representation for error reports (`current_inputs` of `execution_error`).
    pub fn repr(&self) -> String {
        match self {
            Value::Int(v) => v.to_string(),
            Value::Float(v) => v.to_string(),
            Value::String(v) => v.clone(),
            Value::Bool(v) => if *v { "True" } else { "False" }.to_owned(),
            Value::Image(t) | Value::Mask(t) | Value::Latent(t) => format!("tensor{:?}", t.shape()),
            Value::Json(v) => v.to_string(),
            Value::Sigmas(s) => format!("tensor{s:?}"),
            Value::Model(_)
            | Value::Clip(_)
            | Value::Vae(_)
            | Value::Conditioning(_)
            | Value::Sampler(_)
            | Value::Noise(_)
            | Value::Guider(_) => format!("<{}>", self.type_name()),
        }
    }

    /// The value as JSON, for values that have a JSON form (used by `PreviewAny` and cache keys).
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Int(v) => (*v).into(),
            Value::Float(v) => {
                serde_json::Number::from_f64(*v).map_or(serde_json::Value::Null, Into::into)
            }
            Value::String(v) => v.clone().into(),
            Value::Bool(v) => (*v).into(),
            Value::Image(t) | Value::Mask(t) | Value::Latent(t) => {
                serde_json::json!({"tensor": t.shape()})
            }
            Value::Json(v) => (**v).clone(),
            Value::Sigmas(s) => {
                serde_json::json!(s.iter().map(|&v| f64::from(v)).collect::<Vec<_>>())
            }
            Value::Model(_)
            | Value::Clip(_)
            | Value::Vae(_)
            | Value::Conditioning(_)
            | Value::Sampler(_)
            | Value::Noise(_)
            | Value::Guider(_) => serde_json::Value::String(format!("<{}>", self.type_name())),
        }
    }
}
