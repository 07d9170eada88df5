//! The HTTP client the S3 store talks through: hyper with rustls on ring and the system's root certificates, as
//! the frontend download uses (object_store's own reqwest client would build aws-lc, or need a process-wide
//! rustls provider that every other reqwest client of the workspace would then depend on).

use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use object_store::client::{
    ClientOptions, HttpClient, HttpError, HttpErrorKind, HttpRequest, HttpRequestBody,
    HttpResponse, HttpResponseBody, HttpService,
};

/// How long a connection may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a request may wait for the response's head (object_store retries it after).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes [`HyperService`] clients for object_store.
#[derive(Debug, Default)]
pub(super) struct HyperConnector;

impl object_store::client::HttpConnector for HyperConnector {
    fn connect(&self, _: &ClientOptions) -> object_store::Result<HttpClient> {
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let https = HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(Arc::new(rustls::crypto::ring::default_provider()))
            .map_err(|e| object_store::Error::Generic { store: "S3", source: Box::new(e) })?
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(HttpClient::new(HyperService(Client::builder(TokioExecutor::new()).build(https))))
    }
}

/// object_store's requests on a hyper client.
#[derive(Debug)]
struct HyperService(Client<HttpsConnector<HttpConnector>, HttpRequestBody>);

#[async_trait::async_trait]
impl HttpService for HyperService {
    async fn call(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let response = tokio::time::timeout(RESPONSE_TIMEOUT, self.0.request(request))
            .await
            .map_err(|e| HttpError::new(HttpErrorKind::Timeout, e))?
            .map_err(|e| {
                let kind =
                    if e.is_connect() { HttpErrorKind::Connect } else { HttpErrorKind::Request };
                HttpError::new(kind, e)
            })?;
        let (parts, body) = response.into_parts();
        let body = body.map_err(|e| HttpError::new(HttpErrorKind::Interrupted, e));
        Ok(HttpResponse::from_parts(parts, HttpResponseBody::new(body)))
    }
}
