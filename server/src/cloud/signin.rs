//! The sign-in page the cloud runtime serves at `/login`: a small form that posts to `POST /api/auth/session`
//! and then goes to the page it was sent from (`?next=`, a path on this server) or the frontend at `/`.
//! `GET /` without a session is sent here first.

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
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
    const next = new URLSearchParams(location.search).get('next') || '/';
    location.assign(next.startsWith('/') && !next.startsWith('//') ? next : '/');
  } else {
    const body = await answer.json().catch(() => ({}));
    document.getElementById('error').textContent = body.message || 'Sign-in failed';
  }
});
"#;

fn page(content_type: &'static str, body: &'static str) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; style-src 'unsafe-inline'; frame-ancestors 'none'",
        ),
    );
    response
}

/// The `/login` page and its script.
pub(crate) fn routes() -> Router {
    Router::new()
        .route("/login", get(|| async { page("text/html; charset=utf-8", PAGE) }))
        .route("/login.js", get(|| async { page("text/javascript; charset=utf-8", SCRIPT) }))
}

/// Where a browser without a session that asks for the frontend goes.
pub(crate) fn to_sign_in() -> Response {
    Redirect::to("/login").into_response()
}
