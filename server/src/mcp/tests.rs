//! `/mcp` end to end over a real runtime (store, queue, worker on the CPU): the handshake and tool list, each
//! tool, scopes, session ownership, the Origin check and workspace isolation.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt as _;
use serde_json::{Value, json};

use super::{McpConfig, McpEndpoint, McpPrincipal, SCOPE_READ};
use crate::config::{CacheMode, Config};
use crate::service::worker::Service;
use crate::workspace::{Caller, Role};

/// A started server (CPU, no cache) in a temporary data directory, and its runtime.
struct Harness {
    runtime: Arc<Service>,
    server: Option<crate::Server>,
    dir: tempfile::TempDir,
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            server.shutdown();
        }
    }
}

/// The local runtime, or the cloud runtime's workspaces when `cloud`.
async fn harness(cloud: bool) -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = Config::under(dir.path().to_path_buf(), Vec::new(), Vec::new());
    config.runtime = if cloud { crate::api::Runtime::Cloud } else { crate::api::Runtime::Local };
    config.cache = CacheMode::None;
    config.compute.force_cpu = true;
    let server = crate::Server::start(&config, crate::LogRing::new()).await.expect("starts");
    Harness { runtime: server.runtime().clone(), server: Some(server), dir }
}

fn config() -> McpConfig {
    McpConfig {
        allowed_hosts: Vec::new(),
        allowed_origins: vec!["http://127.0.0.1:8188".to_owned()],
        resource_metadata: None,
        require_principal: false,
    }
}

fn endpoint(harness: &Harness, config: McpConfig) -> McpEndpoint {
    McpEndpoint::new(Arc::downgrade(&harness.runtime), config)
}

/// Who sends a request: the gate's principal and caller (none on the local runtime), and its headers.
#[derive(Clone, Default)]
struct Client {
    principal: Option<McpPrincipal>,
    caller: Option<Caller>,
    session: Option<String>,
    origin: Option<String>,
}

impl Client {
    /// A cloud user acting in `workspace` with these scopes (`None`: every scope).
    fn cloud(harness: &Harness, user: &str, workspace: &str, scopes: Option<&[&str]>) -> Client {
        let caller =
            harness.runtime.workspaces.caller(workspace, user, Role::Member).expect("caller");
        let scopes = scopes.map(|s| s.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>());
        Client {
            principal: Some(McpPrincipal { user: user.to_owned(), scopes }),
            caller: Some(caller),
            ..Client::default()
        }
    }

    fn request(&self, method: &str, body: Option<&Value>) -> Request {
        let mut builder = Request::builder()
            .method(method)
            .uri("/mcp")
            .header(header::HOST, "127.0.0.1:8188")
            .header(header::ACCEPT, "application/json, text/event-stream");
        if body.is_some() {
            builder = builder.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(session) = &self.session {
            builder = builder
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-06-18");
        }
        if let Some(origin) = &self.origin {
            builder = builder.header(header::ORIGIN, origin);
        }
        let body = body.map_or_else(Body::empty, |b| Body::from(b.to_string()));
        let mut request = builder.body(body).expect("request");
        if let Some(principal) = &self.principal {
            request.extensions_mut().insert(principal.clone());
        }
        if let Some(caller) = &self.caller {
            request.extensions_mut().insert(caller.clone());
        }
        request
    }

    async fn send(&self, mcp: &McpEndpoint, method: &str, body: Option<&Value>) -> Response {
        mcp.serve(self.request(method, body)).await
    }

    /// Opens a session: `initialize`, then `notifications/initialized`.
    async fn initialize(&mut self, mcp: &McpEndpoint) {
        let init = json!({
            "jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "test", "version": "0"}}
        });
        let response = self.send(mcp, "POST", Some(&init)).await;
        assert_eq!(response.status(), StatusCode::OK);
        let session =
            response.headers().get("mcp-session-id").expect("a session id").to_str().expect("text");
        self.session = Some(session.to_owned());
        let answer = rpc_answer(response).await;
        assert_eq!(answer["result"]["serverInfo"]["name"], "kiln");
        let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let response = self.send(mcp, "POST", Some(&initialized)).await;
        assert_eq!(response.status(), StatusCode::ACCEPTED);
    }

    /// A JSON-RPC call in the session: its answer (`result` or `error`).
    async fn call(&self, mcp: &McpEndpoint, id: i64, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self.send(mcp, "POST", Some(&body)).await;
        assert_eq!(response.status(), StatusCode::OK, "{method}");
        rpc_answer(response).await
    }

    /// A tool call's result.
    async fn tool(&self, mcp: &McpEndpoint, name: &str, arguments: Value) -> Value {
        let answer =
            self.call(mcp, 7, "tools/call", json!({"name": name, "arguments": arguments})).await;
        answer["result"].clone()
    }
}

/// The JSON-RPC answer in a response: the body, or the first SSE event that carries one.
async fn rpc_answer(response: Response) -> Value {
    let sse = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
    let mut body = response.into_body();
    let mut text = String::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.expect("body").into_data() else { continue };
            text.push_str(&String::from_utf8_lossy(&data));
            if !sse {
                continue;
            }
            let found = text
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .filter_map(|data| serde_json::from_str::<Value>(data.trim()).ok())
                .find(|message| message.get("id").is_some());
            if let Some(message) = found {
                return message;
            }
        }
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("no JSON-RPC answer in {text:?}"))
    };
    tokio::time::timeout(Duration::from_secs(120), read).await.expect("an answer in time")
}

