//! The node API: the [`Node`] trait every node class implements, the values it receives and returns, and the
//! [`Registry`] of node classes that validation, execution and `object_info` read.

mod builtin;
mod context;
pub(crate) mod error;
mod spec;

use std::collections::BTreeMap;
use std::sync::Arc;

use indexmap::IndexMap;

pub use crate::preview::{Preview, PreviewFormat, PreviewMethod};
pub use crate::roots::FileKind;
pub use builtin::builtin_registry;
pub use context::{Context, Interrupted, ProgressSink};
pub use error::{ErrorKind, NodeError};
pub use spec::{
    AUTOGROW, DYNAMIC_COMBO, DynamicOption, Hidden, InputDef, InputType, MATCHTYPE, NodeSpec,
    OutputDef,
};

use kiln_models::sampling::SamplerChoice;

use crate::models::{
    AudioEncoder, AudioEncoderOutput, Conditioning, ControlNet, DancerMusic, DiffusionModel,
    Guider, ModelPatch, Noise, TextEncoder, UpscaleModel, Vae,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// A node class.
pub trait Node: Send + Sync + 'static {
    /// The declaration (cheap to call: static nodes hand out a shared copy).
    fn spec(&self) -> Arc<NodeSpec>;

    /// The node's own validation of its literal inputs (ComfyUI's `VALIDATE_INPUTS`); an `Err` message becomes a
    /// `custom_validation_failed` error. Called only when the node declares `validates_inputs`.
    fn validate(&self, _inputs: &Inputs) -> Result<(), String> {
        Ok(())
    }

    /// What, besides its inputs, decides the node's output (ComfyUI's `IS_CHANGED`), from its literal inputs.
    fn fingerprint(&self, _inputs: &Inputs) -> Fingerprint {
        Fingerprint::Unchanged
    }

    /// Which lazy inputs the node needs, given the inputs available so far (unevaluated lazy inputs are
    /// absent). The default needs every lazy input.
    fn check_lazy(&self, _inputs: &Inputs, spec: &NodeSpec) -> Vec<String> {
        spec.inputs().filter(|i| i.is_lazy()).map(|i| i.name.clone()).collect()
    }

    /// Runs the node.
    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError>;
}

/// A fingerprint of what a node's output depends on besides its inputs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Fingerprint {
    /// Nothing else (ComfyUI's `IS_CHANGED` returning `False` or absent).
    Unchanged,
    /// This value (e.g. a file's hash); a change forces a re-run.
    Value(String),
    /// Different every time: the node never comes from the cache (ComfyUI's NaN).
    Always,
}

/// The inputs a node runs with, by name. A node that is not `is_input_list` sees exactly one value per input.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    values: BTreeMap<String, Vec<Value>>,
}

impl Inputs {
    /// Inputs from single values.
    pub fn from_values(values: impl IntoIterator<Item = (String, Value)>) -> Inputs {
        Inputs { values: values.into_iter().map(|(k, v)| (k, vec![v])).collect() }
    }

    /// Inputs from lists.
    pub fn from_lists(values: BTreeMap<String, Vec<Value>>) -> Inputs {
        Inputs { values }
    }

    /// Whether an input is present.
    pub fn has(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }

    /// An input's value.
    pub fn get(&self, name: &str) -> Option<&Value> {
        self.values.get(name).and_then(|v| v.first())
    }

    /// An input's whole list (for `is_input_list` nodes).
    pub fn list(&self, name: &str) -> &[Value] {
        self.values.get(name).map(Vec::as_slice).unwrap_or_default()
    }

