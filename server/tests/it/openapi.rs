//! The document the running `kiln` serves at `/api/openapi.json` is the committed spec reduced to the local
//! runtime, and the router mounts exactly what it lists: every operation answers, and every other method of its
//! path gets 405 with an `Allow` header (`/api/X`, its bare alias `/X`, and `HEAD`). Files go out with content
//! types the document declares.

use std::collections::{BTreeMap, BTreeSet};

use kiln_server::api::{Runtime, document};
use serde_json::Value;

use crate::binary::{get_json, start, temp_dir};

const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

fn committed() -> Value {
    serde_yaml::from_str(kiln_spec::OPENAPI_YAML).expect("the spec parses")
}

/// `(method, path)` of every operation in a document, with the operation.
fn operations(spec: &Value) -> BTreeMap<(String, String), Value> {
    let mut out = BTreeMap::new();
    for (path, item) in spec["paths"].as_object().into_iter().flatten() {
        for (method, operation) in item.as_object().into_iter().flatten() {
            if METHODS.contains(&method.as_str()) {
                out.insert((method.clone(), path.clone()), operation.clone());
            }
        }
    }
    out
}

/// Whether the runtime serves the operation: its `x-runtime` names it.
fn mounts(operation: &Value, runtime: &str) -> bool {
    operation["x-runtime"].as_array().is_some_and(|r| r.iter().any(|v| v == runtime))
}

