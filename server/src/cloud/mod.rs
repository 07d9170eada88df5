//! The cloud runtime's own parts: who is asking (`gate.rs`, the authentication layer that turns an API key,
//! a bearer token or a session cookie into a [`crate::workspace::Caller`]), the `CloudApi` operations
//! (`api.rs`: sign-in, sessions, API keys, tokens, signing keys, and the OAuth operations, which `crate::oauth`
//! answers) and the sign-in page (`signin.rs`).
//!
//! Which operations need credentials comes from the spec: each operation's `security` (codegen's
//! `OPERATIONS`), never a hand-written list.

use std::sync::Arc;

use crate::accounts::Accounts;
use crate::auth::keys::SigningKeys;
use crate::auth::tokens::TokenIssuer;
use crate::oauth::AuthorizationServer;

mod api;
pub(crate) mod gate;
pub(crate) mod signin;

/// The session cookie's name (`__Host-`: Secure, no Domain, Path=/).
pub(crate) const SESSION_COOKIE: &str = "__Host-comfy_session";

/// Everything the cloud operations and the gate share.
pub(crate) struct Cloud {
    /// Users, workspaces, sessions and API keys.
    pub(crate) accounts: Accounts,
    /// The token signing keys.
    pub(crate) keys: Arc<SigningKeys>,
    /// First-party API tokens.
    pub(crate) tokens: TokenIssuer,
    /// The configured issuer (`--issuer`), byte-identical wherever it appears.
    pub(crate) issuer: String,
    /// The OAuth authorization server for MCP clients.
    pub(crate) oauth: AuthorizationServer,
}

impl Cloud {
    /// Opens the account store in `database` and the signing keys (created on first start) under `data_dir`; tokens name
    /// `issuer` and are for `<issuer>/api` (API tokens) or `<issuer>/mcp` (OAuth access tokens).
    /// `documents_over_loopback_http` is the test mode of client metadata documents.
    pub(crate) async fn open(
        data_dir: &std::path::Path,
        database: &crate::config::Database,
        issuer: &str,
        documents_over_loopback_http: bool,
    ) -> std::io::Result<Cloud> {
        let accounts = Accounts::open(data_dir, database).await.map_err(std::io::Error::other)?;
        let keys = Arc::new(SigningKeys::load_or_create(data_dir).map_err(std::io::Error::other)?);
        let tokens = TokenIssuer::new(keys.clone(), issuer, format!("{issuer}/api"));
        let documents = crate::oauth::cimd::CimdPolicy {
            allow_loopback_http: documents_over_loopback_http,
            ..Default::default()
        };
        let oauth = AuthorizationServer::new(issuer, accounts.clone(), keys.clone(), documents);
        Ok(Cloud { accounts, keys, tokens, issuer: issuer.to_owned(), oauth })
    }
}
