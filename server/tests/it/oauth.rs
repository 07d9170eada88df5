//! The OAuth 2.1 authorization server through the cloud router (issue #13): metadata, registration, the
//! authorization endpoint and consent, the token endpoint, and every attack of oauth.md §7 that can be driven
//! over HTTP, each answer checked against the spec's contract.

use std::net::{Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use kiln_server::{Config, LogRing, Runtime, Server};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

const ISSUER: &str = "https://kiln.test";
const RESOURCE: &str = "https://kiln.test/mcp";
const REDIRECT: &str = "http://127.0.0.1:4567/callback";
const VERIFIER: &str = "a-verifier-that-is-long-enough-for-pkce-0123456789";

struct Answered {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Answered {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    fn location(&self) -> String {
        self.headers.get("location").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    }

    fn header(&self, name: &str) -> String {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    }
}

async fn send(server: &Server, request: Request<Body>) -> Answered {
    let (status, headers, body) = crate::answer(server, "cloud", request).await;
    Answered { status, headers, body }
}

fn request(method: &str, path: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(path).header("host", "kiln.test")
}

fn challenge(verifier: &str) -> String {
    URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// The query parameters of a URL.
fn params(url: &str) -> Vec<(String, String)> {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    form_urlencoded::parse(query.as_bytes()).into_owned().collect()
}

fn param(url: &str, name: &str) -> Option<String> {
    params(url).into_iter().find(|(k, _)| k == name).map(|(_, v)| v)
}

/// A cloud server with alice (workspace `a`) and bob (workspace `b`).
async fn cloud(name: &str) -> Server {
    cloud_with(name, ISSUER, false).await
}

/// A cloud server with `issuer`, fetching client metadata documents over loopback http when `test_mode`.
async fn cloud_with(name: &str, issuer: &str, test_mode: bool) -> Server {
    let dir = std::env::temp_dir().join(format!("kiln-oauth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    crate::cloud_isolation::accounts(&dir).await;
    let mut config = Config::under(
        dir,
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
        vec!["kiln".to_owned()],
    );
    config.runtime = Runtime::Cloud;
    config.issuer = issuer.to_owned();
    config.cimd_allow_loopback_http = test_mode;
    Server::start(&config, LogRing::new()).await.expect("starts")
}

/// A signed-in browser: its session cookie and CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

async fn sign_in(server: &Server, user: &str) -> Browser {
    let answer = send(
        server,
        request("POST", "/api/auth/session")
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"username": user, "password": "correct horse battery"}).to_string(),
            ))
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    let cookie = answer.header("set-cookie");
    let cookie = cookie.split(';').next().unwrap_or("").to_owned();
    Browser { cookie, csrf: answer.json()["csrf_token"].as_str().unwrap_or("").to_owned() }
}

/// A GET by the signed-in browser.
async fn browse(server: &Server, browser: &Browser, path: &str) -> Answered {
    let request =
        request("GET", path).header("cookie", &browser.cookie).header("accept", "application/json");
    send(server, request.body(Body::empty()).unwrap()).await
}

async fn register(server: &Server, metadata: Value) -> Answered {
    send(
        server,
        request("POST", "/oauth/register")
            .header("content-type", "application/json")
            .body(Body::from(metadata.to_string()))
            .unwrap(),
    )
    .await
}

async fn public_client(server: &Server) -> String {
    let answer = register(
        server,
        json!({"redirect_uris": [REDIRECT], "client_name": "Test client", "grant_types": ["authorization_code", "refresh_token"]}),
    )
    .await;
    assert_eq!(answer.status, StatusCode::CREATED, "{}", String::from_utf8_lossy(&answer.body));
    answer.json()["client_id"].as_str().unwrap_or("").to_owned()
}

/// The authorization URL query for `client` with the usual parameters, overridden by `changes` (an empty value
/// removes a parameter).
fn authorization_query(client: &str, changes: &[(&str, &str)]) -> String {
    let challenge = challenge(VERIFIER);
    let mut fields: Vec<(&str, String)> = vec![
        ("response_type", "code".into()),
        ("client_id", client.into()),
        ("redirect_uri", REDIRECT.into()),
        ("code_challenge", challenge),
        ("code_challenge_method", "S256".into()),
        ("state", "xyz".into()),
        ("resource", RESOURCE.into()),
    ];
    for (name, value) in changes {
        fields.retain(|(n, _)| n != name);
        if !value.is_empty() {
            fields.push((name, (*value).to_owned()));
        }
    }
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in &fields {
        query.append_pair(name, value);
    }
    query.finish()
}

async fn authorize(server: &Server, browser: Option<&Browser>, query: &str) -> Answered {
    let mut builder = request("GET", &format!("/oauth/authorize?{query}"));
    if let Some(browser) = browser {
        builder = builder.header("cookie", &browser.cookie);
    }
    send(server, builder.body(Body::empty()).unwrap()).await
}

/// Runs authorization and consent (allow, workspace `a` unless given) and answers `redirect_to`.
async fn approve(server: &Server, browser: &Browser, query: &str) -> String {
    let started = authorize(server, Some(browser), query).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER, "{}", String::from_utf8_lossy(&started.body));
    let id = param(&started.location(), "oauth_request_id").expect("a request id");
    let challenge =
        browse(server, browser, &format!("/oauth/authorize?oauth_request_id={id}")).await;
    assert_eq!(challenge.status, StatusCode::OK);
    let workspace = challenge.json()["workspaces"][0]["id"].as_str().unwrap_or("").to_owned();
    let decided = decide(server, browser, &id, "allow", &workspace).await;
    assert_eq!(decided.status, StatusCode::OK, "{}", String::from_utf8_lossy(&decided.body));
    decided.json()["redirect_to"].as_str().unwrap_or("").to_owned()
}

async fn decide(
    server: &Server,
    browser: &Browser,
    id: &str,
    decision: &str,
    workspace: &str,
) -> Answered {
    send(
        server,
        request("POST", "/oauth/authorize")
            .header("cookie", &browser.cookie)
            .header("x-csrf-token", &browser.csrf)
            .header("content-type", "application/json")
            .body(Body::from(
                json!({"oauth_request_id": id, "csrf_token": browser.csrf, "decision": decision, "workspace_id": workspace})
                    .to_string(),
            ))
            .unwrap(),
    )
    .await
}

async fn token(server: &Server, form: &[(&str, &str)]) -> Answered {
    let mut body = form_urlencoded::Serializer::new(String::new());
    for (name, value) in form {
        body.append_pair(name, value);
    }
    send(
        server,
        request("POST", "/oauth/token")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from(body.finish()))
            .unwrap(),
    )
    .await
}

