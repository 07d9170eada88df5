//! The cloud runtime's own operations (`CloudApi`): sign-in and the web session, API keys, first-party tokens
//! and the signing keys; the OAuth authorization server's operations are answered by `crate::oauth`.

use axum::http::request::Parts;
use chrono::{DateTime, Utc};
use kiln_spec::types;

use super::gate::{Principal, Via};
use super::{Cloud, SESSION_COOKIE};
use crate::accounts::{AccountError, ApiKeyId, ApiKeyInfo, Session, WorkspaceId};
use crate::api::*;
use crate::auth::tokens::NewToken;
use crate::service::api::{ApiServer, error};

fn time(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(seconds, 0).unwrap_or_default()
}

fn internal(e: AccountError) -> types::ErrorResponse {
    crate::api::internal("the account store", e)
}

fn session_cookie(secret: &str, max_age: i64) -> String {
    format!("{SESSION_COOKIE}={secret}; Path=/; Secure; HttpOnly; SameSite=Lax; Max-Age={max_age}")
}

fn session_answer(session: &Session) -> types::WebSessionResponse {
    types::WebSessionResponse {
        csrf_token: session.csrf_token.clone(),
        email: None,
        expires_at: time(session.expires_at),
        user_id: session.user.id.to_string(),
        username: Some(session.user.username.clone()),
        workspace_id: Some(session.workspace_id.to_string()),
    }
}

fn api_key(info: ApiKeyInfo) -> types::ApiKey {
    types::ApiKey {
        created_at: time(info.created_at),
        hint: info.hint,
        id: info.id.to_string(),
        last_used_at: info.last_used_at.map(time),
        name: info.name,
        revoked: info.revoked,
        workspace_id: info.workspace_id.to_string(),
    }
}

impl ApiServer {
    /// The cloud state; the cloud routes are mounted only on the cloud runtime, which has it.
    fn cloud(&self) -> Option<&Cloud> {
        self.0.cloud.as_deref()
    }

    /// The cloud state, for the operations only the cloud router mounts.
    fn cloud_state(&self) -> &Cloud {
        match self.cloud() {
            Some(cloud) => cloud,
            None => unreachable!(
                "cloud operations are mounted only on the cloud runtime, which has its state"
            ),
        }
    }

    fn principal(parts: &Parts) -> Option<&Principal> {
        parts.extensions.get::<Principal>()
    }
}

/// The gate lets no request without a principal reach the account operations; should one arrive, it is a
/// fault of the server, not of the client.
fn no_principal() -> types::ErrorResponse {
    crate::api::internal("authenticating the request", "no principal reached an account operation")
}

fn unauthenticated() -> types::ErrorResponse {
    error("unauthenticated", "sign in first")
}

impl CloudApi for ApiServer {
    async fn create_session(
        &self,
        _: Parts,
        body: types::CreateSessionRequest,
    ) -> CreateSessionResponse {
        let Some(cloud) = self.cloud() else {
            return CreateSessionResponse::Unauthorized(unauthenticated());
        };
        let accounts = &cloud.accounts;
        let user = match accounts.authenticate(&body.username, &body.password).await {
            Ok(user) => user,
            Err(AccountError::BadCredentials) => {
                return CreateSessionResponse::Unauthorized(error(
                    "invalid_credentials",
                    "unknown user or wrong password",
                ));
            }
            Err(e) => return CreateSessionResponse::InternalServerError(internal(e)),
        };
        let memberships = match accounts.memberships(&user.id).await {
            Ok(memberships) => memberships,
            Err(e) => return CreateSessionResponse::InternalServerError(internal(e)),
        };
        let wanted = body.workspace_id.map(WorkspaceId::from);
        let chosen = memberships
            .iter()
            .find(|m| wanted.as_ref().is_none_or(|w| *w == m.workspace.id))
            .map(|m| m.workspace.id.clone());
        let Some(workspace) = chosen else {
            return CreateSessionResponse::Forbidden(error(
                "workspace_access_denied",
                "the user is not a member of that workspace",
            ));
        };
        match accounts.create_session(&user.id, &workspace).await {
            Ok((secret, session)) => {
                let max_age = session.absolute_expires_at - chrono::Utc::now().timestamp();
                CreateSessionResponse::Ok {
                    body: session_answer(&session),
                    set_cookie: Some(session_cookie(&secret, max_age.max(0))),
                    cache_control: Some("no-store".to_owned()),
                }
            }
            Err(e) => CreateSessionResponse::InternalServerError(internal(e)),
        }
    }

