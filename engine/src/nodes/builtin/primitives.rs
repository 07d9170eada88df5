//! Primitive value nodes (`PrimitiveInt`, `PrimitiveFloat`, `PrimitiveString`, `PrimitiveStringMultiline`,
//! `PrimitiveBoolean`, `PrimitiveBoundingBox`), the frontend's `Seed` and `Color Picker` (`SeedNode`,
//! `ColorToRGBInt`), and `PreviewAny`, which shows any value as text and passes the text on.

use std::sync::Arc;

use super::pure::Pure;
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

/// `PrimitiveBoundingBox` (`comfy_extras.nodes_images`): a `BOUNDING_BOX`, ComfyUI's `{x, y, width, height}`.
pub(super) fn bounding_box() -> Pure {
    let side = |name: &str, default: i64, min: i64| InputDef::int(name, default, min, 16384);
    let spec = NodeSpec::new("PrimitiveBoundingBox", "Bounding Box", "utilities/primitive")
        .python_module("comfy_extras.nodes_images")
        .v3()
        .input(side("x", 0, 0))
        .input(side("y", 0, 0))
        .input(side("width", 512, 1))
        .input(side("height", 512, 1))
        .output(OutputDef::new("BOUNDING_BOX"));
    Pure::new(spec, |inputs| {
        let [x, y, width, height] = ["x", "y", "width", "height"].map(|k| inputs.int(k));
        let (x, y, width, height) = (x?, y?, width?, height?);
        let box_ = serde_json::json!({"x": x, "y": y, "width": width, "height": height});
        Ok(vec![Value::Json(Arc::new(box_))])
    })
}

/// `SeedNode` (`comfy_extras.nodes_seed`, shown as `Seed`): its seed widget's value as an `INT`.
pub(super) fn seed() -> Pure {
    let spec = NodeSpec::new("SeedNode", "Seed", "utilities")
        .python_module("comfy_extras.nodes_seed")
        .v3()
        .input(
            InputDef::bare("seed", "INT")
                .option("min", 0)
                .option("max", i64::MAX)
                .option("control_after_generate", "fixed"),
        )
        .output(OutputDef::new("INT").named("seed"))
        .aliases(&["seed", "random"]);
    Pure::new(spec, |inputs| Ok(vec![Value::Int(inputs.int("seed")?)]))
}

/// `ColorToRGBInt` (`comfy_extras.nodes_color`, shown as `Color Picker`): a `#RRGGBB` or `#RRGGBBAA` colour
/// as the integer `0xRRGGBB`, the `#RRGGBB` text and the alpha in 0..=1 (1 without one).
pub(super) fn colour_picker() -> Pure {
    let spec = NodeSpec::new("ColorToRGBInt", "Color Picker", "utilities")
        .python_module("comfy_extras.nodes_color")
        .v3()
        .description("Return a color RGB integer value and hexadecimal representation.")
        .input(
            InputDef::bare("color", "COLOR")
                .option("default", "#ffffff")
                .option("socketless", true),
        )
        .output(OutputDef::new("INT").named("rgb_int"))
        .output(OutputDef::new("COLOR").named("hex"))
        .output(OutputDef::new("FLOAT").named("alpha"));
    Pure::new(spec, |inputs| {
        let text = inputs.widget_text("color");
        let (rgb, alpha) = parse_colour(text).ok_or_else(|| {
            NodeError::of_kind(
                ErrorKind::InvalidValue,
                "Color must be in format #RRGGBB or #RRGGBBAA",
            )
        })?;
        Ok(vec![
            Value::Int(i64::from(rgb)),
            Value::String(text[..7].to_owned()),
            Value::Float(alpha),
        ])
    })
}

/// `#RRGGBB` or `#RRGGBBAA` (hex digits of either case) as `0xRRGGBB` and the alpha (`AA / 255`, 1 without).
fn parse_colour(text: &str) -> Option<(u32, f64)> {
    let hex = text.strip_prefix('#').filter(|h| matches!(h.len(), 6 | 8))?;
    if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let rgb = u32::from_str_radix(&hex[..6], 16).ok()?;
    let alpha = match hex.get(6..8) {
        Some(a) => f64::from(u8::from_str_radix(a, 16).ok()?) / 255.0,
        None => 1.0,
    };
    Some((rgb, alpha))
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

#[cfg(test)]
mod tests {
    use super::parse_colour;

    #[test]
    fn colours_parse_as_the_colour_picker_reads_them() {
        assert_eq!(parse_colour("#ff8000"), Some((0xff8000, 1.0)));
        assert_eq!(parse_colour("#FF800080"), Some((0xff8000, 128.0 / 255.0)));
        for bad in ["ff8000", "#ff80", "#ff800", "#gg8000", "#ff8000800", ""] {
            assert_eq!(parse_colour(bad), None, "{bad}");
        }
    }
}