async fn exchange(server: &Server, client: &str, code: &str) -> Answered {
    token(
        server,
        &[
            ("grant_type", "authorization_code"),
            ("code", code),
            ("code_verifier", VERIFIER),
            ("redirect_uri", REDIRECT),
            ("client_id", client),
            ("resource", RESOURCE),
        ],
    )
    .await
}

async fn refresh(server: &Server, client: &str, refresh_token: &str) -> Answered {
    token(
        server,
        &[("grant_type", "refresh_token"), ("refresh_token", refresh_token), ("client_id", client)],
    )
    .await
}

/// An MCP `tools/list` with a bearer token: 200 when the token is accepted.
async fn mcp_status(server: &Server, access_token: &str) -> StatusCode {
    let (status, _, _) = crate::answer(
        server,
        "cloud",
        request("POST", "/mcp")
            .header("authorization", format!("Bearer {access_token}"))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .body(Body::from(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-06-18", "capabilities": {},
                    "clientInfo": {"name": "test", "version": "1"}}})
                .to_string(),
            ))
            .unwrap(),
    )
    .await;
    status
}

fn error_code(answer: &Answered) -> String {
    answer.json()["error"].as_str().unwrap_or("").to_owned()
}

#[tokio::test]
async fn issue_13_metadata_names_one_issuer_everywhere() {
    let server = cloud("metadata").await;
    let get = |path: &'static str| {
        let server = &server;
        async move { send(server, request("GET", path).body(Body::empty()).unwrap()).await }
    };
    let metadata = get("/.well-known/oauth-authorization-server").await;
    assert_eq!(metadata.status, StatusCode::OK);
    let m = metadata.json();
    assert_eq!(m["issuer"], ISSUER);
    assert_eq!(m["authorization_endpoint"], format!("{ISSUER}/oauth/authorize"));
    assert_eq!(m["token_endpoint"], format!("{ISSUER}/oauth/token"));
    assert_eq!(m["registration_endpoint"], format!("{ISSUER}/oauth/register"));
    assert_eq!(m["code_challenge_methods_supported"], json!(["S256"]));
    assert_eq!(m["response_types_supported"], json!(["code"]));
    assert_eq!(m["authorization_response_iss_parameter_supported"], true);
    assert_eq!(metadata.header("access-control-allow-origin"), "*");
    let root = get("/.well-known/oauth-protected-resource").await;
    let path = get("/.well-known/oauth-protected-resource/mcp").await;
    assert_eq!(root.body, path.body, "the same document at both URLs");
    assert_eq!(path.json()["resource"], RESOURCE);
    assert_eq!(path.json()["authorization_servers"], json!([ISSUER]));
    assert_eq!(path.json()["scopes_supported"], json!(["kiln:read", "kiln:run"]));
    let oidc = request("GET", "/.well-known/openid-configuration").body(Body::empty()).unwrap();
    let oidc = status_outside_the_spec(&server, oidc).await;
    assert_eq!(oidc, StatusCode::NOT_FOUND, "Kiln is not an OpenID provider");
}

/// The status of a request the spec does not describe (an undocumented path, a CORS preflight), sent without
/// the contract check.
async fn status_outside_the_spec(server: &Server, request: Request<Body>) -> StatusCode {
    use tower::ServiceExt as _;
    server.router().oneshot(request).await.expect("answers").status()
}

