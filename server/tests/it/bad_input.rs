//! Bad input on every route of the local runtime: malformed JSON, wrong types, unknown ids and path escapes get
//! a clear 4xx, and nothing is written outside the roots.

use kiln_server::api::OPERATIONS;
use serde_json::Value;

use kiln_tests::contract::Contract;

use crate::binary::{start, temp_dir};

/// The local operations whose body is JSON, read from the spec.
fn json_body_operations() -> Vec<(String, String, bool)> {
    let spec: serde_yaml::Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("spec");
    let mut out = Vec::new();
    for op in OPERATIONS.iter().filter(|op| op.runtimes.contains(&"local")) {
        let operation = &spec["paths"][op.path][op.method.to_lowercase().as_str()];
        // Raw operations (MCP's transport) answer malformed messages by their own protocol's rules.
        if operation["x-kiln-raw"].as_bool() == Some(true) {
            continue;
        }
        let body = &operation["requestBody"];
        if body["content"]["application/json"].is_mapping() {
            let required = body["required"].as_bool().unwrap_or(false);
            out.push((op.method.to_owned(), op.path.to_owned(), required));
        }
    }
    out
}

fn concrete(path: &str) -> String {
    path.replace("{id}", "Comfy.Locale")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_a_clear_400_on_every_json_route() {
    let data_dir = temp_dir("bad-json");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let operations = json_body_operations();
    assert!(operations.len() >= 10, "the spec's JSON-body operations: {operations:?}");
    for (method, path, required) in operations {
        let url = format!("http://{addr}{}", concrete(&path));
        let request = match method.as_str() {
            "PATCH" => http.patch(&url),
            _ => http.post(&url),
        };
        let response = request.body("{not json").send().await.expect("answers");
        let status = response.status().as_u16();
        let body = response.text().await.expect("body");
        // Optional bodies (`/interrupt`) too: ComfyUI takes a body it cannot decode for `{}` and stops whatever
        // runs, where the client may have meant one prompt; Kiln refuses it.
        assert_eq!(status, 400, "{method} {path}: {body}");
        let json: Value = serde_json::from_str(&body)
            .unwrap_or_else(|_| panic!("{method} {path}: a JSON error body, got {body}"));
        assert!(json.to_string().contains("not valid JSON"), "{method} {path}: {body}");
        if !required {
            // No body at all is the absent optional body.
            let url = format!("http://{addr}{}", concrete(&path));
            let empty = http.post(&url).send().await.expect("answers");
            assert_eq!(empty.status().as_u16(), 200, "{method} {path} without a body");
        }
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Requests with bad input and the status each must get: (method, path and query, body, status).
fn cases() -> Vec<(&'static str, String, Option<&'static str>, u16)> {
    vec![
        ("POST", "/api/prompt".to_owned(), Some(r#"{"prompt": [1, 2]}"#), 400),
        ("POST", "/api/prompt".to_owned(), Some(r#"{"prompt": {}, "number": "first"}"#), 400),
        ("POST", "/api/queue".to_owned(), Some(r#"{"delete": "all"}"#), 400),
        // A JSON array is never an object, and `null` never a map (serde would take both).
        ("POST", "/api/free".to_owned(), Some("[true, null]"), 400),
        ("POST", "/api/queue".to_owned(), Some("[true, []]"), 400),
        ("POST", "/api/settings".to_owned(), Some("null"), 400),
        (
            "POST",
            "/api/prompt".to_owned(),
            Some(
                r#"{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {}, "_meta": ["t"]}}}"#,
            ),
            400,
        ),
        // Kept as the client sent them, prompt and extra_data are still held to the spec's shapes.
        (
            "POST",
            "/api/prompt".to_owned(),
            Some(
                r#"{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}, "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}}}, "extra_data": {"preview_method": {}}}"#,
            ),
            400,
        ),
        ("POST", "/api/prompt".to_owned(), Some(r#"{"prompt": {"1": {"class_type": 5}}}"#), 400),
        // An interrupt aimed at something that is not a prompt id stops nothing.
        ("POST", "/api/interrupt".to_owned(), Some(r#"{"prompt_id": 5}"#), 400),
        ("POST", "/api/interrupt".to_owned(), Some(r#"{"prompt_id": null}"#), 200),
        ("POST", "/api/history".to_owned(), Some(r#"{"clear": "yes"}"#), 400),
        ("POST", "/api/jobs/cancel".to_owned(), Some(r#"{"job_ids": ["not-a-uuid"]}"#), 400),
        ("GET", "/api/jobs/not-a-uuid".to_owned(), None, 400),
        ("GET", "/api/jobs?limit=0".to_owned(), None, 400),
        ("GET", "/api/history?max_items=lots".to_owned(), None, 400),
        // Any integer is a `max_items` (ComfyUI: `{}` for 0 or less), the smallest included.
        ("GET", "/api/history?max_items=-9223372036854775808".to_owned(), None, 200),
        ("GET", "/api/view?filename=../../etc/passwd".to_owned(), None, 400),
        ("GET", "/api/view?filename=passwd&subfolder=../../..".to_owned(), None, 403),
        ("GET", "/api/view?filename=x.png&type=elsewhere".to_owned(), None, 400),
        ("GET", "/api/userdata/..%2F..%2Fsecret".to_owned(), None, 403),
        ("POST", "/api/userdata/..%2Fescape.txt".to_owned(), Some("data"), 403),
        // MCP's transport: a client that accepts neither JSON nor an event stream is refused first.
        ("POST", "/mcp".to_owned(), Some("{not json"), 406),
        ("DELETE", "/api/userdata/..%2F..%2Fkiln.sqlite".to_owned(), None, 403),
        ("POST", "/api/userdata/a.txt/move/..%2F..%2Fb.txt".to_owned(), None, 403),
        ("GET", "/api/userdata?dir=..%2F..".to_owned(), None, 403),
        ("GET", "/api/models/not_a_kind".to_owned(), None, 404),
        (
            "GET",
            "/api/view_metadata/checkpoints?filename=..%2F..%2Fkiln.sqlite".to_owned(),
            None,
            404,
        ),
        ("GET", "/internal/files/elsewhere".to_owned(), None, 400),
        ("GET", "/api/experiment/models/preview/loras/x/a.safetensors".to_owned(), None, 400),
        // An unknown folder kind or directory index names no model.
        ("GET", "/api/experiment/models/preview/no_kind/0/a.safetensors".to_owned(), None, 404),
        ("GET", "/api/experiment/models/preview/loras/7/a.safetensors".to_owned(), None, 404),
        ("PATCH", "/internal/logs/subscribe".to_owned(), Some(r#"{"clientId": 5}"#), 400),
        ("GET", "/api/history/no-such-id".to_owned(), None, 200), // ComfyUI: {}
        ("POST", "/api/jobs/not-a-uuid/cancel".to_owned(), None, 400),
        ("POST", "/api/jobs/00000000-0000-4000-8000-000000000000/cancel".to_owned(), None, 200),
        ("GET", "/api/object_info/NoSuchNode".to_owned(), None, 200), // ComfyUI: {}
        ("GET", "/api/experiment/models/no_such_folder".to_owned(), None, 404),
        ("GET", "/api/v2/userdata?path=..%2F..".to_owned(), None, 403),
        ("GET", "/api/v2/userdata?path=nope".to_owned(), None, 404),
        ("GET", "/api/settings/No.Such.Setting".to_owned(), None, 200), // ComfyUI: null
        ("GET", "/api/workflow_templates/..%2F../x.json".to_owned(), None, 404),
        ("GET", "/api/global_subgraphs/..%2F..%2Fkiln.sqlite".to_owned(), None, 200), // null: not a blueprint
        ("GET", "/ws?clientId=abc".to_owned(), None, 400), // plain HTTP, not a websocket handshake
    ]
}

/// An upload with bad input: the route, its form fields, the file part's name (if one is sent), the status.
type UploadCase = (&'static str, Vec<(&'static str, &'static str)>, Option<&'static str>, u16);

/// Uploads with bad input.
fn upload_cases() -> Vec<UploadCase> {
    vec![
        ("/api/upload/image", vec![("overwrite", "true")], None, 400),
        ("/api/upload/image", vec![], Some("../../evil.png"), 400),
        ("/api/upload/image", vec![("subfolder", "../..")], Some("ok.png"), 400),
        // `/` is absolute (ComfyUI: 400), and "" names no root.
        ("/api/upload/image", vec![("subfolder", "/")], Some("ok.png"), 400),
        ("/api/upload/image", vec![("type", "")], Some("ok.png"), 400),
        ("/api/upload/mask", vec![("original_ref", r#"["x.png"]"#)], Some("mask.png"), 400),
        (
            "/api/upload/mask",
            vec![("original_ref", r#"{"filename": "x.png", "type": "elsewhere"}"#)],
            Some("mask.png"),
            400,
        ),
        (
            "/api/upload/mask",
            vec![("original_ref", r#"{"filename": "none.png"}"#)],
            Some("m.png"),
            404,
        ),
        (
            "/api/upload/mask",
            vec![("original_ref", r#"{"filename": "x.png", "subfolder": "../.."}"#)],
            Some("mask.png"),
            403,
        ),
        ("/api/upload/mask", vec![("original_ref", "notjson")], Some("mask.png"), 400),
        (
            "/api/upload/mask",
            vec![("original_ref", r#"{"filename": "../../x.png", "type": "input"}"#)],
            Some("mask.png"),
            400,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_unknown_ids_and_escapes_are_refused() {
    let data_dir = temp_dir("bad-input");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let status = |response: reqwest::Response| response.status().as_u16();
    let base = format!("http://{addr}");
    let cases = cases();
    for (method, path, body, expected) in cases {
        let url = format!("{base}{path}");
        let mut request = match method {
            "POST" => http.post(&url),
            "DELETE" => http.delete(&url),
            "PATCH" => http.patch(&url),
            _ => http.get(&url),
        };
        if let Some(body) = body {
            request = request.body(body.to_owned());
        }
        let got = status(request.send().await.expect("answers"));
        assert_eq!(got, expected, "{method} {path}");
    }
    let png =
        std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/browser/kiln-input.png"))
            .expect("the test image");
    for (route, fields, file_name, expected) in upload_cases() {
        let mut form = reqwest::multipart::Form::new();
        for (name, value) in &fields {
            form = form.text(*name, *value);
        }
        if let Some(name) = file_name {
            form = form.part("image", reqwest::multipart::Part::bytes(png.clone()).file_name(name));
        }
        let got = status(
            http.post(format!("{base}{route}")).multipart(form).send().await.expect("answers"),
        );
        assert_eq!(got, expected, "POST {route} {fields:?} {file_name:?}");
    }
    for escaped in ["escape.txt", "evil.png", "x.png"] {
        assert!(
            !data_dir.parent().expect("parent").join(escaped).exists(),
            "nothing written outside the roots ({escaped})"
        );
    }
    assert!(!data_dir.join("evil.png").exists() && !data_dir.join("ok.png").exists());
    assert!(data_dir.join("kiln.sqlite").exists(), "the database was not deleted");

    // An oversized body is refused (the default limit is 100 MB; send just over it).
    let big = vec![b'x'; 100 * 1024 * 1024 + 1];
    let got = status(
        http.post(format!("{base}/api/userdata/big.bin")).body(big).send().await.expect("answers"),
    );
    assert_eq!(got, 413);
    let _ = std::fs::remove_dir_all(&data_dir);
}

/// Every local operation that takes input (parameters or a body) has at least one bad-input case above.
#[test]
fn bad_input_reaches_every_local_operation_that_takes_input() {
    let contract = Contract::from_spec();
    let spec: serde_yaml::Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("spec");
    let mut covered = std::collections::BTreeSet::new();
    let routes = cases().into_iter().map(|(method, path, _, _)| (method.to_owned(), path));
    let uploads =
        upload_cases().into_iter().map(|(route, ..)| ("POST".to_owned(), route.to_owned()));
    let json =
        json_body_operations().into_iter().map(|(method, path, _)| (method, concrete(&path)));
    for (method, path) in routes.chain(uploads).chain(json) {
        let path = path.split('?').next().unwrap_or_default().to_owned();
        let route = contract
            .route_of(&method, &path)
            .unwrap_or_else(|| panic!("{method} {path} is no route"));
        covered.insert((method, route.to_owned()));
    }
    let mut missing = Vec::new();
    for op in OPERATIONS.iter().filter(|op| op.runtimes.contains(&"local")) {
        let operation = &spec["paths"][op.path][op.method.to_lowercase().as_str()];
        let takes_input = operation["parameters"].as_sequence().is_some_and(|p| !p.is_empty())
            || operation["requestBody"].is_mapping();
        if takes_input && !covered.contains(&(op.method.to_owned(), op.path.to_owned())) {
            missing.push(format!("{} {}", op.method, op.path));
        }
    }
    assert!(missing.is_empty(), "operations with input but no bad-input case: {missing:#?}");
}
