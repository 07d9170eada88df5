//! The spec against the wire truth: every recorded exchange with the real ComfyUI server
//! (`tests/golden/comfyui`, see its README) must be described by the spec. For each HTTP case the
//! operation and the response status must exist, a response without content in the spec must have had an empty
//! body, and a JSON body must round-trip through the generated Rust type without losing or renaming anything.
//! Every websocket frame must round-trip as `WsMessage`. Kiln's deliberate differences are listed in
//! `DIFFERENCES`, each with the status Kiln answers instead.

use std::path::PathBuf;

use kiln_spec::types;
use kiln_tests::{Operation, load_spec, operations};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Where ComfyUI answers differently from Kiln on purpose: (case, the status Kiln answers, why).
const DIFFERENCES: &[(&str, u16, &str)] = &[
    (
        "post_prompt_invalid_json_body",
        400,
        "plain-text 500 upstream; Kiln answers PromptErrorResponse",
    ),
    (
        "post_prompt_prompt_is_list",
        400,
        "plain-text 500 upstream; Kiln answers PromptErrorResponse",
    ),
    ("post_upload_image_no_file", 400, "plain-text 500 upstream; Kiln answers ErrorResponse"),
    (
        "post_upload_image_empty_filename",
        400,
        "plain-text 500 upstream; Kiln answers ErrorResponse",
    ),
    (
        "post_upload_image_traversal",
        400,
        "same status; Kiln adds an ErrorResponse body naming the problem",
    ),
    ("post_upload_image_traversal_subfolder", 400, "same status; Kiln adds an ErrorResponse body"),
    ("get_unknown_route", 404, "not an operation: the static fallback answers 404"),
];

fn golden_dir() -> PathBuf {
    let dir = kiln_tests::golden_dir();
    assert!(dir.is_dir(), "the ComfyUI golden captures are missing at {}", dir.display());
    dir
}

fn golden_cases() -> Vec<(String, Value)> {
    let mut cases: Vec<_> = std::fs::read_dir(golden_dir())
        .expect("golden dir readable")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .map(|e| {
            let name = e.path().file_stem().expect("file name").to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).expect("golden file readable");
            (name, serde_json::from_str(&text).expect("golden file is JSON"))
        })
        .collect();
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(cases.len() >= 80, "expected the 85 golden cases, found {}", cases.len());
    cases
}