/// The status of a CORS preflight from another site to `path`.
async fn preflight(server: &Server, path: &str) -> StatusCode {
    let request = request("OPTIONS", path)
        .header("origin", "https://other-site.example")
        .header("access-control-request-method", "POST")
        .body(Body::empty())
        .unwrap();
    status_outside_the_spec(server, request).await
}

#[tokio::test]
async fn issue_13_a_client_registers_is_authorized_and_refreshes() {
    let server = cloud("flow").await;
    let registered = register(
        &server,
        json!({"redirect_uris": [REDIRECT, "cursor://anysphere.cursor-mcp/oauth/callback"], "client_name": "Flow", "scope": "kiln:read"}),
    )
    .await;
    assert_eq!(registered.status, StatusCode::CREATED);
    assert_eq!(registered.header("cache-control"), "no-store");
    let r = registered.json();
    assert_eq!(r["token_endpoint_auth_method"], "none", "the default is a public client");
    assert!(r.get("client_secret").is_none(), "no secret for a public client");
    let client = r["client_id"].as_str().expect("client_id").to_owned();
    // RFC 7592 read with the registration access token.
    let read = send(
        &server,
        request("GET", &format!("/oauth/register/{client}"))
            .header(
                "authorization",
                format!("Bearer {}", r["registration_access_token"].as_str().unwrap_or("")),
            )
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(read.status, StatusCode::OK);
    assert_eq!(read.json()["client_id"], client.as_str());
    assert!(read.json().get("registration_access_token").is_none());
    let foreign = send(
        &server,
        request("GET", &format!("/oauth/register/{client}"))
            .header("authorization", "Bearer not-the-token")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(foreign.status, StatusCode::UNAUTHORIZED);

    // No session: sign in first, then back to the same request.
    let query = authorization_query(&client, &[]);
    let anonymous = authorize(&server, None, &query).await;
    assert_eq!(anonymous.status, StatusCode::SEE_OTHER);
    assert!(
        anonymous.location().starts_with("/login?next=%2Foauth%2Fauthorize%3F"),
        "{}",
        anonymous.location()
    );
    let browser = sign_in(&server, "alice").await;
    // Scopes beyond the registered `scope` are fine: consent decides (§7 row 30).
    let started = authorize(&server, Some(&browser), &query).await;
    assert_eq!(started.status, StatusCode::SEE_OTHER);
    assert!(started.location().starts_with(&format!("{ISSUER}/oauth/consent?oauth_request_id=")));
    assert_eq!(started.header("x-frame-options"), "DENY");
    assert!(started.header("content-security-policy").contains("frame-ancestors 'none'"));
    let id = param(&started.location(), "oauth_request_id").expect("id");
    // The consent page, server-rendered, names the client as unverified and the redirect host.
    let page = browse(&server, &browser, &format!("/oauth/consent?oauth_request_id={id}")).await;
    assert_eq!(page.status, StatusCode::OK);
    let html = String::from_utf8_lossy(&page.body);
    assert!(
        html.contains("Flow") && html.contains("not verified") && html.contains("127.0.0.1:4567")
    );
    assert_eq!(page.header("x-frame-options"), "DENY");
    let challenge =
        browse(&server, &browser, &format!("/oauth/authorize?oauth_request_id={id}")).await;
    let c = challenge.json();
    assert_eq!(c["scopes"], json!(["kiln:read", "kiln:run"]), "no scope asked: every scope");
    assert_eq!(c["workspaces"][0]["id"].as_str().map(|s| !s.is_empty()), Some(true));
    assert_eq!(challenge.header("cache-control"), "no-store");
    assert_eq!(
        challenge.header("x-frame-options"),
        "DENY",
        "the JSON challenge is not framed either"
    );
    let workspace = c["workspaces"][0]["id"].as_str().unwrap_or("").to_owned();
    let decided = decide(&server, &browser, &id, "allow", &workspace).await;
    assert_eq!(decided.status, StatusCode::OK);
    let to = decided.json()["redirect_to"].as_str().unwrap_or("").to_owned();
    assert!(to.starts_with(&format!("{REDIRECT}?code=")));
    assert_eq!(param(&to, "state").as_deref(), Some("xyz"));
    assert_eq!(param(&to, "iss").as_deref(), Some(ISSUER));
    let code = param(&to, "code").expect("code");
    let tokens = exchange(&server, &client, &code).await;
    assert_eq!(tokens.status, StatusCode::OK, "{}", String::from_utf8_lossy(&tokens.body));
    assert_eq!(tokens.header("cache-control"), "no-store");
    assert_eq!(tokens.header("pragma"), "no-cache");
    let t = tokens.json();
    assert_eq!(t["token_type"], "Bearer");
    assert_eq!(t["scope"], "kiln:read kiln:run");
    let access = t["access_token"].as_str().expect("access token").to_owned();
    let rt1 = t["refresh_token"].as_str().expect("refresh token").to_owned();
    assert_eq!(mcp_status(&server, &access).await, StatusCode::OK);
    // A browser page of another origin, or a request for another host, is refused even with a token (row 26).
    for (name, value) in [("origin", "https://evil.example"), ("host", "attacker.example")] {
        let mut foreign = mcp_request(Some(&access));
        foreign.headers_mut().insert(name, value.parse().expect("header"));
        assert_eq!(send(&server, foreign).await.status, StatusCode::FORBIDDEN, "{name}: {value}");
    }
    // An MCP token is not a REST API token.
    let api = send(
        &server,
        request("GET", "/api/queue")
            .header("authorization", format!("Bearer {access}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(api.status, StatusCode::UNAUTHORIZED);

    // Refresh rotates; a narrower scope is fine, a wider one is not.
    let refreshed = token(
        &server,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &rt1),
            ("client_id", &client),
            ("scope", "kiln:read"),
        ],
    )
    .await;
    assert_eq!(refreshed.status, StatusCode::OK);
    assert_eq!(refreshed.json()["scope"], "kiln:read");
    let rt2 = refreshed.json()["refresh_token"].as_str().expect("rt2").to_owned();
    assert_ne!(rt1, rt2);
    // Within the grace window, while rt2 is unused, rt1 yields rt2 again (two processes refreshing at once).
    let concurrent = refresh(&server, &client, &rt1).await;
    assert_eq!(concurrent.status, StatusCode::OK);
    assert_eq!(concurrent.json()["refresh_token"], rt2.as_str());
    let wider = token(
        &server,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", &rt2),
            ("client_id", &client),
            ("scope", "kiln:run admin"),
        ],
    )
    .await;
    assert_eq!(
        (wider.status, error_code(&wider)),
        (StatusCode::BAD_REQUEST, "invalid_scope".into())
    );
    let third = refresh(&server, &client, &rt2).await;
    let rt3 = third.json()["refresh_token"].as_str().expect("rt3").to_owned();
    let newest = third.json()["access_token"].as_str().expect("at").to_owned();
    assert_eq!(mcp_status(&server, &newest).await, StatusCode::OK);
    // rt1 again, after its successor was used: reuse revokes the whole grant (§7 row 11).
    let reused = refresh(&server, &client, &rt1).await;
    assert_eq!(
        (reused.status, error_code(&reused)),
        (StatusCode::BAD_REQUEST, "invalid_grant".into())
    );
    assert_eq!(refresh(&server, &client, &rt3).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(mcp_status(&server, &newest).await, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn issue_13_codes_are_single_use_bound_and_pkce_checked() {
    let server = cloud("codes").await;
    let client = public_client(&server).await;
    let other = public_client(&server).await;
    let browser = sign_in(&server, "alice").await;

    // Wrong verifier, another client's id, another redirect: refused without spending the code (rows 3, 6, 9).
    let code = param(&approve(&server, &browser, &authorization_query(&client, &[])).await, "code")
        .expect("code");
    for form in [
        vec![
            ("code_verifier", "a-verifier-that-is-long-enough-for-pkce-0123456780"),
            ("client_id", client.as_str()),
            ("redirect_uri", REDIRECT),
        ],
        vec![
            ("code_verifier", VERIFIER),
            ("client_id", other.as_str()),
            ("redirect_uri", REDIRECT),
        ],
        vec![
            ("code_verifier", VERIFIER),
            ("client_id", client.as_str()),
            ("redirect_uri", "http://127.0.0.1:4567/other"),
        ],
        vec![
            ("code_verifier", "short"),
            ("client_id", client.as_str()),
            ("redirect_uri", REDIRECT),
        ],
    ] {
        let mut fields = vec![("grant_type", "authorization_code"), ("code", code.as_str())];
        fields.extend(form);
        let refused = token(&server, &fields).await;
        assert_eq!(
            (refused.status, error_code(&refused)),
            (StatusCode::BAD_REQUEST, "invalid_grant".into())
        );
        assert_eq!(refused.header("cache-control"), "no-store");
        assert_eq!(refused.header("pragma"), "no-cache");
    }
    let first = exchange(&server, &client, &code).await;
    assert_eq!(first.status, StatusCode::OK);
    let access = first.json()["access_token"].as_str().unwrap_or("").to_owned();
    let rt = first.json()["refresh_token"].as_str().unwrap_or("").to_owned();
    // An invalid replay after success revokes nothing (row 2).
    let mut bad_replay = vec![("grant_type", "authorization_code"), ("code", code.as_str())];
    bad_replay.extend([
        ("code_verifier", "wrong-wrong-wrong-wrong-wrong-wrong-wrong-wrong"),
        ("client_id", client.as_str()),
        ("redirect_uri", REDIRECT),
    ]);
    assert_eq!(token(&server, &bad_replay).await.status, StatusCode::BAD_REQUEST);
    assert_eq!(mcp_status(&server, &access).await, StatusCode::OK);
    // A second valid redemption: refused, and the first one's tokens are revoked (row 1).
    let second = exchange(&server, &client, &code).await;
    assert_eq!(
        (second.status, error_code(&second)),
        (StatusCode::BAD_REQUEST, "invalid_grant".into())
    );
    assert_eq!(mcp_status(&server, &access).await, StatusCode::UNAUTHORIZED);
    assert_eq!(refresh(&server, &client, &rt).await.status, StatusCode::BAD_REQUEST);

    // Eight redemptions of one code at once: exactly one gets tokens, and the replays revoke them (row 1).
    let code = param(&approve(&server, &browser, &authorization_query(&client, &[])).await, "code")
        .expect("code");
    let racing = futures::future::join_all((0..8).map(|_| exchange(&server, &client, &code))).await;
    let won: Vec<&Answered> = racing.iter().filter(|a| a.status == StatusCode::OK).collect();
    assert_eq!(won.len(), 1, "one redemption wins");
    let access = won[0].json()["access_token"].as_str().unwrap_or("").to_owned();
    assert_eq!(
        mcp_status(&server, &access).await,
        StatusCode::UNAUTHORIZED,
        "the replays revoked it"
    );

    // A token for another resource (rows 13, 20).
    let code = param(&approve(&server, &browser, &authorization_query(&client, &[])).await, "code")
        .expect("code");
    let foreign = token(
        &server,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("code_verifier", VERIFIER),
            ("redirect_uri", REDIRECT),
            ("client_id", &client),
            ("resource", "https://other.example/mcp"),
        ],
    )
    .await;
    assert_eq!(error_code(&foreign), "invalid_target");
    // Without `resource` the canonical one is meant; a trailing slash and case are tolerated.
    let tolerant = token(
        &server,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("code_verifier", VERIFIER),
            ("redirect_uri", REDIRECT),
            ("client_id", &client),
            ("resource", "HTTPS://Kiln.test/mcp/"),
        ],
    )
    .await;
    assert_eq!(tolerant.status, StatusCode::OK);
    let rt = tolerant.json()["refresh_token"].as_str().unwrap_or("").to_owned();
    let stolen = refresh(&server, &other, &rt).await;
    assert_eq!(error_code(&stolen), "invalid_grant", "another client's refresh token (row 13)");

    // Token endpoint input: unknown grant, repeated parameter, a JSON body.
    let unknown = token(&server, &[("grant_type", "password"), ("client_id", &client)]).await;
    assert_eq!(error_code(&unknown), "unsupported_grant_type");
    let repeated = token(
        &server,
        &[("grant_type", "refresh_token"), ("grant_type", "refresh_token"), ("client_id", &client)],
    )
    .await;
    assert_eq!(error_code(&repeated), "invalid_request");
    let json_body = send(
        &server,
        request("POST", "/oauth/token")
            .header("content-type", "application/json")
            .body(Body::from("{\"grant_type\":\"refresh_token\"}"))
            .unwrap(),
    )
    .await;
    assert_eq!(
        (json_body.status, error_code(&json_body)),
        (StatusCode::BAD_REQUEST, "invalid_request".into())
    );
    assert_eq!(json_body.header("cache-control"), "no-store");
}

#[tokio::test]
async fn issue_13_bad_authorization_requests_are_shown_or_redirected_with_iss() {
    let server = cloud("authorize").await;
    let client = public_client(&server).await;
    let browser = sign_in(&server, "alice").await;
    // Client or redirect problems: 400, no redirect (rows 7, 8, 10).
    for (name, value) in [
        ("client_id", "unknown-client"),
        ("client_id", ""),
        ("redirect_uri", "https://evil.example/callback"),
        ("redirect_uri", "http://127.0.0.1:4567/callback/extra"),
        ("redirect_uri", "http://127.0.0.1:4567/callback?x=1"),
        ("redirect_uri", "http://localhost:4567/callback"),
        ("redirect_uri", "http://evil.com:4567/callback"),
        ("redirect_uri", "http://127.0.0.1:4567/Callback"),
        ("redirect_uri", "http://127.0.0.1:4567/%63allback"),
        ("redirect_uri", "http://127.0.0.1:4567@evil.example/callback"),
    ] {
        let answer =
            authorize(&server, Some(&browser), &authorization_query(&client, &[(name, value)]))
                .await;
        assert_eq!(answer.status, StatusCode::BAD_REQUEST, "{name}={value}");
        assert!(answer.location().is_empty(), "{name}={value} must not redirect");
    }
    // Any loopback port is the registered one (RFC 8252).
    let other_port = authorize(
        &server,
        Some(&browser),
        &authorization_query(&client, &[("redirect_uri", "http://127.0.0.1:5555/callback")]),
    )
    .await;
    assert_eq!(other_port.status, StatusCode::SEE_OTHER);
    // Unknown client without a session: shown, never redirected (row 10).
    let anonymous = authorize(&server, None, &authorization_query("unknown", &[])).await;
    assert_eq!(anonymous.status, StatusCode::BAD_REQUEST);
    // Other problems go back to the client with error, state and iss (rows 4, 5, 14).
    for (change, error) in [
        (("code_challenge", ""), "invalid_request"),
        (("code_challenge_method", "plain"), "invalid_request"),
        (("code_challenge_method", ""), "invalid_request"),
        (("code_challenge", "too-short"), "invalid_request"),
        (("response_type", "token"), "unsupported_response_type"),
        (("scope", "kiln:read admin"), "invalid_scope"),
        (("resource", "https://other.example/mcp"), "invalid_target"),
    ] {
        let answer =
            authorize(&server, Some(&browser), &authorization_query(&client, &[change])).await;
        assert_eq!(answer.status, StatusCode::FOUND, "{change:?}");
        let to = answer.location();
        assert!(to.starts_with(REDIRECT), "{to}");
        assert_eq!(param(&to, "error").as_deref(), Some(error), "{change:?}");
        assert_eq!(param(&to, "state").as_deref(), Some("xyz"));
        assert_eq!(param(&to, "iss").as_deref(), Some(ISSUER));
    }
    // A parameter without a value is an omitted one: `resource=` means the canonical resource.
    let empty =
        authorize(&server, Some(&browser), &authorization_query(&client, &[("resource", "")]))
            .await;
    assert_eq!(empty.status, StatusCode::SEE_OTHER);
    let bare = authorize(
        &server,
        Some(&browser),
        &format!("{}&resource=", authorization_query(&client, &[("resource", "")])),
    )
    .await;
    assert_eq!(bare.status, StatusCode::SEE_OTHER, "{}", bare.location());
    // An overlong state is refused (it would be held in memory and sent back), and not echoed.
    let long = "s".repeat(2000);
    let overlong =
        authorize(&server, Some(&browser), &authorization_query(&client, &[("state", &long)]))
            .await;
    assert_eq!(param(&overlong.location(), "error").as_deref(), Some("invalid_request"));
    assert!(param(&overlong.location(), "state").is_none());
    // `state` is optional, and not echoed when absent.
    let stateless =
        approve(&server, &browser, &authorization_query(&client, &[("state", "")])).await;
    assert!(param(&stateless, "code").is_some() && param(&stateless, "state").is_none());
    assert_eq!(param(&stateless, "iss").as_deref(), Some(ISSUER));
    // Deny: access_denied with state and iss.
    let started = authorize(&server, Some(&browser), &authorization_query(&client, &[])).await;
    let id = param(&started.location(), "oauth_request_id").expect("id");
    let denied = decide(&server, &browser, &id, "deny", "").await;
    let to = denied.json()["redirect_to"].as_str().unwrap_or("").to_owned();
    assert_eq!(param(&to, "error").as_deref(), Some("access_denied"));
    assert_eq!(param(&to, "iss").as_deref(), Some(ISSUER));
    // No CORS on the authorization endpoint (row 18).
    assert_ne!(preflight(&server, "/oauth/authorize").await, StatusCode::NO_CONTENT);
}

#[tokio::test]
async fn issue_13_consent_is_csrf_protected_single_use_and_bound_to_its_session() {
    let server = cloud("consent").await;
    let client = public_client(&server).await;
    let alice = sign_in(&server, "alice").await;
    let bob = sign_in(&server, "bob").await;
    let started = authorize(&server, Some(&alice), &authorization_query(&client, &[])).await;
    let id = param(&started.location(), "oauth_request_id").expect("id");
    // Bob cannot see or decide Alice's request.
    let foreign = browse(&server, &bob, &format!("/oauth/authorize?oauth_request_id={id}")).await;
    assert_eq!(foreign.status, StatusCode::NOT_FOUND);
    assert_eq!(decide(&server, &bob, &id, "allow", "b").await.status, StatusCode::BAD_REQUEST);
    // No CSRF header, a forged body token, another origin (row 15).
    let mut missing = decide_request(&alice, &id, &alice.csrf);
    missing.headers_mut().remove("x-csrf-token");
    assert_eq!(send(&server, missing).await.status, StatusCode::FORBIDDEN);
    let forged = send(&server, decide_request(&alice, &id, "forged")).await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let mut cross = decide_request(&alice, &id, &alice.csrf);
    cross.headers_mut().insert("origin", "https://evil.example".parse().expect("origin"));
    assert_eq!(send(&server, cross).await.status, StatusCode::FORBIDDEN);
    // A workspace that was not offered: refused, and the request is still usable (row 16).
    let unoffered = decide(&server, &alice, &id, "allow", "b").await;
    assert_eq!(unoffered.status, StatusCode::BAD_REQUEST);
    let allowed =
        decide(&server, &alice, &id, "allow", &workspace_of(&server, &alice, &id).await).await;
    assert_eq!(allowed.status, StatusCode::OK, "never a 307/308 (row 24)");
    assert!(allowed.json()["redirect_to"].as_str().is_some_and(|to| to.contains("code=")));
    // Single use.
    let again = decide(&server, &alice, &id, "allow", "a").await;
    assert_eq!(again.status, StatusCode::BAD_REQUEST);
}

fn decide_request(browser: &Browser, id: &str, csrf: &str) -> Request<Body> {
    request("POST", "/oauth/authorize")
        .header("cookie", &browser.cookie)
        .header("x-csrf-token", csrf)
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"oauth_request_id": id, "csrf_token": csrf, "decision": "allow", "workspace_id": "a"}).to_string(),
        ))
        .unwrap()
}

