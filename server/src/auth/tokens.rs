//! First-party API tokens: the short-lived "Cloud JWT" of `POST /api/auth/token` (oauth.md §6).
//!
//! Header: `alg: ES256`, `typ: kiln-api+jwt` (explicit typing, RFC 8725 §3.11: MCP access tokens signed by the
//! same keys carry `typ: at+jwt` and are refused here, as are untyped or `JWT`-typed tokens), `kid`. Claims:
//! `iss`, `sub` (the user id), `aud`, `workspace_id`, `role` (`owner` or `member`), `jti` (UUID v4), `iat`,
//! `exp`, all required.
//!
//! Verification checks, in order: the header (ES256 only, the type, a `kid` of a live key, re-reading the key
//! directory once for an unknown one), the signature, then `iss`, `aud`, `exp` and the claims. `exp` has no
//! leeway: the tokens are minted and checked by the same server on the same clock.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, Utc};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use serde::{Deserialize, Serialize};

use super::keys::SigningKeys;

/// How long a minted token is valid unless the issuer is configured otherwise.
pub(crate) const DEFAULT_LIFETIME: Duration = Duration::from_secs(15 * 60);

/// The `typ` header of first-party API tokens.
pub(crate) const TOKEN_TYPE: &str = "kiln-api+jwt";

/// The workspace roles a token can carry.
const ROLES: [&str; 2] = ["owner", "member"];

/// What a new token is for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NewToken<'a> {
    /// The user (`sub`).
    pub(crate) user_id: &'a str,
    /// The workspace the token acts in.
    pub(crate) workspace_id: &'a str,
    /// The user's role there: `owner` or `member`.
    pub(crate) role: &'a str,
}

/// A minted token.
#[derive(Debug, Clone)]
pub(crate) struct Minted {
    /// The compact JWT (a secret: never log it).
    pub(crate) token: String,
    /// When it expires (its `exp`).
    pub(crate) expires_at: DateTime<Utc>,
    /// Its id (`jti`).
    pub(crate) jti: String,
}

/// The claims of a verified token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ApiTokenClaims {
    /// The issuer.
    pub(crate) iss: String,
    /// The user id.
    pub(crate) sub: String,
    /// The audience (the REST API).
    pub(crate) aud: String,
    /// The workspace the token acts in.
    pub(crate) workspace_id: String,
    /// `owner` or `member`.
    pub(crate) role: String,
    /// The token id.
    pub(crate) jti: String,
    /// Issued at, seconds since the Unix epoch.
    pub(crate) iat: u64,
    /// Expires at, seconds since the Unix epoch.
    pub(crate) exp: u64,
}

/// Why a token could not be minted or was rejected. `Expired` and `Invalid` answer 401; the others are server
/// faults.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TokenError {
    /// The token was valid but its `exp` has passed.
    #[error("the token has expired")]
    Expired,
    /// The token is malformed, of another type, signed by an unknown key, or for another issuer or audience.
    #[error("invalid token: {reason}")]
    Invalid {
        /// What is wrong (never the token itself).
        reason: String,
    },
    /// `mint` was asked for a role other than `owner` or `member`.
    #[error("cannot mint a token for role {0:?} (owner or member)")]
    UnknownRole(String),
    /// Signing failed (or the clock is before 1970).
    #[error("cannot sign a token: {0}")]
    Sign(String),
}

/// Mints and verifies first-party API tokens with the server's signing keys.
#[derive(Debug)]
pub(crate) struct TokenIssuer {
    /// The signing keys.
    keys: Arc<SigningKeys>,
    /// `iss`: the configured issuer, byte-identical everywhere (oauth.md §1.1).
    issuer: String,
    /// `aud`: the REST API.
    audience: String,
    /// How long minted tokens are valid.
    lifetime: Duration,
    /// The checks of [`TokenIssuer::verify`].
    validation: Validation,
}

impl TokenIssuer {
    /// An issuer of tokens for `audience`, valid for [`DEFAULT_LIFETIME`].
    pub(crate) fn new(
        keys: Arc<SigningKeys>,
        issuer: impl Into<String>,
        audience: impl Into<String>,
    ) -> Self {
        let (issuer, audience) = (issuer.into(), audience.into());
        let mut validation = Validation::new(Algorithm::ES256);
        validation.leeway = 0;
        validation.set_issuer(&[&issuer]);
        validation.set_audience(&[&audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        Self { keys, issuer, audience, lifetime: DEFAULT_LIFETIME, validation }
    }

    /// Mints a token signed by the current key.
    pub(crate) fn mint(&self, new: &NewToken<'_>) -> Result<Minted, TokenError> {
        self.mint_at(new, SystemTime::now())
    }

    /// Mints a token as if the time were `now` (tests mint expired tokens with it).
    pub(super) fn mint_at(
        &self,
        new: &NewToken<'_>,
        now: SystemTime,
    ) -> Result<Minted, TokenError> {
        if !ROLES.contains(&new.role) {
            return Err(TokenError::UnknownRole(new.role.to_owned()));
        }
        let iat = now
            .duration_since(UNIX_EPOCH)
            .map_err(|error| TokenError::Sign(error.to_string()))?
            .as_secs();
        let exp = iat.saturating_add(self.lifetime.as_secs());
        let expires_at =
            i64::try_from(exp)
                .ok()
                .and_then(|exp| DateTime::from_timestamp(exp, 0))
                .ok_or_else(|| TokenError::Sign(format!("expiry {exp} is out of range")))?;
        let claims = ApiTokenClaims {
            iss: self.issuer.clone(),
            sub: new.user_id.to_owned(),
            aud: self.audience.clone(),
            workspace_id: new.workspace_id.to_owned(),
            role: new.role.to_owned(),
            jti: uuid::Uuid::new_v4().to_string(),
            iat,
            exp,
        };
        let key = self.keys.current();
        let header = Header {
            typ: Some(TOKEN_TYPE.to_owned()),
            kid: Some(key.kid.clone()),
            ..Header::new(Algorithm::ES256)
        };
        let token = jsonwebtoken::encode(&header, &claims, &key.encoding)
            .map_err(|error| TokenError::Sign(error.to_string()))?;
        Ok(Minted { token, expires_at, jti: claims.jti })
    }

    /// Checks a token and returns its claims.
    pub(crate) fn verify(&self, token: &str) -> Result<ApiTokenClaims, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(invalid)?;
        if header.alg != Algorithm::ES256 {
            return Err(TokenError::Invalid {
                reason: format!("alg {:?} is not ES256", header.alg),
            });
        }
        if header.typ.as_deref() != Some(TOKEN_TYPE) {
            return Err(TokenError::Invalid { reason: format!("typ is not {TOKEN_TYPE}") });
        }
        let kid = header.kid.ok_or_else(|| TokenError::Invalid { reason: "no kid".into() })?;
        let key = self
            .keys
            .find(&kid)
            .ok_or_else(|| TokenError::Invalid { reason: "unknown kid".into() })?;
        let claims = jsonwebtoken::decode::<ApiTokenClaims>(token, &key.decoding, &self.validation)
            .map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => TokenError::Expired,
                _ => invalid(error),
            })?
            .claims;
        if !ROLES.contains(&claims.role.as_str()) {
            return Err(TokenError::Invalid { reason: "unknown role".into() });
        }
        Ok(claims)
    }
}

/// A rejection with jsonwebtoken's reason (which never quotes the token).
fn invalid(error: jsonwebtoken::errors::Error) -> TokenError {
    TokenError::Invalid { reason: error.to_string() }
}
