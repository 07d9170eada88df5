//! The authorization endpoint (RFC 6749 §4.1 with OAuth 2.1, RFC 7636, RFC 8707, RFC 9207) and consent.
//!
//! Order matters (oauth.md §5.4): the client and its redirect URI are checked first, and a problem with either
//! is shown (400), never redirected, since the redirect target is not trusted yet. Only then do other problems
//! go back to the client as error redirects, and only for a signed-in user (an unauthenticated request is sent
//! to sign in first, and comes back here). Every redirect to the client carries `iss`.

use axum::http::request::Parts;
use kiln_spec::types;

use super::clients::Client;
use super::grants::{CodeGrant, Pending, PendingError};
use super::{AuthorizationServer, SCOPES, given, redirect, resource};
use crate::accounts::{Session, csrf_matches, csrf_token};
use crate::api::{OauthAuthorizeDecisionResponse, OauthAuthorizeQuery, OauthAuthorizeResponse};
use crate::cloud::{SESSION_COOKIE, gate::cookie};
use crate::service::api::error;

/// What the consent page shows, or why it cannot.
#[derive(Debug)]
pub(crate) enum ConsentAnswer {
    /// The challenge.
    Challenge(Box<types::OAuthConsentChallenge>),
    /// No session: sign in and come back.
    SignIn,
    /// The request id is unknown, expired, used or another session's.
    Unknown(PendingError),
}

/// The longest `state` kept (it is held in memory until consent and sent back).
const MAX_STATE_BYTES: usize = 1024;

/// Why a client could not be looked up.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClientLookupError {
    /// Its metadata document cannot be used (the message names host and reason).
    #[error("{0}")]
    Document(super::cimd::CimdError),
    /// Kiln's store failed.
    #[error("the server could not read its clients; try again")]
    Store(#[source] super::clients::StoreError),
}

/// An error redirect to a client (RFC 6749 §4.1.2.1, RFC 9207).
fn error_redirect(
    redirect_uri: &str,
    error: &str,
    description: &str,
    state: Option<&str>,
    issuer: &str,
) -> String {
    let mut params = form_urlencoded::Serializer::new(String::new());
    params.append_pair("error", error).append_pair("error_description", description);
    if let Some(state) = state {
        params.append_pair("state", state);
    }
    params.append_pair("iss", issuer);
    with_query(redirect_uri, &params.finish())
}

/// `uri` with `query` appended to its own query.
fn with_query(uri: &str, query: &str) -> String {
    let separator = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{separator}{query}")
}

/// The query parameters that appear more than once (RFC 6749 §3.1: each may appear at most once).
fn repeated(parts: &Parts) -> Vec<String> {
    let mut seen: Vec<String> = Vec::new();
    let mut repeated = Vec::new();
    for (name, _) in form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
        if seen.iter().any(|s| *s == name) {
            if !repeated.iter().any(|r: &String| *r == name) {
                repeated.push(name.into_owned());
            }
        } else {
            seen.push(name.into_owned());
        }
    }
    repeated
}

/// The requested scopes, or the error description for `invalid_scope`. No `scope` means every scope;
/// `offline_access` is dropped (refresh tokens are always issued).
fn requested_scopes(scope: Option<&str>) -> Result<Vec<String>, String> {
    let asked: Vec<&str> = scope
        .unwrap_or("")
        .split(' ')
        .filter(|s| !s.is_empty() && *s != "offline_access")
        .collect();
    if let Some(unknown) = asked.iter().find(|s| !SCOPES.contains(s)) {
        return Err(format!("unknown scope `{unknown}` (this server has {})", SCOPES.join(", ")));
    }
    if asked.is_empty() {
        return Ok(SCOPES.iter().map(|s| (*s).to_owned()).collect());
    }
    // In the server's order, once each.
    Ok(SCOPES.iter().filter(|s| asked.contains(s)).map(|s| (*s).to_owned()).collect())
}