async fn workspace_of(server: &Server, browser: &Browser, id: &str) -> String {
    let challenge =
        browse(server, browser, &format!("/oauth/authorize?oauth_request_id={id}")).await;
    challenge.json()["workspaces"][0]["id"].as_str().unwrap_or("").to_owned()
}

#[tokio::test]
async fn issue_13_registration_refuses_abuse_and_confidential_clients_need_their_secret() {
    let server = cloud("register").await;
    for (metadata, error) in [
        (json!({"redirect_uris": ["javascript:alert(1)"]}), "invalid_redirect_uri"),
        (json!({"redirect_uris": ["data:text/html,x"]}), "invalid_redirect_uri"),
        (json!({"redirect_uris": ["http://evil.example/cb"]}), "invalid_redirect_uri"),
        (json!({"redirect_uris": []}), "invalid_redirect_uri"),
        (
            json!({"redirect_uris": [REDIRECT], "grant_types": ["implicit"]}),
            "invalid_client_metadata",
        ),
        (
            json!({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "private_key_jwt"}),
            "invalid_client_metadata",
        ),
        (
            json!({"redirect_uris": [REDIRECT], "response_types": ["token"]}),
            "invalid_client_metadata",
        ),
        (json!({"client_name": "no redirects"}), "invalid_client_metadata"),
    ] {
        let refused = register(&server, metadata.clone()).await;
        assert_eq!(
            (refused.status, error_code(&refused)),
            (StatusCode::BAD_REQUEST, error.into()),
            "{metadata}"
        );
    }
    let huge =
        register(&server, json!({"redirect_uris": [REDIRECT], "client_name": "x".repeat(20_000)}))
            .await;
    assert_eq!(huge.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Custom schemes and VS Code's loopback set are fine; unknown fields are ignored.
    let vscode = register(
        &server,
        json!({"redirect_uris": ["http://127.0.0.1/", "http://127.0.0.1:33418/", "https://vscode.dev/redirect", "cursor://anysphere.cursor-mcp/oauth/callback"], "resource_grants": {}, "application_type": "native"}),
    )
    .await;
    assert_eq!(vscode.status, StatusCode::CREATED);

    // client_secret_post: 201 with a secret; the token endpoint then wants exactly that secret (row 28).
    let confidential = register(
        &server,
        json!({"redirect_uris": [REDIRECT], "token_endpoint_auth_method": "client_secret_post"}),
    )
    .await;
    assert_eq!(confidential.status, StatusCode::CREATED);
    let c = confidential.json();
    assert_eq!(c["client_secret_expires_at"], 0);
    let (id, secret) = (
        c["client_id"].as_str().unwrap_or("").to_owned(),
        c["client_secret"].as_str().unwrap_or("").to_owned(),
    );
    assert!(secret.len() >= 43);
    let browser = sign_in(&server, "alice").await;
    let code = param(&approve(&server, &browser, &authorization_query(&id, &[])).await, "code")
        .expect("code");
    let base = [
        ("grant_type", "authorization_code"),
        ("code", code.as_str()),
        ("code_verifier", VERIFIER),
        ("redirect_uri", REDIRECT),
        ("client_id", id.as_str()),
    ];
    let without = token(&server, &base).await;
    assert_eq!(
        (without.status, error_code(&without)),
        (StatusCode::UNAUTHORIZED, "invalid_client".into())
    );
    let mut wrong = base.to_vec();
    wrong.push(("client_secret", "wrong"));
    assert_eq!(token(&server, &wrong).await.status, StatusCode::UNAUTHORIZED);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
    let mut form = form_urlencoded::Serializer::new(String::new());
    for (k, v) in base {
        form.append_pair(k, v);
    }
    let with_basic = send(
        &server,
        request("POST", "/oauth/token")
            .header("content-type", "application/x-www-form-urlencoded")
            .header("authorization", format!("Basic {basic}"))
            .body(Body::from(form.finish()))
            .unwrap(),
    )
    .await;
    assert_eq!(
        with_basic.status,
        StatusCode::UNAUTHORIZED,
        "the registered method is client_secret_post"
    );
    assert!(with_basic.header("www-authenticate").starts_with("Basic"));
    let mut right = base.to_vec();
    right.push(("client_secret", secret.as_str()));
    let issued = token(&server, &right).await;
    assert_eq!(issued.status, StatusCode::OK);
    // Only hashes are stored: no secret, registration token or refresh token in the database files (row 23).
    let dir = std::env::temp_dir().join(format!("kiln-oauth-register-{}", std::process::id()));
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("data dir") {
        let path = entry.expect("entry").path();
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("kiln.sqlite")) {
            stored.extend(std::fs::read(path).expect("database file"));
        }
    }
    let stored = String::from_utf8_lossy(&stored);
    for value in [
        &secret,
        &c["registration_access_token"].as_str().unwrap_or("").to_owned(),
        &issued.json()["refresh_token"].as_str().unwrap_or("").to_owned(),
    ] {
        assert!(
            value.len() >= 43 && !stored.contains(value.as_str()),
            "a secret is stored in clear"
        );
    }
    // A public client that sends a secret is refused too.
    let public = public_client(&server).await;
    let sent_secret = token(
        &server,
        &[
            ("grant_type", "refresh_token"),
            ("refresh_token", "x"),
            ("client_id", &public),
            ("client_secret", "s"),
        ],
    )
    .await;
    assert_eq!(sent_secret.status, StatusCode::UNAUTHORIZED);

    // Bursts pass, then the limit answers 429 with Retry-After (row 19).
    let mut limited = None;
    for _ in 0..25 {
        let answer = register(&server, json!({"redirect_uris": [REDIRECT]})).await;
        if answer.status == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(answer);
            break;
        }
        assert_eq!(answer.status, StatusCode::CREATED);
    }
    let limited = limited.expect("the rate limit applies within 25 registrations");
    assert_eq!(error_code(&limited), "too_many_requests");
    assert!(limited.header("retry-after").parse::<u64>().is_ok_and(|s| s >= 1));
}