    async fn get_session(&self, parts: Parts) -> GetSessionResponse {
        match Self::principal(&parts).map(|p| &p.via) {
            Some(Via::Session(_, session)) => GetSessionResponse::Ok(session_answer(session)),
            _ => GetSessionResponse::Unauthorized(unauthenticated()),
        }
    }

    async fn delete_session(&self, parts: Parts, _csrf: Option<String>) -> DeleteSessionResponse {
        let (Some(cloud), Some(Via::Session(secret, _))) =
            (self.cloud(), Self::principal(&parts).map(|p| &p.via))
        else {
            return DeleteSessionResponse::Unauthorized(unauthenticated());
        };
        match cloud.accounts.end_session(secret).await {
            Ok(_) => DeleteSessionResponse::Ok {
                body: types::SuccessResponse { success: true },
                set_cookie: Some(session_cookie("", 0)),
                cache_control: Some("no-store".to_owned()),
            },
            Err(e) => DeleteSessionResponse::InternalServerError(internal(e)),
        }
    }

    async fn exchange_token(
        &self,
        parts: Parts,
        body: Option<types::ExchangeTokenRequest>,
    ) -> ExchangeTokenResponse {
        let (Some(cloud), Some(principal)) = (self.cloud(), Self::principal(&parts)) else {
            return ExchangeTokenResponse::Unauthorized(unauthenticated());
        };
        let workspace = match body.and_then(|b| b.workspace_id) {
            Some(id) if id.is_empty() || id.len() > 64 => {
                return ExchangeTokenResponse::BadRequest(error(
                    "workspace_id_invalid",
                    "workspace_id must be a workspace id",
                ));
            }
            Some(id) => WorkspaceId::from(id),
            None => principal.workspace.clone(),
        };
        let role = match cloud.accounts.role(&principal.user, &workspace).await {
            Ok(Some(role)) => role,
            Ok(None) => {
                return ExchangeTokenResponse::Forbidden(error(
                    "workspace_access_denied",
                    "the user is not a member of that workspace",
                ));
            }
            Err(e) => return ExchangeTokenResponse::InternalServerError(internal(e)),
        };
        let new = NewToken {
            user_id: principal.user.as_str(),
            workspace_id: workspace.as_str(),
            role: role.as_str(),
        };
        match cloud.tokens.mint(&new) {
            Ok(minted) => {
                tracing::info!(jti = %minted.jti, workspace = %workspace, "API token minted");
                ExchangeTokenResponse::Ok(types::ExchangeTokenResponse {
                    expires_in: (minted.expires_at - chrono::Utc::now()).num_seconds().max(0),
                    token: minted.token,
                    token_type: "Bearer".to_owned(),
                    workspace_id: workspace.to_string(),
                })
            }
            Err(e) => ExchangeTokenResponse::InternalServerError(crate::api::internal(
                "signing a token",
                e,
            )),
        }
    }

    async fn list_api_keys(&self, parts: Parts) -> ListApiKeysResponse {
        let (Some(cloud), Some(principal)) = (self.cloud(), Self::principal(&parts)) else {
            return ListApiKeysResponse::InternalServerError(no_principal());
        };
        match cloud.accounts.list_api_keys(&principal.user).await {
            Ok(keys) => ListApiKeysResponse::Ok(types::ApiKeyList {
                keys: keys.into_iter().map(api_key).collect(),
            }),
            Err(e) => ListApiKeysResponse::InternalServerError(internal(e)),
        }
    }

