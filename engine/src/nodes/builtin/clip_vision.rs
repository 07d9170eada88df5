//! Vision towers and style models (`nodes.py`): `CLIPVisionLoader` loads a tower from `clip_vision/`,
//! `CLIPVisionEncode` runs an image through it (ComfyUI's `clip_preprocess`, then the tower: a
//! `CLIP_VISION_OUTPUT`), `StyleModelLoader` loads FLUX.1 Redux from `style_models/`, and `StyleModelApply`
//! appends the Redux tokens of a vision output to every prompt of a conditioning.
//!
//! Invariant: `StyleModelApply` changes only the prompt's tokens (`cond`), as ComfyUI's does: the pooled output
//! and everything riding along are kept, and the DiT simply sees a longer text.

use std::sync::Arc;

use kiln_compute::{Backend, DType};

use super::loaders::{find, progress};
use crate::compute::Compute;
use crate::models::device::{OnDevice, on_device, to_host};
use crate::models::{ClipVision, ClipVisionOutput, Cond, Conditioning, ModelEnv, StyleModel, load};
use crate::nodes::error::node_error;
use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
};
use crate::tensor::Tensor;
use crate::value::Value;

/// A `CLIP_VISION` input.
fn clip_vision<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Arc<ClipVision>, NodeError> {
    match inputs.get(name) {
        Some(Value::ClipVision(c)) => Ok(c),
        other => Err(wrong(name, "CLIP_VISION", other)),
    }
}

/// A `CLIP_VISION_OUTPUT` input.
pub(super) fn vision_output<'a>(
    inputs: &'a Inputs,
    name: &str,
) -> Result<&'a Arc<ClipVisionOutput>, NodeError> {
    match inputs.get(name) {
        Some(Value::ClipVisionOutput(o)) => Ok(o),
        other => Err(wrong(name, "CLIP_VISION_OUTPUT", other)),
    }
}

/// A `STYLE_MODEL` input.
fn style_model<'a>(inputs: &'a Inputs, name: &str) -> Result<&'a Arc<StyleModel>, NodeError> {
    match inputs.get(name) {
        Some(Value::StyleModel(s)) => Ok(s),
        other => Err(wrong(name, "STYLE_MODEL", other)),
    }
}

/// The error for input `name` missing or of another type than `expected`.
fn wrong(name: &str, expected: &str, got: Option<&Value>) -> NodeError {
    let message = match got {
        Some(v) => format!("input `{name}` should be {expected}, got {}", v.type_name()),
        None => format!("input `{name}` is missing"),
    };
    NodeError::of_kind(ErrorKind::WrongType, message)
}

/// `CLIPVisionLoader`: a vision tower from `clip_vision/`.
pub(super) struct ClipVisionLoader(pub(super) ModelEnv);

impl Node for ClipVisionLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("clip_vision");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("CLIPVisionLoader", "Load CLIP Vision", "model/loaders")
                .input(InputDef::choices("clip_name", &files))
                .output(OutputDef::new("CLIP_VISION"))
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "clip_vision", inputs, "clip_name")?;
        let net = load::load_clip_vision(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::ClipVision(Arc::new(net))]))
    }
}

/// An image batch `[B, H, W, C]` through a vision tower.
struct Encode<'a> {
    clip_vision: &'a ClipVision,
    image: &'a Tensor,
    crop: bool,
}

impl OnDevice for Encode<'_> {
    type Output = Result<ClipVisionOutput, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        // As ComfyUI loads the tower before it encodes: top residency priority.
        self.clip_vision.net.weights().activate()?;
        let shape: [usize; 4] = self.image.shape().try_into().map_err(|_| {
            kiln_models::Error::Invalid(format!(
                "CLIPVisionEncode takes an image [B, H, W, C], not {:?}",
                self.image.shape()
            ))
        })?;
        let out = self.clip_vision.net.encode(b, self.image.data(), shape, self.crop)?;
        Ok(ClipVisionOutput {
            last_hidden_state: to_host(b, &out.last)?,
            penultimate_hidden_states: out
                .penultimate
                .as_ref()
                .map(|t| to_host(b, t))
                .transpose()?,
            image_embeds: to_host(b, &out.embeds)?,
            all_hidden_states: out.all.iter().map(|t| to_host(b, t)).collect::<Result<_, _>>()?,
        })
    }
}

/// `CLIPVisionEncode`: an image through a vision tower, cropped to its centre (`crop` "center") or squashed
/// ("none") to the tower's size.
pub(super) struct ClipVisionEncode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ClipVisionEncode {
    pub(super) fn new(compute: Arc<Compute>) -> ClipVisionEncode {
        let spec = NodeSpec::new("CLIPVisionEncode", "CLIP Vision Encode", "model/conditioning")
            .input(InputDef::typed("clip_vision", "CLIP_VISION"))
            .input(InputDef::typed("image", "IMAGE"))
            .input(InputDef::choices("crop", &["center", "none"]))
            .output(OutputDef::new("CLIP_VISION_OUTPUT"));
        ClipVisionEncode { spec: Arc::new(spec), compute }
    }
}

