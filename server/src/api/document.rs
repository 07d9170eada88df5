//! The OpenAPI document a runtime serves at `GET /api/openapi.json`: the committed spec
//! (`kiln_spec::OPENAPI_YAML`) reduced, when the server starts, to what that runtime mounts.
//!
//! Invariant: there is no second source. The document is the spec with operations, security and unused
//! components taken away, never anything added, so a client generated from it, or a fuzzer driven by it, sees
//! exactly the routes the generated router mounts for the same runtime.
//!
//! What is taken away, and why:
//! - operations whose `x-runtime` does not name the runtime (the router does not mount them), then path items
//!   left empty;
//! - on the local runtime, every `security` requirement and the security schemes: it takes anonymous requests;
//! - component schemas and tags no remaining operation uses, so a client is not generated with types of routes
//!   it cannot call;
//! - `x-kiln-*` keys, which only steer Kiln's code generation. The other `x-*` keys stay: `x-runtime`,
//!   `x-websocket-messages` and `x-middleware-responses` describe the wire.

use std::collections::BTreeSet;

use kiln_spec::types;
use serde_json::{Map, Value};

use super::support::Runtime;

/// The prefix of the keys that steer code generation only.
const CODEGEN_ONLY: &str = "x-kiln-";

/// The HTTP methods a path item can hold.
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// Why the document could not be built from the committed spec.
#[derive(Debug, thiserror::Error)]
pub enum DocumentError {
    /// The committed spec is not YAML (the spec's own tests would have failed first).
    #[error("the committed spec is not valid YAML")]
    Yaml(#[source] serde_yaml::Error),
    /// The reduced document does not have the shape of `OpenApiDocument`.
    #[error("the reduced spec is not an OpenAPI document")]
    Shape(#[source] serde_json::Error),
}

/// The document `runtime` serves: see the module doc for what is taken away.
pub fn document(runtime: Runtime) -> Result<types::OpenApiDocument, DocumentError> {
    let spec: Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).map_err(DocumentError::Yaml)?;
    serde_json::from_value(reduce(spec, runtime)).map_err(DocumentError::Shape)
}

/// The spec reduced for `runtime`, as JSON.
fn reduce(mut spec: Value, runtime: Runtime) -> Value {
    if let Some(paths) = spec.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut().filter_map(Value::as_object_mut) {
            item.retain(|key, operation| {
                !METHODS.contains(&key.as_str()) || mounted(operation, runtime)
            });
        }
        paths.retain(|_, item| {
            item.as_object().is_some_and(|item| item.keys().any(|k| METHODS.contains(&k.as_str())))
        });
    }
    if runtime == Runtime::Local {
        drop_security(&mut spec);
    }
    drop_codegen_keys(&mut spec);
    prune_tags(&mut spec);
    prune_schemas(&mut spec);
    spec
}

/// Whether the runtime serves the operation: its `x-runtime` names it.
fn mounted(operation: &Value, runtime: Runtime) -> bool {
    operation["x-runtime"]
        .as_array()
        .is_some_and(|runtimes| runtimes.iter().any(|r| r.as_str() == Some(runtime.name())))
}

/// The operations of a reduced document.
fn operations(spec: &Value) -> impl Iterator<Item = &Map<String, Value>> {
    spec["paths"].as_object().into_iter().flat_map(|paths| {
        paths.values().filter_map(Value::as_object).flat_map(|item| {
            item.iter()
                .filter(|(key, _)| METHODS.contains(&key.as_str()))
                .filter_map(|(_, operation)| operation.as_object())
        })
    })
}

fn drop_security(spec: &mut Value) {
    let Some(root) = spec.as_object_mut() else { return };
    root.remove("security");
    if let Some(components) = root.get_mut("components").and_then(Value::as_object_mut) {
        components.remove("securitySchemes");
    }
    for item in root
        .get_mut("paths")
        .and_then(Value::as_object_mut)
        .into_iter()
        .flat_map(|p| p.values_mut())
    {
        for (key, operation) in item.as_object_mut().into_iter().flatten() {
            if METHODS.contains(&key.as_str())
                && let Some(operation) = operation.as_object_mut()
            {
                operation.remove("security");
            }
        }
    }
}

