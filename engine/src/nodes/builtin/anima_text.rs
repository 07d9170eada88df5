//! Anima's prompts for a run (ComfyUI's `Anima.extra_conds`, which runs the model's LLM adapter as conditions are
//! processed): each prompt's Qwen3 states become the adapter's output on its T5 tokens, the context the DiT
//! cross-attends to.

use kiln_compute::{Backend, DType};
use kiln_models::prompt_weights::Weighted;

use crate::compute::Compute;
use crate::models::device::{OnDevice, on_device, to_host};
use crate::models::{Conditioning, DiffusionModel};
use crate::nodes::error::node_error;
use crate::nodes::{ErrorKind, NodeError};
use crate::tensor::Tensor;

/// Replaces each prompt's states on `sides` with the adapter's context when `model` reads its prompts through one
/// (Anima); leaves them as they are otherwise. A prompt without T5 tokens is an error naming the encoder it needs.
pub(super) fn prepare(
    compute: &Compute,
    model: &DiffusionModel,
    sides: &mut [(&mut Conditioning, bool)],
) -> Result<(), NodeError> {
    if !model.net.adapts_text() {
        return Ok(());
    }
    for (side, _) in sides.iter_mut() {
        for entry in &mut side.entries {
            let tokens = entry.extras.t5_tokens.take().ok_or_else(|| {
                NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "{} reads its prompts through its LLM adapter, which takes the prompt's T5 tokens beside \
                         the text encoder's states: encode the prompt with Anima's Qwen3 0.6B text encoder \
                         (CLIPLoader, qwen_3_06b_base)",
                        model.net.family().name()
                    ),
                )
            })?;
            let job = Adapt { model, states: &entry.cond, tokens: &tokens };
            entry.cond = on_device(compute.device(), job).map_err(node_error)?;
        }
    }
    Ok(())
}

/// One prompt through the model's adapter, in the model's compute type; the context on the host, f32.
struct Adapt<'a> {
    model: &'a DiffusionModel,
    states: &'a Tensor,
    tokens: &'a [Weighted],
}

impl OnDevice for Adapt<'_> {
    type Output = Result<Tensor, kiln_models::Error>;
    fn run<B: Backend>(self, b: &B) -> Self::Output {
        let b = &b.with_compute_dtype(self.model.compute_dtype)?;
        let states = b.from_f32(self.states.shape(), self.states.data(), DType::F32)?;
        to_host(b, &self.model.net.adapt_text(b, &states, self.tokens)?)
    }
}
