//! Kiln's MCP server at `/mcp`: the Streamable HTTP transport of rmcp ([`StreamableHttpService`] with
//! in-memory sessions) over Kiln's tools (`tools.rs`), behind Kiln's own checks (`access.rs`).
//!
//! Before rmcp sees a request, [`McpEndpoint::serve`] checks, in order: the `Origin` (403), the principal the
//! cloud gate put into the request (401 when required and absent), the `Mcp-Session-Id` (404 unless the
//! principal's user created that session, `sessions.rs`), and for a POST the scopes its JSON-RPC calls need
//! (403 `insufficient_scope`; the body is read under [`MAX_BODY`], 413 above). rmcp then checks `Host`
//! (`allowed_hosts`), `Accept`, `Content-Type` and the protocol version, and runs the call. Every error answer
//! is JSON: Kiln's `{code, message}`, or a JSON-RPC error object from rmcp.
//!
//! rmcp configuration: `legacy_session_mode` on (its default), because every MCP client before the 2026-07-28
//! revision needs `initialize` and a session; 2026-07-28 requests are served statelessly by rmcp whatever it
//! says. `json_response` on: stateless requests get one `application/json` answer instead of an SSE stream
//! when the tool sends nothing before its result (session requests are always SSE in rmcp). `sse_keep_alive`
//! 15 s (rmcp's default), so a `queue_prompt` that waits minutes keeps its stream alive through proxies. Idle
//! sessions close after [`SESSION_IDLE`], longer than the longest wait, so no session closes under a call.

mod access;
mod sessions;
#[cfg(test)]
mod tests;
mod tools;
mod views;

use std::collections::BTreeSet;
use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt as _;
use rmcp::transport::streamable_http_server::SessionManager as _;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::Value;

use self::access::Refusal;
pub(crate) use self::access::challenge;
use self::sessions::SessionOwners;
use self::tools::KilnTools;
use crate::service::worker::Service;
use crate::workspace::Caller;

/// The scope of the reading tools: list node types, list models, job status, outputs and images.
pub(crate) const SCOPE_READ: &str = "kiln:read";
/// The scope of queueing a prompt.
pub(crate) const SCOPE_RUN: &str = "kiln:run";
/// Every scope the tools need, in challenge order.
pub(crate) const SCOPES: [&str; 2] = [SCOPE_READ, SCOPE_RUN];

/// The largest POST body `/mcp` reads (rmcp's default cap too).
pub(crate) const MAX_BODY: usize = 4 * 1024 * 1024;

/// How long an MCP session may sit idle before rmcp closes it: longer than `queue_prompt`'s longest wait.
const SESSION_IDLE: Duration = Duration::from_secs(30 * 60);

/// The interval of SSE keep-alive comments on open streams.
const SSE_KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The user of every request to `/mcp` on the local runtime (no principal).
const LOCAL_USER: &str = "local";

/// The header that names an MCP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// The most bytes of a plain-text rmcp refusal read to turn it into JSON.
const REFUSAL_TEXT_LIMIT: usize = 64 * 1024;

/// Who calls /mcp: inserted into request extensions by the cloud gate; absent in the local runtime.
#[derive(Debug, Clone)]
pub(crate) struct McpPrincipal {
    /// The user id (the owner of the sessions this principal creates).
    pub(crate) user: String,
    /// None = every scope (API keys)
    pub(crate) scopes: Option<BTreeSet<String>>,
}

impl McpPrincipal {
    /// The local runtime's caller: every scope.
    fn local() -> McpPrincipal {
        McpPrincipal { user: LOCAL_USER.to_owned(), scopes: None }
    }

    /// Whether the principal was granted `scope`.
    fn has(&self, scope: &str) -> bool {
        self.scopes.as_ref().is_none_or(|granted| granted.contains(scope))
    }
}

/// How `/mcp` is exposed.
pub(crate) struct McpConfig {
    /// Host header values accepted (rmcp allowed_hosts); empty = no Host check.
    pub(crate) allowed_hosts: Vec<String>,
    /// Origins accepted; a request with any other Origin gets 403 (an empty list still rejects every present
    /// Origin).
    pub(crate) allowed_origins: Vec<String>,
    /// The protected-resource metadata URL for WWW-Authenticate (cloud), None in the local runtime.
    pub(crate) resource_metadata: Option<String>,
    /// Cloud: a request without McpPrincipal (or without the workspace `Caller`) is refused 401 (defence in
    /// depth; the gate should have answered first).
    pub(crate) require_principal: bool,
}

/// The `/mcp` endpoint: Kiln's checks in front of rmcp's Streamable HTTP service.
pub(crate) struct McpEndpoint {
    service: StreamableHttpService<KilnTools, LocalSessionManager>,
    sessions: Arc<LocalSessionManager>,
    owners: SessionOwners,
    config: McpConfig,
}

