//! What the layers in front of the handlers share: the operation a matched route serves (from the generated
//! `OPERATIONS`, so no route is listed by hand) and their refusals (an `ErrorResponse` with `no-store`).

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use kiln_spec::types;

use super::{OPERATIONS, OperationInfo};

/// The spec's operation for a method and a matched route (a bare alias `/X` is `/api/X`; `HEAD` is `GET`).
pub fn operation(method: &Method, route: &str) -> Option<&'static OperationInfo> {
    let method = if method == Method::HEAD { "GET" } else { method.as_str() };
    let find = |path: &str| OPERATIONS.iter().find(|op| op.method == method && op.path == path);
    find(route).or_else(|| find(&format!("/api{route}"))).or_else(|| match route {
        "/api/ws" => find("/ws"),
        _ => None,
    })
}

/// The token of an `Authorization: Bearer` header, if there is one.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token.trim())
}

/// A refusal: status, a stable code and a message, `no-store`, and for 401 the challenge.
pub fn refuse(status: StatusCode, code: &str, message: &str) -> Response {
    let body =
        types::ErrorResponse { code: code.to_owned(), details: None, message: message.to_owned() };
    let mut response = (status, axum::Json(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if status == StatusCode::UNAUTHORIZED {
        headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer realm=\"kiln\""));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_their_operations() {
        let op = |m: Method, r: &str| operation(&m, r).map(|o| o.id);
        assert_eq!(op(Method::GET, "/prompt"), Some("getPromptInfo"));
        assert_eq!(op(Method::POST, "/api/prompt"), Some("executePrompt"));
        assert_eq!(op(Method::HEAD, "/api/queue"), Some("getQueue"));
        assert_eq!(op(Method::GET, "/api/ws"), Some("webSocketConnect"));
        assert_eq!(op(Method::POST, "/api/auth/session"), Some("createSession"));
        assert!(operation(&Method::GET, "/api/auth/session").is_some_and(|o| !o.is_public()));
        assert!(operation(&Method::GET, "/.well-known/jwks.json").is_some_and(|o| o.is_public()));
        assert_eq!(op(Method::GET, "/nothing"), None);
    }
}
