//! The fetcher against a real HTTP server on `127.0.0.1:0` that serves a good document and each bad variant of
//! §5.10, counting the requests it sees (to prove caching, and that refused URLs make no connection).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HOST, LOCATION};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::resolver::Resolver;
use super::{CimdError, CimdPolicy, ClientMetadataDocuments, DocumentProblem, UrlProblem};

/// The local document server: its address and the requests it has seen, by path.
struct DocumentServer {
    /// Where it listens.
    address: SocketAddr,
    /// Requests seen, by path.
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl DocumentServer {
    /// Starts a server on `127.0.0.1:0`. `GET /{variant}` serves the document variant named by the path, with
    /// `client_id` = `http://<Host header>/<variant>` so the same route serves `127.0.0.1` and `localhost` URLs.
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("local address");
        let hits = Arc::new(Mutex::new(HashMap::new()));
        let app =
            Router::new().route("/{variant}", get(serve_variant)).with_state(Arc::clone(&hits));
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { address, hits }
    }

    /// The `http://127.0.0.1:<port>/<variant>` URL.
    fn url(&self, variant: &str) -> String {
        format!("http://{}/{variant}", self.address)
    }

    /// How many requests `/<variant>` has seen.
    fn hits(&self, variant: &str) -> usize {
        self.hits.lock().expect("hits").get(&format!("/{variant}")).copied().unwrap_or(0)
    }

    /// How many requests the server has seen in all.
    fn total_hits(&self) -> usize {
        self.hits.lock().expect("hits").values().sum()
    }
}

