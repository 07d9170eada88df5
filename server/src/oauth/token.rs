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
use super::grants::{Grant, Redemption, Refreshed};
use super::{AuthorizationServer, resource};
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
        let form_id = request.client_id.as_deref().filter(|id| !id.is_empty());
        let form_secret = request.client_secret.as_deref().filter(|s| !s.is_empty());
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
            Err(message) => return Err(refuse(Code::InvalidRequest, &message)),
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
        let (Some(code), Some(verifier)) =
            (request.code.as_deref(), request.code_verifier.as_deref())
        else {
            return refuse(Code::InvalidRequest, "code and code_verifier are required");
        };
        if let Some(asked) = request.resource.as_deref()
            && !resource::names(self.resource(), asked)
        {
            return refuse(
                Code::InvalidTarget,
                "the resource is not the one the code was issued for",
            );
        }
        let now = self.now();
        let grant = match self.codes.redeem(
            code,
            &client.id,
            request.redirect_uri.as_deref(),
            verifier,
            now,
        ) {
            Redemption::First(grant) => grant,
            Redemption::Replayed(grant_id) => {
                tracing::warn!(client = %client.id, "authorization code replayed: grant revoked");
                if let Err(e) = self.grants.revoke(&grant_id, now).await {
                    tracing::error!(error = %e, "cannot revoke a grant");
                }
                return refuse(Code::InvalidGrant, "the code was already used");
            }
            Redemption::Refused(why) => return refuse(Code::InvalidGrant, why),
        };
        let (grant, refresh_token) = match self.grants.create(&grant, now).await {
            Ok(created) => created,
            Err(e) => {
                tracing::error!(error = %e, "cannot store a grant");
                return refuse(
                    Code::InvalidGrant,
                    "the server could not store the grant; authorize again",
                );
            }
        };
        self.codes.redeemed(code, &grant.id);
        self.tokens(&grant, &grant.scope, refresh_token)
    }

    async fn refresh(&self, client: &Client, request: &types::OAuthTokenRequest) -> TokenAnswer {
        let Some(token) = request.refresh_token.as_deref() else {
            return refuse(Code::InvalidRequest, "refresh_token is required");
        };
        let (grant, successor) = match self.grants.refresh(token, &client.id, self.now()).await {
            Ok(Refreshed::Rotated(grant, successor)) => (grant, successor),
            Ok(Refreshed::Refused(why)) => return refuse(Code::InvalidGrant, why),
            Err(e) => {
                tracing::error!(error = %e, "cannot refresh");
                return refuse(Code::InvalidGrant, "the server could not refresh; authorize again");
            }
        };
        if let Some(asked) = request.resource.as_deref()
            && !resource::names(&grant.resource, asked)
        {
            return refuse(Code::InvalidTarget, "the grant is not for that resource");
        }
        let granted: Vec<&str> = grant.scope.split(' ').collect();
        let scope = match request.scope.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            Some(asked)
                if asked.split(' ').filter(|s| !s.is_empty()).all(|s| granted.contains(&s)) =>
            {
                asked.split(' ').filter(|s| !s.is_empty()).collect::<Vec<_>>().join(" ")
            }
            Some(_) => {
                return refuse(Code::InvalidScope, "a refresh cannot widen the granted scopes");
            }
            None => grant.scope.clone(),
        };
        self.tokens(&grant, &scope, successor)
    }

    fn tokens(&self, grant: &Grant, scope: &str, refresh_token: String) -> TokenAnswer {
        let new = NewAccessToken {
            user_id: &grant.user_id,
            client_id: &grant.client_id,
            scope,
            workspace_id: &grant.workspace_id,
            grant_id: &grant.id,
        };
        match self.access.mint_at(&new, self.system_time()) {
            Ok(access_token) => OauthTokenResponse::Ok {
                body: types::OAuthTokenResponse {
                    access_token,
                    token_type: "Bearer".to_owned(),
                    expires_in: ACCESS_TOKEN_LIFETIME.as_secs() as i64,
                    scope: scope.to_owned(),
                    refresh_token: Some(refresh_token),
                },
                cache_control: Some("no-store".to_owned()),
            },
            Err(e) => {
                tracing::error!(error = %e, "cannot sign an access token");
                refuse(Code::InvalidRequest, "the server could not sign a token; try again")
            }
        }
    }
}
