//! `ComfySwitchNode`: passes `on_true` or `on_false` through; both are lazy, so the branch not taken never runs.

use std::sync::Arc;

use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, MATCHTYPE, Node, NodeError, NodeResult, NodeSpec,
    OutputDef,
};

/// The lazy switch.
pub(super) struct ComfySwitchNode(Arc<NodeSpec>);

impl ComfySwitchNode {
    pub(super) fn new() -> ComfySwitchNode {
        ComfySwitchNode(Arc::new(
            NodeSpec::new("ComfySwitchNode", "If/Else Switch", "utilities/logic")
                .python_module("comfy_extras.nodes_logic")
                .v3()
                .experimental()
                .input(InputDef::bare("switch", "BOOLEAN"))
                .input(InputDef::bare("on_false", MATCHTYPE).lazy().template("switch", "*"))
                .input(InputDef::bare("on_true", MATCHTYPE).lazy().template("switch", "*"))
                .output(OutputDef::matchtype("output", "switch"))
                .aliases(&["if", "then", "switch", "conditional", "branch"]),
        ))
    }
}

impl Node for ComfySwitchNode {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn check_lazy(&self, inputs: &Inputs, _: &NodeSpec) -> Vec<String> {
        let branch = if inputs.bool("switch").unwrap_or(false) { "on_true" } else { "on_false" };
        if inputs.has(branch) { Vec::new() } else { vec![branch.to_owned()] }
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let branch = if inputs.bool("switch")? { "on_true" } else { "on_false" };
        let value = inputs.get(branch).cloned().ok_or_else(|| {
            NodeError::of_kind(ErrorKind::WrongType, format!("input `{branch}` is missing"))
        })?;
        Ok(NodeResult::values([value]))
    }
}
