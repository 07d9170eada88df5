//! A checking proxy in front of the real `kiln` binary: the integration tests talk to it, it forwards every
//! request unchanged, and hands every answer (and every websocket frame the server sends) to the [`Contract`]
//! before passing it on. It runs on its own thread and runtime, so sync and async tests can both use it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::ws::{Message as ClientMessage, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts as _, Request, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use axum::response::{IntoResponse as _, Response};
use futures::{SinkExt as _, StreamExt as _};
use tokio::sync::oneshot;
use tokio_tungstenite::tungstenite::{self, Message as ServerMessage};

use crate::contract::{Answer, Contract};

/// The running proxy; dropping it stops it.
pub struct Proxy {
    /// Where the proxy listens.
    pub addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

struct Forward {
    backend: String,
    http: reqwest::Client,
    contract: Arc<Contract>,
}

/// Starts a proxy on a free loopback port that forwards to `backend` (host:port) and checks with `contract`.
pub fn start(backend: &str, contract: Arc<Contract>) -> Proxy {
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .build()
        .expect("an HTTP client");
    let forward = Arc::new(Forward { backend: backend.to_owned(), http, contract });
    let (stop, stopped) = oneshot::channel::<()>();
    let (ready, bound) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
            ready.send(listener.local_addr().expect("an address")).expect("the test waits");
            let app = axum::Router::new().fallback(relay).with_state(forward);
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
    });
    let addr = bound.recv().expect("the proxy binds");
    Proxy { addr, stop: Some(stop), thread: Some(thread) }
}

const HOP_BY_HOP: [HeaderName; 4] =
    [header::CONNECTION, header::TRANSFER_ENCODING, header::CONTENT_LENGTH, header::UPGRADE];

async fn relay(State(forward): State<Arc<Forward>>, request: Request) -> Response {
    let is_upgrade = request
        .headers()
        .get(header::UPGRADE)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if is_upgrade {
        return relay_websocket(forward, request).await;
    }
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.expect("the request body reads");
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut outgoing = forward
        .http
        .request(parts.method.clone(), format!("http://{}{path_and_query}", forward.backend))
        .body(body);
    for (name, value) in parts.headers.iter().filter(|(name, _)| !HOP_BY_HOP.contains(name)) {
        outgoing = outgoing.header(name, value);
    }
    let answer = match outgoing.send().await {
        Ok(answer) => answer,
        Err(error) => return (StatusCode::BAD_GATEWAY, format!("proxy: {error}")).into_response(),
    };
    let status = answer.status();
    let headers = answer.headers().clone();
    let bytes = answer.bytes().await.unwrap_or_default();
    check(&forward.contract, parts.method.as_str(), parts.uri.path(), status, &headers, &bytes);
    response(status, &headers, bytes)
}

/// Hands the backend's answer to a request to the contract.
fn check(
    contract: &Contract,
    method: &str,
    path: &str,
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) {
    contract.check(&Answer {
        method,
        path,
        status: status.as_u16(),
        content_type: headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()),
        body,
    });
}

/// The backend's answer, passed on to the client without its hop-by-hop headers.
fn response(
    status: StatusCode,
    headers: &HeaderMap,
    body: impl Into<axum::body::Body>,
) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = status;
    for (name, value) in headers.iter().filter(|(name, _)| !HOP_BY_HOP.contains(name)) {
        response.headers_mut().append(name, value.clone());
    }
    response
}

/// Opens the same websocket on the backend, then relays messages both ways, checking the server's text frames.
async fn relay_websocket(forward: Arc<Forward>, request: Request) -> Response {
    let (mut parts, _) = request.into_parts();
    let path_and_query = parts.uri.path_and_query().map_or("/ws", |p| p.as_str()).to_owned();
    let mut backend_request = tungstenite::client::IntoClientRequest::into_client_request(format!(
        "ws://{}{path_and_query}",
        forward.backend
    ))
    .expect("a websocket request");
    // What the server decides on: the origin rule, and the cloud runtime's credentials.
    let passed = [header::ORIGIN, header::HOST, header::COOKIE, header::AUTHORIZATION];
    for name in passed.into_iter().chain([header::HeaderName::from_static("x-api-key")]) {
        if let Some(value) = parts.headers.get(&name) {
            backend_request.headers_mut().insert(name, value.clone());
        }
    }
    let path = parts.uri.path().to_owned();
    let backend = match tokio_tungstenite::connect_async(backend_request).await {
        Ok((backend, handshake)) => {
            check(&forward.contract, "GET", &path, handshake.status(), handshake.headers(), b"");
            backend
        }
        Err(tungstenite::Error::Http(refused)) => {
            let body = refused.body().clone().unwrap_or_default();
            check(&forward.contract, "GET", &path, refused.status(), refused.headers(), &body);
            return response(refused.status(), refused.headers(), body);
        }
        Err(error) => return (StatusCode::BAD_GATEWAY, format!("proxy: {error}")).into_response(),
    };
    let upgrade = match WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
        Ok(upgrade) => upgrade,
        Err(rejection) => return rejection.into_response(),
    };
    let contract = forward.contract.clone();
    upgrade.on_upgrade(move |client| pump(client, backend, contract))
}

type Backend =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn pump(client: WebSocket, backend: Backend, contract: Arc<Contract>) {
    let (mut to_client, mut from_client) = client.split();
    let (mut to_backend, mut from_backend) = backend.split();
    let upstream = async {
        while let Some(Ok(message)) = from_client.next().await {
            let message = match message {
                ClientMessage::Text(text) => ServerMessage::text(text.as_str()),
                ClientMessage::Binary(bytes) => ServerMessage::binary(bytes),
                ClientMessage::Ping(bytes) => ServerMessage::Ping(bytes),
                ClientMessage::Pong(bytes) => ServerMessage::Pong(bytes),
                ClientMessage::Close(_) => break,
            };
            if to_backend.send(message).await.is_err() {
                break;
            }
        }
        let _ = to_backend.close().await;
    };
    let downstream = async {
        while let Some(Ok(message)) = from_backend.next().await {
            let message = match message {
                ServerMessage::Text(text) => {
                    contract.check_ws_frame(text.as_str());
                    ClientMessage::Text(text.as_str().into())
                }
                ServerMessage::Binary(bytes) => ClientMessage::Binary(bytes),
                ServerMessage::Ping(bytes) => ClientMessage::Ping(bytes),
                ServerMessage::Pong(bytes) => ClientMessage::Pong(bytes),
                ServerMessage::Close(_) => break,
                ServerMessage::Frame(_) => continue,
            };
            if to_client.send(message).await.is_err() {
                break;
            }
        }
        let _ = to_client.close().await;
    };
    tokio::select! {
        () = upstream => {}
        () = downstream => {}
    }
}