    async fn create_api_key(
        &self,
        parts: Parts,
        body: types::CreateApiKeyRequest,
    ) -> CreateApiKeyResponse {
        let (Some(cloud), Some(principal)) = (self.cloud(), Self::principal(&parts)) else {
            return CreateApiKeyResponse::InternalServerError(no_principal());
        };
        let created =
            cloud.accounts.create_api_key(&principal.user, &principal.workspace, &body.name).await;
        match created {
            Ok((key, info)) => CreateApiKeyResponse::Created {
                body: types::CreatedApiKey { api_key: api_key(info), key },
                cache_control: Some("no-store".to_owned()),
            },
            Err(e @ AccountError::InvalidName { .. }) => {
                CreateApiKeyResponse::BadRequest(error("invalid_request", e.to_string()))
            }
            Err(e) => CreateApiKeyResponse::InternalServerError(internal(e)),
        }
    }

    async fn revoke_api_key(&self, parts: Parts, key_id: String) -> RevokeApiKeyResponse {
        let (Some(cloud), Some(principal)) = (self.cloud(), Self::principal(&parts)) else {
            return RevokeApiKeyResponse::InternalServerError(no_principal());
        };
        match cloud.accounts.revoke_api_key(&principal.user, &ApiKeyId::from(key_id)).await {
            Ok(true) => RevokeApiKeyResponse::NoContent,
            Ok(false) => RevokeApiKeyResponse::NotFound(error("not_found", "no such API key")),
            Err(e) => RevokeApiKeyResponse::InternalServerError(internal(e)),
        }
    }

    async fn get_jwks(&self, _: Parts) -> GetJwksResponse {
        let Some(cloud) = self.cloud() else {
            return GetJwksResponse::Ok(types::JwkSet { keys: Vec::new() });
        };
        cloud.keys.reload_if_changed();
        GetJwksResponse::Ok(cloud.keys.jwks())
    }

    async fn get_oauth_authorization_server_metadata(
        &self,
        _: Parts,
    ) -> GetOauthAuthorizationServerMetadataResponse {
        let oauth = &self.cloud_state().oauth;
        GetOauthAuthorizationServerMetadataResponse::Ok(oauth.metadata())
    }

    async fn get_oauth_protected_resource_metadata(
        &self,
        _: Parts,
    ) -> GetOauthProtectedResourceMetadataResponse {
        GetOauthProtectedResourceMetadataResponse::Ok(self.cloud_state().oauth.protected_resource())
    }

    async fn get_oauth_protected_resource_metadata_for_mcp(
        &self,
        _: Parts,
    ) -> GetOauthProtectedResourceMetadataForMcpResponse {
        let oauth = &self.cloud_state().oauth;
        GetOauthProtectedResourceMetadataForMcpResponse::Ok(oauth.protected_resource())
    }

    async fn oauth_authorize(
        &self,
        parts: Parts,
        query: OauthAuthorizeQuery,
    ) -> OauthAuthorizeResponse {
        self.cloud_state().oauth.authorize(&parts, query).await
    }

    async fn oauth_authorize_decision(
        &self,
        parts: Parts,
        body: types::OAuthConsentDecision,
    ) -> OauthAuthorizeDecisionResponse {
        match Self::principal(&parts).map(|p| &p.via) {
            Some(Via::Session(secret, session)) => {
                self.cloud_state().oauth.decide(secret, session, body).await
            }
            _ => OauthAuthorizeDecisionResponse::Forbidden(error(
                "session_required",
                "the decision is made in the browser session that signed in",
            )),
        }
    }

    async fn oauth_token(
        &self,
        parts: Parts,
        body: types::OAuthTokenRequest,
    ) -> OauthTokenResponse {
        self.cloud_state().oauth.token(&parts, body).await
    }

    async fn oauth_register(
        &self,
        parts: Parts,
        body: types::OAuthRegisterRequest,
    ) -> OauthRegisterResponse {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|info| info.0.ip());
        self.cloud_state().oauth.register(peer, &body).await
    }

    async fn get_oauth_client(&self, parts: Parts, client_id: String) -> GetOauthClientResponse {
        let token = crate::api::bearer(&parts.headers);
        self.cloud_state().oauth.read_client(&client_id, token).await
    }

    async fn oauth_consent_page(
        &self,
        parts: Parts,
        query: OauthConsentPageQuery,
    ) -> OauthConsentPageResponse {
        self.cloud_state().oauth.consent_page(&parts, query).await
    }
}