/// Every `$ref` target (schema name) in `value`.
fn references(value: &Value, out: &mut BTreeSet<String>) {
    match value {
        Value::Object(object) => {
            if let Some(Value::String(r)) = object.get("$ref")
                && let Some(name) = r.strip_prefix("#/components/schemas/")
            {
                out.insert(name.to_owned());
            }
            object.values().for_each(|v| references(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| references(v, out)),
        _ => {}
    }
}

/// Drops the keys that steer code generation only.
fn without_codegen_keys(mut value: Value) -> Value {
    if let Value::Object(object) = &mut value {
        object.retain(|key, _| !key.starts_with("x-kiln-"));
        for v in object.values_mut() {
            *v = without_codegen_keys(v.take());
        }
    } else if let Value::Array(items) = &mut value {
        for v in items.iter_mut() {
            *v = without_codegen_keys(v.take());
        }
    }
    value
}

fn contains_key(value: &Value, key: &str) -> bool {
    match value {
        Value::Object(object) => {
            object.contains_key(key) || object.values().any(|v| contains_key(v, key))
        }
        Value::Array(items) => items.iter().any(|v| contains_key(v, key)),
        _ => false,
    }
}

/// Checks that `served` is the committed spec reduced to `runtime`: its operations exactly, unchanged but for
/// `security` where the runtime takes none, the schemas and tags they use, everything else as committed.
fn assert_reduced(served: &Value, runtime: &str, keeps_security: bool) {
    let spec = committed();
    let all = operations(&spec);
    let expected: BTreeSet<_> =
        all.iter().filter(|(_, op)| mounts(op, runtime)).map(|(key, _)| key.clone()).collect();
    let got = operations(served);
    assert_eq!(got.keys().cloned().collect::<BTreeSet<_>>(), expected, "{runtime}: the operations");
    assert!(expected.len() < all.len(), "some operations are not mounted by {runtime}");
    for (key, operation) in &got {
        let mut committed_op = all[key].clone();
        if !keeps_security && let Some(op) = committed_op.as_object_mut() {
            op.remove("security");
        }
        assert_eq!(operation, &without_codegen_keys(committed_op), "{runtime}: {key:?}");
    }
    if keeps_security {
        assert_eq!(served["security"], spec["security"]);
        assert_eq!(served["components"]["securitySchemes"], spec["components"]["securitySchemes"]);
    } else {
        assert!(!contains_key(served, "security"), "{runtime}: no security requirement anywhere");
        assert!(served["components"].get("securitySchemes").is_none());
    }
    // The schemas: exactly those the rest of the document reaches, each as committed.
    let schemas = served["components"]["schemas"].as_object().expect("schemas");
    let mut outside = served.clone();
    outside["components"].as_object_mut().expect("components").remove("schemas");
    let mut reached = BTreeSet::new();
    references(&outside, &mut reached);
    loop {
        let mut more = reached.clone();
        for name in &reached {
            references(&served["components"]["schemas"][name], &mut more);
        }
        if more == reached {
            break;
        }
        reached = more;
    }
    assert_eq!(
        schemas.keys().cloned().collect::<BTreeSet<_>>(),
        reached,
        "{runtime}: used schemas"
    );
    for (name, schema) in schemas {
        let committed_schema = without_codegen_keys(spec["components"]["schemas"][name].clone());
        assert_eq!(schema, &committed_schema, "{runtime}: schema {name}");
    }
    assert!(!contains_key(served, "x-kiln-checked-by-handler"));
    // The tags the operations use, in the committed order and words.
    let used: BTreeSet<&str> = got
        .values()
        .flat_map(|op| op["tags"].as_array().into_iter().flatten().filter_map(Value::as_str))
        .collect();
    let tags: Vec<&Value> = spec["tags"]
        .as_array()
        .expect("tags")
        .iter()
        .filter(|t| t["name"].as_str().is_some_and(|n| used.contains(n)))
        .collect();
    assert_eq!(served["tags"].as_array().map(|t| t.iter().collect::<Vec<_>>()), Some(tags));
    for key in ["openapi", "info", "servers", "x-middleware-responses"] {
        assert_eq!(served[key], spec[key], "{runtime}: `{key}` as committed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_served_document_is_the_committed_spec_for_the_local_runtime() {
    let data_dir = temp_dir("openapi-served");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let mut bodies = Vec::new();
    for path in ["/api/openapi.json", "/openapi.json"] {
        let response = http.get(format!("http://{addr}{path}")).send().await.expect("answers");
        assert_eq!(response.status().as_u16(), 200, "{path}");
        bodies.push(response.json::<Value>().await.expect("JSON"));
    }
    assert_eq!(bodies[0], bodies[1], "the bare alias serves the same document");
    assert_reduced(&bodies[0], "local", false);
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[test]
fn the_cloud_document_is_the_committed_spec_for_the_cloud_runtime_with_its_security() {
    let cloud = serde_json::to_value(document(Runtime::Cloud).expect("reduces")).expect("JSON");
    assert_reduced(&cloud, "cloud", true);
}

/// A concrete path for a spec path, with values every handler parses.
fn concrete(path: &str) -> String {
    path.split('/')
        .map(|segment| match segment {
            "{path_index}" => "0",
            "{directory_type}" => "output",
            "{job_id}" => "00000000-0000-4000-8000-000000000000",
            s if s.starts_with('{') => "x",
            s => s,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_served_operation_is_mounted_and_other_methods_get_405_with_allow() {
    let data_dir = temp_dir("openapi-allow");
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let served = get_json(&http, &addr, "/api/openapi.json").await;
    let mut by_path: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (method, path) in operations(&served).into_keys() {
        by_path.entry(path).or_default().insert(method.to_uppercase());
    }
    assert!(by_path.len() > 40, "the local paths: {}", by_path.len());
    for (path, methods) in &by_path {
        // `GET` paths answer `HEAD` too, as ComfyUI's aiohttp routes.
        let mut allowed = methods.clone();
        if methods.contains("GET") {
            allowed.insert("HEAD".to_owned());
        }
        let mut forms = vec![concrete(path)];
        if let Some(bare) = path.strip_prefix("/api") {
            forms.push(concrete(bare));
        } else if path == "/ws" {
            forms.push("/api/ws".to_owned());
        }
        for url_path in &forms {
            // A method no Kiln path has: the router answers 405 and lists the path's methods, which proves each
            // of the document's operations on this path is mounted.
            let response = http
                .request(reqwest::Method::PUT, format!("http://{addr}{url_path}"))
                .send()
                .await
                .expect("answers");
            assert_eq!(response.status().as_u16(), 405, "PUT {url_path}");
            let allow: BTreeSet<String> = response
                .headers()
                .get("allow")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_else(|| panic!("PUT {url_path}: no Allow header"))
                .split(',')
                .map(|m| m.trim().to_owned())
                .collect();
            assert_eq!(allow, allowed, "Allow of {url_path}");
            assert!(response.bytes().await.expect("body").is_empty(), "405 has no body");
            if !methods.contains("GET") {
                let head =
                    http.head(format!("http://{addr}{url_path}")).send().await.expect("answers");
                assert_eq!(head.status().as_u16(), 405, "HEAD {url_path}");
            }
        }
    }
    // HEAD on a GET operation: the GET's status and headers, no body.
    let get = http.get(format!("http://{addr}/queue")).send().await.expect("answers");
    let head = http.head(format!("http://{addr}/queue")).send().await.expect("answers");
    assert_eq!(head.status(), get.status());
    assert_eq!(head.headers().get("content-type"), get.headers().get("content-type"));
    assert!(head.bytes().await.expect("body").is_empty());
    // Cloud-only paths are not mounted at all.
    for path in ["/api/auth/session", "/oauth/token", "/.well-known/jwks.json"] {
        let response = http.get(format!("http://{addr}{path}")).send().await.expect("answers");
        assert_eq!(response.status().as_u16(), 404, "{path}");
    }
    let _ = std::fs::remove_dir_all(&data_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_served_with_content_types_the_spec_declares() {
    let data_dir = temp_dir("openapi-media");
    // The proxy in front fails the test (when the server is dropped) on any undeclared content type.
    let (_server, addr) = start(&data_dir);
    let http = reqwest::Client::new();
    let files = [
        ("a.gif", "image/gif"),
        ("a.json", "application/json"),
        ("a.txt", "text/plain"),
        ("a.mp4", "video/mp4"),
        ("a.flac", "audio/flac"),
        // Types that could run script are sent as bytes to download.
        ("a.html", "application/octet-stream"),
        ("a.unknown", "application/octet-stream"),
    ];
    for (name, content_type) in files {
        let part = reqwest::multipart::Part::bytes(b"{}".to_vec()).file_name(name);
        let form = reqwest::multipart::Form::new().part("image", part);
        let stored = http
            .post(format!("http://{addr}/api/upload/image"))
            .multipart(form)
            .send()
            .await
            .expect("answers");
        assert_eq!(stored.status().as_u16(), 200, "upload {name}");
        let viewed = http
            .get(format!("http://{addr}/api/view?type=input&filename={name}"))
            .send()
            .await
            .expect("answers");
        assert_eq!(viewed.status().as_u16(), 200, "view {name}");
        assert_eq!(
            viewed.headers().get("content-type").and_then(|v| v.to_str().ok()),
            Some(content_type),
            "{name}"
        );
    }
    // `user.css` is sent inline as CSS.
    let css = "body { color: red; }";
    let written = http
        .post(format!("http://{addr}/api/userdata/user.css"))
        .body(css)
        .send()
        .await
        .expect("answers");
    assert_eq!(written.status().as_u16(), 200);
    let read =
        http.get(format!("http://{addr}/api/userdata/user.css")).send().await.expect("answers");
    assert_eq!(read.headers().get("content-type").and_then(|v| v.to_str().ok()), Some("text/css"));
    let _ = std::fs::remove_dir_all(&data_dir);
}
