//! The authentication layer: finds the operation a request is for (from the matched route), lets public
//! operations through, and for the others turns the credentials the operation's `security` allows into a
//! [`Caller`] in the request's extensions, or answers 401 (no or bad credentials) or 403 (a cookie write
//! without the session's CSRF token, a cookie request from another origin).
//!
//! Credentials, tried in this order among those the operation allows: `X-API-Key`, `Authorization: Bearer`
//! (a first-party JWT), the `__Host-comfy_session` cookie. A credential that is presented but not valid is
//! refused even if another one would do: a client learns at once that its key was revoked. Answers never say
//! which part of a credential was wrong, and every refusal carries `Cache-Control: no-store`.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{Cloud, SESSION_COOKIE};
use crate::accounts::{Role, Session, UserId, WorkspaceId};
use crate::api::{OperationInfo, bearer, operation, refuse};
use crate::workspace::Workspaces;

/// How a request was authenticated, for the operations that depend on it (the session routes).
#[derive(Clone)]
pub(crate) enum Via {
    /// The session cookie, with its secret.
    Session(Arc<str>, Session),
    /// An API key.
    ApiKey,
    /// A bearer token.
    Token,
}

/// The authenticated user, beside the [`crate::workspace::Caller`].
#[derive(Clone)]
pub(crate) struct Principal {
    /// The user.
    pub(crate) user: UserId,
    /// The workspace acted in.
    pub(crate) workspace: WorkspaceId,
    /// The user's role there.
    pub(crate) role: Role,
    /// How.
    pub(crate) via: Via,
}

/// What the gate needs.
pub(crate) struct Gate {
    /// Accounts and tokens.
    pub(crate) cloud: Arc<Cloud>,
    /// Where callers' workspaces are opened.
    pub(crate) workspaces: Arc<Workspaces>,
}

fn unauthenticated() -> Response {
    refuse(
        StatusCode::UNAUTHORIZED,
        "unauthenticated",
        "sign in, or send a valid X-API-Key or bearer token",
    )
}

/// A cookie's value from the `Cookie` headers.
pub(crate) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// Whether an `Origin` header, when present, is this server's own: the configured issuer's origin (scheme, host
/// and port), or the host the request was sent to (a direct connection, where `Host` is the browser's).
fn same_origin(headers: &HeaderMap, issuer: &str) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return true;
    };
    if origin.eq_ignore_ascii_case(issuer_origin(issuer)) {
        return true;
    }
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
    let origin_host = origin.split_once("://").map_or(origin, |(_, rest)| rest);
    origin_host.eq_ignore_ascii_case(host)
}

/// `scheme://host[:port]` of the issuer URL.
pub(crate) fn issuer_origin(issuer: &str) -> &str {
    let after_scheme = issuer.find("://").map_or(0, |at| at + 3);
    issuer[after_scheme..].find('/').map_or(issuer, |end| &issuer[..after_scheme + end])
}

fn other_origin() -> Response {
    refuse(
        StatusCode::FORBIDDEN,
        "origin_not_allowed",
        "a request with the session cookie must come from this server's own pages",
    )
}

/// The principal of an `X-API-Key`, if it is a live key (its role read now).
async fn key_principal(
    cloud: &Cloud,
    key: &HeaderValue,
) -> Result<Option<Principal>, crate::accounts::AccountError> {
    let found = cloud.accounts.api_key(key.to_str().unwrap_or_default()).await?;
    Ok(found.map(|p| Principal {
        user: p.user.id,
        workspace: p.workspace_id,
        role: p.role,
        via: Via::ApiKey,
    }))
}

/// The principal of a verified token for `user` in `workspace`. The membership is looked up again: a user
/// removed from the workspace loses its tokens at once.
async fn token_principal(
    cloud: &Cloud,
    user: String,
    workspace: String,
) -> Result<Option<Principal>, crate::accounts::AccountError> {
    let (user, workspace) = (UserId::from(user), WorkspaceId::from(workspace));
    let role = cloud.accounts.role(&user, &workspace).await?;
    Ok(role.map(|role| Principal { user, workspace, role, via: Via::Token }))
}

/// The outcome of checking a request's credentials.
enum Checked {
    /// Who it is.
    Principal(Principal),
    /// What to answer instead.
    Refused(Response),
}

