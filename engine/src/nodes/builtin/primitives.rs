//! Primitive value nodes (`PrimitiveInt`, `PrimitiveFloat`, `PrimitiveString`, `PrimitiveStringMultiline`,
//! `PrimitiveBoolean`) and `PreviewAny`, which shows any value as text and passes the text on.

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

/// The five primitive nodes, V3 classes of `comfy_extras.nodes_primitive`. They declare no defaults (the
/// frontend fills the widget) and the integer range ±(2⁶³ − 1), for floats too.
pub(super) fn primitives() -> Vec<Primitive> {
    const LIMIT: i64 = i64::MAX;
    let make = |name: &str, display: &str, input: InputDef, ty: &str, aliases: &[&str]| {
        let mut spec = NodeSpec::new(name, display, "utilities/primitive")
            .python_module("comfy_extras.nodes_primitive")
            .v3()
            .input(input)
            .output(OutputDef::new(ty));
        if !aliases.is_empty() {
            spec = spec.aliases(aliases);
        }
        Primitive(Arc::new(spec))
    };
    let text_aliases = ["text", "string", "text box", "prompt"];
    vec![
        make(
            "PrimitiveInt",
            "Int",
            InputDef::bare("value", "INT")
                .option("min", -LIMIT)
                .option("max", LIMIT)
                .option("control_after_generate", "fixed"),
            "INT",
            &[],
        ),
        make(
            "PrimitiveFloat",
            "Float",
            InputDef::bare("value", "FLOAT")
                .option("min", -LIMIT)
                .option("max", LIMIT)
                .option("step", 0.1),
            "FLOAT",
            &[],
        ),
        make(
            "PrimitiveString",
            "Text",
            InputDef::bare("value", "STRING").option("multiline", false),
            "STRING",
            &text_aliases,
        ),
        Primitive(Arc::new(
            NodeSpec::new("PrimitiveStringMultiline", "Text (Multiline)", "utilities/primitive")
                .python_module("comfy_extras.nodes_primitive")
                .v3()
                .input(InputDef::bare("value", "STRING").option("multiline", true))
                .output(OutputDef::new("STRING"))
                .aliases(&[
                    "text",
                    "string",
                    "text multiline",
                    "string multiline",
                    "text box",
                    "prompt",
                ])
                .essentials("Basics"),
        )),
        make("PrimitiveBoolean", "Boolean", InputDef::bare("value", "BOOLEAN"), "BOOLEAN", &[]),
    ]
}

/// `PreviewAny`: shows its input as text in the UI.
pub(super) struct PreviewAny(Arc<NodeSpec>);

impl PreviewAny {
    pub(super) fn new() -> PreviewAny {
        PreviewAny(Arc::new(
            NodeSpec::new("PreviewAny", "Preview as Text", "utilities")
                .description("Preview any input value as text.")
                .python_module("comfy_extras.nodes_preview_any")
                .input(InputDef::typed("source", "*").with_options())
                .output(OutputDef::new("STRING"))
                .output_node()
                .aliases(&["show output", "inspect", "debug", "print value", "show text"]),
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
        // Shown, and passed on as its STRING output.
        Ok(NodeResult {
            ui: Some(UiOutput { text: vec![text.clone()], ..UiOutput::default() }),
            ..NodeResult::values([Value::String(text)])
        })
    }
}
