//! The local runtime's optional token mode (`--api-key-file`): every API operation requires the configured key,
//! as `X-API-Key` or `Authorization: Bearer`, so a server reachable from a network is not open to it. The
//! frontend's static files stay public (they hold no data); a browser cannot send the key, so token mode is for
//! scripts and API clients.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::Response;
use sha2::{Digest, Sha256};

use crate::api::{bearer, operation, refuse};

/// Whether `presented` is `key`, compared through their SHA-256 digests (no early exit on the key's bytes).
fn same_key(key: &str, presented: &str) -> bool {
    let (a, b) = (Sha256::digest(key.as_bytes()), Sha256::digest(presented.as_bytes()));
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The layer: API operations answer 401 unless the request carries the key.
pub(crate) async fn require(key: Arc<String>, request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    if route.as_deref().and_then(|r| operation(request.method(), r)).is_none() {
        return next.run(request).await;
    }
    let headers = request.headers();
    let presented = headers.get("x-api-key").and_then(|v| v.to_str().ok()).or(bearer(headers));
    match presented {
        Some(presented) if same_key(&key, presented) => next.run(request).await,
        _ => refuse(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "this server requires its API key (X-API-Key or Authorization: Bearer)",
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_the_key_itself_matches() {
        assert!(super::same_key("0123456789abcdef", "0123456789abcdef"));
        assert!(!super::same_key("0123456789abcdef", "0123456789abcdeF"));
        assert!(!super::same_key("0123456789abcdef", ""));
    }
}