async fn check(cloud: &Cloud, allowed: &[&str], method: &Method, headers: &HeaderMap) -> Checked {
    let allows = |scheme: &str| allowed.contains(&scheme);
    let internal = |e: crate::accounts::AccountError| {
        tracing::error!(error = %e, "cannot read the account store");
        Checked::Refused(refuse(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "the account store failed",
        ))
    };
    if allows("ApiKeyAuth")
        && let Some(key) = headers.get("x-api-key")
    {
        return match key_principal(cloud, key).await {
            Ok(Some(principal)) => Checked::Principal(principal),
            Ok(None) => Checked::Refused(unauthenticated()),
            Err(e) => internal(e),
        };
    }
    if allows("BearerAuth")
        && let Some(token) = bearer(headers)
    {
        let Ok(claims) = cloud.tokens.verify(token) else {
            return Checked::Refused(unauthenticated());
        };
        return match token_principal(cloud, claims.sub, claims.workspace_id).await {
            Ok(Some(principal)) => Checked::Principal(principal),
            Ok(None) => Checked::Refused(unauthenticated()),
            Err(e) => internal(e),
        };
    }
    if allows("WebSessionAuth")
        && let Some(secret) = cookie(headers, SESSION_COOKIE)
    {
        let session = match cloud.accounts.session(secret).await {
            Ok(Some(session)) => session,
            Ok(None) => return Checked::Refused(unauthenticated()),
            Err(e) => return internal(e),
        };
        if !same_origin(headers, &cloud.issuer) {
            return Checked::Refused(other_origin());
        }
        let safe = matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        let presented = headers.get("x-csrf-token").and_then(|v| v.to_str().ok()).unwrap_or("");
        if !safe && !crate::accounts::csrf_matches(secret, presented) {
            return Checked::Refused(refuse(
                StatusCode::FORBIDDEN,
                "csrf_invalid",
                "send the session's csrf_token (GET /api/auth/session) as X-CSRF-Token",
            ));
        }
        return Checked::Principal(Principal {
            user: session.user.id.clone(),
            workspace: session.workspace_id.clone(),
            role: session.role,
            via: Via::Session(secret.into(), session),
        });
    }
    Checked::Refused(unauthenticated())
}

/// The paths browser-based OAuth and MCP clients call from other origins: discovery, the JWKS, the token and
/// registration endpoints, and `/mcp` (never the authorization endpoint or consent, RFC 9700 §4.16). CORS
/// there carries no credentials: these endpoints take tokens, not cookies.
fn cross_origin_path(path: &str) -> bool {
    path.starts_with("/.well-known/") || matches!(path, "/oauth/token" | "/oauth/register" | "/mcp")
}

/// The cloud runtime's authentication layer (`Router::layer`: it runs after routing, so the matched route
/// names the operation), with CORS for [`cross_origin_path`]s: their preflight is answered here, before any
/// authentication.
pub(crate) async fn authenticate(
    State(gate): State<Arc<Gate>>,
    request: Request,
    next: Next,
) -> Response {
    if !cross_origin_path(request.uri().path()) {
        return check_request(gate, request, next).await;
    }
    let mut response = if request.method() == Method::OPTIONS {
        let mut preflight = StatusCode::NO_CONTENT.into_response();
        let headers = preflight.headers_mut();
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
        );
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(
                "authorization, content-type, x-api-key, mcp-protocol-version, mcp-session-id, \
                 last-event-id, mcp-method, mcp-name",
            ),
        );
        headers.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
        preflight
    } else {
        check_request(gate, request, next).await
    };
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(
            "www-authenticate, mcp-session-id, mcp-protocol-version, retry-after",
        ),
    );
    response
}

/// Authentication proper (see the module comment).
async fn check_request(gate: Arc<Gate>, mut request: Request, next: Next) -> Response {
    let route = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_owned());
    let Some(op) = route.as_deref().and_then(|r| operation(request.method(), r)) else {
        // Not an operation: the frontend's files and the sign-in page. A browser without a session that opens
        // the frontend is sent to sign in first.
        if matches!(request.uri().path(), "/" | "/index.html") {
            let session = cookie(request.headers(), SESSION_COOKIE).map(str::to_owned);
            let signed_in = match session {
                Some(secret) => matches!(gate.cloud.accounts.session(&secret).await, Ok(Some(_))),
                None => false,
            };
            if !signed_in {
                return super::signin::to_sign_in();
            }
        }
        return next.run(request).await;
    };
    if op.id == "oauthRegister" {
        // Read under the registration limit here: the body limit of the whole server is far larger.
        let (parts, body) = request.into_parts();
        match axum::body::to_bytes(body, crate::oauth::MAX_REGISTRATION_BYTES).await {
            Ok(bytes) => request = Request::from_parts(parts, axum::body::Body::from(bytes)),
            Err(_) => return registration_too_large(),
        }
    }
    let auth_route = op.path.starts_with("/api/auth/") || op.path.starts_with("/oauth/");
    // Signing in sets the cookie: another site must not sign a browser into an account of its choosing.
    if op.id == "createSession" && !same_origin(request.headers(), &gate.cloud.issuer) {
        return other_origin();
    }
    let principal = if op.path == "/mcp" {
        match mcp_principal(&gate, request.headers()).await {
            Ok((principal, mcp)) => {
                request.extensions_mut().insert(mcp);
                Some(principal)
            }
            Err(response) => return response,
        }
    } else if !op.is_public() && !self_authenticated(op) {
        let (method, headers) = (request.method().clone(), request.headers().clone());
        match check(&gate.cloud, &allowed(op), &method, &headers).await {
            Checked::Principal(principal) => Some(principal),
            Checked::Refused(response) => return response,
        }
    } else {
        None
    };
    if let Some(principal) = principal {
        let caller = gate.workspaces.caller(
            principal.workspace.as_str(),
            principal.user.as_str(),
            principal.role,
        );
        match caller {
            Ok(caller) => {
                tracing::debug!(
                    user = %caller.user,
                    role = %caller.role,
                    workspace = caller.workspace_id(),
                    "authenticated"
                );
                request.extensions_mut().insert(caller)
            }
            Err(error) => {
                tracing::error!(%error, "cannot open the caller's workspace");
                return refuse(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the workspace cannot be opened",
                );
            }
        };
        request.extensions_mut().insert(principal);
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    if auth_route {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
    }
    if matches!(op.id, "oauthAuthorize" | "oauthAuthorizeDecision" | "oauthConsentPage") {
        super::signin::forbid_framing(headers);
    }
    response
}

