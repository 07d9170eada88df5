//! Serving the ComfyUI frontend (the pinned one from `frontend_package`, or `--front-end-root`) and ComfyUI's
//! `--enable-cors-header` mode.
//!
//! `/` answers `index.html` with ComfyUI's no-cache headers; other paths are the frontend's static files; an
//! unknown path is 404. Without a frontend, `/` is a 404 whose plain text says why and what to do. These are not
//! API operations, so they are not in the spec.

use std::path::Path;

use axum::Router;
use axum::extract::Request;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, EXPIRES, HeaderValue, PRAGMA};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::services::{ServeDir, ServeFile};

use crate::config::{Config, FrontEnd};
use crate::frontend_package::{self, FRONTEND_VERSION};

/// Adds the configured frontend to a router, installing the pinned one first if it is not cached yet, and says
/// which `comfyui-frontend-package` version it serves when that is known (not for a `--front-end-root`). A
/// frontend that cannot be had is reported in one line, and `/` says the same; the API is served either way.
pub(crate) async fn mount(router: Router, config: &Config) -> (Router, Option<&'static str>) {
    match &config.front_end {
        FrontEnd::Root(root) => (serve(router, root), None),
        FrontEnd::Pinned { wheel_url } => {
            let wheel = frontend_package::pinned_wheel(wheel_url);
            match frontend_package::ensure(&config.data_dir, &wheel, FRONTEND_VERSION).await {
                Ok(root) => (serve(router, &root), Some(FRONTEND_VERSION)),
                Err(error) => {
                    let advice = frontend_package::advice(&error);
                    tracing::warn!("{advice}");
                    (no_frontend(router, advice), None)
                }
            }
        }
        FrontEnd::Disabled => (
            no_frontend(
            router,
            "Kiln is running without a frontend (--disable-front-end); its API is at /api/. Start it without \
             that flag to serve the ComfyUI frontend here, or with --front-end-root DIR to serve your own build."
                    .to_owned(),
            ),
            None,
        ),
    }
}

/// Adds the frontend's files under `root` to a router: `/` is `index.html` without caching.
fn serve(router: Router, root: &Path) -> Router {
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

/// `/` without a frontend: a 404 whose plain text says why and how to get one.
fn no_frontend(router: Router, message: String) -> Router {
    let page = move || async move {
        let headers = [(CONTENT_TYPE, "text/plain; charset=utf-8")];
        (StatusCode::NOT_FOUND, headers, format!("{message}\n")).into_response()
    };
    router.route("/", axum::routing::get(page))
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