impl AuthorizationServer {
    /// The web session of a request's cookie, with its secret.
    async fn session(&self, parts: &Parts) -> Option<(String, Session)> {
        let secret = cookie(&parts.headers, SESSION_COOKIE)?;
        match self.accounts.session(secret).await {
            Ok(Some(session)) => Some((secret.to_owned(), session)),
            Ok(None) => None,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the session store");
                None
            }
        }
    }

    /// A client by id: a registered client, or the client whose metadata document the id is the URL of.
    pub(super) async fn client(
        &self,
        client_id: &str,
    ) -> Result<Option<Client>, ClientLookupError> {
        if self.documents.is_document_url(client_id) {
            let document =
                self.documents.get(client_id).await.map_err(ClientLookupError::Document)?;
            // Only the redirect URIs a registration could have: the document's other entries are ignored.
            let redirect_uris = document
                .redirect_uris
                .iter()
                .filter(|uri| redirect::check_registrable(uri).is_ok())
                .cloned()
                .collect();
            let application_type = match document.application_type.as_deref() {
                Some("web") => types::OAuthApplicationType::Web,
                _ => types::OAuthApplicationType::Native,
            };
            return Ok(Some(Client {
                id: document.client_id.clone(),
                name: Some(document.client_name.clone()),
                redirect_uris,
                auth_method: types::OAuthRegisterResponseTokenEndpointAuthMethod::None,
                secret_hash: None,
                application_type,
                grant_types: vec!["authorization_code".to_owned(), "refresh_token".to_owned()],
            }));
        }
        self.clients.find(client_id, self.now()).await.map_err(|e| {
            tracing::error!(error = %e, "cannot read the OAuth clients");
            ClientLookupError::Store(e)
        })
    }

    /// `GET /oauth/authorize`: an authorization request, or (with `oauth_request_id`) the consent challenge.
    pub(crate) async fn authorize(
        &self,
        parts: &Parts,
        query: OauthAuthorizeQuery,
    ) -> OauthAuthorizeResponse {
        if let Some(id) = query.oauth_request_id.as_deref() {
            return match self.challenge(parts, id).await {
                ConsentAnswer::Challenge(challenge) => OauthAuthorizeResponse::Ok {
                    body: *challenge,
                    cache_control: Some("no-store".into()),
                },
                ConsentAnswer::SignIn => OauthAuthorizeResponse::Unauthorized(error(
                    "unauthenticated",
                    "sign in to see this authorization request",
                )),
                ConsentAnswer::Unknown(PendingError::OtherSession) => {
                    OauthAuthorizeResponse::NotFound(error(
                        "not_found",
                        PendingError::OtherSession.to_string(),
                    ))
                }
                ConsentAnswer::Unknown(e) => {
                    OauthAuthorizeResponse::BadRequest(error("invalid_request", e.to_string()))
                }
            };
        }
        let shown =
            |message: String| OauthAuthorizeResponse::BadRequest(error("invalid_request", message));
        let repeated = repeated(parts);
        if repeated.iter().any(|p| p == "client_id" || p == "redirect_uri") {
            return shown("client_id and redirect_uri may each be sent once".into());
        }
        let Some(client_id) = given(&query.client_id) else {
            return shown("client_id is missing".into());
        };
        let client = match self.client(client_id).await {
            Ok(Some(client)) => client,
            Ok(None) => return shown(format!("unknown client_id `{}`", clip(client_id))),
            Err(e) => return shown(e.to_string()),
        };
        let sent_redirect = given(&query.redirect_uri);
        let redirect_uri = match sent_redirect {
            Some(uri) if redirect::is_registered(&client.redirect_uris, uri) => uri.to_owned(),
            Some(uri) => {
                return shown(format!(
                    "redirect_uri `{}` is not registered for this client",
                    clip(uri)
                ));
            }
            None if client.redirect_uris.len() == 1 => client.redirect_uris[0].clone(),
            None => return shown("redirect_uri is missing (the client registered several)".into()),
        };
        // From here on, problems go back to the client, but only to a signed-in user.
        let Some((secret, _session)) = self.session(parts).await else {
            return OauthAuthorizeResponse::SeeOther { location: Some(sign_in_then(parts)) };
        };
        let too_long = given(&query.state).is_some_and(|s| s.len() > MAX_STATE_BYTES);
        let state = given(&query.state).filter(|_| !too_long);
        let fail = |code: &str, description: &str| OauthAuthorizeResponse::Found {
            location: Some(error_redirect(&redirect_uri, code, description, state, &self.issuer)),
        };
        if let Some(name) = repeated.first() {
            return fail("invalid_request", &format!("`{name}` was sent more than once"));
        }
        if too_long {
            return fail("invalid_request", "state is longer than 1024 bytes");
        }
        if query.response_type.as_deref() != Some("code") {
            return fail("unsupported_response_type", "response_type must be `code`");
        }
        let Some(challenge) = given(&query.code_challenge) else {
            return fail("invalid_request", "code_challenge is required (PKCE S256)");
        };
        if query.code_challenge_method.as_deref() != Some("S256") {
            return fail("invalid_request", "code_challenge_method must be S256");
        }
        if !super::pkce::is_s256_challenge(challenge) {
            return fail("invalid_request", "code_challenge must be 43 base64url characters");
        }
        let scopes = match requested_scopes(given(&query.scope)) {
            Ok(scopes) => scopes,
            Err(message) => return fail("invalid_scope", &message),
        };
        if let Some(asked) = given(&query.resource)
            && !resource::names(self.resource(), asked)
        {
            return fail(
                "invalid_target",
                &format!("this server issues tokens only for {}", self.resource()),
            );
        }
        let now = self.now();
        let pending = Pending::new(
            client,
            (redirect_uri, sent_redirect.is_some()),
            state.map(str::to_owned),
            scopes,
            self.resource().to_owned(),
            challenge.to_owned(),
            now,
        );
        // Bound to this browser's session at once.
        let id = self.pending.insert(pending, &secret, now);
        OauthAuthorizeResponse::SeeOther {
            location: Some(format!("{}/oauth/consent?oauth_request_id={id}", self.issuer)),
        }
    }

    /// The consent challenge of pending request `id` for the request's session.
    pub(crate) async fn challenge(&self, parts: &Parts, id: &str) -> ConsentAnswer {
        let Some((secret, session)) = self.session(parts).await else {
            return ConsentAnswer::SignIn;
        };
        let pending = match self.pending.view(id, &secret, self.now()) {
            Ok(pending) => pending,
            Err(e) => return ConsentAnswer::Unknown(e),
        };
        let workspaces = match self.accounts.memberships(&session.user.id).await {
            Ok(memberships) => memberships
                .into_iter()
                .map(|m| types::OAuthConsentChallengeWorkspace {
                    id: m.workspace.id.to_string(),
                    name: m.workspace.name,
                    role: match m.role {
                        crate::accounts::Role::Owner => types::OAuthWorkspaceRole::Owner,
                        crate::accounts::Role::Member => types::OAuthWorkspaceRole::Member,
                    },
                    type_: types::OAuthWorkspaceType::Team,
                })
                .collect(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read memberships");
                Vec::new()
            }
        };
        ConsentAnswer::Challenge(Box::new(types::OAuthConsentChallenge {
            oauth_request_id: id.parse().unwrap_or_default(),
            csrf_token: csrf_token(&secret),
            client_display_name: pending
                .client
                .name
                .clone()
                .unwrap_or_else(|| "An unnamed application".to_owned()),
            client_id: Some(pending.client.id.clone()),
            client_application_type: Some(pending.client.application_type),
            redirect_uri: pending.redirect_uri.clone(),
            resource: Some(pending.resource.clone()),
            resource_display_name: format!("Kiln at {}", self.issuer),
            scopes: pending.scopes.clone(),
            workspaces,
            expires_at: chrono::DateTime::from_timestamp(pending.expires_at, 0),
        }))
    }

    /// `POST /oauth/authorize`: records the decision of the signed-in user with session `secret` and answers
    /// where the browser goes.
    pub(crate) async fn decide(
        &self,
        secret: &str,
        session: &Session,
        decision: types::OAuthConsentDecision,
    ) -> OauthAuthorizeDecisionResponse {
        let bad = |code: &str, message: String| {
            OauthAuthorizeDecisionResponse::BadRequest(error(code, message))
        };
        if !csrf_matches(secret, &decision.csrf_token) {
            return OauthAuthorizeDecisionResponse::Forbidden(error(
                "csrf_invalid",
                "csrf_token is not this session's (reload the consent page)",
            ));
        }
        let id = decision.oauth_request_id.to_string();
        let now = self.now();
        // Checked before the request is used up, so a wrong workspace loses nothing.
        let pending = match self.pending.view(&id, secret, now) {
            Ok(pending) => pending,
            Err(e) => return bad("invalid_request", e.to_string()),
        };
        let answer = |redirect_to: String| OauthAuthorizeDecisionResponse::Ok {
            body: types::OAuthAuthorizeRedirectResponse {
                redirect_url: Some(redirect_to.clone()),
                redirect_to,
            },
            cache_control: Some("no-store".into()),
        };
        let state = pending.state.as_deref();
        if decision.decision == types::OAuthDecision::Deny {
            if self.pending.take(&id, secret, now).is_err() {
                return bad("invalid_request", PendingError::Unknown.to_string());
            }
            return answer(error_redirect(
                &pending.redirect_uri,
                "access_denied",
                "the user denied access",
                state,
                &self.issuer,
            ));
        }
        let Some(workspace_id) = decision.workspace_id.as_deref() else {
            return bad("invalid_request", "workspace_id is required to allow".into());
        };
        let member = match self.accounts.memberships(&session.user.id).await {
            Ok(memberships) => memberships.iter().any(|m| m.workspace.id.as_str() == workspace_id),
            Err(e) => {
                tracing::error!(error = %e, "cannot read memberships");
                false
            }
        };
        if !member {
            return bad(
                "workspace_id_invalid",
                "that workspace was not offered to this user".into(),
            );
        }
        let pending = match self.pending.take(&id, secret, now) {
            Ok(pending) => pending,
            Err(e) => return bad("invalid_request", e.to_string()),
        };
        let grant = CodeGrant {
            client_id: pending.client.id.clone(),
            redirect_uri: pending.redirect_uri_sent.then(|| pending.redirect_uri.clone()),
            code_challenge: pending.code_challenge.clone(),
            resource: pending.resource.clone(),
            scope: pending.scopes.join(" "),
            user_id: session.user.id.to_string(),
            workspace_id: workspace_id.to_owned(),
        };
        let code = match self.codes.issue(grant, now) {
            Ok(code) => code,
            Err(e) => {
                tracing::error!(error = %e, "cannot issue a code");
                return answer(error_redirect(
                    &pending.redirect_uri,
                    "server_error",
                    "the server could not issue a code",
                    state,
                    &self.issuer,
                ));
            }
        };
        if let Err(e) = self.clients.approved(&pending.client.id, now).await {
            tracing::warn!(error = %e, "cannot mark the client approved");
        }
        tracing::info!(client = %pending.client.id, user = %session.user.id, "authorization approved");
        let mut params = form_urlencoded::Serializer::new(String::new());
        params.append_pair("code", &code);
        if let Some(state) = state {
            params.append_pair("state", state);
        }
        params.append_pair("iss", &self.issuer);
        answer(with_query(&pending.redirect_uri, &params.finish()))
    }
}

/// `/login?next=<this request>`: the sign-in page sends the browser back here.
fn sign_in_then(parts: &Parts) -> String {
    let here = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let next: String = form_urlencoded::byte_serialize(here.as_bytes()).collect();
    format!("/login?next={next}")
}

/// At most 100 characters of untrusted text, for messages.
fn clip(text: &str) -> String {
    text.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_default_to_all_and_unknown_ones_are_refused() {
        assert_eq!(requested_scopes(None).unwrap_or_default(), vec!["kiln:read", "kiln:run"]);
        assert_eq!(requested_scopes(Some("")).unwrap_or_default(), vec!["kiln:read", "kiln:run"]);
        assert_eq!(
            requested_scopes(Some("kiln:run offline_access")).unwrap_or_default(),
            vec!["kiln:run"]
        );
        assert!(requested_scopes(Some("kiln:read admin")).is_err());
    }

    #[test]
    fn error_redirects_carry_state_and_iss() {
        let to =
            error_redirect("cursor://x/cb?a=1", "access_denied", "no", Some("s 1"), "https://k");
        assert_eq!(
            to,
            "cursor://x/cb?a=1&error=access_denied&error_description=no&state=s+1&iss=https%3A%2F%2Fk"
        );
    }
}
