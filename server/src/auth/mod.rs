//! The cloud runtime's own tokens: ES256 signing keys ([`keys`]) and first-party API tokens ([`tokens`]).
//!
//! The keys live in `<data_dir>/keys/` and are published as the JWKS; the tokens are the short-lived "Cloud JWT"
//! that `POST /api/auth/token` mints (oauth.md §6). MCP access tokens (`typ: at+jwt`) will be signed by the same
//! keys but are a different token type: [`tokens::TokenIssuer::verify`] refuses them.

pub(crate) mod keys;
pub(crate) mod tokens;

#[cfg(test)]
mod tests;
