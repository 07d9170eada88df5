//! The response contract: every answer the integration tests receive is checked against `spec/openapi.yaml`.
//!
//! [`Contract::check`] finds the operation a request was routed to (by method and path template, with the
//! router's `/api` aliases), then checks that the status is declared, that the media type is one the operation
//! declares (no body where none is declared), and that a JSON body validates against the declared schema. The
//! answers of the server's request rules (`x-middleware-responses` in the spec) are accepted on every operation.
//! `HEAD` is answered as the `GET` operation without a body; a method a known path does not have must get 405.
//! Websocket text frames are checked against `WsMessage`. Violations are collected, not panicked on the spot, so
//! the server's answer still reaches the test; [`Contract::assert_clean`] fails the test with all of them.
//!
//! OpenAPI 3.0 schemas are JSON Schema draft 4 plus `nullable`; `json_schema` rewrites `nullable` into draft 4
//! so the `jsonschema` crate can validate against the spec's own components.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use jsonschema::{Draft, Validator};
use serde_json::{Value, json};

/// One answer as the client received it.
pub struct Answer<'a> {
    /// The request's method, upper case.
    pub method: &'a str,
    /// The request's path, without the query.
    pub path: &'a str,
    /// The status answered.
    pub status: u16,
    /// The `Content-Type` header, if any.
    pub content_type: Option<&'a str>,
    /// The whole body.
    pub body: &'a [u8],
}

/// One local operation: method (upper case), path template segments, the path as written.
struct Route {
    method: String,
    template: Vec<String>,
    path: String,
}

/// The spec's responses, and what the server was seen sending that they do not describe.
pub struct Contract {
    spec: Value,
    routes: Vec<Route>,
    components: Value,
    validators: Mutex<HashMap<String, Arc<Validator>>>,
    violations: Mutex<Vec<String>>,
    checked: AtomicUsize,
}

impl Contract {
    /// Reads the spec compiled into `kiln-spec`, for the local runtime's operations.
    pub fn from_spec() -> Contract {
        Contract::for_runtime("local")
    }

    /// Reads the spec compiled into `kiln-spec`, for the operations `runtime` (`local`, `cloud`) mounts.
    pub fn for_runtime(runtime: &str) -> Contract {
        let spec: Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("the spec parses");
        let components = json_schema(spec["components"].clone(), Objects::Closed);
        Contract {
            routes: routes(&spec, runtime),
            spec,
            components,
            validators: Mutex::default(),
            violations: Mutex::default(),
            checked: AtomicUsize::new(0),
        }
    }

