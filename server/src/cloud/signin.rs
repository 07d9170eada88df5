//! The pages the cloud runtime adds to the frontend: the sign-in page at `/login` (a small form that posts to
//! `POST /api/auth/session`, then goes to `?next=`, a path on this server, or the frontend at `/`; `GET /`
//! without a session is sent there first), and `/kiln-cloud.js`, a script put into the frontend's `index.html`
//! that sends the session's CSRF token (from `GET /api/auth/session`) as `X-CSRF-Token` with the frontend's
//! same-origin writes, so the unmodified ComfyUI frontend works behind the cloud runtime's CSRF rule.

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in · Kiln</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font-family:system-ui,sans-serif;background:#202020;color:#eee;display:grid;place-items:center;
min-height:100vh;margin:0}form{background:#2b2b2b;padding:2rem;border-radius:8px;display:grid;gap:.75rem;
min-width:18rem}input,button{font:inherit;padding:.5rem;border-radius:4px;border:1px solid #555}
button{background:#3a6ea5;color:#fff;border:0;cursor:pointer}#error{color:#ff8080;min-height:1.2em}</style>
</head><body><form id="signin"><h1>Kiln</h1>
<label>User name <input name="username" autocomplete="username" required></label>
<label>Password <input name="password" type="password" autocomplete="current-password" required></label>
<button type="submit">Sign in</button><div id="error" role="alert"></div></form>
<script src="/login.js"></script></body></html>
"#;

const SCRIPT: &str = r#"document.getElementById('signin').addEventListener('submit', async (event) => {
  event.preventDefault();
  const form = new FormData(event.target);
  const answer = await fetch('/api/auth/session', {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({username: form.get('username'), password: form.get('password')}),
  });
  if (answer.ok) {
    // Only a page of this server: whatever `next` says, the browser stays on this origin.
    const next = new URL(new URLSearchParams(location.search).get('next') || '/', location.origin);
    location.assign(next.origin === location.origin ? next.pathname + next.search + next.hash : '/');
  } else {
    const body = await answer.json().catch(() => ({}));
    document.getElementById('error').textContent = body.message || 'Sign-in failed';
  }
});
"#;

const CSRF_SHIM: &str = r#"// Kiln cloud runtime: sends the session's CSRF token with this page's same-origin writes.
(() => {
  let token = '';
  const ready = fetch('/api/auth/session', {credentials: 'same-origin'})
    .then((answer) => (answer.ok ? answer.json() : {}))
    .then((session) => { token = session.csrf_token || ''; })
    .catch(() => {});
  const isWrite = (method) => !['GET', 'HEAD', 'OPTIONS'].includes(String(method || 'GET').toUpperCase());
  const sameOrigin = (url) => new URL(url, location.href).origin === location.origin;
  const fetchOriginal = window.fetch.bind(window);
  window.fetch = async (input, init = {}) => {
    const request = input instanceof Request ? input : null;
    const method = init.method || (request ? request.method : 'GET');
    const url = request ? request.url : String(input);
    if (!isWrite(method) || !sameOrigin(url)) return fetchOriginal(input, init);
    await ready;
    const headers = new Headers(init.headers || (request ? request.headers : undefined));
    headers.set('X-CSRF-Token', token);
    return fetchOriginal(input, {...init, headers});
  };
  const open = XMLHttpRequest.prototype.open;
  const send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url, ...rest) {
    this.kilnWrite = isWrite(method) && sameOrigin(url);
    return open.call(this, method, url, ...rest);
  };
  XMLHttpRequest.prototype.send = function (body) {
    if (this.kilnWrite) this.setRequestHeader('X-CSRF-Token', token);
    return send.call(this, body);
  };
})();
"#;

/// The tag that loads [`CSRF_SHIM`], put into `index.html` before the frontend's own scripts.
const SHIM_TAG: &str = "<script src=\"/kiln-cloud.js\"></script>";

/// A static page or script with the headers every page of the cloud runtime carries (no caching, no framing).
pub(crate) fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    forbid_framing(headers);
    response
}

/// The headers of the cloud runtime's own pages (sign-in, consent): no framing by other sites (clickjacking),
/// scripts and everything else only from this server, no referrer leaving it.
pub(crate) fn forbid_framing(headers: &mut axum::http::HeaderMap) {
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
}

/// The `/login` page and its script.
pub(crate) fn routes() -> Router {
    Router::new()
        .route("/login", get(|| async { page("text/html; charset=utf-8", PAGE) }))
        .route("/login.js", get(|| async { page("text/javascript; charset=utf-8", SCRIPT) }))
        .route(
            "/kiln-cloud.js",
            get(|| async { page("text/javascript; charset=utf-8", CSRF_SHIM) }),
        )
}

/// The frontend's `index.html` with the CSRF script put first into its `<head>` (other answers unchanged).
pub(crate) async fn with_csrf_shim(request: Request, next: Next) -> Response {
    let is_index = matches!(request.uri().path(), "/" | "/index.html");
    let response = next.run(request).await;
    let html = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/html"));
    if !(is_index && html && response.status().is_success()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, INDEX_LIMIT).await else {
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    let page = String::from_utf8_lossy(&bytes);
    let page = match page.find("<head>") {
        Some(at) => {
            format!("{}{SHIM_TAG}{}", &page[..at + "<head>".len()], &page[at + "<head>".len()..])
        }
        None => format!("{SHIM_TAG}{page}"),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(page))
}

/// The largest `index.html` the script is put into.
const INDEX_LIMIT: usize = 4 * 1024 * 1024;

/// Where a browser without a session that asks for the frontend goes.
pub(crate) fn to_sign_in() -> Response {
    Redirect::to("/login").into_response()
}