#[tokio::test]
async fn issue_13_mcp_asks_for_a_token_for_itself() {
    let server = cloud("mcp-auth").await;
    let anonymous = send(&server, mcp_request(None)).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    let challenge = anonymous.header("www-authenticate");
    assert_eq!(
        challenge,
        format!(
            "Bearer resource_metadata=\"{ISSUER}/.well-known/oauth-protected-resource/mcp\", scope=\"kiln:read kiln:run\""
        )
    );
    // A first-party API token is for the REST API, not for /mcp (row 20).
    let browser = sign_in(&server, "alice").await;
    let api_token = send(
        &server,
        request("POST", "/api/auth/token")
            .header("cookie", &browser.cookie)
            .header("x-csrf-token", &browser.csrf)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap(),
    )
    .await;
    let api_token = api_token.json()["token"].as_str().unwrap_or("").to_owned();
    let refused = send(&server, mcp_request(Some(&api_token))).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    assert!(refused.header("www-authenticate").contains("error=\"invalid_token\""));
    // The preflight is answered before authentication (row 25).
    assert_eq!(preflight(&server, "/mcp").await, StatusCode::NO_CONTENT);
}

fn mcp_request(token: Option<&str>) -> Request<Body> {
    let mut builder = request("POST", "/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder
        .body(Body::from(json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).to_string()))
        .unwrap()
}

