//! What the generated router mounts per runtime, the bare aliases, and lenient JSON parsing.

use kiln_server::api::{OPERATIONS, Runtime};
use reqwest::Method;

use crate::fixture::{Fixture, serve, start};

async fn status(base: &str, method: &str, path: &str) -> u16 {
    let method = Method::from_bytes(method.as_bytes()).expect("method");
    reqwest::Client::new()
        .request(method, format!("{base}{path}"))
        .send()
        .await
        .expect("request sent")
        .status()
        .as_u16()
}

/// A concrete path for a spec path: `{param}` segments filled with a value every handler accepts.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|segment| match segment {
            "{path_index}" => "0",
            "{directory_type}" => "output",
            s if s.starts_with('{') => "x",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test]
async fn each_runtime_mounts_exactly_its_operations() {
    for runtime in [Runtime::Local, Runtime::Cloud] {
        let fixture = Fixture::new();
        let base = serve(runtime, fixture.clone()).await;
        for op in OPERATIONS {
            let got = status(&base, op.method, &concrete(op.path)).await;
            // A handler may reject input before the implementation runs (the websocket a plain GET, `free` an
            // empty body); an unmounted route answers 404, or 405 when another method shares its path.
            let reached = fixture.calls().contains(op.id) || (got != 404 && got != 405);
            assert_eq!(
                reached,
                runtime.is_in(op.runtimes),
                "{} {} in {runtime:?}: reached the implementation = {reached}, status {got}",
                op.method,
                op.path
            );
        }
    }
    // Spot checks a reader can see at a glance.
    let servers = start().await;
    assert_eq!(status(&servers.local, "POST", "/oauth/token").await, 404);
    assert_eq!(status(&servers.local, "GET", "/api/auth/session").await, 404);
    assert_eq!(status(&servers.cloud, "POST", "/api/free").await, 404);
    assert_eq!(status(&servers.cloud, "GET", "/internal/logs").await, 404);
}

#[tokio::test]
async fn local_routes_answer_at_the_bare_path_too() {
    let servers = start().await;
    for (api, bare) in [
        ("/api/queue", "/queue"),
        ("/api/object_info", "/object_info"),
        ("/api/system_stats", "/system_stats"),
    ] {
        assert_eq!(status(&servers.local, "GET", api).await, 200, "{api}");
        assert_eq!(status(&servers.local, "GET", bare).await, 200, "{bare}");
    }
    // Internal routes and cloud routes have no alias.
    assert_eq!(status(&servers.local, "GET", "/logs").await, 404);
    assert_eq!(status(&servers.cloud, "GET", "/auth/session").await, 404);
}

#[tokio::test]
async fn json_bodies_are_parsed_whatever_the_content_type() {
    let servers = start().await;
    let body = r#"{"prompt": {"1": {"class_type": "EmptyImage", "inputs": {}}}}"#;
    for content_type in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("text/plain"),
        Some("application/json"),
    ] {
        let mut request =
            reqwest::Client::new().post(format!("{}/prompt", servers.local)).body(body);
        if let Some(content_type) = content_type {
            request = request.header("content-type", content_type);
        }
        let response = request.send().await.expect("sent");
        assert_eq!(response.status().as_u16(), 200, "content type {content_type:?}");
    }
}

#[tokio::test]
async fn unparseable_input_gets_the_operations_declared_400() {
    let servers = start().await;
    let client = reqwest::Client::new();
    // POST /api/prompt: PromptErrorResponse.
    let response = client
        .post(format!("{}/api/prompt", servers.local))
        .body("{not json")
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 400);
    let body: serde_json::Value = response.json().await.expect("JSON error body");
    assert_eq!(body["error"]["type"], "invalid_prompt");
    assert_eq!(body["node_errors"], serde_json::json!({}));
    // A prompt that is a list (ComfyUI answers a plain-text 500): a clear 400.
    let response = client
        .post(format!("{}/api/prompt", servers.local))
        .body(r#"{"prompt": [1, 2]}"#)
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 400);
    // GET /api/jobs?limit=abc: SimpleError.
    let response =
        client.get(format!("{}/api/jobs?limit=abc", servers.local)).send().await.expect("sent");
    assert_eq!(response.status().as_u16(), 400);
    let body: serde_json::Value = response.json().await.expect("JSON error body");
    assert!(body["error"].as_str().is_some_and(|e| e.contains("limit")), "{body}");
    // POST /oauth/token with JSON instead of a form: OAuth JSON error, never a framework 415.
    let response = client
        .post(format!("{}/oauth/token", servers.cloud))
        .json(&serde_json::json!({"x": 1}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 400);
    let body: serde_json::Value = response.json().await.expect("JSON error body");
    assert_eq!(body["error"], "invalid_request");
    // A duplicated query key counts once, with its first value (as ComfyUI).
    let response = client
        .get(format!("{}/api/history?max_items=1&max_items=oops", servers.local))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status().as_u16(), 200);
}

#[tokio::test]
async fn a_second_server_on_the_same_fixture_is_independent() {
    let servers = start().await;
    let again = serve(Runtime::Local, servers.fixture.clone()).await;
    assert_ne!(again, servers.local);
    assert_eq!(status(&again, "GET", "/api/queue").await, 200);
}
