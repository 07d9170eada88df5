//! Conditioning nodes: `CLIPTextEncode` (a prompt through the text encoder), `ConditioningZeroOut` and
//! `ConditioningCombine`.

use std::sync::Arc;

use kiln_compute::{Backend, DType};

use super::model_specs;
use crate::compute::Compute;
use crate::models::device::{OnDevice, on_device};
use crate::models::{Cond, Conditioning, TextEncoder};
use crate::nodes::error::node_error;
use crate::nodes::{Context, Inputs, Node, NodeError, NodeResult, NodeSpec};
use crate::tensor::Tensor;
use crate::value::Value;

/// The text encoder's hidden state for token ids, as a host tensor `[1, N, D]`.
struct Encode<'a> {
    clip: &'a TextEncoder,
    ids: &'a [u32],
}

impl OnDevice for Encode<'_> {
    type Output = Result<Tensor, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        // As ComfyUI loads the encoder before it encodes: top residency priority.
        self.clip.net.weights().activate()?;
        let hidden = self.clip.net.encode(b, self.ids)?;
        let hidden = b.cast(&hidden, DType::F32)?;
        let shape = hidden.shape().to_vec();
        let values = b.to_f32(&hidden)?;
        Tensor::new(shape, values).map_err(|e| kiln_models::Error::Invalid(e.to_string()))
    }
}

/// `CLIPTextEncode`: encodes a prompt with ComfyUI's template for the family.
pub(super) struct ClipTextEncode {
    spec: Arc<NodeSpec>,
    compute: Arc<Compute>,
}

impl ClipTextEncode {
    pub(super) fn new(compute: Arc<Compute>) -> ClipTextEncode {
        ClipTextEncode { spec: Arc::new(model_specs::clip_text_encode()), compute }
    }
}

impl Node for ClipTextEncode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.spec.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let clip = inputs.clip("clip")?;
        let text = inputs.string("text")?;
        let ids = clip.net.tokenize(text).map_err(node_error)?;
        let cond =
            on_device(self.compute.device(), Encode { clip, ids: &ids }).map_err(node_error)?;
        let conditioning = Conditioning { entries: vec![Cond { cond, pooled: None }] };
        Ok(NodeResult::values([Value::Conditioning(Arc::new(conditioning))]))
    }
}

/// `ConditioningZeroOut`: the same conditioning with every tensor zeroed (same shapes, so the same token
/// count as the prompt it came from).
pub(super) struct ConditioningZeroOut(Arc<NodeSpec>);

impl ConditioningZeroOut {
    pub(super) fn new() -> ConditioningZeroOut {
        ConditioningZeroOut(Arc::new(model_specs::conditioning_zero_out()))
    }
}

impl Node for ConditioningZeroOut {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let zero = |t: &Tensor| Tensor::full(t.shape().to_vec(), 0.0);
        let entries = inputs
            .conditioning("conditioning")?
            .entries
            .iter()
            .map(|c| Cond { cond: zero(&c.cond), pooled: c.pooled.as_ref().map(zero) })
            .collect();
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}

/// `ConditioningCombine`: both lists in one (the sampler averages their predictions).
pub(super) struct ConditioningCombine(Arc<NodeSpec>);

impl ConditioningCombine {
    pub(super) fn new() -> ConditioningCombine {
        ConditioningCombine(Arc::new(model_specs::conditioning_combine()))
    }
}

impl Node for ConditioningCombine {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let mut entries = inputs.conditioning("conditioning_1")?.entries.clone();
        entries.extend(inputs.conditioning("conditioning_2")?.entries.iter().cloned());
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}