    /// The names present.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.values.keys().map(String::as_str)
    }

    fn required(&self, name: &str) -> Result<&Value, NodeError> {
        self.get(name).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::WrongType, format!("input `{name}` is missing"))
        })
    }

    fn wrong(&self, name: &str, expected: &str, got: &Value) -> NodeError {
        NodeError::of_kind(
            ErrorKind::WrongType,
            format!("input `{name}` should be {expected}, got {}", got.type_name()),
        )
    }

    /// An `INT` input.
    pub fn int(&self, name: &str) -> Result<i64, NodeError> {
        match self.required(name)? {
            Value::Int(v) => Ok(*v),
            other => Err(self.wrong(name, "INT", other)),
        }
    }

    /// A `FLOAT` input (an `INT` is widened).
    pub fn float(&self, name: &str) -> Result<f64, NodeError> {
        match self.required(name)? {
            Value::Float(v) => Ok(*v),
            Value::Int(v) => Ok(*v as f64),
            other => Err(self.wrong(name, "FLOAT", other)),
        }
    }

    /// A `STRING` or combo input.
    pub fn string(&self, name: &str) -> Result<&str, NodeError> {
        match self.required(name)? {
            Value::String(v) => Ok(v),
            other => Err(self.wrong(name, "STRING", other)),
        }
    }

    /// The text of a widget of a custom type (`COLOR`, `AUDIO_RECORD`), which reaches the node as a `STRING` or
    /// as the JSON string it came as; empty when the input is absent or not text.
    pub fn widget_text(&self, name: &str) -> &str {
        match self.get(name) {
            Some(Value::String(s)) => s,
            Some(Value::Json(j)) => j.as_str().unwrap_or_default(),
            _ => "",
        }
    }

    /// A `BOOLEAN` input.
    pub fn bool(&self, name: &str) -> Result<bool, NodeError> {
        match self.required(name)? {
            Value::Bool(v) => Ok(*v),
            other => Err(self.wrong(name, "BOOLEAN", other)),
        }
    }

    /// An `IMAGE` input.
    pub fn image(&self, name: &str) -> Result<&Tensor, NodeError> {
        match self.required(name)? {
            Value::Image(t) => Ok(t),
            other => Err(self.wrong(name, "IMAGE", other)),
        }
    }

    /// An optional `IMAGE` input: `None` when it is not connected.
    pub fn optional_image(&self, name: &str) -> Result<Option<&Tensor>, NodeError> {
        self.get(name).map(|_| self.image(name)).transpose()
    }

    /// A `LATENT` input.
    pub fn latent(&self, name: &str) -> Result<&Latent, NodeError> {
        match self.required(name)? {
            Value::Latent(t) => Ok(t),
            other => Err(self.wrong(name, "LATENT", other)),
        }
    }

    /// A `MODEL` input.
    pub fn model(&self, name: &str) -> Result<&Arc<DiffusionModel>, NodeError> {
        match self.required(name)? {
            Value::Model(m) => Ok(m),
            other => Err(self.wrong(name, "MODEL", other)),
        }
    }

    /// A `CLIP` input.
    pub fn clip(&self, name: &str) -> Result<&Arc<TextEncoder>, NodeError> {
        match self.required(name)? {
            Value::Clip(c) => Ok(c),
            other => Err(self.wrong(name, "CLIP", other)),
        }
    }

    /// A `VAE` input.
    pub fn vae(&self, name: &str) -> Result<&Arc<Vae>, NodeError> {
        match self.required(name)? {
            Value::Vae(v) => Ok(v),
            other => Err(self.wrong(name, "VAE", other)),
        }
    }

    /// An `UPSCALE_MODEL` input.
    pub fn upscale_model(&self, name: &str) -> Result<&Arc<UpscaleModel>, NodeError> {
        match self.required(name)? {
            Value::UpscaleModel(m) => Ok(m),
            other => Err(self.wrong(name, "UPSCALE_MODEL", other)),
        }
    }

    /// An `AUDIO_ENCODER` input.
    pub fn audio_encoder(&self, name: &str) -> Result<&Arc<AudioEncoder>, NodeError> {
        match self.required(name)? {
            Value::AudioEncoder(e) => Ok(e),
            other => Err(self.wrong(name, "AUDIO_ENCODER", other)),
        }
    }

    /// An `AUDIO_ENCODER_OUTPUT` input.
    pub fn audio_encoder_output(&self, name: &str) -> Result<&Arc<AudioEncoderOutput>, NodeError> {
        match self.required(name)? {
            Value::AudioEncoderOutput(o) => Ok(o),
            Value::DancerMusic(_) => Err(NodeError::of_kind(
                ErrorKind::WrongType,
                format!(
                    "input `{name}` is WanDancerEncodeAudio's music features, which only WanDancerVideo reads: \
                     connect AudioEncoderEncode's output"
                ),
            )),
            other => Err(self.wrong(name, "AUDIO_ENCODER_OUTPUT", other)),
        }
    }

    /// An `AUDIO_ENCODER_OUTPUT` input made by `WanDancerEncodeAudio`.
    pub fn dancer_music(&self, name: &str) -> Result<&Arc<DancerMusic>, NodeError> {
        match self.required(name)? {
            Value::DancerMusic(m) => Ok(m),
            Value::AudioEncoderOutput(_) => Err(NodeError::of_kind(
                ErrorKind::WrongType,
                format!(
                    "input `{name}` is an audio encoder's states; WanDancerVideo reads the music features of \
                     WanDancerEncodeAudio"
                ),
            )),
            other => Err(self.wrong(name, "AUDIO_ENCODER_OUTPUT", other)),
        }
    }

    /// A `CONTROL_NET` input.
    pub fn control_net(&self, name: &str) -> Result<&Arc<ControlNet>, NodeError> {
        match self.required(name)? {
            Value::ControlNet(c) => Ok(c),
            other => Err(self.wrong(name, "CONTROL_NET", other)),
        }
    }

    /// A `MODEL_PATCH` input.
    pub fn model_patch(&self, name: &str) -> Result<&Arc<ModelPatch>, NodeError> {
        match self.required(name)? {
            Value::ModelPatch(p) => Ok(p),
            other => Err(self.wrong(name, "MODEL_PATCH", other)),
        }
    }

    /// A `CONDITIONING` input.
    pub fn conditioning(&self, name: &str) -> Result<&Arc<Conditioning>, NodeError> {
        match self.required(name)? {
            Value::Conditioning(c) => Ok(c),
            other => Err(self.wrong(name, "CONDITIONING", other)),
        }
    }

    /// A `SAMPLER` input.
    pub fn sampler(&self, name: &str) -> Result<SamplerChoice, NodeError> {
        match self.required(name)? {
            Value::Sampler(s) => Ok(*s),
            other => Err(self.wrong(name, "SAMPLER", other)),
        }
    }

    /// A `SIGMAS` input.
    pub fn sigmas(&self, name: &str) -> Result<&Arc<[f32]>, NodeError> {
        match self.required(name)? {
            Value::Sigmas(s) => Ok(s),
            other => Err(self.wrong(name, "SIGMAS", other)),
        }
    }

    /// A `NOISE` input.
    pub fn noise(&self, name: &str) -> Result<Noise, NodeError> {
        match self.required(name)? {
            Value::Noise(n) => Ok(*n),
            other => Err(self.wrong(name, "NOISE", other)),
        }
    }

    /// A `GUIDER` input.
    pub fn guider(&self, name: &str) -> Result<&Arc<Guider>, NodeError> {
        match self.required(name)? {
            Value::Guider(g) => Ok(g),
            other => Err(self.wrong(name, "GUIDER", other)),
        }
    }
}

