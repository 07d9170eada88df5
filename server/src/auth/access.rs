//! OAuth access tokens for the MCP endpoint (RFC 9068 shape), signed by the same keys as the first-party API
//! tokens but told apart by `typ: at+jwt` and the audience: `aud` is the MCP resource (`<issuer>/mcp`), so
//! neither kind of token is accepted where the other is meant.
//!
//! Claims: `iss`, `sub` (user), `aud`, `client_id`, `scope`, `workspace_id`, `gid` (the grant: revoking it
//! revokes every access token minted from it), `jti`, `iat`, `exp`.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use serde::{Deserialize, Serialize};

use super::keys::SigningKeys;
use super::tokens::TokenError;

/// The `typ` header of access tokens (RFC 9068 §2.1).
pub(crate) const ACCESS_TOKEN_TYPE: &str = "at+jwt";

/// How long an access token is valid.
pub(crate) const ACCESS_TOKEN_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// The claims of an access token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AccessClaims {
    /// The issuer.
    pub(crate) iss: String,
    /// The user id.
    pub(crate) sub: String,
    /// The resource the token is for.
    pub(crate) aud: String,
    /// The client it was issued to.
    pub(crate) client_id: String,
    /// The granted scopes, space-separated.
    pub(crate) scope: String,
    /// The workspace the token acts in.
    pub(crate) workspace_id: String,
    /// The grant it was minted from.
    pub(crate) gid: String,
    /// The token id.
    pub(crate) jti: String,
    /// Issued at, seconds since the Unix epoch.
    pub(crate) iat: u64,
    /// Expires at, seconds since the Unix epoch.
    pub(crate) exp: u64,
}

/// What a new access token says.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewAccessToken<'a> {
    /// The user.
    pub(crate) user_id: &'a str,
    /// The client.
    pub(crate) client_id: &'a str,
    /// The scopes, space-separated.
    pub(crate) scope: &'a str,
    /// The workspace.
    pub(crate) workspace_id: &'a str,
    /// The grant.
    pub(crate) grant_id: &'a str,
}

/// Mints and verifies access tokens for one resource.
#[derive(Debug)]
pub(crate) struct AccessTokens {
    keys: Arc<SigningKeys>,
    issuer: String,
    resource: String,
    validation: Validation,
}

impl AccessTokens {
    /// Access tokens of `issuer` for `resource`.
    pub(crate) fn new(keys: Arc<SigningKeys>, issuer: &str, resource: &str) -> Self {
        let mut validation = Validation::new(Algorithm::ES256);
        validation.leeway = 0;
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[resource]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        AccessTokens { keys, issuer: issuer.to_owned(), resource: resource.to_owned(), validation }
    }

    /// The resource (`aud`) of the tokens.
    pub(crate) fn resource(&self) -> &str {
        &self.resource
    }

    /// Mints a token valid for [`ACCESS_TOKEN_LIFETIME`] from `now`.
    pub(crate) fn mint_at(
        &self,
        new: &NewAccessToken<'_>,
        now: SystemTime,
    ) -> Result<String, TokenError> {
        let iat = now
            .duration_since(UNIX_EPOCH)
            .map_err(|error| TokenError::Sign(error.to_string()))?
            .as_secs();
        let claims = AccessClaims {
            iss: self.issuer.clone(),
            sub: new.user_id.to_owned(),
            aud: self.resource.clone(),
            client_id: new.client_id.to_owned(),
            scope: new.scope.to_owned(),
            workspace_id: new.workspace_id.to_owned(),
            gid: new.grant_id.to_owned(),
            jti: uuid::Uuid::new_v4().to_string(),
            iat,
            exp: iat.saturating_add(ACCESS_TOKEN_LIFETIME.as_secs()),
        };
        let key = self.keys.current();
        let header = Header {
            typ: Some(ACCESS_TOKEN_TYPE.to_owned()),
            kid: Some(key.kid.clone()),
            ..Header::new(Algorithm::ES256)
        };
        jsonwebtoken::encode(&header, &claims, &key.encoding)
            .map_err(|error| TokenError::Sign(error.to_string()))
    }

    /// Checks a token (ES256, `typ`, a live `kid`, signature, `iss`, `aud`, `exp`) and returns its claims.
    pub(crate) fn verify(&self, token: &str) -> Result<AccessClaims, TokenError> {
        let invalid = |reason: String| TokenError::Invalid { reason };
        let header = jsonwebtoken::decode_header(token).map_err(|e| invalid(e.to_string()))?;
        if header.alg != Algorithm::ES256 || header.typ.as_deref() != Some(ACCESS_TOKEN_TYPE) {
            return Err(invalid(format!("not an ES256 {ACCESS_TOKEN_TYPE} token")));
        }
        let kid = header.kid.ok_or_else(|| invalid("no kid".into()))?;
        let key = self.keys.find(&kid).ok_or_else(|| invalid("unknown kid".into()))?;
        jsonwebtoken::decode::<AccessClaims>(token, &key.decoding, &self.validation)
            .map(|data| data.claims)
            .map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                _ => invalid(error.to_string()),
            })
    }
}