fn drop_codegen_keys(value: &mut Value) {
    match value {
        Value::Object(object) => {
            object.retain(|key, _| !key.starts_with(CODEGEN_ONLY));
            object.values_mut().for_each(drop_codegen_keys);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_codegen_keys),
        _ => {}
    }
}

fn prune_tags(spec: &mut Value) {
    let used: BTreeSet<String> = operations(spec)
        .flat_map(|operation| operation.get("tags").and_then(Value::as_array).into_iter().flatten())
        .filter_map(|tag| tag.as_str().map(str::to_owned))
        .collect();
    if let Some(tags) = spec.get_mut("tags").and_then(Value::as_array_mut) {
        tags.retain(|tag| tag["name"].as_str().is_some_and(|name| used.contains(name)));
    }
}

/// Keeps the component schemas the rest of the document reaches through `$ref`, directly or through other
/// schemas.
fn prune_schemas(spec: &mut Value) {
    const PREFIX: &str = "#/components/schemas/";
    let Some(schemas) = spec.pointer("/components/schemas").and_then(Value::as_object).cloned()
    else {
        return;
    };
    let mut outside = spec.clone();
    if let Some(components) = outside.get_mut("components").and_then(Value::as_object_mut) {
        components.remove("schemas");
    }
    let mut pending: Vec<String> = Vec::new();
    references(&outside, &mut pending);
    let mut kept = BTreeSet::new();
    while let Some(reference) = pending.pop() {
        let Some(name) = reference.strip_prefix(PREFIX) else { continue };
        if kept.insert(name.to_owned())
            && let Some(schema) = schemas.get(name)
        {
            references(schema, &mut pending);
        }
    }
    if let Some(schemas) = spec.pointer_mut("/components/schemas").and_then(Value::as_object_mut) {
        schemas.retain(|name, _| kept.contains(name));
    }
}

/// Every `$ref` in `value`, at any depth.
fn references(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(reference)) = object.get("$ref") {
                out.push(reference.clone());
            }
            object.values().for_each(|v| references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{Runtime, reduce};

    #[test]
    fn a_runtime_keeps_its_operations_and_what_they_use() {
        let spec = json!({
            "openapi": "3.0.3",
            "security": [{"Key": []}],
            "tags": [{"name": "a"}, {"name": "b"}],
            "paths": {
                "/shared": {"get": {"tags": ["a"], "x-runtime": ["local", "cloud"], "security": [],
                    "responses": {"200": {"content": {"application/json":
                        {"schema": {"$ref": "#/components/schemas/Outer"}}}}}}},
                "/cloud": {"post": {"tags": ["b"], "x-runtime": ["cloud"],
                    "responses": {"200": {"content": {"application/json":
                        {"schema": {"$ref": "#/components/schemas/CloudOnly"}}}}}}},
            },
            "components": {
                "securitySchemes": {"Key": {"type": "apiKey"}},
                "schemas": {
                    "Outer": {"x-kiln-checked-by-handler": ["inner"],
                        "properties": {"inner": {"$ref": "#/components/schemas/Inner"}}},
                    "Inner": {"type": "string"},
                    "CloudOnly": {"type": "string"},
                },
            },
        });
        let local = reduce(spec.clone(), Runtime::Local);
        assert_eq!(local["paths"].as_object().map(|p| p.len()), Some(1), "{local}");
        assert!(local.get("security").is_none());
        assert!(local["paths"]["/shared"]["get"].get("security").is_none());
        assert!(local["components"].get("securitySchemes").is_none());
        assert_eq!(local["tags"], json!([{"name": "a"}]));
        assert_eq!(
            local["components"]["schemas"],
            json!({"Outer": {"properties": {"inner": {"$ref": "#/components/schemas/Inner"}}},
                   "Inner": {"type": "string"}})
        );

        let cloud = reduce(spec, Runtime::Cloud);
        assert_eq!(cloud["paths"].as_object().map(|p| p.len()), Some(2));
        assert_eq!(cloud["security"], json!([{"Key": []}]), "the cloud runtime keeps its security");
        assert_eq!(cloud["paths"]["/shared"]["get"]["security"], json!([]));
        assert!(cloud["components"]["securitySchemes"].is_object());
        assert!(cloud["components"]["schemas"]["CloudOnly"].is_object());
    }
}
