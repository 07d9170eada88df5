//! Helpers shared by Kiln's cross-crate tests: where the repository is, how to read the spec, how to run
//! the pinned npm tools (`npm ci` installs them; the README's test command does that first), and the response
//! contract ([`contract`]) with its checking proxy ([`proxy`], also the `kiln-contract-proxy` binary).

#![deny(missing_docs)]

pub mod contract;
pub mod key_order;
pub mod postgres;
pub mod proxy;
pub mod s3;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// ComfyUI's recorded exchanges, kept in the repository (`tests/golden/comfyui`, see its README for where they
/// came from); `KILN_GOLDEN_DIR` points the tests at another recording.
pub fn golden_dir() -> PathBuf {
    std::env::var_os("KILN_GOLDEN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/golden/comfyui"))
}

/// Serves `body` at `/wheel.whl` on a loopback port of the current tokio runtime (a stand-in for PyPI in the
/// frontend download tests); returns its URL and a count of the requests it answered.
pub async fn serve_wheel(
    body: Vec<u8>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let app = axum::Router::new().route(
        "/wheel.whl",
        axum::routing::get(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let body = body.clone();
            async move { body }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}/wheel.whl", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, requests)
}

/// Serves `files` (name, body) at `/<name>` on a loopback port of the current tokio runtime (a stand-in for a
/// folder of wheels on a mirror; other names answer 404); returns the folder's URL and a count of the requests
/// it answered with a file.
pub async fn serve_files(
    files: Vec<(String, Vec<u8>)>,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let counter = requests.clone();
    let files: std::sync::Arc<std::collections::HashMap<String, Vec<u8>>> =
        std::sync::Arc::new(files.into_iter().collect());
    let app = axum::Router::new().route(
        "/{name}",
        axum::routing::get(move |axum::extract::Path(name): axum::extract::Path<String>| {
            let files = files.clone();
            let counter = counter.clone();
            async move {
                match files.get(&name) {
                    Some(body) => {
                        counter.fetch_add(1, Ordering::SeqCst);
                        Ok(body.clone())
                    }
                    None => Err(axum::http::StatusCode::NOT_FOUND),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, requests)
}

/// One golden capture, parsed (key order preserved).
pub fn golden(case: &str) -> serde_json::Value {
    let path = golden_dir().join(format!("{case}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the golden capture {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the golden capture {} is not JSON: {e}", path.display()))
}

/// ComfyUI's full node catalogue (`GET /object_info` at the commit Kiln matches; `tests/golden/comfyui-catalogue`),
/// class name → entry, in ComfyUI's order.
pub fn comfyui_catalogue() -> serde_json::Value {
    let path = repo_root().join("tests/golden/comfyui-catalogue/object_info.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the catalogue {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the catalogue {} is not JSON: {e}", path.display()))
}

/// The spec parsed as YAML, key order preserved.
pub fn load_spec() -> serde_yaml::Value {
    let path = repo_root().join("spec/openapi.yaml");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("spec/openapi.yaml is not YAML: {e}"))
}

/// The HTTP methods an OpenAPI path item can hold, in the order the inventory lists them.
pub const HTTP_METHODS: [&str; 8] =
    ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// One operation of the spec.
#[derive(Debug, Clone)]
pub struct Operation {
    /// The HTTP method, lower case.
    pub method: String,
    /// The path as written in the spec.
    pub path: String,
    /// The operation object.
    pub body: serde_yaml::Value,
}

impl Operation {
    /// The operationId, or an empty string.
    pub fn operation_id(&self) -> &str {
        self.body.get("operationId").and_then(serde_yaml::Value::as_str).unwrap_or("")
    }

    /// The `x-runtime` list.
    pub fn runtimes(&self) -> Vec<String> {
        string_list(self.body.get("x-runtime"))
    }

    /// The tags.
    pub fn tags(&self) -> Vec<String> {
        string_list(self.body.get("tags"))
    }
}

fn string_list(value: Option<&serde_yaml::Value>) -> Vec<String> {
    value
        .and_then(serde_yaml::Value::as_sequence)
        .map(|items| items.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect())
        .unwrap_or_default()
}

/// Every operation of the spec, in document order.
pub fn operations(spec: &serde_yaml::Value) -> Vec<Operation> {
    let Some(paths) = spec.get("paths").and_then(serde_yaml::Value::as_mapping) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (path, item) in paths {
        let path = path.as_str().unwrap_or_default();
        for method in HTTP_METHODS {
            if let Some(body) = item.get(method) {
                out.push(Operation {
                    method: method.to_owned(),
                    path: path.to_owned(),
                    body: body.clone(),
                });
            }
        }
    }
    out
}

/// The path of an installed npm tool under `node_modules/.bin`.
///
/// Panics with the fix when the tools are not installed: tests never fetch from the network themselves.
pub fn npm_tool(name: &str) -> PathBuf {
    let path = repo_root().join("node_modules/.bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `npm ci` at the repository root (the README's test command does)",
        path.display()
    );
    path
}

/// Runs Spectral with Kiln's ruleset on the given files (relative to the repository root) and returns its
/// JSON results, one object per problem.
pub fn spectral(files: &[&str]) -> Vec<serde_json::Value> {
    let output = Command::new(npm_tool("spectral"))
        .current_dir(repo_root())
        .args(["lint", "--ruleset", "spec/.spectral.yaml", "--format", "json", "--quiet"])
        .args(files)
        .output()
        .expect("spectral runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "spectral did not print JSON ({e}); status {}, stdout: {stdout}, stderr: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )
    })
}
