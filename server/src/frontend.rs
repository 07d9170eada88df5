//! Serving a built ComfyUI frontend (`--front-end-root`) and ComfyUI's `--enable-cors-header` mode.
//!
//! `/` answers `index.html` with ComfyUI's no-cache headers; other paths are the frontend's static files; an
//! unknown path is 404. These are not API operations, so they are not in the spec.

use std::path::Path;

use axum::Router;
use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, EXPIRES, HeaderValue, PRAGMA};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::services::{ServeDir, ServeFile};

/// Adds the frontend's files under `root` to a router: `/` is `index.html` without caching.
pub(crate) fn serve(router: Router, root: &Path) -> Router {
    let index = ServeFile::new(root.join("index.html"));
    let router = router.route_service("/", index).fallback_service(ServeDir::new(root));
    router.layer(axum::middleware::from_fn(no_cache_index))
}

async fn no_cache_index(request: Request, next: Next) -> Response {
    let is_index = matches!(request.uri().path(), "/" | "/index.html");
    let mut response = next.run(request).await;
    if is_index && response.status().is_success() {
        let headers = response.headers_mut();
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store, must-revalidate"));
        headers.insert(PRAGMA, HeaderValue::from_static("no-cache"));
        headers.insert(EXPIRES, HeaderValue::from_static("0"));
    }
    response
}

/// `/` without a frontend: says how to get one.
pub(crate) async fn no_frontend() -> Response {
    let text = "Kiln is running. Its API is at /api/...; start it with --front-end-root <the static folder of \
                comfyui-frontend-package> to serve the ComfyUI frontend here.\n";
    (StatusCode::OK, [(axum::http::header::CONTENT_TYPE, "text/plain; charset=utf-8")], text)
        .into_response()
}

/// ComfyUI's `--enable-cors-header ORIGIN`: every response allows `origin`; `OPTIONS` answers 200 at once.
pub(crate) async fn cors(origin: String, request: Request, next: Next) -> Response {
    let mut response = if request.method() == Method::OPTIONS {
        StatusCode::OK.into_response()
    } else {
        next.run(request).await
    };
    let headers = response.headers_mut();
    let value = |v: &str| HeaderValue::from_str(v).unwrap_or(HeaderValue::from_static("*"));
    headers.insert("access-control-allow-origin", value(&origin));
    headers.insert("access-control-allow-methods", value("POST, GET, DELETE, PUT, OPTIONS, PATCH"));
    headers.insert("access-control-allow-headers", value("Content-Type, Authorization"));
    headers.insert("access-control-allow-credentials", value("true"));
    response
}