/// Replaces the captures' placeholders with values of the right JSON type.
fn denormalize(value: &Value) -> Value {
    fn placeholder(s: &str) -> Option<Value> {
        if let Some(n) = s.strip_prefix("<PROMPT_ID_").and_then(|r| r.strip_suffix('>')) {
            let n: u64 = n.parse().ok()?;
            return Some(Value::String(format!("00000000-0000-4000-8000-{n:012}")));
        }
        match s {
            "<TIMESTAMP>" | "<CREATE_TIME>" | "<EXECUTION_START_TIME>" | "<EXECUTION_END_TIME>" => {
                Some(Value::from(1_764_460_800_000_i64))
            }
            "<int>" => Some(Value::from(0)),
            "<bool>" => Some(Value::Bool(false)),
            "<NoneType>" => Some(Value::Null),
            "<str>" => Some(Value::from("s")),
            _ => None,
        }
    }
    match value {
        Value::String(s) => placeholder(s).unwrap_or_else(|| value.clone()),
        Value::Array(items) => Value::Array(items.iter().map(denormalize).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let key = match placeholder(k) {
                        Some(Value::String(id)) => id,
                        _ => k.clone(),
                    };
                    (key, denormalize(v))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// JSON equality where `28` equals `28.0` (the spec's `number` is a float in Rust).
fn same_json(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_json(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

fn round_trip<T: DeserializeOwned + Serialize>(value: &Value) -> Result<(), String> {
    let typed: T =
        serde_json::from_value(value.clone()).map_err(|e| format!("does not parse: {e}"))?;
    let back = serde_json::to_value(&typed).map_err(|e| format!("does not serialize: {e}"))?;
    if same_json(value, &back) {
        Ok(())
    } else {
        Err(format!("loses or changes data:\n  wire:  {value}\n  typed: {back}"))
    }
}

/// Round-trips a JSON body through the generated type of a component schema.
fn check_schema(schema: &str, value: &Value) -> Result<(), String> {
    match schema {
        "ObjectInfoResponse" => round_trip::<types::ObjectInfoResponse>(value),
        "QueueResponse" => round_trip::<types::QueueResponse>(value),
        "PromptInfo" => round_trip::<types::PromptInfo>(value),
        "HistoryResponse" => round_trip::<types::HistoryResponse>(value),
        "JobsListResponse" => round_trip::<types::JobsListResponse>(value),
        "JobDetail" => round_trip::<types::JobDetail>(value),
        "SimpleError" => round_trip::<types::SimpleError>(value),
        "FeatureFlags" => round_trip::<types::FeatureFlags>(value),
        "SystemStats" => round_trip::<types::SystemStats>(value),
        "StringList" => round_trip::<types::StringList>(value),
        "PromptRequest" => round_trip::<types::PromptRequest>(value),
        "QueueManageRequest" => round_trip::<types::QueueManageRequest>(value),
        "HistoryManageRequest" => round_trip::<types::HistoryManageRequest>(value),
        "InterruptRequest" => round_trip::<types::InterruptRequest>(value),
        "PromptResponse" => round_trip::<types::PromptResponse>(value),
        "PromptErrorResponse" => round_trip::<types::PromptErrorResponse>(value),
        "UploadImageResponse" => round_trip::<types::UploadImageResponse>(value),
        "WsMessage" => round_trip::<types::WsMessage>(value),
        other => Err(format!("no typed check for schema `{other}`: add it to check_schema")),
    }
}

/// The spec operation serving a request, trying the `/api` form of bare ComfyUI paths.
fn find_operation<'a>(ops: &'a [Operation], method: &str, path: &str) -> Option<&'a Operation> {
    let path = path.split('?').next().unwrap_or(path);
    let api_path = if path.starts_with("/api/") || path.starts_with("/internal/") || path == "/ws" {
        path.to_owned()
    } else {
        format!("/api{path}")
    };
    let segments: Vec<&str> = api_path.split('/').collect();
    ops.iter().find(|op| {
        let template: Vec<&str> = op.path.split('/').collect();
        op.method.eq_ignore_ascii_case(method)
            && template.len() == segments.len()
            && template.iter().zip(&segments).all(|(t, s)| t.starts_with('{') || t == s)
    })
}

fn response(op: &Operation, status: u16) -> Option<&serde_yaml::Value> {
    op.body.get("responses")?.get(status.to_string())
}

fn request_schema_name(op: &Operation) -> Option<String> {
    let body = op.body.get("requestBody")?;
    schema_name(body)
}

fn schema_name(response: &serde_yaml::Value) -> Option<String> {
    let reference =
        response.get("content")?.get("application/json")?.get("schema")?.get("$ref")?.as_str()?;
    reference.rsplit('/').next().map(str::to_owned)
}

#[test]
fn every_golden_http_exchange_is_described_by_the_spec() {
    let ops = operations(&load_spec());
    let mut failures = Vec::new();
    for (name, case) in golden_cases() {
        let Some(request) = case.get("request") else { continue };
        let method = request["method"].as_str().expect("method");
        let path = request["path"].as_str().expect("path");
        let status = case["response"]["status"].as_u64().expect("status") as u16;
        let body = &case["response"]["body"];
        let difference = DIFFERENCES.iter().find(|(case, _, _)| *case == name);
        let Some(op) = find_operation(&ops, method, path) else {
            if difference.is_none() {
                failures.push(format!("{name}: no operation for {method} {path}"));
            }
            continue;
        };
        if let (Some(json), Some(schema), None) =
            (request.get("json"), request_schema_name(op), difference)
            && let Err(e) = check_schema(&schema, &denormalize(json))
        {
            failures.push(format!("{name}: request body {schema} {e}"));
        }
        if let Some((_, kiln_status, _)) = difference {
            if response(op, *kiln_status).is_none() {
                failures.push(format!(
                    "{name}: the spec lacks Kiln's {kiln_status} for {}",
                    op.operation_id()
                ));
            }
            continue;
        }
        let Some(spec_response) = response(op, status) else {
            failures
                .push(format!("{name}: {} does not declare status {status}", op.operation_id()));
            continue;
        };
        let kind = body["kind"].as_str().unwrap_or_default();
        match (spec_response.get("content"), schema_name(spec_response)) {
            (None, _) if kind != "empty" => failures
                .push(format!("{name}: the spec says no body for {status}, ComfyUI sent {kind}")),
            (None, _) => {}
            (Some(_), Some(schema)) => match check_schema(&schema, &denormalize(&body["json"])) {
                Ok(()) => {}
                Err(e) => failures.push(format!("{name}: {schema} {e}")),
            },
            (Some(_), None) if kind == "json" => failures
                .push(format!("{name}: ComfyUI sent JSON but the spec declares no JSON schema")),
            (Some(_), None) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "{} golden cases disagree with the spec:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_golden_websocket_frame_is_a_ws_message() {
    let mut failures = Vec::new();
    let mut frames = 0;
    for (name, case) in golden_cases() {
        let Some(messages) = case.get("messages").and_then(Value::as_array) else { continue };
        for (index, message) in messages.iter().enumerate() {
            if message["frame"] != "text" {
                continue;
            }
            frames += 1;
            if let Err(e) = check_schema("WsMessage", &denormalize(&message["message"])) {
                failures.push(format!("{name} frame {index}: {e}"));
            }
        }
        if let Err(e) = check_schema("PromptRequest", &denormalize(&case["post_body"])) {
            failures.push(format!("{name} post_body: {e}"));
        }
        if let Err(e) = check_schema("PromptResponse", &denormalize(&case["post_response"]["body"]))
        {
            failures.push(format!("{name} post_response: {e}"));
        }
        if let Err(e) = check_schema("HistoryResponse", &denormalize(&case["history_after"])) {
            failures.push(format!("{name} history_after: {e}"));
        }
    }
    assert!(frames > 50, "expected the recorded websocket frames, found {frames}");
    assert!(
        failures.is_empty(),
        "{} websocket checks failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn open_objects_keep_keys_the_spec_does_not_name() {
    // Custom nodes put `video`, `audio`, `3d` in their UI output; clients put their own keys in extra_data.
    let output =
        serde_json::json!({"video": [{"filename": "a.mp4", "subfolder": "", "type": "output"}]});
    round_trip::<types::NodeOutput>(&output).expect("NodeOutput keeps `video`");
    let extra = serde_json::json!({"client_id": "c", "my_extension": {"x": 1}});
    round_trip::<types::ExtraData>(&extra).expect("ExtraData keeps unknown keys");
    let flags = serde_json::json!({"supports_preview_metadata": true, "supports_model_type_tags": false,
        "max_upload_size": 1, "extension": {"manager": {"supports_v4": false}, "other": {}},
        "node_replacements": true, "assets": false, "my_flag": "on"});
    round_trip::<types::FeatureFlags>(&flags).expect("FeatureFlags keeps unknown keys");
    let client =
        serde_json::json!({"supports_preview_metadata": true, "supports_manager_v4_ui": true});
    round_trip::<types::ClientFeatureFlags>(&client)
        .expect("ClientFeatureFlags keeps unknown keys");
}
