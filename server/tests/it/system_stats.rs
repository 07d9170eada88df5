//! `GET /api/system_stats` through the router, at both the `/api` path and the bare alias.

use std::net::{Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use kiln_server::{Config, LogRing, Server};
use kiln_spec::types::SystemStats;
use tower::ServiceExt as _;

use kiln_tests::contract::{Answer, Contract};
use kiln_tests::key_order::{comfyui_shape, shape};

fn config() -> Config {
    let data_dir = std::env::temp_dir().join(format!("kiln-router-test-{}", std::process::id()));
    Config::under(
        data_dir,
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
        vec!["kiln".to_owned(), "--port".to_owned(), "0".to_owned()],
    )
}

async fn get(path: &str) -> (StatusCode, Option<String>, Vec<u8>) {
    let server = Server::start(&config(), LogRing::new()).await.expect("server starts");
    let response = server
        .router()
        .oneshot(Request::get(path).body(Body::empty()).expect("request builds"))
        .await
        .expect("router answers");
    let status = response.status();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = response.into_body().collect().await.expect("body reads").to_bytes().to_vec();
    Contract::assert_conforms(&Answer {
        method: "GET",
        path,
        status: status.as_u16(),
        content_type: content_type.as_deref(),
        body: &body,
    });
    (status, content_type, body)
}

#[tokio::test]
async fn system_stats_describes_the_host_and_the_cpu_device() {
    for path in ["/api/system_stats", "/system_stats"] {
        let (status, content_type, body) = get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(content_type.as_deref(), Some("application/json; charset=utf-8"), "{path}");
        let stats: SystemStats = serde_json::from_slice(&body).expect("body is a SystemStats");
        assert_eq!(stats.system.argv, ["kiln", "--port", "0"]);
        assert!(!stats.system.embedded_python);
        assert_eq!(stats.system.comfyui_version, env!("CARGO_PKG_VERSION"));
        assert!(stats.system.ram_free <= stats.system.ram_total);
        let [device] = stats.devices.as_slice() else {
            panic!("one device expected: {:?}", stats.devices)
        };
        assert_eq!((device.type_.as_str(), device.index), ("cpu", None));
        // ComfyUI clients read `index: null`, not a missing key.
        let raw: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(raw["devices"][0]["index"], serde_json::Value::Null);
        assert!(raw["devices"][0].as_object().is_some_and(|d| d.contains_key("index")));
    }
}

#[tokio::test]
async fn unknown_routes_are_404() {
    let (status, _, _) = get("/api/no_such_route").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// Issue #9, item 4: `/system_stats` and `/features` carry every field ComfyUI sends, in its order.
#[tokio::test]
async fn issue_9_server_facts_carry_every_field_comfyui_sends() {
    for (path, case) in
        [("/api/system_stats", "get_system_stats_shape"), ("/api/features", "get_features")]
    {
        let (status, _, body) = get(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let ours: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
        let recorded = kiln_tests::golden(case);
        let theirs = &recorded["response"]["body"]["json"];
        let (got, expected) = (comfyui_shape(&ours), shape(theirs));
        assert_eq!(got, expected, "{path}: the same fields as ComfyUI, in its order");
    }
    let (_, _, body) = get("/api/system_stats").await;
    let stats: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    let device = &stats["devices"][0];
    assert_eq!(device["type"], "cpu", "no CUDA on this machine or in this build");
    let budget = device["vram_budget"].as_i64().expect("a budget");
    assert!(budget > 0, "the CPU's simulated device has a budget: {budget}");
    let system = &stats["system"];
    assert_eq!(system["required_frontend_version"], "1.58.1", "the frontend Kiln serves");
    assert_eq!(system["comfy_package_versions"][0]["name"], "comfyui-frontend-package");
    assert_eq!(system["comfy_package_versions"][0]["required"], "1.58.1");
    // This server was built in code, without templates (as `--disable-front-end`): none installed, the pinned
    // version asked for.
    assert!(system["installed_templates_version"].is_null(), "no templates installed");
    assert_eq!(system["required_templates_version"], kiln_server::TEMPLATES_VERSION);
    assert_eq!(system["comfy_package_versions"][1]["name"], "comfyui-workflow-templates");
    assert!(system["comfy_package_versions"][1]["installed"].is_null());
    let (_, _, body) = get("/api/features").await;
    let features: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(features["extension"]["manager"]["supports_v4"], false, "no ComfyUI-Manager");
    assert_eq!(features["node_replacements"], true, "/api/node_replacements is served");
}
