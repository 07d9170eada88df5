//! The hand-written runtime of the generated server code (`generated.rs`): parsing bodies and queries the way
//! ComfyUI's clients send them, answering unparseable input with the operation's declared 400 body, and
//! building responses.
//!
//! Invariant: JSON bodies are parsed whatever the `Content-Type` says. ComfyUI's clients send none, or
//! `application/x-www-form-urlencoded` for JSON; a strict extractor would answer 415 and break them.

use std::fmt::Display;

use axum::extract::multipart::MultipartRejection;
use axum::extract::rejection::PathRejection;
use axum::http::StatusCode;
use axum::http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use kiln_spec::types;
use serde::de::DeserializeOwned;

use super::strict;

/// Which API surface a router mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    /// The single-user server, ComfyUI's local API.
    Local,
    /// The multi-user server with accounts and OAuth.
    Cloud,
}

impl Runtime {
    /// The name used in the spec's `x-runtime`.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Local => "local",
            Runtime::Cloud => "cloud",
        }
    }

    /// Whether an operation with these `x-runtime` values is mounted in this runtime.
    pub fn is_in(self, runtimes: &[&str]) -> bool {
        runtimes.contains(&self.name())
    }
}

/// An operation of the spec, as listed in `OPERATIONS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperationInfo {
    /// The operationId.
    pub id: &'static str,
    /// The HTTP method, upper case.
    pub method: &'static str,
    /// The path as written in the spec.
    pub path: &'static str,
    /// The runtimes that mount it.
    pub runtimes: &'static [&'static str],
    /// Who may call it on the cloud runtime: alternatives, each the security schemes (`ApiKeyAuth`,
    /// `BearerAuth`, `WebSessionAuth`) that must all be satisfied. No alternative, or an empty one: anyone.
    pub security: &'static [&'static [&'static str]],
}

impl OperationInfo {
    /// Whether anyone may call it, without credentials.
    pub fn is_public(&self) -> bool {
        self.security.is_empty() || self.security.iter().any(|schemes| schemes.is_empty())
    }
}

/// A response body of bytes with its content type (files, previews).
#[derive(Debug, Clone)]
pub struct Binary {
    /// The `Content-Type` to send.
    pub content_type: String,
    /// The bytes.
    pub bytes: Bytes,
}

impl Binary {
    /// Builds the response with a status.
    pub fn into_response_with(self, status: StatusCode) -> Response {
        let content_type = HeaderValue::from_str(&self.content_type)
            .unwrap_or(HeaderValue::from_static("application/octet-stream"));
        (status, [(CONTENT_TYPE, content_type)], self.bytes).into_response()
    }
}

/// Why a request's input could not be parsed: a message naming the problem and the parser's detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// What is wrong, for people.
    pub message: String,
    /// The parser's own words (position of a JSON error, the offending field).
    pub details: String,
}

impl Problem {
    fn new(message: impl Into<String>, details: impl Display) -> Problem {
        Problem { message: message.into(), details: details.to_string() }
    }

    /// A path parameter that does not parse.
    pub fn path(rejection: PathRejection) -> Problem {
        Problem::new("invalid path parameter", rejection.body_text())
    }

    /// A body that is not multipart/form-data.
    pub fn multipart(rejection: MultipartRejection) -> Problem {
        Problem::new("the body must be multipart/form-data", rejection.body_text())
    }

    /// A required header that is missing.
    pub fn missing_header(name: &str) -> Problem {
        Problem::new(format!("missing header {name}"), "")
    }
}

/// An error body the generated code can build from a [`Problem`]: the 400 body of operations whose input
/// can fail to parse. An error schema used for such a 400 must implement it, or the server does not compile.
pub trait RejectionBody: serde::Serialize {
    /// The body answering `problem`.
    fn rejection(problem: Problem) -> Self;
}

impl RejectionBody for types::ErrorResponse {
    fn rejection(problem: Problem) -> Self {
        types::ErrorResponse {
            code: "invalid_request".to_owned(),
            details: (!problem.details.is_empty()).then_some(problem.details),
            message: problem.message,
        }
    }
}

impl RejectionBody for types::SimpleError {
    /// ComfyUI's jobs routes answer a sentence (`{"error": "limit must be an integer"}`): the message alone.
    fn rejection(problem: Problem) -> Self {
        types::SimpleError { error: problem.message, invalid_ids: Vec::new() }
    }
}

impl RejectionBody for types::PromptErrorResponse {
    fn rejection(problem: Problem) -> Self {
        types::PromptErrorResponse {
            error: types::PromptError {
                details: problem.details,
                extra_info: serde_json::Map::new(),
                message: problem.message,
                type_: "invalid_prompt".to_owned(),
            },
            node_errors: Default::default(),
        }
    }
}

impl RejectionBody for types::OAuthTokenError {
    fn rejection(problem: Problem) -> Self {
        types::OAuthTokenError {
            error: types::OAuthTokenErrorCode::InvalidRequest,
            error_description: Some(ascii(&format!("{}: {}", problem.message, problem.details))),
            error_uri: None,
        }
    }
}

impl RejectionBody for types::OAuthRegisterError {
    fn rejection(problem: Problem) -> Self {
        types::OAuthRegisterError {
            error: "invalid_client_metadata".to_owned(),
            error_description: Some(ascii(&format!("{}: {}", problem.message, problem.details))),
        }
    }
}

/// OAuth error descriptions must be ASCII (RFC 6749 §5.2).
fn ascii(text: &str) -> String {
    text.chars().map(|c| if c.is_ascii() && !c.is_ascii_control() { c } else { '?' }).collect()
}

