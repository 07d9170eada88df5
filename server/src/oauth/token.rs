//! The token endpoint (RFC 6749 §3.2, §4.1.3, §6 with OAuth 2.1): client authentication by the client's
//! registered method, the authorization-code grant with PKCE, and rotating refresh tokens. Every answer is OAuth
//! JSON (the gate adds `Cache-Control: no-store` and `Pragma: no-cache`).

use axum::http::header;
use axum::http::request::Parts;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kiln_spec::types::{
    self, OAuthRegisterResponseTokenEndpointAuthMethod as AuthMethod, OAuthTokenErrorCode as Code,
};

use super::clients::Client;
use super::grants::{Grant, Redemption, RefreshRefusal, RefreshWanted, Refreshed};
use super::{AuthorizationServer, given, resource};
use crate::api::OauthTokenResponse;
use crate::auth::access::{ACCESS_TOKEN_LIFETIME, NewAccessToken};

/// A token endpoint answer.
pub(crate) type TokenAnswer = OauthTokenResponse;

fn oauth_error(code: Code, description: &str) -> types::OAuthTokenError {
    types::OAuthTokenError {
        error: code,
        error_description: Some(description.to_owned()),
        error_uri: None,
    }
}

fn refuse(code: Code, description: &str) -> TokenAnswer {
    OauthTokenResponse::BadRequest(oauth_error(code, description))
}

/// Kiln's own failure: logged, and answered 500 so the client keeps its tokens and may retry.
fn server_error(what: &str, error: &dyn std::fmt::Display) -> TokenAnswer {
    tracing::error!(%error, "{what}");
    OauthTokenResponse::InternalServerError(oauth_error(
        Code::ServerError,
        &format!("{what} failed; try again"),
    ))
}

fn unauthorized(description: &str, basic: bool) -> TokenAnswer {
    OauthTokenResponse::Unauthorized {
        body: oauth_error(Code::InvalidClient, description),
        www_authenticate: basic.then(|| "Basic realm=\"kiln\"".to_owned()),
    }
}

