//! Prompt numbers as ComfyUI gives them: its `post_prompt` takes the next number from its counter for every
//! request whose JSON body has no `number`, before anything else is checked, so a rejected prompt uses one
//! too (and `front` negates it). `execute_prompt` takes the number itself ([`take`]); [`count_rejected`]
//! takes one for the requests the generated handler rejects before `execute_prompt` runs (a body whose
//! fields do not have the spec's types).
//!
//! Invariant: each `POST /prompt` takes at most one number, and takes one exactly when ComfyUI would.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::body::Body;
use axum::extract::{FromRequest as _, Request, State};
use axum::http::Method;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse as _, Response};
use bytes::Bytes;
use kiln_engine::queue::Placement;
use serde_json::Value;

use super::worker::Service;

/// Set on a `POST /prompt` request once its number is taken.
#[derive(Clone, Default)]
pub(crate) struct Numbered(Arc<AtomicBool>);

/// Takes the number of a prompt request (the client's, or the counter's) and records that it was taken.
pub(crate) async fn take(
    runtime: &Service,
    parts: &Parts,
    placement: Placement,
) -> Result<f64, sqlx::Error> {
    if let Some(numbered) = parts.extensions.get::<Numbered>() {
        numbered.0.store(true, Ordering::SeqCst);
    }
    take_number(runtime, placement).await
}

/// The next number: from this server's counter (stored without waiting), or from a cluster's shared one.
async fn take_number(runtime: &Service, placement: Placement) -> Result<f64, sqlx::Error> {
    if let Some(cluster) = &runtime.cluster {
        return cluster.take_number(placement).await;
    }
    let number = runtime.queue.take_number(placement);
    if !matches!(placement, Placement::Number(_)) {
        runtime.storage.note_counter(runtime.queue.counter());
    }
    Ok(number)
}

/// Whether ComfyUI's `post_prompt` takes a number from its counter for this body: a JSON object without a
/// `number` key, or (Python's `in` on other types) a list without the element `"number"` or a string without
/// the substring `number`. A body that is not JSON, or a JSON scalar, fails before the counter.
fn takes_number(body: &[u8]) -> bool {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(fields)) => !fields.contains_key("number"),
        Ok(Value::Array(items)) => !items.iter().any(|item| item == "number"),
        Ok(Value::String(text)) => !text.contains("number"),
        Ok(_) | Err(_) => false,
    }
}

/// Middleware on `POST /prompt` (and `/api/prompt`): if the request was answered without `execute_prompt`
/// taking a number, takes the one ComfyUI would have taken. Must sit inside the body limit layer, whose limit
/// it reads the body under.
pub(crate) async fn count_rejected(
    State(runtime): State<Arc<Service>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    if request.method() != Method::POST || !(path == "/prompt" || path == "/api/prompt") {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match Bytes::from_request(Request::from_parts(parts.clone(), body), &()).await {
        Ok(bytes) => bytes,
        Err(rejection) => return rejection.into_response(),
    };
    let numbered = Numbered::default();
    let mut request = Request::from_parts(parts, Body::from(bytes.clone()));
    request.extensions_mut().insert(numbered.clone());
    let response = next.run(request).await;
    if !numbered.0.load(Ordering::SeqCst)
        && takes_number(&bytes)
        && let Err(error) = take_number(&runtime, Placement::Back).await
    {
        tracing::warn!(%error, "cannot take the number of a rejected prompt request");
    }
    response
}

#[cfg(test)]
mod tests {
    use super::takes_number;

    #[test]
    fn the_counter_moves_where_comfyuis_post_prompt_moves_it() {
        for (body, takes) in [
            (r#"{"prompt": [1, 2]}"#, true),
            (r#"{}"#, true),
            (r#"{"prompt": {}, "front": "yes"}"#, true),
            (r#"{"prompt": {}, "number": "soon"}"#, false),
            (r#"{"number": null}"#, false),
            (r#"["prompt"]"#, true),
            (r#"["number"]"#, false),
            (r#""a string""#, true),
            (r#""numbers""#, false),
            ("5", false),
            ("null", false),
            ("{not json", false),
            ("", false),
        ] {
            assert_eq!(takes_number(body.as_bytes()), takes, "{body}");
        }
    }
}
