//! The OAuth 2.1 authorization server of the cloud runtime, for MCP clients (oauth.md): metadata (RFC 8414,
//! RFC 9728), dynamic client registration (RFC 7591, read per RFC 7592), client ID metadata documents, the
//! authorization endpoint with Kiln's own consent page, and the token endpoint (authorization code with PKCE
//! S256, rotating refresh tokens).
//!
//! The one resource tokens are issued for is the MCP endpoint, `<issuer>/mcp`; access tokens are ES256 JWTs
//! (`auth::access`), revocable through their grant.
//!
//! Modules: [`redirect`] (which redirect URIs may be registered and used), [`pkce`], [`resource`], [`clients`]
//! (registration and the clients table), [`grants`] (pending requests, codes, grants, refresh tokens),
//! `authorize` (the authorization endpoint and consent), `token` (the token endpoint), `consent_page`.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use kiln_spec::types;

use crate::accounts::Accounts;
use crate::auth::access::AccessTokens;
use crate::auth::keys::SigningKeys;

mod authorize;
pub(crate) mod cimd;
pub(crate) mod clients;
pub(crate) mod consent_page;
pub(crate) mod grants;
pub(crate) mod pkce;
pub(crate) mod redirect;
pub(crate) mod resource;
mod token;

/// The scopes: those the MCP tools need, granted together by default (oauth.md §1.9: a refresh cannot widen
/// them later).
pub(crate) use crate::mcp::{SCOPE_READ, SCOPE_RUN, SCOPES};

/// Registrations an address may make at once before the rate limit applies.
const REGISTRATION_BURST: u32 = 20;
/// Registrations an address earns per hour after a burst.
const REGISTRATIONS_PER_HOUR: u32 = 60;
/// The largest registration body.
pub(crate) const MAX_REGISTRATION_BYTES: usize = 16 * 1024;

/// The authorization server.
pub(crate) struct AuthorizationServer {
    /// The configured issuer, byte-identical everywhere.
    issuer: String,
    /// The accounts (sessions, memberships).
    accounts: Accounts,
    clients: clients::Clients,
    grants: grants::Grants,
    pending: grants::PendingRequests,
    codes: grants::Codes,
    /// Access tokens for `<issuer>/mcp`.
    access: AccessTokens,
    /// Clients identified by the URL of their metadata document.
    documents: cimd::ClientMetadataDocuments,
    registrations: DefaultKeyedRateLimiter<IpAddr>,
}

impl std::fmt::Debug for AuthorizationServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthorizationServer").field("issuer", &self.issuer).finish_non_exhaustive()
    }
}

impl AuthorizationServer {
    /// The authorization server of `issuer`, with its tables beside the accounts, fetching client metadata
    /// documents under `documents`.
    pub(crate) fn new(
        issuer: &str,
        accounts: Accounts,
        keys: Arc<SigningKeys>,
        documents: cimd::CimdPolicy,
    ) -> Self {
        let pool = accounts.pool().clone();
        let per_hour = NonZeroU32::new(REGISTRATIONS_PER_HOUR).unwrap_or(NonZeroU32::MIN);
        let burst = NonZeroU32::new(REGISTRATION_BURST).unwrap_or(NonZeroU32::MIN);
        AuthorizationServer {
            issuer: issuer.to_owned(),
            clients: clients::Clients::new(pool.clone(), issuer),
            grants: grants::Grants::new(pool),
            pending: grants::PendingRequests::default(),
            codes: grants::Codes::default(),
            access: AccessTokens::new(keys, issuer, &format!("{issuer}/mcp")),
            documents: cimd::ClientMetadataDocuments::new(documents),
            registrations: RateLimiter::keyed(Quota::per_hour(per_hour).allow_burst(burst)),
            accounts,
        }
    }

    /// The MCP resource tokens are for (`<issuer>/mcp`).
    pub(crate) fn resource(&self) -> &str {
        self.access.resource()
    }

    /// The protected-resource metadata URL of the MCP endpoint (for `WWW-Authenticate`).
    pub(crate) fn resource_metadata_url(&self) -> String {
        format!("{}/.well-known/oauth-protected-resource/mcp", self.issuer)
    }

    /// Now, in unix seconds.
    fn now(&self) -> i64 {
        crate::accounts::now()
    }

    /// RFC 8414 metadata.
    pub(crate) fn metadata(&self) -> types::OAuthAuthorizationServerMetadata {
        let issuer = &self.issuer;
        let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect();
        types::OAuthAuthorizationServerMetadata {
            issuer: issuer.clone(),
            authorization_endpoint: format!("{issuer}/oauth/authorize"),
            token_endpoint: format!("{issuer}/oauth/token"),
            registration_endpoint: Some(format!("{issuer}/oauth/register")),
            jwks_uri: format!("{issuer}/.well-known/jwks.json"),
            response_types_supported: strings(&["code"]),
            response_modes_supported: strings(&["query"]),
            grant_types_supported: strings(&["authorization_code", "refresh_token"]),
            code_challenge_methods_supported: strings(&["S256"]),
            token_endpoint_auth_methods_supported: strings(&[
                "none",
                "client_secret_post",
                "client_secret_basic",
            ]),
            scopes_supported: strings(&SCOPES),
            authorization_response_iss_parameter_supported: Some(true),
            client_id_metadata_document_supported: Some(true),
            revocation_endpoint: None,
            service_documentation: None,
        }
    }

