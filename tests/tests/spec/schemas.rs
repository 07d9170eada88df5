//! Each component schema's shape (kind, property names in order, required list) as one snapshot, so any change
//! to the wire surface is a reviewed diff.

use kiln_tests::load_spec;
use serde_yaml::Value;

fn names(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::Mapping(map)) => {
            map.keys().filter_map(|k| k.as_str().map(str::to_owned)).collect()
        }
        Some(Value::Sequence(items)) => {
            items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()
        }
        _ => Vec::new(),
    }
}

fn kind(schema: &Value) -> String {
    if let Some(ty) = schema.get("type").and_then(Value::as_str) {
        let nullable = schema.get("nullable").and_then(Value::as_bool) == Some(true);
        return if nullable { format!("{ty}?") } else { ty.to_owned() };
    }
    for combinator in ["oneOf", "anyOf", "allOf"] {
        if let Some(Value::Sequence(variants)) = schema.get(combinator) {
            return format!("{combinator}({})", variants.len());
        }
    }
    "any".to_owned()
}

#[test]
fn component_schema_shapes() {
    let spec = load_spec();
    let schemas = spec
        .get("components")
        .and_then(|c| c.get("schemas"))
        .and_then(Value::as_mapping)
        .expect("the spec has component schemas");
    let mut lines = Vec::new();
    for (name, schema) in schemas {
        let name = name.as_str().unwrap_or_default();
        let mut line = format!("{name}: {}", kind(schema));
        let properties = names(schema.get("properties"));
        if !properties.is_empty() {
            line += &format!(" properties=[{}]", properties.join(", "));
        }
        let required = names(schema.get("required"));
        if !required.is_empty() {
            line += &format!(" required=[{}]", required.join(", "));
        }
        if let Some(Value::Sequence(values)) = schema.get("enum") {
            let values: Vec<_> = values.iter().filter_map(Value::as_str).collect();
            line += &format!(" enum=[{}]", values.join(", "));
        }
        lines.push(line);
    }
    lines.sort();
    insta::assert_snapshot!("component_schema_shapes", lines.join("\n"));
}