    /// Checks one HTTP answer; a violation is recorded, naming the request and what is wrong.
    pub fn check(&self, answer: &Answer<'_>) {
        self.checked.fetch_add(1, Ordering::Relaxed);
        if let Err(problem) = self.conforms(answer) {
            let body = String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]);
            self.violations.lock().expect("violations").push(format!(
                "{} {} answered {}: {problem}\n    body: {body}",
                answer.method, answer.path, answer.status
            ));
        }
    }

    /// Checks one websocket text frame the server sent.
    pub fn check_ws_frame(&self, text: &str) {
        self.checked.fetch_add(1, Ordering::Relaxed);
        let problem = match serde_json::from_str::<Value>(text) {
            Ok(message) => {
                let schema = json!({"$ref": "#/components/schemas/WsMessage"});
                self.validate("WsMessage", &schema, &message).err()
            }
            Err(error) => Some(format!("not JSON: {error}")),
        };
        if let Some(problem) = problem {
            self.violations
                .lock()
                .expect("violations")
                .push(format!("websocket frame {text}: {problem}"));
        }
    }

    /// How many answers and frames were checked.
    pub fn checked(&self) -> usize {
        self.checked.load(Ordering::Relaxed)
    }

    /// Every violation seen so far, each naming the request and what is wrong.
    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().expect("violations").clone()
    }

    /// Fails with every violation seen so far.
    pub fn assert_clean(&self) {
        let violations = self.violations();
        assert!(
            violations.is_empty(),
            "the server sent {} answer(s) the spec does not describe:\n{}",
            violations.len(),
            violations.join("\n")
        );
    }

    /// Checks one answer on its own and fails at once if the spec does not describe it (for tests that drive
    /// the router in memory rather than through the proxy).
    pub fn assert_conforms(answer: &Answer<'_>) {
        Contract::assert_conforms_on("local", answer);
    }

    /// [`Contract::assert_conforms`] for an answer of a server of `runtime`.
    pub fn assert_conforms_on(runtime: &str, answer: &Answer<'_>) {
        let contract = Contract::for_runtime(runtime);
        contract.check(answer);
        contract.assert_clean();
    }

    /// The spec path of the local operation that answers `method path` (`/api` aliases included), if any.
    pub fn route_of(&self, method: &str, path: &str) -> Option<&str> {
        self.operation(method, path).map(|(template, _)| template)
    }

    fn conforms(&self, answer: &Answer<'_>) -> Result<(), String> {
        if answer.method == "OPTIONS" {
            return Ok(()); // a CORS preflight, answered by the CORS layer (`--enable-cors-header`), not an operation
        }
        // `HEAD` runs the `GET` operation and sends its status and headers without the body.
        let head = answer.method == "HEAD";
        let method = if head { "GET" } else { answer.method };
        let Some((template, operation)) = self.operation(method, answer.path) else {
            if self.routes.iter().any(|route| route_matches(route, answer.path)) {
                // A path of the spec asked with a method it does not have.
                return match answer.status {
                    405 => Ok(()),
                    status => {
                        Err(format!("a method the path does not have answered {status}, not 405"))
                    }
                };
            }
            // Routes outside the spec: the frontend's static files, and the 404/405 of unknown routes.
            let api_like =
                ["/api/", "/internal/", "/ws"].iter().any(|p| answer.path.starts_with(p));
            return match answer.status {
                404 | 405 => Ok(()),
                _ if api_like => {
                    Err("no operation of the spec has this method and path".to_owned())
                }
                _ => Ok(()),
            };
        };
        let status = answer.status.to_string();
        let middleware = self.spec["x-middleware-responses"].get(&status);
        let response = operation["responses"].get(&status).or(middleware).ok_or_else(|| {
            let declared: Vec<&String> =
                operation["responses"].as_object().map(|r| r.keys().collect()).unwrap_or_default();
            format!("status {status} is not declared for {template} (declared: {declared:?})")
        })?;
        let response = self.resolve(response);
        if head {
            return if answer.body.is_empty() {
                Ok(())
            } else {
                Err("a HEAD answer has a body".to_owned())
            };
        }
        let Some(content) = response["content"].as_object() else {
            return if answer.body.is_empty() {
                Ok(())
            } else {
                Err(format!("{template} declares no body for {status}"))
            };
        };
        let media = answer
            .content_type
            .map(|c| c.split(';').next().unwrap_or(c).trim().to_ascii_lowercase());
        let Some(media) = media else {
            return Err(format!(
                "no Content-Type; {template} declares {:?}",
                content.keys().collect::<Vec<_>>()
            ));
        };
        let Some((declared, entry)) =
            content.iter().find(|(declared, _)| media_matches(declared, &media))
        else {
            return Err(format!(
                "Content-Type {media} is not declared for {template} {status} (declared: {:?})",
                content.keys().collect::<Vec<_>>()
            ));
        };
        if declared != "application/json" {
            return Ok(());
        }
        let body: Value = serde_json::from_slice(answer.body)
            .map_err(|error| format!("the body is not JSON: {error}"))?;
        let key = format!("{} {template} {status}", answer.method);
        self.validate(&key, &entry["schema"], &body)
    }

    /// The operation for a request: the template with the most literal segments that matches the path, tried
    /// as written and with the `/api` prefix the router also mounts it without.
    fn operation(&self, method: &str, path: &str) -> Option<(&str, &Value)> {
        self.routes
            .iter()
            .filter(|route| route.method == method)
            .filter(|route| route_matches(route, path))
            .max_by_key(|route| route.template.iter().filter(|s| !s.starts_with('{')).count())
            .map(|route| {
                let operation =
                    &self.spec["paths"][route.path.as_str()][method.to_ascii_lowercase().as_str()];
                (route.path.as_str(), operation)
            })
    }

    fn resolve<'s>(&'s self, value: &'s Value) -> &'s Value {
        match value["$ref"].as_str().and_then(|r| r.strip_prefix('#')) {
            Some(pointer) => self.spec.pointer(pointer).unwrap_or(value),
            None => value,
        }
    }

    /// Validates `instance` against `schema` (one of the spec's, `$ref`s into its components), compiled once
    /// per `key`.
    fn validate(&self, key: &str, schema: &Value, instance: &Value) -> Result<(), String> {
        let validator = self.validator(key, schema)?;
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }

    fn validator(&self, key: &str, schema: &Value) -> Result<Arc<Validator>, String> {
        if let Some(found) = self.validators.lock().expect("validators").get(key) {
            return Ok(found.clone());
        }
        let root = json!({
            "allOf": [json_schema(schema.clone(), Objects::Closed)],
            "components": self.components
        });
        let validator = jsonschema::options()
            .with_draft(Draft::Draft4)
            .build(&root)
            .map_err(|error| format!("the schema of {key} does not compile: {error}"))?;
        let validator = Arc::new(validator);
        self.validators.lock().expect("validators").insert(key.to_owned(), validator.clone());
        Ok(validator)
    }
}