async fn json_body(response: Response) -> Value {
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&bytes).expect("JSON")
}

fn text_of(result: &Value) -> String {
    result["content"][0]["text"].as_str().expect("a text block").to_owned()
}

/// An 8×8 image, saved: runs on the CPU without model files.
fn saved_image() -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 255}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "mcp"}}
    })
}

#[tokio::test]
async fn the_handshake_lists_the_four_tools_with_input_schemas() {
    let harness = harness(false).await;
    let mcp = endpoint(&harness, config());
    let mut client = Client::default();
    client.initialize(&mcp).await;
    let listed = client.call(&mcp, 1, "tools/list", json!({})).await;
    let tools = listed["result"]["tools"].as_array().expect("tools");
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["list_node_types", "list_models", "queue_prompt", "get_job"]);
    for tool in tools {
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
        assert!(tool["description"].as_str().is_some_and(|d| d.len() > 80), "{tool}");
    }
    let queue = &tools[2]["inputSchema"];
    assert_eq!(queue["required"], json!(["prompt"]));
    assert_eq!(queue["properties"]["wait_seconds"]["maximum"], json!(600.0));
}

#[tokio::test]
async fn list_node_types_describes_a_node_and_list_models_its_folders() {
    let harness = harness(false).await;
    let mcp = endpoint(&harness, config());
    let mut client = Client::default();
    client.initialize(&mcp).await;
    let found = client.tool(&mcp, "list_node_types", json!({"filter": "emptyimage"})).await;
    let nodes: Value = serde_json::from_str(&text_of(&found)).expect("JSON");
    let empty = &nodes["EmptyImage"];
    assert_eq!(empty["inputs"]["required"]["width"]["type"], "INT");
    assert!(empty["inputs"]["required"]["width"]["default"].is_number());
    assert_eq!(empty["outputs"][0]["type"], "IMAGE");
    assert!(nodes.get("SaveImage").is_none(), "the filter narrows the list");
    let brief = client
        .tool(&mcp, "list_node_types", json!({"filter": "Save", "include_inputs": false}))
        .await;
    let brief: Value = serde_json::from_str(&text_of(&brief)).expect("JSON");
    assert!(brief["SaveImage"].get("inputs").is_none());

    let checkpoints = harness.dir.path().join("models").join("checkpoints");
    std::fs::create_dir_all(&checkpoints).expect("folder");
    std::fs::write(checkpoints.join("tiny.safetensors"), b"x").expect("model file");
    let models = client.tool(&mcp, "list_models", json!({"folder": "checkpoints"})).await;
    assert_eq!(
        serde_json::from_str::<Value>(&text_of(&models)).expect("JSON"),
        json!({"checkpoints": ["tiny.safetensors"]})
    );
    let unknown = client.tool(&mcp, "list_models", json!({"folder": "nope"})).await;
    assert_eq!(unknown["isError"], true);
    assert!(text_of(&unknown).contains("unknown model folder `nope`"));
    let wrong = client.tool(&mcp, "list_models", json!({"folders": "x"})).await;
    assert_eq!(wrong["isError"], true, "unknown arguments are named");
}

