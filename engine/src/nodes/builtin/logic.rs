//! `ComfySwitchNode`: passes `on_true` or `on_false` through; both are lazy, so the branch not taken never runs.
//! `CustomCombo`: a combo whose options the frontend defines, answered as the chosen string and its index.
//! `CreateList`: its inputs, whatever their type, joined into one list that the nodes after it map over.

use std::sync::Arc;

use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, MATCHTYPE, Node, NodeError, NodeResult, NodeSpec,
    OutputDef,
};

/// `CustomCombo`: the frontend keeps the options (`option1`, `option2`, ... widgets) and sends the choice and
/// its `index`; as in ComfyUI the node accepts every input and skips the combo check (its declared options are
/// empty), and answers the choice and the index (0 when none is sent).
pub(super) fn custom_combo() -> super::pure::Pure {
    super::pure::Pure::new(
        NodeSpec::new("CustomCombo", "Custom Combo", "utilities")
            .python_module("comfy_extras.nodes_logic")
            .v3()
            .experimental()
            .input(InputDef::v3_combo("choice", &[]))
            .output(OutputDef::new("STRING").named("STRING"))
            .output(OutputDef::new("INT").named("INDEX"))
            .validates(&["choice"])
            .accepts_all_inputs(),
        |inputs| {
            let choice = inputs.string("choice")?.to_owned();
            let index = match inputs.get("index") {
                None => 0,
                Some(crate::value::Value::Int(i)) => *i,
                Some(crate::value::Value::Json(json)) => json.as_i64().ok_or_else(|| {
                    NodeError::of_kind(
                        ErrorKind::InvalidValue,
                        format!("CustomCombo's `index` is {json}, not an integer"),
                    )
                })?,
                Some(other) => {
                    return Err(NodeError::of_kind(
                        ErrorKind::WrongType,
                        format!("CustomCombo's `index` should be INT, got {}", other.type_name()),
                    ));
                }
            };
            Ok(vec![crate::value::Value::String(choice), crate::value::Value::Int(index)])
        },
    )
}

/// How many inputs `CreateList` grows into (`inputs.input0` … `inputs.input9`).
const LIST_INPUTS: usize = 10;

/// `CreateList`: every value of every input, in input order (an input that is itself a list gives all of its
/// values), as one list; whole lists in, a list out.
pub(super) struct CreateList(Arc<NodeSpec>);

impl CreateList {
    pub(super) fn new() -> CreateList {
        CreateList(Arc::new(
            NodeSpec::new("CreateList", "Create List", "utilities")
                .python_module("comfy_extras.nodes_toolkit")
                .v3()
                .input_list()
                .autogrow_prefix(
                    "inputs",
                    InputDef::bare("input", MATCHTYPE).template("type", "*"),
                    "input",
                    (1, LIST_INPUTS),
                )
                .output(OutputDef::matchtype("list", "type").list())
                .aliases(&["Image Iterator", "Text Iterator", "Iterator"]),
        ))
    }
}

impl Node for CreateList {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let values: Vec<crate::value::Value> = (0..LIST_INPUTS)
            .flat_map(|i| inputs.list(&format!("inputs.input{i}")).iter().cloned())
            .collect();
        Ok(NodeResult { outputs: vec![crate::nodes::Output::List(values)], ui: None })
    }
}

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