/// The operations the local runtime mounts (`x-runtime` contains `local`).
/// The routes of the operations `runtime` mounts.
fn routes(spec: &Value, runtime: &str) -> Vec<Route> {
    let mut routes = Vec::new();
    for (path, item) in spec["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            let mounted =
                operation["x-runtime"].as_array().is_some_and(|r| r.iter().any(|r| r == runtime));
            if !mounted {
                continue;
            }
            routes.push(Route {
                method: method.to_ascii_uppercase(),
                template: path.trim_start_matches('/').split('/').map(str::to_owned).collect(),
                path: path.clone(),
            });
        }
    }
    routes
}

/// Whether `path` is one of `route`'s, as written or through the router's `/api` aliases.
fn route_matches(route: &Route, path: &str) -> bool {
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let with_api: Vec<&str> = ["api"].into_iter().chain(segments.iter().copied()).collect();
    let without_api: Option<Vec<&str>> =
        (segments.first() == Some(&"api")).then(|| segments[1..].to_vec());
    [Some(segments.clone()), Some(with_api), without_api]
        .iter()
        .flatten()
        .any(|candidate| template_matches(&route.template, candidate))
}

fn template_matches(template: &[String], path: &[&str]) -> bool {
    template.len() == path.len()
        && template.iter().zip(path).all(|(t, p)| t == p || (t.starts_with('{') && !p.is_empty()))
}

fn media_matches(declared: &str, actual: &str) -> bool {
    match declared.strip_suffix("/*") {
        Some("*") => true,
        Some(family) => actual.split('/').next() == Some(family),
        None => declared == actual,
    }
}

/// The spec's verdict on request values (parameters, bodies, form fields): valid or not against the schema
/// the spec gives them, read as JSON Schema with objects open as the spec writes them (a client may send keys a
/// schema does not name).
pub struct RequestSchemas {
    components: Value,
}

impl RequestSchemas {
    /// Reads the spec compiled into `kiln-spec`.
    pub fn from_spec() -> RequestSchemas {
        let spec: Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("the spec parses");
        RequestSchemas { components: json_schema(spec["components"].clone(), Objects::Open) }
    }

    /// Whether `instance` is valid against `schema` (one of the spec's, `$ref`s into its components).
    pub fn validate(&self, schema: &Value, instance: &Value) -> Result<(), String> {
        let root = json!({
            "allOf": [json_schema(schema.clone(), Objects::Open)],
            "components": self.components
        });
        let validator = jsonschema::options()
            .with_draft(Draft::Draft4)
            .build(&root)
            .map_err(|error| format!("the schema does not compile: {error}"))?;
        let errors: Vec<String> = validator
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() { Ok(()) } else { Err(errors.join("; ")) }
    }
}

/// Whether an object schema with `properties` and no `additionalProperties` takes other keys.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Objects {
    /// As the spec says: other keys are allowed (what a client may send).
    Open,
    /// Only the named keys (what the server may send).
    Closed,
}

