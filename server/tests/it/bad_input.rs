//! Bad input on every route of the local runtime: malformed JSON, wrong types, unknown ids and path escapes get
//! a clear 4xx, and nothing is written outside the roots.

use kiln_server::api::OPERATIONS;
use serde_json::Value;

use crate::binary::{start, temp_dir};

/// The local operations whose body is JSON, read from the spec.
fn json_body_operations() -> Vec<(String, String, bool)> {
    let spec: serde_yaml::Value = serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("spec");
    let mut out = Vec::new();
    for op in OPERATIONS.iter().filter(|op| op.runtimes.contains(&"local")) {
        let body = &spec["paths"][op.path][op.method.to_lowercase().as_str()]["requestBody"];
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
        if required {
            assert_eq!(status, 400, "{method} {path}: {body}");
            let json: Value = serde_json::from_str(&body)
                .unwrap_or_else(|_| panic!("{method} {path}: a JSON error body, got {body}"));
            assert!(!json.to_string().is_empty());
        } else {
            // Optional bodies (`/interrupt`): a body that is not JSON counts as none, as ComfyUI.
            assert_eq!(status, 200, "{method} {path}: {body}");
        }
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_types_unknown_ids_and_escapes_are_refused() {
    let data_dir = temp_dir("bad-input");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let status = |response: reqwest::Response| response.status().as_u16();
    let base = format!("http://{addr}");
    let cases: Vec<(&str, String, Option<&str>, u16)> = vec![
        ("POST", "/api/prompt".to_owned(), Some(r#"{"prompt": [1, 2]}"#), 400),
        ("POST", "/api/prompt".to_owned(), Some(r#"{"prompt": {}, "number": "first"}"#), 400),
        ("POST", "/api/queue".to_owned(), Some(r#"{"delete": "all"}"#), 400),
        ("POST", "/api/history".to_owned(), Some(r#"{"clear": "yes"}"#), 400),
        ("POST", "/api/jobs/cancel".to_owned(), Some(r#"{"job_ids": ["not-a-uuid"]}"#), 400),
        ("GET", "/api/jobs/not-a-uuid".to_owned(), None, 400),
        ("GET", "/api/jobs?limit=0".to_owned(), None, 400),
        ("GET", "/api/history?max_items=lots".to_owned(), None, 400),
        ("GET", "/api/view?filename=../../etc/passwd".to_owned(), None, 400),
        ("GET", "/api/view?filename=passwd&subfolder=../../..".to_owned(), None, 403),
        ("GET", "/api/view?filename=x.png&type=elsewhere".to_owned(), None, 400),
        ("GET", "/api/userdata/..%2F..%2Fsecret".to_owned(), None, 403),
        ("POST", "/api/userdata/..%2Fescape.txt".to_owned(), Some("data"), 403),
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
        ("PATCH", "/internal/logs/subscribe".to_owned(), Some(r#"{"clientId": 5}"#), 400),
    ];
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
    assert!(
        !data_dir.parent().expect("parent").join("escape.txt").exists(),
        "nothing written outside the roots"
    );
    assert!(data_dir.join("kiln.sqlite").exists(), "the database was not deleted");

    // An oversized body is refused (the default limit is 100 MB; send just over it).
    let big = vec![b'x'; 100 * 1024 * 1024 + 1];
    let got = status(
        http.post(format!("{base}/api/userdata/big.bin")).body(big).send().await.expect("answers"),
    );
    assert_eq!(got, 413);
    let _ = std::fs::remove_dir_all(&data_dir);
}