impl Node for ClipVisionEncode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip_vision = clip_vision(inputs, "clip_vision")?;
        let image = inputs.image("image")?;
        // ComfyUI crops for "center" and for nothing else.
        let crop = inputs.string("crop")? == "center";
        let out = on_device(self.compute.device(), Encode { clip_vision, image, crop })
            .map_err(node_error)?;
        Ok(NodeResult::values([Value::ClipVisionOutput(Arc::new(out))]))
    }
}

/// `StyleModelLoader`: a style model from `style_models/`.
pub(super) struct StyleModelLoader(pub(super) ModelEnv);

impl Node for StyleModelLoader {
    fn spec(&self) -> Arc<NodeSpec> {
        let files = self.0.files.list("style_models");
        let files: Vec<&str> = files.iter().map(String::as_str).collect();
        Arc::new(
            NodeSpec::new("StyleModelLoader", "Load Style Model", "model/loaders")
                .input(InputDef::choices("style_model_name", &files))
                .output(OutputDef::new("STYLE_MODEL"))
                .shared_between_partitions(),
        )
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let path = find(&self.0, "style_models", inputs, "style_model_name")?;
        let net = load::load_style_model(&self.0, &path, &mut progress(ctx)).map_err(node_error)?;
        Ok(NodeResult::values([Value::StyleModel(Arc::new(net))]))
    }
}

/// A vision output's `last_hidden_state` through a style model.
struct Tokens<'a> {
    style_model: &'a StyleModel,
    last_hidden_state: &'a Tensor,
}

impl OnDevice for Tokens<'_> {
    type Output = Result<Tensor, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        self.style_model.net.weights().activate()?;
        let x =
            b.from_f32(self.last_hidden_state.shape(), self.last_hidden_state.data(), DType::F32)?;
        to_host(b, &self.style_model.net.tokens(b, &x)?)
    }
}

/// `StyleModelApply`: the style model's tokens for the vision output, the batch's flattened into one sequence
/// (times `strength` with `multiply`), appended to every prompt's tokens.
pub(super) struct StyleModelApply {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl StyleModelApply {
    pub(super) fn new(compute: Arc<Compute>) -> StyleModelApply {
        let spec = NodeSpec::new("StyleModelApply", "Apply Style Model", "model/conditioning")
            .input(InputDef::typed("conditioning", "CONDITIONING"))
            .input(InputDef::typed("style_model", "STYLE_MODEL"))
            .input(InputDef::typed("clip_vision_output", "CLIP_VISION_OUTPUT"))
            .input(InputDef::float("strength", 1.0, 0.0, 10.0).option("step", 0.001))
            .input(InputDef::choices("strength_type", &["multiply", "attn_bias"]))
            .output(OutputDef::new("CONDITIONING"))
            .aliases(&["style transfer"]);
        StyleModelApply { spec: Arc::new(spec), compute }
    }
}

impl Node for StyleModelApply {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let conditioning = inputs.conditioning("conditioning")?;
        let style_model = style_model(inputs, "style_model")?;
        let output = vision_output(inputs, "clip_vision_output")?;
        let strength = inputs.float("strength")?;
        let multiply = match inputs.string("strength_type")? {
            "multiply" => true,
            // Without an attention mask (Kiln's conditionings carry none), ComfyUI's attn_bias at strength 1
            // appends the tokens as they are; any other strength biases the attention to them with a mask.
            "attn_bias" if strength == 1.0 => false,
            "attn_bias" => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "strength_type attn_bias at strength {strength} weights the image tokens through an \
                         attention mask, which Kiln's models do not take yet: use multiply"
                    ),
                ));
            }
            other => {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!("unknown strength_type {other}"),
                ));
            }
        };
        let tokens = on_device(
            self.compute.device(),
            Tokens { style_model, last_hidden_state: &output.last_hidden_state },
        )
        .map_err(node_error)?;
        // [B, N, D] → one sequence [1, B·N, D].
        let width = tokens.shape().last().copied().unwrap_or(0);
        let tokens: Vec<f32> = if multiply {
            let strength = strength as f32;
            tokens.data().iter().map(|v| v * strength).collect()
        } else {
            tokens.data().to_vec()
        };
        let entries = conditioning
            .entries
            .iter()
            .map(|c| append(c, &tokens, width))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}

/// `c` with `tokens` (`width` wide) after its own tokens; everything else kept.
fn append(c: &Cond, tokens: &[f32], width: usize) -> Result<Cond, NodeError> {
    let [1, n, d] = c.cond.shape() else {
        return Err(NodeError::new(format!(
            "StyleModelApply takes a prompt's tokens [1, N, D], not {:?}",
            c.cond.shape()
        )));
    };
    if *d != width {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "the style model gives tokens {width} wide, but the conditioning's are {d} wide: a style model \
                 for another model's text encoder?"
            ),
        ));
    }
    let added = tokens.len() / width.max(1);
    let data: Vec<f32> = c.cond.data().iter().chain(tokens).copied().collect();
    let cond =
        Tensor::new(vec![1, n + added, *d], data).map_err(|e| NodeError::new(e.to_string()))?;
    Ok(Cond { cond, ..c.clone() })
}