/// `Authorization: Basic` credentials (RFC 6749 §2.3.1: id and secret form-urlencoded, then joined by `:`).
/// `Err` for a malformed header.
fn basic_credentials(parts: &Parts) -> Result<Option<(String, String)>, ()> {
    let Some(value) = parts.headers.get(header::AUTHORIZATION) else { return Ok(None) };
    let value = value.to_str().map_err(|_| ())?;
    let Some((scheme, encoded)) = value.split_once(' ') else { return Err(()) };
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(());
    }
    let decoded = STANDARD.decode(encoded.trim()).map_err(|_| ())?;
    let decoded = String::from_utf8(decoded).map_err(|_| ())?;
    let (id, secret) = decoded.split_once(':').ok_or(())?;
    let unescape = |s: &str| -> String {
        form_urlencoded::parse(format!("x={s}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    };
    Ok(Some((unescape(id), unescape(secret))))
}

impl AuthorizationServer {
    /// `POST /oauth/token`.
    pub(crate) async fn token(
        &self,
        parts: &Parts,
        request: types::OAuthTokenRequest,
    ) -> TokenAnswer {
        let client = match self.authenticate_client(parts, &request).await {
            Ok(client) => client,
            Err(answer) => return answer,
        };
        match request.grant_type.as_str() {
            "authorization_code" => self.redeem_code(&client, &request).await,
            "refresh_token" => self.refresh(&client, &request).await,
            "" => refuse(Code::InvalidRequest, "grant_type is missing"),
            _ => refuse(
                Code::UnsupportedGrantType,
                "grant_type must be authorization_code or refresh_token",
            ),
        }
    }

    /// The client, authenticated by its registered method, or the answer refusing it.
    async fn authenticate_client(
        &self,
        parts: &Parts,
        request: &types::OAuthTokenRequest,
    ) -> Result<Client, TokenAnswer> {
        let basic = basic_credentials(parts).map_err(|()| {
            unauthorized("the Authorization header is not valid Basic credentials", true)
        })?;
        let form_id = given(&request.client_id);
        let form_secret = given(&request.client_secret);
        if basic.is_some() && form_secret.is_some() {
            return Err(refuse(
                Code::InvalidRequest,
                "use one client authentication method, not Basic and client_secret together",
            ));
        }
        let client_id = match (&basic, form_id) {
            (Some((id, _)), Some(form)) if id != form => {
                return Err(refuse(
                    Code::InvalidRequest,
                    "client_id differs from the Basic credentials",
                ));
            }
            (Some((id, _)), _) => id.clone(),
            (None, Some(id)) => id.to_owned(),
            (None, None) => return Err(unauthorized("client_id is missing", false)),
        };
        let client = match self.client(&client_id).await {
            Ok(Some(client)) => client,
            Ok(None) => return Err(unauthorized("unknown client", basic.is_some())),
            Err(super::authorize::ClientLookupError::Store(e)) => {
                return Err(server_error("reading the clients", &e));
            }
            Err(e) => return Err(unauthorized(&e.to_string(), basic.is_some())),
        };
        let ok = match client.auth_method {
            AuthMethod::None => basic.is_none() && form_secret.is_none(),
            AuthMethod::ClientSecretPost => {
                basic.is_none() && form_secret.is_some_and(|s| client.secret_matches(s))
            }
            AuthMethod::ClientSecretBasic => {
                basic.as_ref().is_some_and(|(_, secret)| client.secret_matches(secret))
            }
        };
        if !ok {
            let description = match client.auth_method {
                AuthMethod::None => "this client is public: send client_id without a secret",
                AuthMethod::ClientSecretPost => "send this client's client_secret in the form",
                AuthMethod::ClientSecretBasic => "send this client's secret with HTTP Basic",
            };
            return Err(unauthorized(
                description,
                basic.is_some() || client.auth_method == AuthMethod::ClientSecretBasic,
            ));
        }
        Ok(client)
    }

    async fn redeem_code(
        &self,
        client: &Client,
        request: &types::OAuthTokenRequest,
    ) -> TokenAnswer {
        let (Some(code), Some(verifier)) = (given(&request.code), given(&request.code_verifier))
        else {
            return refuse(Code::InvalidRequest, "code and code_verifier are required");
        };
        if let Some(asked) = given(&request.resource)
            && !resource::names(self.resource(), asked)
        {
            return refuse(
                Code::InvalidTarget,
                "the resource is not the one the code was issued for",
            );
        }
        let now = self.now();
        let redirect_uri = given(&request.redirect_uri);
        let (grant_id, grant) = match self.codes.redeem(
            code,
            &client.id,
            redirect_uri,
            verifier,
            now,
        ) {
            Redemption::First(grant_id, grant) => (grant_id, grant),
            Redemption::Replayed(grant_id) => {
                tracing::warn!(client = %client.id, "authorization code replayed: grant revoked");
                if let Err(e) = self.grants.revoke(&grant_id, now).await {
                    return server_error("revoking the grant of a replayed code", &e);
                }
                return refuse(Code::InvalidGrant, "the code was already used");
            }
            Redemption::Refused(why) => return refuse(Code::InvalidGrant, why),
        };
        match self.grants.create(grant_id, &grant, now).await {
            Ok((grant, refresh_token)) => {
                let refresh_token = refreshes(client).then_some(refresh_token);
                self.tokens(&grant, &grant.scope, refresh_token)
            }
            Err(e) => server_error("storing the grant", &e),
        }
    }

    async fn refresh(&self, client: &Client, request: &types::OAuthTokenRequest) -> TokenAnswer {
        if !refreshes(client) {
            return refuse(
                Code::UnauthorizedClient,
                "this client did not register the refresh_token grant",
            );
        }
        let Some(token) = given(&request.refresh_token) else {
            return refuse(Code::InvalidRequest, "refresh_token is required");
        };
        let wanted =
            RefreshWanted { scope: given(&request.scope), resource: given(&request.resource) };
        match self.grants.refresh(token, &client.id, wanted, self.now()).await {
            Ok(Refreshed::Rotated(grant, successor, scope)) => {
                self.tokens(&grant, &scope, Some(successor))
            }
            Ok(Refreshed::Refused(RefreshRefusal::Grant(why))) => refuse(Code::InvalidGrant, why),
            Ok(Refreshed::Refused(RefreshRefusal::Scope)) => {
                refuse(Code::InvalidScope, "a refresh cannot widen the granted scopes")
            }
            Ok(Refreshed::Refused(RefreshRefusal::Target)) => {
                refuse(Code::InvalidTarget, "the grant is not for that resource")
            }
            Err(e) => server_error("refreshing", &e),
        }
    }

    fn tokens(&self, grant: &Grant, scope: &str, refresh_token: Option<String>) -> TokenAnswer {
        let new = NewAccessToken {
            user_id: &grant.user_id,
            client_id: &grant.client_id,
            scope,
            workspace_id: &grant.workspace_id,
            grant_id: &grant.id,
        };
        match self.access.mint_at(&new, std::time::SystemTime::now()) {
            Ok(access_token) => OauthTokenResponse::Ok {
                body: types::OAuthTokenResponse {
                    access_token,
                    token_type: "Bearer".to_owned(),
                    expires_in: ACCESS_TOKEN_LIFETIME.as_secs() as i64,
                    scope: scope.to_owned(),
                    refresh_token,
                },
                cache_control: Some("no-store".to_owned()),
            },
            Err(e) => server_error("signing the access token", &e),
        }
    }
}

/// Whether the client registered the `refresh_token` grant (refresh tokens are issued only then).
fn refreshes(client: &Client) -> bool {
    client.grant_types.iter().any(|g| g == "refresh_token")
}