#[tokio::test]
async fn an_invalid_workflow_is_an_error_result_naming_each_node_error() {
    let harness = harness(false).await;
    let mcp = endpoint(&harness, config());
    let mut client = Client::default();
    client.initialize(&mcp).await;
    let mut prompt = saved_image();
    prompt["1"]["inputs"] = json!({"width": 8});
    let refused = client.tool(&mcp, "queue_prompt", json!({"prompt": prompt})).await;
    assert_eq!(refused["isError"], true);
    let text = text_of(&refused);
    assert!(text.starts_with("The workflow was not queued"), "{text}");
    assert!(text.contains("node \"1\" (EmptyImage)"), "{text}");
    assert!(text.contains("height"), "names the missing input: {text}");
    assert!(harness.runtime.queue.pending().is_empty(), "nothing was queued");
}

#[tokio::test]
async fn a_queued_workflow_runs_and_get_job_returns_its_image() {
    let harness = harness(false).await;
    let mcp = endpoint(&harness, config());
    let mut client = Client::default();
    client.initialize(&mcp).await;
    let done = client
        .tool(&mcp, "queue_prompt", json!({"prompt": saved_image(), "wait_seconds": 60}))
        .await;
    assert_ne!(done["isError"], true, "{done}");
    let job: Value = serde_json::from_str(&text_of(&done)).expect("JSON");
    assert_eq!(job["status"], "success", "{job}");
    assert_eq!(done["content"][1]["type"], "image");
    assert_eq!(done["content"][1]["mimeType"], "image/png");

    let prompt_id = job["prompt_id"].as_str().expect("id");
    let again = client.tool(&mcp, "get_job", json!({"prompt_id": prompt_id})).await;
    let job: Value = serde_json::from_str(&text_of(&again)).expect("JSON");
    assert_eq!(job["status"], "success");
    assert!(
        job["outputs"]["2"]["images"][0]["filename"].as_str().is_some_and(|f| f.starts_with("mcp"))
    );
    let png = again["content"][1]["data"].as_str().expect("base64");
    assert!(png.starts_with("iVBORw0KGgo"), "a PNG");
    let bare = client
        .tool(&mcp, "get_job", json!({"prompt_id": prompt_id, "include_images": false}))
        .await;
    assert_eq!(bare["content"].as_array().map(Vec::len), Some(1));

    let queued = client.tool(&mcp, "queue_prompt", json!({"prompt": saved_image()})).await;
    let queued: Value = serde_json::from_str(&text_of(&queued)).expect("JSON");
    assert!(queued["prompt_id"].is_string() && queued["number"].is_number(), "{queued}");
}

