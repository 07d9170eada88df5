//! The operation inventory: every operation's method, path, operationId, tags and runtimes, sorted, as a
//! snapshot, plus the coverage facts the spec promises (every ComfyUI route, every cloud auth route).

use std::collections::BTreeSet;

use kiln_tests::{load_spec, operations};

#[test]
fn operation_inventory() {
    let spec = load_spec();
    let mut lines: Vec<String> = operations(&spec)
        .iter()
        .map(|op| {
            format!(
                "{:<6} {:<66} {:<40} [{}] x-runtime=[{}]",
                op.method.to_uppercase(),
                op.path,
                op.operation_id(),
                op.tags().join(", "),
                op.runtimes().join(", ")
            )
        })
        .collect();
    lines.sort();
    let count =
        |runtime: &[&str]| operations(&spec).iter().filter(|op| op.runtimes() == runtime).count();
    let summary = format!(
        "operations: {} ([local]: {}, [local, cloud]: {}, [cloud]: {})",
        lines.len(),
        count(&["local"]),
        count(&["local", "cloud"]),
        count(&["cloud"])
    );
    insta::assert_snapshot!("operation_inventory", format!("{summary}\n\n{}", lines.join("\n")));
}

#[test]
fn operation_ids_are_unique() {
    let spec = load_spec();
    let mut seen = BTreeSet::new();
    for op in operations(&spec) {
        assert!(
            seen.insert(op.operation_id().to_owned()),
            "duplicate operationId {}",
            op.operation_id()
        );
    }
}

#[test]
fn every_operation_declares_a_runtime() {
    for op in operations(&load_spec()) {
        let runtimes = op.runtimes();
        assert!(
            runtimes == ["local"] || runtimes == ["cloud"] || runtimes == ["local", "cloud"],
            "{} {} has x-runtime {runtimes:?}",
            op.method,
            op.path
        );
    }
}

/// ComfyUI's local routes (comfy-api.md §2 and §3) in their `/api` form, plus `/ws` and `/internal/...`.
const COMFYUI_ROUTES: &[(&str, &str)] = &[
    ("get", "/ws"),
    ("get", "/api/embeddings"),
    ("get", "/api/models"),
    ("get", "/api/models/{folder}"),
    ("get", "/api/extensions"),
    ("post", "/api/upload/image"),
    ("post", "/api/upload/mask"),
    ("get", "/api/view"),
    ("get", "/api/view_metadata/{folder_name}"),
    ("get", "/api/system_stats"),
    ("get", "/api/features"),
    ("get", "/api/prompt"),
    ("post", "/api/prompt"),
    ("get", "/api/object_info"),
    ("get", "/api/object_info/{node_class}"),
    ("get", "/api/queue"),
    ("post", "/api/queue"),
    ("post", "/api/interrupt"),
    ("post", "/api/free"),
    ("get", "/api/history"),
    ("get", "/api/history/{prompt_id}"),
    ("post", "/api/history"),
    ("get", "/api/jobs"),
    ("get", "/api/jobs/{job_id}"),
    ("post", "/api/jobs/{job_id}/cancel"),
    ("post", "/api/jobs/cancel"),
    ("get", "/api/users"),
    ("post", "/api/users"),
    ("get", "/api/userdata"),
    ("get", "/api/v2/userdata"),
    ("get", "/api/userdata/{file}"),
    ("post", "/api/userdata/{file}"),
    ("delete", "/api/userdata/{file}"),
    ("post", "/api/userdata/{file}/move/{dest}"),
    ("get", "/api/settings"),
    ("get", "/api/settings/{id}"),
    ("post", "/api/settings"),
    ("post", "/api/settings/{id}"),
    ("get", "/api/experiment/models"),
    ("get", "/api/experiment/models/{folder}"),
    ("get", "/api/experiment/models/preview/{folder}/{path_index}/{filename}"),
    ("get", "/api/workflow_templates"),
    ("get", "/api/workflow_templates/{module_name}/{filename}"),
    ("get", "/api/i18n"),
    ("get", "/api/global_subgraphs"),
    ("get", "/api/global_subgraphs/{id}"),
    ("get", "/api/node_replacements"),
    ("get", "/internal/logs"),
    ("get", "/internal/logs/raw"),
    ("patch", "/internal/logs/subscribe"),
    ("get", "/internal/folder_paths"),
    ("get", "/internal/files/{directory_type}"),
];

/// The cloud-only auth and OAuth operations (oauth.md §2).
const CLOUD_ROUTES: &[(&str, &str)] = &[
    ("post", "/api/auth/session"),
    ("get", "/api/auth/session"),
    ("delete", "/api/auth/session"),
    ("post", "/api/auth/token"),
    ("get", "/.well-known/jwks.json"),
    ("get", "/.well-known/oauth-authorization-server"),
    ("get", "/.well-known/oauth-protected-resource"),
    ("get", "/.well-known/oauth-protected-resource/mcp"),
    ("get", "/oauth/authorize"),
    ("post", "/oauth/authorize"),
    ("post", "/oauth/token"),
    ("post", "/oauth/register"),
    ("get", "/oauth/register/{client_id}"),
    ("get", "/oauth/consent"),
];

fn find<'a>(
    ops: &'a [kiln_tests::Operation],
    method: &str,
    path: &str,
) -> Option<&'a kiln_tests::Operation> {
    ops.iter().find(|op| op.method == method && op.path == path)
}

#[test]
fn every_comfyui_route_is_in_the_spec_and_mounted_locally() {
    let ops = operations(&load_spec());
    let missing: Vec<_> =
        COMFYUI_ROUTES.iter().filter(|(m, p)| find(&ops, m, p).is_none()).collect();
    assert!(missing.is_empty(), "ComfyUI routes missing from the spec: {missing:?}");
    for (method, path) in COMFYUI_ROUTES {
        let op = find(&ops, method, path).expect("checked above");
        assert!(
            op.runtimes().contains(&"local".to_owned()),
            "{method} {path} is not mounted in the local runtime"
        );
    }
}

#[test]
fn every_cloud_auth_route_is_cloud_only() {
    let ops = operations(&load_spec());
    for (method, path) in CLOUD_ROUTES {
        let op = find(&ops, method, path)
            .unwrap_or_else(|| panic!("{method} {path} is missing from the spec"));
        assert_eq!(op.runtimes(), ["cloud"], "{method} {path}");
        let description = op.body.get("description").and_then(|d| d.as_str()).unwrap_or("");
        assert!(
            description.starts_with("[cloud-only] "),
            "{method} {path} lacks the [cloud-only] prefix"
        );
    }
}

#[test]
fn the_spec_is_openapi_3_0_3() {
    assert_eq!(load_spec().get("openapi").and_then(|v| v.as_str()), Some("3.0.3"));
}
