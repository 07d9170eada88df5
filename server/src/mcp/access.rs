//! What `/mcp` checks before rmcp sees a request, and the answers it gives when a check fails: the `Origin`,
//! the scopes a JSON-RPC body needs, and Kiln's JSON error shape for everything `/mcp` refuses (rmcp's own
//! plain-text refusals included, so every error answer of `/mcp` is JSON).

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::Value;

use super::{SCOPE_READ, SCOPE_RUN, SCOPES};

/// The tool that needs [`SCOPE_RUN`]; every other tool needs [`SCOPE_READ`].
const RUN_TOOL: &str = "queue_prompt";

/// Why a request to `/mcp` is refused before rmcp sees it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refusal {
    /// No principal where one is required.
    #[error(
        "this endpoint needs an access token (Authorization: Bearer) or an API key (X-API-Key)"
    )]
    Unauthenticated,
    /// A present `Origin` that is not allowed.
    #[error("requests from the origin `{0}` are not allowed")]
    Origin(String),
    /// The principal lacks a scope the request needs.
    #[error("this request needs the scope(s) {}", .0.join(" "))]
    Scope(Vec<&'static str>),
    /// The `Mcp-Session-Id` is unknown to the caller (another user's, closed, or never created).
    #[error("no such MCP session; start a new one with initialize")]
    Session,
    /// The body is larger than the cap.
    #[error("the request body exceeds {0} bytes")]
    TooLarge(usize),
    /// The body could not be read.
    #[error("cannot read the request body: {0}")]
    Unreadable(String),
}

