//! `LotusConditioning` (`comfy_extras.nodes_lotus`): Lotus depth's fixed prompt.
//!
//! Lotus conditions its UNet on its frozen text encoder's states for an empty prompt, which never change, so
//! ComfyUI ships them inline rather than the encoder: `[1, 2, 1024]`. `lotus_null_prompt.f32` holds those 2048
//! values as little-endian f32 (each exact in f16), as `comfy_extras/nodes_lotus.py` at 0f1fa67a lists them:
//! measured outputs of the Lotus release's encoder, data rather than code.

use std::sync::Arc;

use crate::models::{Cond, Conditioning};
use crate::nodes::{Context, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef};
use crate::tensor::Tensor;
use crate::value::Value;

/// The null prompt's states, `[1, TOKENS, WIDTH]` little-endian f32.
const NULL_PROMPT: &[u8] = include_bytes!("lotus_null_prompt.f32");
/// Tokens of the null prompt.
const TOKENS: usize = 2;
/// Width of Lotus's context (SD 2's OpenCLIP-H text states).
const WIDTH: usize = 1024;

/// `LotusConditioning`: the conditioning `[[states, {}]]` of Lotus's null prompt.
pub(super) struct LotusConditioning(Arc<NodeSpec>);

impl LotusConditioning {
    pub(super) fn new() -> LotusConditioning {
        let spec = NodeSpec::new("LotusConditioning", "", "model/conditioning/lotus")
            .v3()
            .python_module("comfy_extras.nodes_lotus")
            .output(OutputDef::new("CONDITIONING").named("conditioning"));
        LotusConditioning(Arc::new(spec))
    }
}

/// The null prompt's states as a tensor.
fn null_prompt() -> Tensor {
    let values =
        NULL_PROMPT.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Tensor::new(vec![1, TOKENS, WIDTH], values).expect("the null prompt holds 1·2·1024 values")
}

impl Node for LotusConditioning {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, _: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let entries = vec![Cond::new(null_prompt(), None)];
        Ok(NodeResult::values([Value::Conditioning(Arc::new(Conditioning { entries }))]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_prompt_is_comfyuis() {
        let t = null_prompt();
        assert_eq!(t.shape(), [1, TOKENS, WIDTH]);
        // `nodes_lotus.py`'s first value, its largest and its last.
        assert_eq!(t.data()[0], -0.313_476_56);
        assert_eq!(t.data().iter().copied().fold(f32::MIN, f32::max), 13.023_437_5);
        assert_eq!(t.data()[2047], 1.500_976_6);
    }
}
