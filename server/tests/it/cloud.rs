//! The cloud runtime through its router: sign-in, CSRF, API keys, tokens and workspace isolation, every answer
//! checked against the spec's contract.

use std::net::{Ipv4Addr, SocketAddr};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use kiln_server::{Config, LogRing, Runtime, Server};
use tower::ServiceExt as _;

struct Answered {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

impl Answered {
    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

async fn send(server: &Server, request: Request<Body>) -> Answered {
    let (status, headers, body) = crate::answer(server, "cloud", request).await;
    Answered { status, headers, body }
}

fn request(method: &str, path: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(path).header("host", "kiln.test")
}

fn data_dir(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("kiln-cloud-{name}-{}", std::process::id()))
}

/// A cloud server with alice in workspace `a` (owner) and bob in workspace `b`, and an API key for each.
async fn cloud(name: &str) -> (Server, String, String) {
    let dir = data_dir(name);
    let _ = std::fs::remove_dir_all(&dir);
    let (alice, bob) = crate::cloud_isolation::accounts(&dir).await;
    let mut config = Config::under(
        dir,
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
        vec!["kiln".to_owned()],
    );
    config.runtime = Runtime::Cloud;
    config.issuer = "https://kiln.test".to_owned();
    let server = Server::start(&config, LogRing::new()).await.expect("starts");
    (server, alice, bob)
}

#[tokio::test]
async fn issue_12_requests_without_valid_credentials_get_401_and_public_routes_stay_open() {
    let (server, alice, _) = cloud("anonymous").await;
    let anonymous = send(&server, request("GET", "/api/queue").body(Body::empty()).unwrap()).await;
    assert_eq!(anonymous.status, StatusCode::UNAUTHORIZED);
    assert_eq!(anonymous.headers["www-authenticate"], "Bearer realm=\"kiln\"");
    assert_eq!(anonymous.headers["cache-control"], "no-store");
    assert_eq!(anonymous.json()["code"], "unauthenticated");
    for bad in ["comfyui-not-a-key", "x"] {
        let refused = send(
            &server,
            request("GET", "/api/queue").header("x-api-key", bad).body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(refused.status, StatusCode::UNAUTHORIZED);
    }
    let forged = send(
        &server,
        request("GET", "/api/queue")
            .header("authorization", "Bearer eyJhbGciOiJub25lIn0.e30.")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(forged.status, StatusCode::UNAUTHORIZED);
    let keyed = send(
        &server,
        request("GET", "/api/queue").header("x-api-key", &alice).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(keyed.status, StatusCode::OK);
    let jwks =
        send(&server, request("GET", "/.well-known/jwks.json").body(Body::empty()).unwrap()).await;
    assert_eq!(jwks.status, StatusCode::OK);
    assert_eq!(jwks.json()["keys"][0]["alg"], "ES256");
    // OAuth discovery is public too.
    let oauth = send(
        &server,
        request("GET", "/.well-known/oauth-authorization-server").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(oauth.status, StatusCode::OK);
    // The frontend sends a browser without a session to sign in.
    let root = server.router().oneshot(request("GET", "/").body(Body::empty()).unwrap()).await;
    let root = root.expect("answers");
    assert_eq!(root.status(), StatusCode::SEE_OTHER);
    assert_eq!(root.headers()["location"], "/login");
}

#[tokio::test]
async fn issue_12_sign_in_sets_a_host_cookie_and_cookie_writes_need_the_csrf_token() {
    let (server, _, _) = cloud("session").await;
    let sign_in = |password: &str| {
        request("POST", "/api/auth/session")
            .header("content-type", "application/json")
            .body(Body::from(
                serde_json::json!({"username": "alice", "password": password}).to_string(),
            ))
            .unwrap()
    };
    // Another site cannot sign the browser in (login CSRF).
    let mut forged = sign_in("correct horse battery");
    forged.headers_mut().insert("origin", "https://evil.example".parse().expect("origin"));
    let forged = send(&server, forged).await;
    assert_eq!(
        (forged.status, forged.json()["code"].clone()),
        (StatusCode::FORBIDDEN, "origin_not_allowed".into())
    );
    assert!(!forged.headers.contains_key("set-cookie"));
    let wrong = send(&server, sign_in("wrong password!")).await;
    assert_eq!(wrong.status, StatusCode::UNAUTHORIZED);
    assert_eq!(wrong.json()["code"], "invalid_credentials");
    assert_eq!(wrong.headers["cache-control"], "no-store");
    let signed_in = send(&server, sign_in("correct horse battery")).await;
    assert_eq!(signed_in.status, StatusCode::OK);
    let set_cookie = signed_in.headers["set-cookie"].to_str().expect("ascii").to_owned();
    for attribute in ["__Host-comfy_session=", "Secure", "HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    let cookie = set_cookie.split(';').next().expect("pair").to_owned();
    let csrf = signed_in.json()["csrf_token"].as_str().expect("csrf").to_owned();

    let session = send(
        &server,
        request("GET", "/api/auth/session").header("cookie", &cookie).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(session.status, StatusCode::OK);
    assert_eq!(session.json()["username"], "alice");

    let write = |token: Option<&str>| {
        let mut builder = request("POST", "/api/settings/Comfy.Theme")
            .header("cookie", &cookie)
            .header("content-type", "application/json");
        if let Some(token) = token {
            builder = builder.header("x-csrf-token", token);
        }
        builder.body(Body::from("\"dark\"")).unwrap()
    };
    let missing = send(&server, write(None)).await;
    assert_eq!(
        (missing.status, missing.json()["code"].clone()),
        (StatusCode::FORBIDDEN, "csrf_invalid".into())
    );
    let foreign = send(&server, write(Some("not-the-token"))).await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert_eq!(send(&server, write(Some(&csrf))).await.status, StatusCode::OK);
    let cross_origin = send(
        &server,
        request("GET", "/api/settings")
            .header("cookie", &cookie)
            .header("origin", "https://evil.example")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(cross_origin.status, StatusCode::FORBIDDEN);

    // A token for the session's workspace works as a bearer token; one for bob's workspace is refused.
    let exchange = |body: serde_json::Value| {
        request("POST", "/api/auth/token")
            .header("cookie", &cookie)
            .header("x-csrf-token", &csrf)
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap()
    };
    let minted = send(&server, exchange(serde_json::json!({}))).await;
    assert_eq!(minted.status, StatusCode::OK);
    let token = minted.json()["token"].as_str().expect("token").to_owned();
    let with_token = send(
        &server,
        request("GET", "/api/settings")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(with_token.status, StatusCode::OK);
    assert_eq!(with_token.json()["Comfy.Theme"], "dark");
    // A token cannot renew itself, nor make an API key that would outlive it.
    let bearer = |method: &str, path: &str, body: &str| {
        request(method, path)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap()
    };
    assert_eq!(
        send(&server, bearer("POST", "/api/auth/token", "{}")).await.status,
        StatusCode::UNAUTHORIZED
    );
    let key = send(&server, bearer("POST", "/api/auth/api-keys", r#"{"name": "x"}"#)).await;
    assert_eq!(key.status, StatusCode::UNAUTHORIZED);
    let foreign = send(&server, exchange(serde_json::json!({"workspace_id": "b"}))).await;
    assert_eq!(foreign.status, StatusCode::FORBIDDEN);
    assert_eq!(foreign.json()["code"], "workspace_access_denied");

    // Signing out clears the cookie and ends the session.
    let out = send(
        &server,
        request("DELETE", "/api/auth/session")
            .header("cookie", &cookie)
            .header("x-csrf-token", &csrf)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(out.status, StatusCode::OK);
    assert!(out.headers["set-cookie"].to_str().expect("ascii").contains("Max-Age=0"));
    let after = send(
        &server,
        request("GET", "/api/auth/session").header("cookie", &cookie).body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn issue_12_one_workspace_cannot_see_another_workspaces_files_settings_or_keys() {
    let (server, alice, bob) = cloud("isolation").await;
    let as_user = |key: &str, method: &str, path: &str| {
        request(method, path).header("x-api-key", key.to_owned())
    };
    // Alice's settings and user data.
    let put = as_user(&alice, "POST", "/api/userdata/notes.json")
        .body(Body::from("{\"secret\": 1}"))
        .unwrap();
    assert_eq!(send(&server, put).await.status, StatusCode::OK);
    let read =
        |key: &str| as_user(key, "GET", "/api/userdata/notes.json").body(Body::empty()).unwrap();
    assert_eq!(send(&server, read(&alice)).await.status, StatusCode::OK);
    assert_eq!(send(&server, read(&bob)).await.status, StatusCode::NOT_FOUND);

    // Alice's uploaded image: bob can neither view it nor see it in LoadImage's list.
    let png = {
        let mut bytes = Vec::new();
        image::RgbImage::new(2, 2)
            .write_to(&mut std::io::Cursor::new(&mut bytes), image::ImageFormat::Png)
            .expect("png");
        bytes
    };
    let boundary = "kilnboundary";
    let mut form = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"image\"; filename=\"alice.png\"\r\nContent-Type: image/png\r\n\r\n"
    )
    .into_bytes();
    form.extend_from_slice(&png);
    form.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let upload = as_user(&alice, "POST", "/api/upload/image")
        .header("content-type", format!("multipart/form-data; boundary={boundary}"))
        .body(Body::from(form))
        .unwrap();
    assert_eq!(send(&server, upload).await.status, StatusCode::OK);
    let view = |key: &str| {
        as_user(key, "GET", "/api/view?filename=alice.png&type=input").body(Body::empty()).unwrap()
    };
    assert_eq!(send(&server, view(&alice)).await.status, StatusCode::OK);
    assert_eq!(send(&server, view(&bob)).await.status, StatusCode::NOT_FOUND);
    let listed =
        |key: &str| as_user(key, "GET", "/api/object_info/LoadImage").body(Body::empty()).unwrap();
    let images =
        |answer: Answered| answer.json()["LoadImage"]["input"]["required"]["image"][0].clone();
    assert_eq!(images(send(&server, listed(&alice)).await), serde_json::json!(["alice.png"]));
    assert_eq!(images(send(&server, listed(&bob)).await), serde_json::json!([]));

    // Bob cannot revoke alice's key, and a revoked key stops working.
    let keys =
        send(&server, as_user(&alice, "GET", "/api/auth/api-keys").body(Body::empty()).unwrap())
            .await;
    let id = keys.json()["keys"][0]["id"].as_str().expect("id").to_owned();
    assert!(!String::from_utf8_lossy(&keys.body).contains(&alice), "the secret is never listed");
    let revoke = |key: &str| {
        as_user(key, "DELETE", &format!("/api/auth/api-keys/{id}")).body(Body::empty()).unwrap()
    };
    assert_eq!(send(&server, revoke(&bob)).await.status, StatusCode::NOT_FOUND);
    assert_eq!(send(&server, revoke(&alice)).await.status, StatusCode::NO_CONTENT);
    assert_eq!(send(&server, read(&alice)).await.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn issue_12_rotated_keys_are_published_and_tokens_of_the_previous_key_still_verify() {
    let (server, _, _) = cloud("rotation").await;
    let body = serde_json::json!({"username": "alice", "password": "correct horse battery"});
    let signed_in = send(
        &server,
        request("POST", "/api/auth/session").body(Body::from(body.to_string())).unwrap(),
    )
    .await;
    let set_cookie = signed_in.headers["set-cookie"].to_str().expect("ascii").to_owned();
    let cookie = set_cookie.split(';').next().expect("pair").to_owned();
    let csrf = signed_in.json()["csrf_token"].as_str().expect("csrf").to_owned();
    let mint = || {
        request("POST", "/api/auth/token")
            .header("cookie", &cookie)
            .header("x-csrf-token", &csrf)
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap()
    };
    let before = send(&server, mint()).await.json()["token"].as_str().expect("token").to_owned();
    kiln_server::rotate_signing_keys(&data_dir("rotation")).expect("rotates");
    let jwks = send(&server, request("GET", "/.well-known/jwks.json").body(Body::empty()).unwrap())
        .await
        .json();
    let kids: Vec<&str> =
        jwks["keys"].as_array().expect("keys").iter().filter_map(|k| k["kid"].as_str()).collect();
    assert_eq!(kids.len(), 2, "the current and the previous key: {kids:?}");
    let with = |token: &str| {
        request("GET", "/api/queue")
            .header("authorization", format!("Bearer {token}"))
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        send(&server, with(&before)).await.status,
        StatusCode::OK,
        "the previous key verifies"
    );
    let after = send(&server, mint()).await.json()["token"].as_str().expect("token").to_owned();
    assert_eq!(send(&server, with(&after)).await.status, StatusCode::OK);
}

#[tokio::test]
async fn issue_12_the_local_runtime_with_an_api_key_file_requires_the_key_on_every_operation() {
    let dir = data_dir("local-key");
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = Config::under(
        dir,
        vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 0))],
        vec!["kiln".to_owned()],
    );
    config.api_key = Some("0123456789abcdef-local".to_owned());
    let server = Server::start(&config, LogRing::new()).await.expect("starts");
    let local = |request: Request<Body>| async { crate::answer(&server, "local", request).await.0 };
    assert_eq!(
        local(request("GET", "/api/queue").body(Body::empty()).unwrap()).await,
        StatusCode::UNAUTHORIZED
    );
    let wrong = request("GET", "/api/queue").header("x-api-key", "0123456789abcdef-wrong");
    assert_eq!(local(wrong.body(Body::empty()).unwrap()).await, StatusCode::UNAUTHORIZED);
    let keyed = request("GET", "/api/queue").header("x-api-key", "0123456789abcdef-local");
    assert_eq!(local(keyed.body(Body::empty()).unwrap()).await, StatusCode::OK);
    let bearer =
        request("GET", "/api/queue").header("authorization", "Bearer 0123456789abcdef-local");
    assert_eq!(local(bearer.body(Body::empty()).unwrap()).await, StatusCode::OK);
    // The MCP endpoint too (#13): an MCP client sends the key as its bearer token.
    let initialize = |key: Option<&str>| {
        let mut builder = Request::builder()
            .method("POST")
            .uri("/mcp")
            .header("host", "127.0.0.1:8188")
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(key) = key {
            builder = builder.header("authorization", format!("Bearer {key}"));
        }
        let message = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
        builder.body(Body::from(message.to_string())).unwrap()
    };
    assert_eq!(local(initialize(None)).await, StatusCode::UNAUTHORIZED);
    assert_eq!(local(initialize(Some("0123456789abcdef-local"))).await, StatusCode::OK);
}
