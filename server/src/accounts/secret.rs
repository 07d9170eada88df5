//! Random secrets (session cookies, API keys), the hashes they are stored and found by, and the CSRF token
//! derived from a session secret.
//!
//! The invariant: a secret leaves this module only to be shown once to its owner; the database sees only
//! [`hash`]. Lookups by hash need no constant-time comparison (the hash of a guess reveals nothing about the
//! stored one); the CSRF check compares in constant time.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

use super::AccountError;

/// Domain separation for the CSRF token, so it can never equal another value derived from the secret.
const CSRF_CONTEXT: &[u8] = b"kiln-csrf\0";

/// A new secret: 32 bytes from the operating system's RNG, base64url without padding (43 characters).
pub(crate) fn new_secret() -> Result<String, AccountError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(AccountError::Random)?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// What is stored for a secret: its SHA-256, lowercase hex.
pub(crate) fn hash(secret: &str) -> String {
    Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// The CSRF token of a session: base64url(SHA-256("kiln-csrf\0" ‖ session secret)). Clients send it back in
/// `X-CSRF-Token`; it is the same for the session's whole life and is not stored anywhere.
pub fn csrf_token(session_secret: &str) -> String {
    let digest = Sha256::new().chain_update(CSRF_CONTEXT).chain_update(session_secret).finalize();
    URL_SAFE_NO_PAD.encode(digest)
}

/// Whether `presented` is the CSRF token of the session with this secret (compared in constant time).
pub fn csrf_matches(session_secret: &str, presented: &str) -> bool {
    csrf_token(session_secret).as_bytes().ct_eq(presented.as_bytes()).into()
}
