//! The server's integration tests: the router in memory, and the real `kiln` binary over TCP.

mod announce;
mod bad_input;
mod binary;
mod cloud;
mod cloud_isolation;
mod cluster;
mod durability;
mod end_to_end;
mod execution_errors;
mod frontend;
mod golden;
mod key_order;
mod media;
mod models;
mod numbers;
mod oauth;
mod openapi;
mod operations;
mod postgres;
mod sdk_credentials;
mod settings;
mod slow_client;
mod spec_agreement;
mod system_stats;
mod zimage;

/// Sends `request` to the server's router in memory; the answer, checked against the contract of `runtime`
/// (`local` or `cloud`).
pub(crate) async fn answer(
    server: &kiln_server::Server,
    runtime: &str,
    request: axum::http::Request<axum::body::Body>,
) -> (axum::http::StatusCode, axum::http::HeaderMap, Vec<u8>) {
    use http_body_util::BodyExt as _;
    use tower::ServiceExt as _;
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    let response = server.router().oneshot(request).await.expect("answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes().to_vec();
    kiln_tests::contract::Contract::assert_conforms_on(
        runtime,
        &kiln_tests::contract::Answer {
            method: method.as_str(),
            path: &path,
            status: parts.status.as_u16(),
            content_type: parts.headers.get("content-type").and_then(|v| v.to_str().ok()),
            body: &body,
        },
    );
    (parts.status, parts.headers, body)
}