/// OpenAPI 3.0 schema → JSON Schema draft 4: `nullable: true` becomes a `null` type (or a `null` enum value, or
/// an `anyOf` with `{type: null}` where there is no `type`).
fn json_schema(value: Value, objects: Objects) -> Value {
    match value {
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|item| json_schema(item, objects)).collect())
        }
        Value::Object(object) => {
            let mut object: serde_json::Map<String, Value> =
                object.into_iter().map(|(key, value)| (key, json_schema(value, objects))).collect();
            if objects == Objects::Closed
                && object.get("properties").is_some_and(Value::is_object)
                && !object.contains_key("additionalProperties")
            {
                // Open for clients (they must ignore unknown keys), closed for the server: every key it sends
                // must be one the spec names. Objects meant to carry more say `additionalProperties`.
                object.insert("additionalProperties".to_owned(), Value::Bool(false));
            }
            if object.get("nullable") != Some(&Value::Bool(true)) {
                return Value::Object(object);
            }
            object.remove("nullable");
            // `nullable` beside `allOf: [$ref]` (the 3.0 way to make a reference nullable) admits `null` whatever
            // the referenced schema says, so it cannot become a `null` type next to that `allOf`.
            let composed =
                ["allOf", "anyOf", "oneOf", "$ref"].iter().any(|k| object.contains_key(*k));
            if let Some(Value::Array(values)) = object.get_mut("enum") {
                values.push(Value::Null);
            }
            match object.remove("type") {
                Some(Value::String(kind)) if !composed => {
                    object.insert("type".to_owned(), json!([kind, "null"]));
                    Value::Object(object)
                }
                kind => {
                    if let Some(kind) = kind {
                        object.insert("type".to_owned(), kind);
                    }
                    json!({"anyOf": [Value::Object(object), {"type": "null"}]})
                }
            }
        }
        other => other,
    }
}

#[cfg(test)]
#[test]
fn the_contract_refuses_what_the_spec_does_not_describe() {
    let contract = Contract::from_spec();
    let answer = |method, path, status, content_type, body: &'static str| Answer {
        method,
        path,
        status,
        content_type,
        body: body.as_bytes(),
    };
    let good = [
        answer(
            "GET",
            "/api/queue",
            200,
            Some("application/json"),
            r#"{"queue_running":[],"queue_pending":[]}"#,
        ),
        answer(
            "GET",
            "/queue",
            200,
            Some("application/json; charset=utf-8"),
            r#"{"queue_running":[],"queue_pending":[]}"#,
        ),
        answer("GET", "/api/history/abc", 200, Some("application/json"), "{}"),
        answer("GET", "/assets/index.js", 200, Some("text/javascript"), "let x;"),
        answer("GET", "/api/nothing-here", 404, None, ""),
        answer(
            "GET",
            "/api/queue",
            403,
            Some("application/json"),
            r#"{"code":"origin_not_allowed","message":"cross-origin"}"#,
        ),
        answer("HEAD", "/api/queue", 200, Some("application/json"), ""),
        answer("HEAD", "/queue", 200, Some("application/json"), ""),
        answer("PUT", "/api/queue", 405, None, ""),
        answer("DELETE", "/interrupt", 405, None, ""),
        answer("HEAD", "/api/interrupt", 405, None, ""),
        answer(
            "POST",
            "/api/prompt",
            413,
            Some("text/plain; charset=utf-8"),
            "length limit exceeded",
        ),
    ];
    for case in &good {
        contract.check(case);
    }
    contract.assert_clean();

    let bad = [
        answer("GET", "/api/queue", 200, Some("application/json"), r#"{"queue_running":[]}"#),
        answer(
            "GET",
            "/api/queue",
            200,
            Some("application/json"),
            r#"{"queue_running":[],"queue_pending":3}"#,
        ),
        answer(
            "GET",
            "/api/queue",
            200,
            Some("application/json"),
            r#"{"queue_running":[],"queue_pending":[],"x":1}"#,
        ),
        answer("GET", "/api/queue", 418, Some("application/json"), "{}"),
        answer("GET", "/api/queue", 200, Some("text/plain"), "hi"),
        answer("GET", "/api/system_stats", 200, Some("application/json"), "not json"),
        answer("POST", "/api/system_stats", 200, Some("application/json"), "{}"),
        answer("PUT", "/api/queue", 404, None, ""),
        answer("HEAD", "/api/queue", 200, Some("application/json"), "{}"),
        answer("HEAD", "/api/queue", 418, None, ""),
    ];
    for case in &bad {
        contract.check(case);
    }
    contract.check_ws_frame(
        r#"{"type":"status","data":{"status":{"exec_info":{"queue_remaining":"many"}}}}"#,
    );
    let violations = contract.violations().len();
    assert_eq!(violations, bad.len() + 1, "each bad answer is one violation");
}