#[tokio::test]
async fn queueing_needs_the_run_scope() {
    let harness = harness(true).await;
    let mut config = config();
    config.resource_metadata =
        Some("http://127.0.0.1:8188/.well-known/oauth-protected-resource/mcp".to_owned());
    config.require_principal = true;
    let mcp = endpoint(&harness, config);
    let mut reader = Client::cloud(&harness, "alice", "default", Some(&[SCOPE_READ]));
    reader.initialize(&mcp).await;
    let listed = reader.call(&mcp, 1, "tools/list", json!({})).await;
    assert!(listed["result"]["tools"].is_array());
    let models = reader.tool(&mcp, "list_models", json!({})).await;
    assert_ne!(models["isError"], true);

    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "queue_prompt", "arguments": {"prompt": saved_image()}}});
    let refused = reader.send(&mcp, "POST", Some(&call)).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        refused.headers()[header::WWW_AUTHENTICATE],
        "Bearer error=\"insufficient_scope\", scope=\"kiln:read kiln:run\", \
         resource_metadata=\"http://127.0.0.1:8188/.well-known/oauth-protected-resource/mcp\""
    );
    assert_eq!(json_body(refused).await["code"], "insufficient_scope");
    let batch = json!([{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, call]);
    assert_eq!(reader.send(&mcp, "POST", Some(&batch)).await.status(), StatusCode::FORBIDDEN);

    let anonymous = Client::default().send(&mcp, "POST", Some(&call)).await;
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        anonymous.headers()[header::WWW_AUTHENTICATE],
        "Bearer resource_metadata=\"http://127.0.0.1:8188/.well-known/oauth-protected-resource/mcp\", \
         scope=\"kiln:read kiln:run\""
    );
    assert_eq!(json_body(anonymous).await["code"], "unauthorized");
    let no_workspace = Client { caller: None, ..reader.clone() };
    assert_eq!(
        no_workspace.send(&mcp, "POST", Some(&call)).await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn a_session_belongs_to_the_user_who_opened_it() {
    let harness = harness(true).await;
    let mcp = endpoint(&harness, config());
    let mut alice = Client::cloud(&harness, "alice", "default", None);
    alice.initialize(&mcp).await;
    let mut bob = Client::cloud(&harness, "bob", "default", None);
    bob.session = alice.session.clone();
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let stolen = bob.send(&mcp, "POST", Some(&list)).await;
    assert_eq!(stolen.status(), StatusCode::NOT_FOUND);
    assert_eq!(json_body(stolen).await["code"], "session_not_found");
    assert_eq!(
        bob.send(&mcp, "DELETE", None).await.status(),
        StatusCode::NOT_FOUND,
        "nor may bob end it"
    );
    assert_eq!(bob.send(&mcp, "GET", None).await.status(), StatusCode::NOT_FOUND);

    assert!(alice.call(&mcp, 2, "tools/list", json!({})).await["result"]["tools"].is_array());
    assert_eq!(alice.send(&mcp, "DELETE", None).await.status(), StatusCode::ACCEPTED);
    assert_eq!(
        alice.send(&mcp, "POST", Some(&list)).await.status(),
        StatusCode::NOT_FOUND,
        "deleted"
    );
}

#[tokio::test]
async fn a_foreign_origin_is_refused() {
    let harness = harness(false).await;
    let mcp = endpoint(&harness, config());
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                 "clientInfo": {"name": "t", "version": "0"}}});
    let evil = Client { origin: Some("https://evil.example".to_owned()), ..Client::default() };
    let refused = evil.send(&mcp, "POST", Some(&init)).await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(json_body(refused).await["code"], "origin_not_allowed");
    let own = Client { origin: Some("http://127.0.0.1:8188".to_owned()), ..Client::default() };
    assert_eq!(own.send(&mcp, "POST", Some(&init)).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn another_workspaces_job_does_not_exist() {
    let harness = harness(true).await;
    let mcp = endpoint(&harness, config());
    let mut alice = Client::cloud(&harness, "alice", "a", None);
    alice.initialize(&mcp).await;
    let queued = alice.tool(&mcp, "queue_prompt", json!({"prompt": saved_image()})).await;
    let prompt_id =
        serde_json::from_str::<Value>(&text_of(&queued)).expect("JSON")["prompt_id"].clone();
    let mut bob = Client::cloud(&harness, "bob", "b", None);
    bob.initialize(&mcp).await;
    let hidden = bob.tool(&mcp, "get_job", json!({"prompt_id": prompt_id})).await;
    assert_eq!(hidden["isError"], true);
    assert_eq!(text_of(&hidden), format!("no such job: {}", prompt_id.as_str().expect("id")));
    let own = alice.tool(&mcp, "get_job", json!({"prompt_id": prompt_id})).await;
    assert_ne!(own["isError"], true, "{own}");
}

#[tokio::test]
async fn rmcp_refusals_are_answered_as_json() {
    let harness = harness(false).await;
    let mcp = endpoint(&harness, config());
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let no_session = Client::default().send(&mcp, "POST", Some(&list)).await;
    assert_eq!(no_session.status(), StatusCode::BAD_REQUEST);
    assert_eq!(json_body(no_session).await["code"], "invalid_request");
    let mut client = Client::default();
    client.initialize(&mcp).await;
    let mut request = client.request("GET", None);
    request.headers_mut().insert(header::ACCEPT, "application/json".parse().expect("header"));
    let refused = mcp.serve(request).await;
    assert_eq!(refused.status(), StatusCode::NOT_ACCEPTABLE);
    assert_eq!(json_body(refused).await["code"], "not_acceptable");
    let huge = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"pad": "x".repeat(5 << 20)}});
    let too_large = client.send(&mcp, "POST", Some(&huge)).await;
    assert_eq!(too_large.status(), StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn a_2026_07_28_request_is_served_without_a_session_as_one_json_answer() {
    let harness = harness(true).await;
    let mcp = endpoint(&harness, config());
    let alice = Client::cloud(&harness, "alice", "a", None);
    let meta = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                      "io.modelcontextprotocol/clientCapabilities": {}});
    let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                      "params": {"name": "list_models", "arguments": {"folder": "vae"}, "_meta": meta}});
    let mut request = alice.request("POST", Some(&call));
    for (name, value) in [
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "list_models"),
    ] {
        request.headers_mut().insert(name, value.parse().expect("header"));
    }
    let response = mcp.serve(request).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    assert!(response.headers().get("mcp-session-id").is_none());
    let answer = json_body(response).await;
    assert_eq!(text_of(&answer["result"]), r#"{"vae":[]}"#);
}