/// Answers a 400 with the operation's JSON error body.
pub(super) fn reject_json<T: RejectionBody>(problem: Problem) -> Response {
    json(StatusCode::BAD_REQUEST, &T::rejection(problem))
}

/// Answers a 400 with a plain-text message.
pub(super) fn reject_text(problem: Problem) -> Response {
    let message = if problem.details.is_empty() {
        problem.message
    } else {
        format!("{}: {}", problem.message, problem.details)
    };
    text(StatusCode::BAD_REQUEST, message)
}

/// Answers a 400 without a body (the operation declares none, as ComfyUI sends none).
pub(super) fn reject_empty(problem: Problem) -> Response {
    tracing::debug!(message = %problem.message, details = %problem.details, "rejected request");
    StatusCode::BAD_REQUEST.into_response()
}

/// Writes whole floats as integers (`28.0` → `28`), as Python's JSON does for ComfyUI's integer queue
/// numbers; the spec's `number` fields are floats in Rust, and JSON clients cannot tell the two apart anyway.
pub(crate) fn integral_floats_as_ints(value: serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => match n.as_f64() {
            Some(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => {
            Value::Array(items.into_iter().map(integral_floats_as_ints).collect())
        }
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, integral_floats_as_ints(v))).collect())
        }
        other => other,
    }
}

/// A JSON response, with the content type ComfyUI sends.
pub(super) fn json<T: serde::Serialize>(status: StatusCode, body: &T) -> Response {
    match serde_json::to_value(body)
        .map(integral_floats_as_ints)
        .and_then(|v| serde_json::to_vec(&v))
    {
        Ok(bytes) => (
            status,
            [(CONTENT_TYPE, HeaderValue::from_static("application/json; charset=utf-8"))],
            bytes,
        )
            .into_response(),
        Err(error) => {
            tracing::error!(%error, "a response body did not serialize");
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

/// A plain-text response.
pub(super) fn text(status: StatusCode, body: String) -> Response {
    (status, [(CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"))], body)
        .into_response()
}

/// Sets a declared response header when the implementation gave a value that is a valid header value.
pub(super) fn set_header<T: Display>(
    response: &mut Response,
    name: &'static str,
    value: Option<T>,
) {
    let Some(value) = value else { return };
    match (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(&value.to_string())) {
        (Ok(name), Ok(value)) => {
            response.headers_mut().insert(name, value);
        }
        _ => tracing::error!(header = name, "an invalid header was not sent"),
    }
}

/// A request header as a string (absent or not UTF-8: `None`).
pub(super) fn header(parts: &Parts, name: &str) -> Option<String> {
    parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Parses the query string into `T`. A key given twice counts once, with its first value (as aiohttp's
/// `query.get` does for ComfyUI).
pub(super) fn query<T: DeserializeOwned>(parts: &Parts) -> Result<T, Problem> {
    let raw = parts.uri.query().unwrap_or("");
    let mut first: Vec<(String, String)> = Vec::new();
    for (key, value) in form_urlencoded::parse(raw.as_bytes()) {
        if !first.iter().any(|(k, _)| *k == key) {
            first.push((key.into_owned(), value.into_owned()));
        }
    }
    let canonical = form_urlencoded::Serializer::new(String::new()).extend_pairs(&first).finish();
    let deserializer =
        serde_urlencoded::Deserializer::new(form_urlencoded::parse(canonical.as_bytes()));
    serde_path_to_error::deserialize(deserializer).map_err(|e| {
        let words = e.inner().to_string();
        let message = match e.path().to_string().as_str() {
            "." => "invalid query string".to_owned(),
            // ComfyUI's words for a number that does not parse (`limit must be an integer`).
            field if INTEGER_ERRORS.contains(&words.as_str()) => {
                format!("{field} must be an integer")
            }
            field if words == "invalid float literal" => format!("{field} must be a number"),
            field => format!("invalid query parameter `{field}`"),
        };
        Problem::new(message, words)
    })
}

/// What `str::parse` says of a string that is not an integer of the type asked for.
const INTEGER_ERRORS: [&str; 4] = [
    "invalid digit found in string",
    "cannot parse integer from empty string",
    "number too large to fit in target type",
    "number too small to fit in target type",
];

/// Parses a required JSON body, whatever the `Content-Type` says; a JSON array is never taken for an object
/// (see `strict.rs`).
pub(super) fn json_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, Problem> {
    if body.is_empty() {
        return Err(Problem::new("the request body is empty; a JSON body is required", ""));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| Problem::new("the request body is not valid JSON", e))?;
    strict::from_value(&value).map_err(|e| {
        Problem::new(format!("the request body has a bad value at `{}`", e.path), e.error)
    })
}

/// Parses an optional JSON body: no body (or only white space) is absent; anything else must be JSON of the
/// shape. ComfyUI takes a `/interrupt` body it cannot decode for `{}`, which would stop whatever runs where
/// the client meant one prompt: Kiln refuses it instead.
pub(super) fn optional_json_body<T: DeserializeOwned>(body: &Bytes) -> Result<Option<T>, Problem> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    json_body(body).map(Some)
}

/// Parses an `application/x-www-form-urlencoded` body, whatever the `Content-Type` says.
pub(super) fn form_body<T: DeserializeOwned>(body: &Bytes) -> Result<T, Problem> {
    serde_urlencoded::from_bytes(body)
        .map_err(|e| Problem::new("the form body does not have the expected fields", e))
}