/// One output slot's value: a single value, or a list for `output_is_list` outputs.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// One value.
    One(Value),
    /// A list of values.
    List(Vec<Value>),
}

/// A file shown in the UI (`{filename, subfolder, type}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileRef {
    /// The file name.
    pub filename: String,
    /// The folder under the root, or empty.
    pub subfolder: String,
    /// The root: `input`, `output` or `temp`.
    pub kind: FileKind,
}

/// A node id (a string; order is string order, as ComfyUI's dict keys sort): a prompt's key for a node, and
/// the node a running `Context` belongs to).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub String);

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for NodeId {
    fn from(id: &str) -> NodeId {
        NodeId(id.to_owned())
    }
}

/// What a node shows in the UI (the `output` of `executed`, the history's outputs).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UiOutput {
    /// Saved or previewed images.
    pub images: Vec<FileRef>,
    /// Text.
    pub text: Vec<String>,
    /// Lists of files under names of the node's own (`ImageCompare`'s `a_images`, `b_images`, the audio
    /// nodes' `audio`), in order.
    pub named: Vec<(String, Vec<FileRef>)>,
    /// ComfyUI's `animated` list: `[true]` when `images` are animations or videos (`SaveVideo`,
    /// `SaveAnimatedWEBP`, ...).
    pub animated: Vec<bool>,
    /// Other values under names of the node's own (`CurveEditor`'s `histogram`), in order.
    pub data: Vec<(String, serde_json::Value)>,
}

impl UiOutput {
    /// Whether there is nothing to show.
    pub fn is_empty(&self) -> bool {
        self.images.is_empty()
            && self.text.is_empty()
            && self.named.is_empty()
            && self.animated.is_empty()
            && self.data.is_empty()
    }

    /// Appends another node call's UI output (list mapping calls a node several times).
    pub fn extend(&mut self, other: UiOutput) {
        self.images.extend(other.images);
        self.text.extend(other.text);
        self.animated.extend(other.animated);
        for (name, files) in other.named {
            match self.named.iter_mut().find(|(n, _)| *n == name) {
                Some((_, existing)) => existing.extend(files),
                None => self.named.push((name, files)),
            }
        }
        // ComfyUI concatenates each key's lists (`merge_result_data`).
        for (name, value) in other.data {
            match self.data.iter_mut().find(|(n, _)| *n == name) {
                Some((_, serde_json::Value::Array(existing))) => match value {
                    serde_json::Value::Array(items) => existing.extend(items),
                    other => existing.push(other),
                },
                Some((_, existing)) => *existing = value,
                None => self.data.push((name, value)),
            }
        }
    }
}

/// What a node returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeResult {
    /// One entry per declared output.
    pub outputs: Vec<Output>,
    /// What to show in the UI, if anything.
    pub ui: Option<UiOutput>,
}

impl NodeResult {
    /// A result of single values, one per output.
    pub fn values(values: impl IntoIterator<Item = Value>) -> NodeResult {
        NodeResult { outputs: values.into_iter().map(Output::One).collect(), ui: None }
    }

    /// A result that only shows something in the UI.
    pub fn ui(ui: UiOutput) -> NodeResult {
        NodeResult { outputs: Vec::new(), ui: Some(ui) }
    }
}

/// The node classes known to the engine, by class name, in the order they were registered (the order
/// `/object_info` lists them, as ComfyUI lists its `NODE_CLASS_MAPPINGS`).
#[derive(Clone, Default)]
pub struct Registry {
    nodes: IndexMap<String, Arc<dyn Node>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.nodes.keys()).finish()
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Registers a node class under its spec's name (replacing one of the same name, which keeps its place).
    pub fn register(&mut self, node: impl Node) {
        let name = node.spec().name.clone();
        self.nodes.insert(name, Arc::new(node));
    }

    /// A node class by name.
    pub fn get(&self, class: &str) -> Option<&Arc<dyn Node>> {
        self.nodes.get(class)
    }

    /// Every node class, in registration order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Arc<dyn Node>)> {
        self.nodes.iter().map(|(k, v)| (k.as_str(), v))
    }
}
