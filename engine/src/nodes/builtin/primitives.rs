//! Primitive value nodes (`PrimitiveInt`, `PrimitiveFloat`, `PrimitiveString`, `PrimitiveStringMultiline`,
//! `PrimitiveBoolean`) and `PreviewAny`, which shows any value as text.

use std::sync::Arc;

use crate::nodes::{
    Context, ErrorKind, InputDef, Inputs, Node, NodeError, NodeResult, NodeSpec, OutputDef,
    UiOutput,
};
use crate::value::Value;

/// A node that outputs its one `value` input.
pub(super) struct Primitive(Arc<NodeSpec>);

impl Node for Primitive {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let value = inputs
            .get("value")
            .cloned()
            .ok_or_else(|| NodeError::of_kind(ErrorKind::WrongType, "input `value` is missing"))?;
        Ok(NodeResult::values([value]))
    }
}

/// The five primitive nodes.
pub(super) fn primitives() -> Vec<Primitive> {
    let make = |name: &str, display: &str, input: InputDef, ty: &str| {
        Primitive(Arc::new(
            NodeSpec::new(name, display, "utils/primitive").input(input).output(OutputDef::new(ty)),
        ))
    };
    vec![
        make(
            "PrimitiveInt",
            "Int",
            InputDef::int("value", 0, i64::MIN, i64::MAX).option("control_after_generate", false),
            "INT",
        ),
        make(
            "PrimitiveFloat",
            "Float",
            InputDef::float("value", 0.0, -f64::MAX, f64::MAX),
            "FLOAT",
        ),
        make("PrimitiveString", "String", InputDef::string("value", ""), "STRING"),
        make(
            "PrimitiveStringMultiline",
            "String (Multiline)",
            InputDef::string("value", "").option("multiline", true),
            "STRING",
        ),
        make("PrimitiveBoolean", "Boolean", InputDef::boolean("value", false), "BOOLEAN"),
    ]
}

/// `PreviewAny`: shows its input as text in the UI.
pub(super) struct PreviewAny(Arc<NodeSpec>);

impl PreviewAny {
    pub(super) fn new() -> PreviewAny {
        PreviewAny(Arc::new(
            NodeSpec::new("PreviewAny", "Preview Any", "utils")
                .input(InputDef::typed("source", "*"))
                .output_node(),
        ))
    }
}

impl Node for PreviewAny {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }
    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let source = inputs
            .get("source")
            .ok_or_else(|| NodeError::of_kind(ErrorKind::WrongType, "input `source` is missing"))?;
        let text = match source {
            Value::String(s) => s.clone(),
            Value::Json(json) => {
                serde_json::to_string_pretty(json.as_ref()).unwrap_or_else(|_| json.to_string())
            }
            other => other.repr(),
        };
        Ok(NodeResult::ui(UiOutput { text: vec![text], ..UiOutput::default() }))
    }
}
