//! One HTTP(S) GET of a client metadata document, with Kiln's limits: no redirects, only 200, JSON only, a
//! capped body, and the cache lifetime the response asks for within Kiln's bounds.
//!
//! Invariant: the connection goes to one of the addresses the caller checked, written into the request URI as
//! an IP literal, so hyper-util's connector never resolves a name; TLS still verifies the certificate against
//! the URL's host (a fixed server name), and the `Host` header carries that host. At most `max_bytes` of body
//! are read.
//!
//! Why not a custom hyper-util resolver: `HttpConnector::new_with_resolver` wants a `tower_service::Service`,
//! and `tower-service` is not a direct dependency of the server; an IP-literal URI plus a fixed TLS server name
//! gives the same guarantee (one lookup, checked) with the crates already there.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::header::{ACCEPT, CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, HOST, USER_AGENT};
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_rustls::{
    ConfigBuilderExt as _, FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder,
};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use url::Position;

use super::target::{Target, TargetHost};
use super::{BoxError, CimdError, CimdPolicy};

/// A fetched body that passed the HTTP checks, and how long it may be cached.
pub(super) struct Fetched {
    /// The response body, at most `max_bytes` long.
    pub(super) body: Bytes,
    /// The cache lifetime from `Cache-Control`, clamped to the policy's bounds.
    pub(super) ttl: Duration,
}

/// The TLS client configuration, built on the first `https` fetch: rustls on ring with the system's roots.
#[derive(Default)]
pub(super) struct Tls {
    /// The configuration, or why it could not be built (no root certificates on this machine, say).
    native: OnceLock<Result<ClientConfig, String>>,
}

impl Tls {
    /// The configuration for `target`: the system roots for `https`, an empty root store for test-mode `http`
    /// (where TLS is never used).
    fn config(&self, target: &Target) -> Result<ClientConfig, BoxError> {
        let builder =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?;
        if !target.is_https() {
            return Ok(builder
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_no_client_auth());
        }
        let native = self.native.get_or_init(|| {
            builder.with_native_roots().map(|b| b.with_no_client_auth()).map_err(|e| e.to_string())
        });
        native.clone().map_err(BoxError::from)
    }
}

/// GETs the document of `target` from the first of `addresses` that accepts a connection.
pub(super) async fn fetch(
    target: &Target,
    addresses: &[SocketAddr],
    tls: &Tls,
    policy: &CimdPolicy,
) -> Result<Fetched, CimdError> {
    let host = target.host_str();
    let failed =
        |source: BoxError| CimdError::Fetch { host: host.to_owned(), source: Some(source) };
    let client = client(target, tls.config(target).map_err(failed)?, policy).map_err(failed)?;
    let mut last_connect_error = None;
    for &address in addresses {
        match client.request(request(target, address).map_err(failed)?).await {
            Ok(response) => return read(response, host, policy).await,
            // Another checked address of the same host may answer.
            Err(error) if error.is_connect() => last_connect_error = Some(error),
            Err(error) => return Err(failed(error.into())),
        }
    }
    Err(CimdError::Fetch { host: host.to_owned(), source: last_connect_error.map(BoxError::from) })
}

/// An HTTP/1.1 client whose TLS verifies the certificate against the URL's host, without a connection pool.
fn client(
    target: &Target,
    config: ClientConfig,
    policy: &CimdPolicy,
) -> Result<Client<HttpsConnector<HttpConnector>, Empty<Bytes>>, BoxError> {
    let server_name = match &target.host {
        TargetHost::Name(name) => ServerName::try_from(name.clone())?,
        TargetHost::Ip(ip) => ServerName::from(*ip),
    };
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_connect_timeout(Some(policy.timeout));
    let builder = HttpsConnectorBuilder::new().with_tls_config(config);
    let builder = if target.is_https() { builder.https_only() } else { builder.https_or_http() };
    let connector = builder
        .with_server_name_resolver(FixedServerNameResolver::new(server_name))
        .enable_http1()
        .wrap_connector(http);
    Ok(Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector))
}

/// The GET for `target`'s path sent to `address`, with the URL's host in `Host`.
fn request(target: &Target, address: SocketAddr) -> Result<Request<Empty<Bytes>>, BoxError> {
    let uri = format!("{}://{address}{}", target.url.scheme(), target.url.path());
    let host = &target.url[Position::BeforeHost..Position::AfterPort];
    let user_agent =
        concat!("kiln/", env!("CARGO_PKG_VERSION"), " (client metadata document fetcher)");
    Ok(Request::get(uri)
        .header(HOST, host)
        .header(ACCEPT, "application/json")
        .header(USER_AGENT, user_agent)
        .body(Empty::new())?)
}

