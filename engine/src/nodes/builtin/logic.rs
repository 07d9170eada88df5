//! `ComfySwitchNode`: passes `on_true` or `on_false` through; both are lazy, so the branch not taken never runs.
//! `CustomCombo`: a combo whose options the frontend defines, answered as the chosen string and its index.
//! `CreateList`: its inputs, whatever their type, joined into one list that the nodes after it map over.

use std::sync::Arc;

use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, MATCHTYPE, Node, NodeError, NodeResult, NodeSpec,
    OutputDef,
};
use crate::value::Value;

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

/// Python's `bool(value)` for a value on a link: numbers other than zero, non-empty text, lists and JSON
/// containers are true, `None` false; a tensor of one element is its value's truth, and one of more (or no)
/// elements has none (torch raises "ambiguous"); the model, latent and other objects are true.
fn truthy(value: &Value) -> Result<bool, NodeError> {
    let tensor = |values: &[f32]| match values {
        [v] => Ok(*v != 0.0),
        _ => Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!(
                "Boolean value of Tensor with {} values is ambiguous",
                if values.is_empty() { "no".to_owned() } else { "more than one".to_owned() }
            ),
        )),
    };
    Ok(match value {
        Value::Int(i) => *i != 0,
        Value::Float(f) => *f != 0.0,
        Value::Bool(b) => *b,
        Value::String(s) => !s.is_empty(),
        Value::Json(json) => match json.as_ref() {
            serde_json::Value::Null => false,
            serde_json::Value::Bool(b) => *b,
            serde_json::Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
            serde_json::Value::String(s) => !s.is_empty(),
            serde_json::Value::Array(a) => !a.is_empty(),
            serde_json::Value::Object(o) => !o.is_empty(),
        },
        Value::Image(t) | Value::Mask(t) | Value::WanCameraEmbedding(t) => tensor(t.data())?,
        Value::Sigmas(s) => tensor(s)?,
        Value::Conditioning(c) => !c.entries.is_empty(),
        _ => true,
    })
}

/// The truth of each grown `values.value<i>` input given, in order.
fn grown(inputs: &Inputs) -> Result<Vec<bool>, NodeError> {
    (0..LIST_INPUTS).filter_map(|i| inputs.get(&format!("values.value{i}"))).map(truthy).collect()
}

/// `ComfyNotNode`, `ComfyAndNode` and `ComfyOrNode` (`comfy_extras.nodes_logic`): Python's `not`, `all` and
/// `any` over values of any type.
pub(super) fn boolean_nodes() -> Vec<super::pure::Pure> {
    let spec = |name: &str, display: &str, description: &str| {
        NodeSpec::new(name, display, "utilities/logic")
            .python_module("comfy_extras.nodes_logic")
            .v3()
            .description(description)
    };
    let values = |spec: NodeSpec| {
        spec.autogrow_prefix("values", InputDef::typed("value", "*"), "value", (1, LIST_INPUTS))
            .output(OutputDef::new("BOOLEAN"))
    };
    vec![
        super::pure::Pure::new(
            spec(
                "ComfyNotNode",
                "Not",
                "Logical NOT operation. Returns true if the value is falsy. Uses Python's rules for truthiness.",
            )
            .input(InputDef::typed("value", "*"))
            .output(OutputDef::new("BOOLEAN"))
            .aliases(&["invert", "toggle", "negate", "flip boolean"]),
            |inputs| {
                let value = inputs.get("value").ok_or_else(|| NodeError::new("input `value` is missing"))?;
                Ok(vec![Value::Bool(!truthy(value)?)])
            },
        ),
        super::pure::Pure::new(
            values(spec(
                "ComfyAndNode",
                "And",
                "Logical AND operation. Returns true if all of the values are truthy. Uses Python's rules for \
                 truthiness.",
            ))
            .aliases(&["all", "every"]),
            |inputs| Ok(vec![Value::Bool(grown(inputs)?.into_iter().all(|b| b))]),
        ),
        super::pure::Pure::new(
            values(spec(
                "ComfyOrNode",
                "Or",
                "Logical OR operation. Returns true if any of the values are truthy. Uses Python's rules for \
                 truthiness.",
            ))
            .aliases(&["any", "some"]),
            |inputs| Ok(vec![Value::Bool(grown(inputs)?.into_iter().any(|b| b))]),
        ),
    ]
}

#[cfg(test)]
mod truth_tests {
    use super::*;

    fn run(name: &str, inputs: Vec<(&str, Value)>) -> Result<bool, NodeError> {
        let node = boolean_nodes().into_iter().find(|n| n.spec().name == name).expect("the node");
        match crate::fixtures::node_outputs(&node, inputs)?.remove(0) {
            Value::Bool(b) => Ok(b),
            other => panic!("a boolean, not {other:?}"),
        }
    }

    #[test]
    fn not_and_or_follow_pythons_truthiness() {
        let json = |v: serde_json::Value| Value::Json(Arc::new(v));
        let one = |v: f32| Value::Image(crate::tensor::Tensor::full(vec![1, 1, 1, 1], v));
        // Python: not 0, not "", not [], not None, not tensor([0.]) are True; the rest False.
        for (value, falsy) in [
            (Value::Int(0), true),
            (Value::Int(-3), false),
            (Value::Float(0.0), true),
            (Value::Float(f64::NAN), false),
            (Value::String(String::new()), true),
            (Value::String("0".into()), false),
            (json(serde_json::json!(null)), true),
            (json(serde_json::json!([])), true),
            (json(serde_json::json!({"a": 0})), false),
            (one(0.0), true),
            (one(0.5), false),
            (
                Value::Latent(crate::value::Latent::new(crate::tensor::Tensor::full(
                    vec![1, 4, 2, 2],
                    0.0,
                ))),
                false,
            ),
        ] {
            assert_eq!(
                run("ComfyNotNode", vec![("value", value.clone())]).unwrap(),
                falsy,
                "{value:?}"
            );
        }
        // A tensor of several values has no truth, as in torch.
        let image = Value::Image(crate::tensor::Tensor::full(vec![1, 2, 2, 3], 1.0));
        let err = run("ComfyNotNode", vec![("value", image)]).unwrap_err();
        assert!(err.message.contains("ambiguous"), "{}", err.message);
        // all() and any() over the grown inputs given.
        let grown = |values: Vec<Value>| -> Vec<(String, Value)> {
            values.into_iter().enumerate().map(|(i, v)| (format!("values.value{i}"), v)).collect()
        };
        let call = |name: &str, values: Vec<Value>| {
            let inputs = grown(values);
            run(name, inputs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect()).unwrap()
        };
        let mixed = vec![Value::Bool(true), Value::String(String::new()), Value::Int(2)];
        assert!(!call("ComfyAndNode", mixed.clone()));
        assert!(call("ComfyOrNode", mixed));
        assert!(call("ComfyAndNode", vec![Value::Bool(true), Value::Float(0.1)]));
        assert!(!call("ComfyOrNode", vec![Value::Int(0), Value::String(String::new())]));
    }
}