impl McpEndpoint {
    /// The endpoint over the runtime `server`.
    pub(crate) fn new(runtime: Weak<Service>, config: McpConfig) -> Self {
        let mut manager = LocalSessionManager::default();
        manager.session_config.keep_alive = Some(SESSION_IDLE);
        let sessions = Arc::new(manager);
        let transport = StreamableHttpServerConfig::default()
            .with_legacy_session_mode(true)
            .with_json_response(true)
            .with_sse_keep_alive(Some(SSE_KEEP_ALIVE))
            .with_max_request_body_bytes(MAX_BODY);
        // Origins are Kiln's check (JSON answer); rmcp's stays off.
        let transport = if config.allowed_hosts.is_empty() {
            transport.disable_allowed_hosts()
        } else {
            transport.with_allowed_hosts(config.allowed_hosts.clone())
        };
        let tools = KilnTools::new(runtime);
        let service =
            StreamableHttpService::new(move || Ok(tools.clone()), sessions.clone(), transport);
        McpEndpoint { service, sessions, owners: SessionOwners::default(), config }
    }

    /// Answers one request to `/mcp` (POST, GET or DELETE).
    pub(crate) async fn serve(&self, request: Request) -> Response {
        match self.admit(request).await {
            Ok(response) => response,
            Err(refusal) => refusal.response(self.config.resource_metadata.as_deref()),
        }
    }

    /// Kiln's checks, then rmcp, then the session bookkeeping.
    async fn admit(&self, request: Request) -> Result<Response, Refusal> {
        access::origin_allowed(request.headers(), &self.config.allowed_origins)?;
        let principal = match request.extensions().get::<McpPrincipal>() {
            // Without the gate's caller too, a cloud request would act as the fallback caller.
            Some(_)
                if self.config.require_principal
                    && request.extensions().get::<Caller>().is_none() =>
            {
                return Err(Refusal::Unauthenticated);
            }
            Some(principal) => principal.clone(),
            None if self.config.require_principal => return Err(Refusal::Unauthenticated),
            None => McpPrincipal::local(),
        };
        let session = request
            .headers()
            .get(SESSION_HEADER)
            .map(|id| String::from_utf8_lossy(id.as_bytes()).into_owned());
        if let Some(session) = &session
            && !self.owners.belongs_to(session, &principal.user)
        {
            return Err(Refusal::Session);
        }
        let method = request.method().clone();
        let request = if method == Method::POST {
            self.check_scopes(request, &principal).await?
        } else {
            request
        };
        let response = self.service.handle(request).await.map(Body::new);
        Ok(self.settle(response, &method, session.as_deref(), &principal.user).await)
    }

    /// Reads a POST body (under [`MAX_BODY`]) and refuses it if its calls need a scope the principal lacks; a
    /// body that is not JSON goes on to rmcp, which refuses it.
    async fn check_scopes(
        &self,
        request: Request,
        principal: &McpPrincipal,
    ) -> Result<Request, Refusal> {
        let (parts, body) = request.into_parts();
        let bytes = match http_body_util::Limited::new(body, MAX_BODY).collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                return Err(Refusal::TooLarge(MAX_BODY));
            }
            Err(e) => return Err(Refusal::Unreadable(e.to_string())),
        };
        if let Ok(body) = serde_json::from_slice::<Value>(&bytes) {
            let needed = access::needed_scopes(&body);
            if needed.iter().any(|scope| !principal.has(scope)) {
                return Err(Refusal::Scope(needed));
            }
        }
        Ok(Request::from_parts(parts, Body::from(bytes)))
    }

    /// Records a new session's owner, forgets deleted or vanished sessions, and turns rmcp's plain-text
    /// refusals into JSON.
    async fn settle(
        &self,
        response: Response,
        method: &Method,
        session: Option<&str>,
        user: &str,
    ) -> Response {
        let status = response.status();
        if status.is_success()
            && *method == Method::POST
            && let Some(created) = response.headers().get(SESSION_HEADER)
        {
            let evicted = {
                let live = self.sessions.sessions.read().await;
                self.owners.retain(|id| live.contains_key(id));
                self.owners.bind(&String::from_utf8_lossy(created.as_bytes()), user)
            };
            if let Some(oldest) = evicted {
                // One user's sessions are bounded: the oldest ends (its owner would have to initialize again).
                if let Err(error) = self.sessions.close_session(&oldest.as_str().into()).await {
                    tracing::warn!(%error, "cannot close an MCP session past the per-user limit");
                }
            }
        }
        let json = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|t| t.to_str().ok())
            .is_some_and(|t| t.starts_with("application/json"));
        // rmcp's own 404 (plain text) means the session is gone (closed for idleness).
        if let Some(session) = session
            && ((status.is_success() && *method == Method::DELETE)
                || (status == StatusCode::NOT_FOUND && !json))
        {
            self.owners.unbind(session);
        }
        if status.is_success() || json {
            return response;
        }
        let allow: Option<HeaderValue> = response.headers().get(header::ALLOW).cloned();
        let text = http_body_util::Limited::new(response.into_body(), REFUSAL_TEXT_LIMIT)
            .collect()
            .await
            .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
            .unwrap_or_default();
        access::as_json_error(status, allow, &text)
    }
}