/// A cloud server whose issuer is loopback (metadata documents over http need one).
async fn cloud_fetching_documents(name: &str, test_mode: bool) -> Server {
    cloud_with(name, "http://127.0.0.1:8188", test_mode).await
}

/// Serves a client metadata document at `/client.json` on loopback, counting requests; answers its URL.
async fn document_server(hits: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> String {
    use std::sync::atomic::Ordering;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}/client.json", listener.local_addr().expect("address"));
    let document =
        json!({"client_id": url, "client_name": "Document client", "redirect_uris": [REDIRECT]});
    let app = axum::Router::new().route(
        "/client.json",
        axum::routing::get(move || {
            hits.fetch_add(1, Ordering::SeqCst);
            let document = document.clone();
            async move { axum::Json(document) }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn issue_13_a_metadata_document_url_is_a_client_id() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let url = document_server(hits.clone()).await;
    let server = cloud_fetching_documents("cimd", true).await;
    let metadata = send(
        &server,
        request("GET", "/.well-known/oauth-authorization-server").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(metadata.json()["client_id_metadata_document_supported"], true);
    let browser = sign_in(&server, "alice").await;
    let query = authorization_query(&url, &[("resource", "")]);
    let to = approve(&server, &browser, &query).await;
    let code = param(&to, "code").expect("code");
    let tokens = token(
        &server,
        &[
            ("grant_type", "authorization_code"),
            ("code", &code),
            ("code_verifier", VERIFIER),
            ("redirect_uri", REDIRECT),
            ("client_id", &url),
        ],
    )
    .await;
    assert_eq!(tokens.status, StatusCode::OK, "{}", String::from_utf8_lossy(&tokens.body));
    assert_eq!(hits.load(Ordering::SeqCst), 1, "the document is cached");
    // A redirect URI the document does not list is shown, not followed.
    let other = authorize(
        &server,
        Some(&browser),
        &authorization_query(
            &url,
            &[("redirect_uri", "http://127.0.0.1:4567/elsewhere"), ("resource", "")],
        ),
    )
    .await;
    assert_eq!(other.status, StatusCode::BAD_REQUEST);

    // Without the test mode, a loopback document URL is refused before any connection (SSRF, row 29).
    let strict = cloud_fetching_documents("cimd-strict", false).await;
    let before = hits.load(Ordering::SeqCst);
    let refused =
        authorize(&strict, Some(&sign_in(&strict, "alice").await), &authorization_query(&url, &[]))
            .await;
    assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    assert!(refused.location().is_empty());
    assert_eq!(hits.load(Ordering::SeqCst), before, "no request reached the document server");
}
