//! `wanBlockSwap` (`comfy_extras.nodes_nop`): ComfyUI stands this node in for a custom block-swapping node
//! that Wan workflows carry, and passes the model through. Kiln's memory manager streams the blocks itself,
//! so here too the node changes nothing, and such a workflow runs instead of failing on an unknown node.

use std::sync::Arc;

use super::pure::Pure;
use crate::nodes::{InputDef, NodeSpec, OutputDef};
use crate::value::Value;

/// `wanBlockSwap` (deprecated): the model, unchanged.
pub(super) fn wan_block_swap() -> Pure {
    let spec = NodeSpec::new("wanBlockSwap", "", "")
        .python_module("comfy_extras.nodes_nop")
        .v3()
        .deprecated()
        .description(
            "Intercept wanBlockSwap custom node that causes major instability and make it no-op.",
        )
        .input(InputDef::typed("model", "MODEL"))
        .output(OutputDef::new("MODEL"));
    Pure::new(spec, |inputs| Ok(vec![Value::Model(Arc::clone(inputs.model("model")?))]))
}
