//! The cloud runtime's own tokens: ES256 signing keys ([`keys`]), first-party API tokens ([`tokens`]) and OAuth
//! access tokens for the MCP endpoint ([`access`]).
//!
//! The keys live in `<data_dir>/keys/` and are published as the JWKS; the API tokens are the short-lived "Cloud
//! JWT" that `POST /api/auth/token` mints (oauth.md §6). Access tokens (`typ: at+jwt`, `aud` = the MCP resource)
//! are signed by the same keys but are a different token type: each verifier refuses the other's tokens.

pub(crate) mod access;
pub(crate) mod keys;
pub(crate) mod tokens;

#[cfg(test)]
mod tests;