/// Serves the document variant `variant` (see the match arms).
async fn serve_variant(
    State(hits): State<Arc<Mutex<HashMap<String, usize>>>>,
    Path(variant): Path<String>,
    headers: HeaderMap,
) -> Response {
    *hits.lock().expect("hits").entry(format!("/{variant}")).or_default() += 1;
    let host = headers.get(HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let url = format!("http://{host}/{variant}");
    let mut document = json!({
        "client_id": url,
        "client_name": "Test Client",
        "redirect_uris": ["http://127.0.0.1/callback"],
        "token_endpoint_auth_method": "none",
    });
    let json = [(CONTENT_TYPE, "application/json")];
    match variant.as_str() {
        "good" | "good-localhost" => {
            ([(CACHE_CONTROL, "max-age=60")], json, document.to_string()).into_response()
        }
        "long-lived" => ([(CACHE_CONTROL, "public, max-age=999999")], json, document.to_string())
            .into_response(),
        "no-store" => ([(CACHE_CONTROL, "no-store")], json, document.to_string()).into_response(),
        "wrong-id" => {
            document["client_id"] = json!(format!("http://{host}/good"));
            (json, document.to_string()).into_response()
        }
        "big" => {
            document["padding"] = json!("x".repeat(6 * 1024));
            (json, document.to_string()).into_response()
        }
        "big-chunked" => {
            document["padding"] = json!("x".repeat(6 * 1024));
            let text = document.to_string();
            let chunks: Vec<Result<String, std::io::Error>> = text
                .as_bytes()
                .chunks(1000)
                .map(|c| Ok(String::from_utf8_lossy(c).into_owned()))
                .collect();
            (json, Body::from_stream(futures::stream::iter(chunks))).into_response()
        }
        "redirect" => (StatusCode::FOUND, [(LOCATION, "/good")]).into_response(),
        "error" => (StatusCode::INTERNAL_SERVER_ERROR, json, document.to_string()).into_response(),
        "html" => ([(CONTENT_TYPE, "text/html")], document.to_string()).into_response(),
        "no-content-type" => Response::new(Body::from(document.to_string())),
        "secret-post" => {
            document["token_endpoint_auth_method"] = json!("client_secret_post");
            (json, document.to_string()).into_response()
        }
        "secret-property" => {
            document["client_secret"] = json!("s3cret");
            (json, document.to_string()).into_response()
        }
        "no-redirect-uris" => {
            if let Some(fields) = document.as_object_mut() {
                fields.remove("redirect_uris");
            }
            (json, document.to_string()).into_response()
        }
        "not-json" => (json, "{\"client_id\": ").into_response(),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            (json, document.to_string()).into_response()
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The test-mode policy (loopback http allowed) with a short timeout.
fn test_mode() -> CimdPolicy {
    CimdPolicy {
        allow_loopback_http: true,
        timeout: Duration::from_millis(500),
        ..CimdPolicy::default()
    }
}

/// A resolver that answers from a fixed table (no DNS) and fails for other names.
fn fake_resolver(table: &[(&str, &[&str])]) -> Resolver {
    let table: HashMap<String, Vec<IpAddr>> = table
        .iter()
        .map(|(name, addresses)| {
            (
                (*name).to_owned(),
                addresses.iter().map(|a| a.parse().expect("test address")).collect(),
            )
        })
        .collect();
    Arc::new(move |name: String| {
        let answer = table.get(&name).cloned().ok_or_else(|| std::io::Error::other("no such host"));
        Box::pin(async move { answer })
    })
}

/// A clock the test moves by hand.
#[derive(Clone)]
struct TestClock {
    /// The current offset from the start.
    offset: Arc<Mutex<Duration>>,
    /// The start.
    start: Instant,
}

impl TestClock {
    /// A clock at its start.
    fn new() -> Self {
        Self { offset: Arc::new(Mutex::new(Duration::ZERO)), start: Instant::now() }
    }

    /// Sets the time to `offset` after the start.
    fn set(&self, offset: Duration) {
        *self.offset.lock().expect("clock") = offset;
    }
}

/// A fetcher with `policy`, `resolver` and `clock`.
fn documents_with(
    policy: CimdPolicy,
    resolver: Resolver,
    clock: &TestClock,
) -> ClientMetadataDocuments {
    let clock = clock.clone();
    ClientMetadataDocuments::with_parts(
        policy,
        resolver,
        Arc::new(move || clock.start + *clock.offset.lock().expect("clock")),
    )
}

#[tokio::test]
async fn a_good_document_is_fetched_once_then_served_from_the_cache() {
    let server = DocumentServer::start().await;
    let documents = ClientMetadataDocuments::new(test_mode());
    let url = server.url("good");
    assert!(documents.is_document_url(&url));

    let first = documents.get(&url).await.expect("good document");
    assert_eq!(first.client_id, url);
    assert_eq!(first.client_name, "Test Client");
    assert_eq!(first.redirect_uris, ["http://127.0.0.1/callback"]);
    let second = documents.get(&url).await.expect("cached document");
    assert_eq!(second, first);
    assert_eq!(server.hits("good"), 1, "the second get is served from the cache");
}

#[tokio::test]
async fn the_cache_lifetime_follows_max_age_within_the_bounds() {
    const MINUTE: Duration = Duration::from_secs(60);
    let server = DocumentServer::start().await;
    let clock = TestClock::new();
    let documents = documents_with(test_mode(), fake_resolver(&[]), &clock);

    // max-age=60 is raised to the 5-minute minimum; no-store gets the minimum too.
    for variant in ["good", "no-store"] {
        clock.set(Duration::ZERO);
        documents.get(&server.url(variant)).await.expect("document");
        clock.set(4 * MINUTE);
        documents.get(&server.url(variant)).await.expect("document");
        assert_eq!(server.hits(variant), 1, "{variant}: still cached after 4 minutes");
        clock.set(6 * MINUTE);
        documents.get(&server.url(variant)).await.expect("document");
        assert_eq!(server.hits(variant), 2, "{variant}: refetched after 6 minutes");
    }

    // max-age=999999 (11.5 days) is capped at 24 hours.
    clock.set(Duration::ZERO);
    documents.get(&server.url("long-lived")).await.expect("document");
    clock.set(23 * 60 * MINUTE);
    documents.get(&server.url("long-lived")).await.expect("document");
    assert_eq!(server.hits("long-lived"), 1, "still cached after 23 hours");
    clock.set(25 * 60 * MINUTE);
    documents.get(&server.url("long-lived")).await.expect("document");
    assert_eq!(server.hits("long-lived"), 2, "refetched after 25 hours");
}

#[tokio::test]
async fn a_loopback_name_connects_only_to_the_addresses_it_resolved_to() {
    let server = DocumentServer::start().await;
    // `localhost` answers ::1 first, where nothing listens: the fetcher falls back to the next checked address,
    // and the server sees the name in `Host`.
    let resolver = fake_resolver(&[("localhost", &["::1", "127.0.0.1"])]);
    let documents = documents_with(test_mode(), resolver, &TestClock::new());
    let url = format!("http://localhost:{}/good-localhost", server.address.port());
    let document = documents.get(&url).await.expect("document via localhost");
    assert_eq!(document.client_id, url);
    assert_eq!(server.hits("good-localhost"), 1);
}

/// Fetches `variant` twice in test mode and checks that both fail with an error `expected` accepts, that the
/// server saw `requests_each` requests per fetch (nothing cached), and that the cache stays empty.
async fn assert_refused(
    variant: &str,
    requests_each: usize,
    expected: impl Fn(&CimdError) -> bool,
) {
    let server = DocumentServer::start().await;
    let documents = ClientMetadataDocuments::new(test_mode());
    for attempt in 1..=2 {
        let error = documents.get(&server.url(variant)).await.expect_err(variant);
        assert!(expected(&error), "{variant}: unexpected error {error:?}");
        assert_eq!(
            server.hits(variant),
            attempt * requests_each,
            "{variant}: errors are not cached"
        );
    }
    assert_eq!(documents.cached_count(), 0, "{variant}: nothing cached");
}

#[tokio::test]
async fn a_document_naming_another_client_id_is_refused() {
    assert_refused("wrong-id", 1, |e| {
        matches!(e, CimdError::InvalidDocument { problem: DocumentProblem::ClientIdMismatch, .. })
    })
    .await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_refused() {
    assert_refused("big", 1, |e| matches!(e, CimdError::TooLarge { max_bytes: 5120, .. })).await;
    assert_refused("big-chunked", 1, |e| matches!(e, CimdError::TooLarge { max_bytes: 5120, .. }))
        .await;
}

#[tokio::test]
async fn redirects_are_not_followed() {
    let server = DocumentServer::start().await;
    let documents = ClientMetadataDocuments::new(test_mode());
    let error = documents.get(&server.url("redirect")).await.expect_err("302");
    assert!(matches!(error, CimdError::Redirect { status: 302, .. }), "{error:?}");
    assert_eq!(server.hits("good"), 0, "the redirect target is never requested");
    assert_eq!(documents.cached_count(), 0);
}

#[tokio::test]
async fn statuses_other_than_200_are_refused() {
    assert_refused("error", 1, |e| matches!(e, CimdError::Status { status: 500, .. })).await;
    assert_refused("missing", 1, |e| matches!(e, CimdError::Status { status: 404, .. })).await;
}

#[tokio::test]
async fn only_json_content_types_are_accepted() {
    assert_refused("html", 1, |e| matches!(e, CimdError::NotJson { .. })).await;
    assert_refused("no-content-type", 1, |e| matches!(e, CimdError::NotJson { .. })).await;
    assert_refused("not-json", 1, |e| {
        matches!(e, CimdError::InvalidDocument { problem: DocumentProblem::NotJson, .. })
    })
    .await;
}

#[tokio::test]
async fn documents_of_confidential_clients_are_refused() {
    assert_refused("secret-post", 1, |e| {
        matches!(
            e,
            CimdError::InvalidDocument { problem: DocumentProblem::SharedSecretAuthMethod, .. }
        )
    })
    .await;
    assert_refused("secret-property", 1, |e| {
        matches!(e, CimdError::InvalidDocument { problem: DocumentProblem::ClientSecret, .. })
    })
    .await;
}

#[tokio::test]
async fn a_document_without_redirect_uris_is_refused() {
    assert_refused("no-redirect-uris", 1, |e| {
        matches!(
            e,
            CimdError::InvalidDocument { problem: DocumentProblem::MissingRedirectUris, .. }
        )
    })
    .await;
}

#[tokio::test]
async fn a_slow_server_runs_into_the_total_timeout() {
    let started = Instant::now();
    assert_refused("slow", 1, |e| matches!(e, CimdError::Timeout { .. })).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "two fetches gave up after about 0.5 s each"
    );
}

#[tokio::test]
async fn loopback_urls_are_refused_without_a_connection_when_test_mode_is_off() {
    let server = DocumentServer::start().await;
    let port = server.address.port();
    // Names resolve through the table only: a rebinding name answers one public and one private address.
    let resolver = fake_resolver(&[
        ("localhost", &["127.0.0.1"]),
        ("rebind.example", &["93.184.216.34", "127.0.0.1"]),
        ("private.example", &["10.0.0.1"]),
        ("metadata.example", &["169.254.169.254"]),
        ("mapped.example", &["::ffff:127.0.0.1"]),
    ]);
    let documents = documents_with(CimdPolicy::default(), resolver, &TestClock::new());
    let refused = [
        (format!("http://127.0.0.1:{port}/good"), "not https"),
        (format!("https://127.0.0.1:{port}/good"), "special"),
        (format!("https://localhost:{port}/good"), "special"),
        (format!("https://[::1]:{port}/good"), "special"),
        (format!("https://[::ffff:7f00:1]:{port}/good"), "special"),
        (format!("https://rebind.example:{port}/good"), "special"),
        (format!("https://private.example:{port}/good"), "special"),
        (format!("https://metadata.example:{port}/good"), "special"),
        (format!("https://mapped.example:{port}/good"), "special"),
        (format!("https://nowhere.example:{port}/good"), "unresolved"),
    ];
    for (url, why) in refused {
        assert!(documents.is_document_url(&url), "{url}");
        let error = documents.get(&url).await.expect_err(&url);
        let expected = match why {
            "not https" => matches!(error, CimdError::InvalidUrl { problem: UrlProblem::NotHttps }),
            "special" => matches!(error, CimdError::SpecialUseAddress { .. }),
            _ => matches!(error, CimdError::Resolve { .. }),
        };
        assert!(expected, "{url}: expected {why}, got {error:?}");
    }
    assert_eq!(server.total_hits(), 0, "no refused URL reached the server");
    assert_eq!(documents.cached_count(), 0);
}

#[tokio::test]
async fn test_mode_opens_loopback_hosts_only() {
    let server = DocumentServer::start().await;
    let port = server.address.port();
    let resolver = fake_resolver(&[
        ("private.example", &["10.0.0.1"]),
        ("localhost", &["127.0.0.1", "10.0.0.1"]),
    ]);
    let documents = documents_with(test_mode(), resolver, &TestClock::new());
    // A name other than `localhost` still needs public addresses, and `localhost` must resolve to loopback only.
    for url in
        [format!("https://private.example:{port}/good"), format!("http://localhost:{port}/good")]
    {
        let error = documents.get(&url).await.expect_err(&url);
        assert!(matches!(error, CimdError::SpecialUseAddress { .. }), "{url}: {error:?}");
    }
    let error = documents.get("http://10.0.0.1/good").await.expect_err("private http");
    assert!(matches!(error, CimdError::InvalidUrl { problem: UrlProblem::NotHttps }), "{error:?}");
    assert_eq!(server.total_hits(), 0);
}

#[tokio::test]
async fn https_goes_through_tls_and_fails_against_a_plain_http_server() {
    let server = DocumentServer::start().await;
    let documents = ClientMetadataDocuments::new(test_mode());
    let url = format!("https://127.0.0.1:{}/good", server.address.port());
    let error = documents.get(&url).await.expect_err("no TLS on the test server");
    assert!(matches!(error, CimdError::Fetch { .. }), "{error:?}");
    assert!(!error.detail().is_empty(), "the log gets the cause");
    assert_eq!(server.hits("good"), 0, "no request is sent in clear text");
    assert_eq!(documents.cached_count(), 0);
}

#[tokio::test]
async fn url_shape_errors_are_refused_before_any_fetch() {
    let server = DocumentServer::start().await;
    let documents = ClientMetadataDocuments::new(test_mode());
    let base = format!("http://{}", server.address);
    for (url, problem) in [
        (base.clone(), UrlProblem::NoPath),
        (format!("{base}/"), UrlProblem::NoPath),
        (format!("{base}/a/../good"), UrlProblem::DotSegment),
        (format!("{base}/good#fragment"), UrlProblem::Fragment),
        (format!("http://user@{}/good", server.address), UrlProblem::UserInfo),
        (format!("{base}/good?x=1"), UrlProblem::Query),
        ("http://example.com/good".to_owned(), UrlProblem::NotHttps),
    ] {
        let error = documents.get(&url).await.expect_err(&url);
        assert!(
            matches!(error, CimdError::InvalidUrl { problem: got } if got == problem),
            "{url}: {error:?}"
        );
    }
    assert_eq!(server.total_hits(), 0);
}

#[tokio::test]
async fn host_lists_are_applied_before_any_lookup() {
    let server = DocumentServer::start().await;
    let policy = CimdPolicy { blocked_hosts: vec!["127.0.0.1".to_owned()], ..test_mode() };
    let documents = ClientMetadataDocuments::new(policy);
    let error = documents.get(&server.url("good")).await.expect_err("blocked host");
    assert!(matches!(error, CimdError::HostNotAllowed { .. }), "{error:?}");

    let policy = CimdPolicy { allowed_hosts: Some(vec!["claude.ai".to_owned()]), ..test_mode() };
    let documents = ClientMetadataDocuments::new(policy);
    let error = documents.get(&server.url("good")).await.expect_err("host not allowed");
    assert!(matches!(error, CimdError::HostNotAllowed { .. }), "{error:?}");
    assert_eq!(server.total_hits(), 0);
}

#[test]
fn errors_name_the_host_and_reason_only() {
    let error = CimdError::SpecialUseAddress {
        host: "rebind.example".to_owned(),
        address: Some("127.0.0.1".parse().expect("address")),
    };
    let message = error.to_string();
    assert!(message.contains("`rebind.example`"), "{message}");
    assert!(!message.contains("127.0.0.1"), "the address stays in the log: {message}");
    assert_eq!(error.detail(), "refused address 127.0.0.1");

    let error = CimdError::Fetch {
        host: "client.example".to_owned(),
        source: Some("tls handshake eof".into()),
    };
    assert_eq!(
        error.to_string(),
        "the client metadata document could not be fetched from `client.example`"
    );
    assert_eq!(error.detail(), "tls handshake eof");

    let error = CimdError::Redirect { host: "client.example".to_owned(), status: 302 };
    assert_eq!(error.status(), Some(302));
    assert_eq!(error.host(), Some("client.example"));
}

#[test]
fn document_urls_are_told_from_registered_ids() {
    let documents = ClientMetadataDocuments::new(CimdPolicy::default());
    for id in [
        "https://claude.ai/oauth/claude-code-client-metadata",
        "HTTPS://x.example/c",
        "http://127.0.0.1/c",
    ] {
        assert!(documents.is_document_url(id), "{id}");
    }
    for id in ["kiln-client-3f2a", "", "https:/x", "urn:example:client"] {
        assert!(!documents.is_document_url(id), "{id}");
    }
}