    /// RFC 9728 metadata of the MCP endpoint (the same document at the root and the path form).
    pub(crate) fn protected_resource(&self) -> types::OAuthProtectedResourceMetadata {
        types::OAuthProtectedResourceMetadata {
            resource: self.resource().to_owned(),
            authorization_servers: vec![self.issuer.clone()],
            scopes_supported: SCOPES.iter().map(|s| (*s).to_owned()).collect(),
            bearer_methods_supported: vec!["header".to_owned()],
            resource_name: Some("Kiln MCP server".to_owned()),
        }
    }

    /// Registers a client for a request from `peer` (rate limited per address).
    pub(crate) async fn register(
        &self,
        peer: Option<IpAddr>,
        request: &types::OAuthRegisterRequest,
    ) -> crate::api::OauthRegisterResponse {
        use crate::api::OauthRegisterResponse as Answer;
        let error = |code: &str, description: String| types::OAuthRegisterError {
            error: code.to_owned(),
            error_description: Some(description),
        };
        let key = registration_key(peer);
        // Forget addresses whose bucket has refilled, so the limiter's memory stays bounded.
        if self.registrations.len() > 10_000 {
            self.registrations.retain_recent();
        }
        if let Err(not_until) = self.registrations.check_key(&key) {
            let wait = not_until.wait_time_from(governor::clock::Clock::now(
                &governor::clock::DefaultClock::default(),
            ));
            return Answer::TooManyRequests {
                body: error("too_many_requests", "too many registrations from this address".into()),
                retry_after: Some(wait.as_secs().max(1) as i64),
            };
        }
        match self.clients.register(request, self.now()).await {
            Ok(registered) => {
                tracing::info!(client = %registered.client_id, "OAuth client registered");
                Answer::Created { body: registered, cache_control: Some("no-store".into()) }
            }
            Err(clients::RegisterError::RedirectUri(e)) => {
                Answer::BadRequest(error("invalid_redirect_uri", e))
            }
            Err(clients::RegisterError::Metadata(e)) => {
                Answer::BadRequest(error("invalid_client_metadata", e))
            }
            Err(clients::RegisterError::TooManyPending) => Answer::TooManyRequests {
                body: error(
                    "too_many_requests",
                    "too many registered clients are waiting for a first approval; try again later"
                        .into(),
                ),
                retry_after: Some(60 * 60),
            },
            Err(clients::RegisterError::Store(e)) => {
                tracing::error!(error = %e, "cannot register an OAuth client");
                Answer::InternalServerError(error(
                    "server_error",
                    "the server could not store the registration; try again".into(),
                ))
            }
        }
    }

    /// RFC 7592 read of a registration.
    pub(crate) async fn read_client(
        &self,
        client_id: &str,
        registration_token: Option<&str>,
    ) -> crate::api::GetOauthClientResponse {
        use crate::api::GetOauthClientResponse as Answer;
        let refused = || Answer::Unauthorized {
            body: types::OAuthRegisterError {
                error: "invalid_token".into(),
                error_description: Some("send this client's registration_access_token".into()),
            },
            www_authenticate: Some("Bearer error=\"invalid_token\"".into()),
        };
        let Some(token) = registration_token else { return refused() };
        match self.clients.read(client_id, token, self.now()).await {
            Ok(Some(body)) => Answer::Ok { body, cache_control: Some("no-store".into()) },
            Ok(None) => refused(),
            Err(e) => {
                tracing::error!(error = %e, "cannot read an OAuth client");
                refused()
            }
        }
    }

    /// Whether an access token's grant is still live.
    pub(crate) async fn grant_is_live(&self, grant_id: &str) -> Result<bool, clients::StoreError> {
        self.grants.is_live(grant_id, self.now()).await
    }

    /// Checks an access token for the MCP resource, including that its grant was not revoked.
    pub(crate) async fn verify_access_token(
        &self,
        token: &str,
    ) -> Result<crate::auth::access::AccessClaims, AccessError> {
        let claims = self.access.verify(token).map_err(|_| AccessError::Invalid)?;
        match self.grant_is_live(&claims.gid).await {
            Ok(true) => Ok(claims),
            Ok(false) => Err(AccessError::Invalid),
            Err(e) => Err(AccessError::Store(e)),
        }
    }
}

/// A request parameter, or `None` when it is absent or empty (RFC 6749 §3.1, §3.2: a parameter without a value
/// is treated as omitted).
fn given(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|v| !v.is_empty())
}

/// The rate-limit key of a registration from `peer`: the IPv4 address, or the /64 of an IPv6 address (one
/// host usually has a whole /64). Without a peer address (requests that did not come over a socket) all share
/// one key.
fn registration_key(peer: Option<IpAddr>) -> IpAddr {
    match peer {
        Some(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none() => {
            let mut segments = v6.segments();
            segments[4..].fill(0);
            IpAddr::from(segments)
        }
        Some(IpAddr::V6(v6)) => {
            IpAddr::V4(v6.to_ipv4_mapped().unwrap_or(std::net::Ipv4Addr::UNSPECIFIED))
        }
        Some(v4) => v4,
        None => IpAddr::from([0, 0, 0, 0]),
    }
}

/// Why an access token was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AccessError {
    /// Malformed, expired, for another audience, or its grant was revoked.
    #[error("the access token is not valid")]
    Invalid,
    /// The grant store failed.
    #[error(transparent)]
    Store(clients::StoreError),
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod key_tests {
    use super::registration_key;

    #[test]
    fn ipv6_peers_share_their_64_and_mapped_ipv4_is_ipv4() {
        let a = registration_key("2001:db8:1:2:aaaa::1".parse().ok());
        let b = registration_key("2001:db8:1:2:bbbb::9".parse().ok());
        let c = registration_key("2001:db8:1:3::1".parse().ok());
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            registration_key("::ffff:10.1.2.3".parse().ok()),
            registration_key("10.1.2.3".parse().ok())
        );
    }
}