impl Refusal {
    /// The answer: Kiln's `{code, message}` JSON with the status and, for 401 and 403 scope refusals, the
    /// `WWW-Authenticate` challenge (naming `resource_metadata` when configured).
    pub(crate) fn response(&self, resource_metadata: Option<&str>) -> Response {
        let (status, code) = match self {
            Refusal::Unauthenticated => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Refusal::Origin(_) => (StatusCode::FORBIDDEN, "origin_not_allowed"),
            Refusal::Scope(_) => (StatusCode::FORBIDDEN, "insufficient_scope"),
            Refusal::Session => (StatusCode::NOT_FOUND, "session_not_found"),
            Refusal::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            Refusal::Unreadable(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
        };
        let mut response = crate::api::refuse(status, code, &self.to_string());
        let challenge = match self {
            Refusal::Unauthenticated => Some(challenge(None, &SCOPES, resource_metadata)),
            // The whole set, not only what was missing: a client that re-authorizes with it gets every tool
            // at once (TS SDK v1 step-up otherwise dead-ends, oauth.md §1.9); the message names what is missing.
            Refusal::Scope(_) => {
                Some(challenge(Some("insufficient_scope"), &SCOPES, resource_metadata))
            }
            _ => None,
        };
        let headers = response.headers_mut();
        headers.remove(header::WWW_AUTHENTICATE);
        if let Some(value) = challenge.and_then(|c| HeaderValue::from_str(&c).ok()) {
            headers.insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

/// A `Bearer` challenge (RFC 6750 §3, RFC 9728 §5.1).
pub(crate) fn challenge(
    error: Option<&str>,
    scopes: &[&str],
    resource_metadata: Option<&str>,
) -> String {
    let scope = format!("scope=\"{}\"", scopes.join(" "));
    let metadata = resource_metadata.map(|url| format!("resource_metadata=\"{url}\""));
    // The orders of the wire contract: `resource_metadata, scope` on 401, `error, scope, resource_metadata` on
    // 403.
    let params: Vec<String> = match error {
        None => metadata.into_iter().chain([scope]).collect(),
        Some(error) => [format!("error=\"{error}\""), scope].into_iter().chain(metadata).collect(),
    };
    format!("Bearer {}", params.join(", "))
}

/// Whether a present `Origin` is one of `allowed` (same scheme, host and port; `null` only if listed).
pub(crate) fn origin_allowed(headers: &HeaderMap, allowed: &[String]) -> Result<(), Refusal> {
    let Some(origin) = headers.get(header::ORIGIN) else { return Ok(()) };
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    let tuple =
        |text: &str| url::Url::parse(text).ok().map(|u| u.origin()).filter(url::Origin::is_tuple);
    let requested = tuple(&origin);
    let listed = allowed.iter().any(|entry| {
        entry == &origin || requested.as_ref().is_some_and(|r| tuple(entry).as_ref() == Some(r))
    });
    if listed { Ok(()) } else { Err(Refusal::Origin(origin)) }
}

/// The scopes a JSON-RPC body (one message or a batch) needs, in [`SCOPES`] order: `tools/call` of
/// `queue_prompt` needs [`SCOPE_RUN`], any other `tools/call` [`SCOPE_READ`]; other methods need none beyond a
/// valid principal.
pub(crate) fn needed_scopes(body: &Value) -> Vec<&'static str> {
    let messages = match body {
        Value::Array(batch) => batch.iter().collect(),
        one => vec![one],
    };
    let mut needed = Vec::new();
    for message in messages {
        if message.get("method").and_then(Value::as_str) != Some("tools/call") {
            continue;
        }
        let tool = message.get("params").and_then(|p| p.get("name")).and_then(Value::as_str);
        needed.push(if tool == Some(RUN_TOOL) { SCOPE_RUN } else { SCOPE_READ });
    }
    SCOPES.into_iter().filter(|scope| needed.contains(scope)).collect()
}

/// The body of a plain-text refusal of rmcp, as Kiln's JSON error with the same status (and `Allow`).
pub(crate) fn as_json_error(
    status: StatusCode,
    allow: Option<HeaderValue>,
    text: &str,
) -> Response {
    let code = match status {
        StatusCode::BAD_REQUEST => "invalid_request",
        StatusCode::FORBIDDEN => "host_not_allowed",
        StatusCode::NOT_FOUND => "session_not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::NOT_ACCEPTABLE => "not_acceptable",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        _ if status.is_server_error() => "internal",
        _ => "invalid_request",
    };
    let mut response = crate::api::refuse(status, code, text.trim());
    if let Some(allow) = allow {
        response.headers_mut().insert(header::ALLOW, allow);
    }
    response
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn queue_prompt_needs_run_and_the_other_tools_read() {
        let call = |name: &str| json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name}});
        assert_eq!(needed_scopes(&call("queue_prompt")), vec![SCOPE_RUN]);
        assert_eq!(needed_scopes(&call("get_job")), vec![SCOPE_READ]);
        assert_eq!(
            needed_scopes(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})),
            Vec::<&str>::new()
        );
        let batch = json!([call("list_models"), call("queue_prompt")]);
        assert_eq!(
            needed_scopes(&batch),
            vec![SCOPE_READ, SCOPE_RUN],
            "every call of a batch counts"
        );
    }

    #[test]
    fn only_listed_origins_pass_and_absent_origins_pass() {
        let allowed = vec!["https://app.example".to_owned(), "http://127.0.0.1:8188".to_owned()];
        let with = |origin: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(header::ORIGIN, HeaderValue::from_str(origin).expect("header"));
            origin_allowed(&headers, &allowed).is_ok()
        };
        assert!(origin_allowed(&HeaderMap::new(), &allowed).is_ok());
        assert!(with("https://app.example"));
        assert!(with("https://APP.example:443"), "same origin, spelled differently");
        assert!(with("http://127.0.0.1:8188"));
        assert!(!with("http://127.0.0.1:9999"));
        assert!(!with("https://evil.example"));
        assert!(!with("null"));
        assert!(origin_allowed(&HeaderMap::new(), &[]).is_ok());
    }

    #[test]
    fn challenges_name_the_error_the_scopes_and_the_metadata() {
        let refused =
            Refusal::Scope(vec![SCOPE_RUN]).response(Some("https://k.example/.well-known/x"));
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            refused.headers()[header::WWW_AUTHENTICATE],
            "Bearer error=\"insufficient_scope\", scope=\"kiln:read kiln:run\", \
             resource_metadata=\"https://k.example/.well-known/x\""
        );
        let anonymous = Refusal::Unauthenticated.response(None);
        assert_eq!(
            anonymous.headers()[header::WWW_AUTHENTICATE],
            "Bearer scope=\"kiln:read kiln:run\""
        );
    }
}