/// Checks the status and headers of `response` and reads at most `policy.max_bytes` of its body.
async fn read<B>(
    response: Response<B>,
    host: &str,
    policy: &CimdPolicy,
) -> Result<Fetched, CimdError>
where
    B: axum::body::HttpBody<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let status = response.status();
    if status.is_redirection() {
        return Err(CimdError::Redirect { host: host.to_owned(), status: status.as_u16() });
    }
    if status != StatusCode::OK {
        return Err(CimdError::Status { host: host.to_owned(), status: status.as_u16() });
    }
    if !response.headers().get(CONTENT_TYPE).is_some_and(is_json) {
        return Err(CimdError::NotJson { host: host.to_owned() });
    }
    let too_large = || CimdError::TooLarge { host: host.to_owned(), max_bytes: policy.max_bytes };
    let declared_length =
        response.headers().get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    if declared_length.is_some_and(|length: usize| length > policy.max_bytes) {
        return Err(too_large());
    }
    let ttl = cache_ttl(response.headers(), policy);
    let mut body = std::pin::pin!(response.into_body());
    let mut read = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| CimdError::Fetch { host: host.to_owned(), source: Some(e.into()) })?;
        let Ok(chunk) = frame.into_data() else { continue };
        if read.len() + chunk.len() > policy.max_bytes {
            // Dropping the body closes the connection; the rest is never read.
            return Err(too_large());
        }
        read.extend_from_slice(&chunk);
    }
    Ok(Fetched { body: Bytes::from(read), ttl })
}

/// Whether a `Content-Type` is JSON: `application/json` or `application/<something>+json`, any parameters.
fn is_json(value: &HeaderValue) -> bool {
    let Ok(value) = value.to_str() else { return false };
    let media_type = value.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    media_type == "application/json"
        || (media_type.starts_with("application/") && media_type.ends_with("+json"))
}

/// How long a document may be cached: `Cache-Control: max-age`, clamped to `[min_ttl, max_ttl]`; `no-store`,
/// `no-cache` or no `max-age` → `min_ttl` (Kiln never refetches on every request: the minimum bounds the load a
/// busy authorization endpoint puts on the client's host).
pub(super) fn cache_ttl(headers: &HeaderMap, policy: &CimdPolicy) -> Duration {
    let mut max_age = None;
    for directive in headers
        .get_all(CACHE_CONTROL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
    {
        let directive = directive.trim().to_ascii_lowercase();
        if directive == "no-store" || directive == "no-cache" {
            return policy.min_ttl;
        }
        if let Some(seconds) = directive.strip_prefix("max-age=") {
            max_age = max_age.or_else(|| seconds.trim_matches('"').parse::<u64>().ok());
        }
    }
    max_age.map_or(policy.min_ttl, |seconds| {
        Duration::from_secs(seconds).clamp(policy.min_ttl, policy.max_ttl)
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use axum::http::header::{CACHE_CONTROL, HeaderValue};
    use axum::http::{HeaderMap, header::CONTENT_TYPE};

    use super::{cache_ttl, is_json};
    use crate::oauth::cimd::CimdPolicy;

    /// The cache lifetime for the given `Cache-Control` header values under the default policy.
    fn ttl(values: &[&str]) -> Duration {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append(CACHE_CONTROL, HeaderValue::from_str(value).expect("header value"));
        }
        cache_ttl(&headers, &CimdPolicy::default())
    }

    #[test]
    fn max_age_is_clamped_to_the_policy_bounds() {
        const MINUTE: u64 = 60;
        assert_eq!(ttl(&[]), Duration::from_secs(5 * MINUTE));
        assert_eq!(ttl(&["max-age=60"]), Duration::from_secs(5 * MINUTE));
        assert_eq!(ttl(&["public, max-age=3600"]), Duration::from_secs(60 * MINUTE));
        assert_eq!(ttl(&["max-age=\"7200\""]), Duration::from_secs(120 * MINUTE));
        assert_eq!(ttl(&["Max-Age=999999999"]), Duration::from_secs(24 * 60 * MINUTE));
        assert_eq!(ttl(&["max-age=3600, no-store"]), Duration::from_secs(5 * MINUTE));
        assert_eq!(ttl(&["public", "no-cache"]), Duration::from_secs(5 * MINUTE));
        assert_eq!(ttl(&["max-age=soon"]), Duration::from_secs(5 * MINUTE));
    }

    #[test]
    fn only_json_media_types_count() {
        let mut headers = HeaderMap::new();
        for (value, json) in [
            ("application/json", true),
            ("application/json; charset=utf-8", true),
            ("Application/JSON", true),
            ("application/oauth-client+json", true),
            ("text/html", false),
            ("text/plain; charset=utf-8", false),
            ("application/jsonp", false),
            ("text/json+html", false),
        ] {
            headers.insert(CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(headers.get(CONTENT_TYPE).is_some_and(is_json), json, "{value}");
        }
    }
}