/// The credentials of a request to `/mcp`: an OAuth access token for the MCP resource (its grant live, the user
/// still a member of its workspace) or an API key. First-party API tokens are for the REST API and are
/// refused here. A refusal is a 401 with the challenge MCP clients start discovery from (RFC 9728 §5.1).
async fn mcp_principal(
    gate: &Gate,
    headers: &HeaderMap,
) -> Result<(Principal, crate::mcp::McpPrincipal), Response> {
    let cloud = &gate.cloud;
    let refused = |error: Option<&str>| {
        let mut response = refuse(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "send an OAuth access token for this MCP server (Authorization: Bearer) or an X-API-Key",
        );
        let url = cloud.oauth.resource_metadata_url();
        let challenge = crate::mcp::challenge(error, &crate::mcp::SCOPES, Some(&url));
        if let Ok(value) = HeaderValue::from_str(&challenge) {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, value);
        }
        response
    };
    let internal = |what: &str, e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "{what}");
        refuse(StatusCode::INTERNAL_SERVER_ERROR, "internal", "the account store failed")
    };
    let (found, scopes) = if let Some(key) = headers.get("x-api-key") {
        (key_principal(cloud, key).await, None)
    } else {
        let Some(token) = bearer(headers) else { return Err(refused(None)) };
        let claims = match cloud.oauth.verify_access_token(token).await {
            Ok(claims) => claims,
            Err(crate::oauth::AccessError::Invalid) => return Err(refused(Some("invalid_token"))),
            Err(crate::oauth::AccessError::Store(e)) => {
                return Err(internal("cannot read the OAuth grants", &e));
            }
        };
        let scopes = claims.scope.split(' ').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        (token_principal(cloud, claims.sub, claims.workspace_id).await, Some(scopes))
    };
    match found {
        Ok(Some(principal)) => {
            let mcp = crate::mcp::McpPrincipal { user: principal.user.to_string(), scopes };
            Ok((principal, mcp))
        }
        Ok(None) => Err(refused(Some("invalid_token"))),
        Err(e) => Err(internal("cannot read the account store", &e)),
    }
}

/// Operations whose handler checks their own credential (the registration access token of RFC 7592).
fn self_authenticated(op: &OperationInfo) -> bool {
    allowed(op) == ["RegistrationAccessToken"]
}

fn registration_too_large() -> Response {
    let limit = crate::oauth::MAX_REGISTRATION_BYTES;
    let body = kiln_spec::types::OAuthRegisterError {
        error: "request_too_large".to_owned(),
        error_description: Some(format!("a registration has at most {limit} bytes")),
    };
    let mut response = crate::api::OauthRegisterResponse::PayloadTooLarge(body).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Every scheme any of the operation's alternatives names (each alternative has one scheme in Kiln's spec).
fn allowed(op: &OperationInfo) -> Vec<&'static str> {
    op.security.iter().flat_map(|schemes| schemes.iter().copied()).collect()
}

#[cfg(test)]
mod tests {

    use super::*;

    #[test]
    fn origins_are_this_servers_when_they_name_the_issuer_or_the_host() {
        let headers = |host: &str, origin: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, HeaderValue::from_str(host).expect("host"));
            h.insert(header::ORIGIN, HeaderValue::from_str(origin).expect("origin"));
            h
        };
        let issuer = "https://kiln.example.com/base";
        assert_eq!(issuer_origin(issuer), "https://kiln.example.com");
        // Behind a proxy that rewrites Host, the issuer's origin is still this server.
        assert!(same_origin(&headers("127.0.0.1:8188", "https://kiln.example.com"), issuer));
        assert!(same_origin(&headers("127.0.0.1:8188", "http://127.0.0.1:8188"), issuer));
        assert!(!same_origin(&headers("127.0.0.1:8188", "https://evil.example"), issuer));
        assert!(!same_origin(
            &headers("kiln.example.com", "https://kiln.example.com.evil"),
            issuer
        ));
        assert!(
            same_origin(&HeaderMap::new(), issuer),
            "no Origin: not a cross-site browser request"
        );
    }

    #[test]
    fn cookies_are_found_by_name() {
        let mut headers = HeaderMap::new();
        headers
            .insert(header::COOKIE, HeaderValue::from_static("a=1; __Host-comfy_session=s3; b=2"));
        assert_eq!(cookie(&headers, SESSION_COOKIE), Some("s3"));
        assert_eq!(cookie(&headers, "c"), None);
    }
}
