//! The frontend's static files at `/`, and the `--enable-cors-header` mode.

use std::net::{Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt as _;
use kiln_server::{Config, LogRing, Server};
use tower::ServiceExt as _;

use kiln_tests::contract::{Answer, Contract};

fn config(name: &str) -> Config {
    let dir = std::env::temp_dir().join(format!("kiln-frontend-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Config::under(dir, vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))], vec!["kiln".to_owned()])
}

async fn send(
    server: &Server,
    request: Request<Body>,
) -> (StatusCode, axum::http::HeaderMap, Vec<u8>) {
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = server.router().oneshot(request).await.expect("answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes().to_vec();
    Contract::assert_conforms(&Answer {
        method: method.as_str(),
        path: &path,
        status: parts.status.as_u16(),
        content_type: parts.headers.get("content-type").and_then(|v| v.to_str().ok()),
        body: &body,
    });
    (parts.status, parts.headers, body)
}

#[tokio::test]
async fn the_frontend_is_served_with_comfyuis_cache_headers() {
    let mut config = config("static");
    let root = config.data_dir.join("frontend");
    std::fs::create_dir_all(root.join("assets")).expect("dirs");
    std::fs::write(root.join("index.html"), "<html>comfy</html>").expect("index");
    std::fs::write(root.join("assets/app.js"), "console.log(1)").expect("asset");
    config.front_end_root = Some(root);
    let server = Server::start(&config, LogRing::new()).await.expect("starts");

    let (status, headers, body) =
        send(&server, Request::get("/").body(Body::empty()).expect("request")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, b"<html>comfy</html>".as_slice()));
    assert_eq!(headers["cache-control"], "no-store, must-revalidate");
    assert_eq!(headers["pragma"], "no-cache");
    let (status, _, body) =
        send(&server, Request::get("/assets/app.js").body(Body::empty()).expect("request")).await;
    assert_eq!((status, body.as_slice()), (StatusCode::OK, b"console.log(1)".as_slice()));
    let (status, _, _) =
        send(&server, Request::get("/no/such/file").body(Body::empty()).expect("request")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, _) =
        send(&server, Request::get("/api/queue").body(Body::empty()).expect("request")).await;
    assert_eq!(status, StatusCode::OK, "the API still answers");
}

#[tokio::test]
async fn cors_mode_allows_other_origins_and_answers_preflight() {
    let mut config = config("cors");
    config.cors_origin = Some("https://app.example".to_owned());
    let server = Server::start(&config, LogRing::new()).await.expect("starts");
    let request = Request::get("/api/queue")
        .header("host", "127.0.0.1:8188")
        .header("origin", "https://app.example")
        .body(Body::empty())
        .expect("request");
    let (status, headers, _) = send(&server, request).await;
    assert_eq!(status, StatusCode::OK, "no loopback origin check in CORS mode");
    assert_eq!(headers["access-control-allow-origin"], "https://app.example");
    let preflight = Request::builder()
        .method("OPTIONS")
        .uri("/api/prompt")
        .body(Body::empty())
        .expect("request");
    let (status, headers, _) = send(&server, preflight).await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.contains_key("access-control-allow-methods"));
}

#[tokio::test]
async fn without_cors_mode_a_foreign_origin_is_refused_on_loopback() {
    let server = Server::start(&config("origin"), LogRing::new()).await.expect("starts");
    let request = Request::get("/api/queue")
        .header("host", "127.0.0.1:8188")
        .header("origin", "http://evil.example")
        .body(Body::empty())
        .expect("request");
    let (status, _, _) = send(&server, request).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}
