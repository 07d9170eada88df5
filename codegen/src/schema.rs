//! Turns OpenAPI 3.0 schema objects into the JSON Schema that typify (schemars 0.8) reads.
//!
//! The two dialects differ in a few keywords only: 3.0 says `nullable: true` where JSON Schema says
//! `type: [T, "null"]`, and 3.0 has `discriminator`, `example` and `x-*` keys JSON Schema does not know.
//! References keep their `#/components/schemas/Name` form; typify resolves them by their last segment.
//!
//! Invariant: the wire types stay plain where the handlers check the input themselves. The value constraints
//! of [`HANDLER_CHECKED`] (patterns, lengths, property counts) are left out, so a string stays a `String`
//! rather than a validating newtype, and the required properties a schema lists in
//! `x-kiln-checked-by-handler` stay optional: the handler answers a request that breaks them with ComfyUI's
//! own error (`no_prompt`, `invalid_prompt_id`, `Invalid job ids`), which a failed parse could not give.

use serde_json::{Map, Value};

/// The value constraints the handlers check, not the generated types.
const HANDLER_CHECKED: [&str; 5] =
    ["pattern", "minLength", "maxLength", "minProperties", "maxProperties"];

/// The required properties whose absence the handler answers itself (listed by the schema, see the module doc).
const CHECKED_BY_HANDLER: &str = "x-kiln-checked-by-handler";

/// Rewrites one OpenAPI 3.0 schema (and every schema nested in it) into JSON Schema.
pub(crate) fn to_json_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(object) => Value::Object(object_to_json_schema(object)),
        Value::Array(items) => Value::Array(items.iter().map(to_json_schema).collect()),
        other => other.clone(),
    }
}

fn object_to_json_schema(object: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in object {
        match key.as_str() {
            "nullable" | "discriminator" | "example" => {}
            key if key.starts_with("x-") || HANDLER_CHECKED.contains(&key) => {}
            "required" => {
                let checked = object.get(CHECKED_BY_HANDLER).and_then(Value::as_array);
                let required = match value {
                    Value::Array(names) => Value::Array(
                        names
                            .iter()
                            .filter(|name| !checked.is_some_and(|checked| checked.contains(name)))
                            .cloned()
                            .collect(),
                    ),
                    other => other.clone(),
                };
                out.insert(key.to_owned(), required);
            }
            // Maps of schemas: rewrite each value, keep the keys (they are property names).
            "properties" => {
                let properties = match value {
                    Value::Object(properties) => Value::Object(
                        properties.iter().map(|(k, v)| (k.clone(), to_json_schema(v))).collect(),
                    ),
                    other => other.clone(),
                };
                out.insert(key.to_owned(), properties);
            }
            _ => {
                out.insert(key.to_owned(), to_json_schema(value));
            }
        }
    }
    // An open object with declared properties keeps its other keys: typify drops them for
    // `additionalProperties: true`, but flattens them into a map for an (empty) schema.
    if object.contains_key("properties")
        && object.get("additionalProperties") == Some(&Value::Bool(true))
    {
        out.insert("additionalProperties".to_owned(), Value::Object(Map::new()));
    }
    if object.get("nullable") == Some(&Value::Bool(true))
        && let Some(Value::String(ty)) = out.get("type").cloned()
    {
        out.insert("type".to_owned(), Value::Array(vec![Value::String(ty), "null".into()]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::to_json_schema;
    use serde_json::json;

    #[test]
    fn nullable_typed_schema_becomes_a_type_union() {
        let got = to_json_schema(&json!({"type": "string", "nullable": true, "description": "d"}));
        assert_eq!(got, json!({"type": ["string", "null"], "description": "d"}));
    }

    #[test]
    fn nullable_untyped_schema_stays_any() {
        assert_eq!(to_json_schema(&json!({"nullable": true})), json!({}));
    }

    #[test]
    fn open_objects_with_properties_keep_their_other_keys() {
        let got = to_json_schema(
            &json!({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": true}),
        );
        assert_eq!(got["additionalProperties"], json!({}));
        let closed = to_json_schema(&json!({"type": "object", "additionalProperties": true}));
        assert_eq!(closed["additionalProperties"], json!(true), "a plain map stays a map");
    }

    #[test]
    fn constraints_the_handlers_check_leave_the_types_plain() {
        let got = to_json_schema(&json!({
            "type": "object",
            "required": ["prompt", "number"],
            "x-kiln-checked-by-handler": ["prompt"],
            "minProperties": 1,
            "properties": {
                "prompt_id": {"type": "string", "pattern": "^[0-9a-f]+$", "maxLength": 36},
                "name": {"type": "string", "minLength": 1},
                "targets": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            },
        }));
        assert_eq!(
            got,
            json!({
                "type": "object",
                "required": ["number"],
                "properties": {
                    "prompt_id": {"type": "string"},
                    "name": {"type": "string"},
                    "targets": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                },
            })
        );
    }

    #[test]
    fn openapi_only_keywords_are_dropped_at_every_depth() {
        let got = to_json_schema(&json!({
            "oneOf": [{"$ref": "#/components/schemas/A"}],
            "discriminator": {"propertyName": "type"},
            "properties": {"x-thing": {"type": "integer", "example": 3, "x-internal": true}},
        }));
        assert_eq!(
            got,
            json!({
                "oneOf": [{"$ref": "#/components/schemas/A"}],
                "properties": {"x-thing": {"type": "integer"}},
            })
        );
    }
}
