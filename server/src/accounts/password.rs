//! Password hashing: argon2id with the `argon2` crate's default parameters, stored as a PHC string
//! (`$argon2id$v=19$m=…,t=…,p=…$salt$hash`, which carries its own parameters and salt).
//!
//! The invariant: a password is never stored, logged or put into an error. These functions are CPU-bound
//! (tens of milliseconds); callers run them on a blocking thread.

use std::sync::OnceLock;

use argon2::{Argon2, PasswordHasher as _, PasswordVerifier as _};

use super::AccountError;

/// The fewest characters a password may have.
pub(super) const MIN_CHARS: usize = 8;

/// The most characters a password may have (hashing cost grows with length; nobody types more).
pub(super) const MAX_CHARS: usize = 1024;

/// Checks a new password's length.
pub(super) fn check_strength(password: &str) -> Result<(), AccountError> {
    if (MIN_CHARS..=MAX_CHARS).contains(&password.chars().count()) {
        Ok(())
    } else {
        Err(AccountError::WeakPassword)
    }
}

/// Hashes a password with a fresh random salt.
pub(super) fn hash(password: &str) -> Result<String, AccountError> {
    let hash =
        Argon2::default().hash_password(password.as_bytes()).map_err(AccountError::PasswordHash)?;
    Ok(hash.to_string())
}

/// Whether `password` matches `stored`; with no stored hash (an unknown user) it checks against
/// [`dummy_hash`], so the answer takes as long either way, and is false.
pub(super) fn verify(password: &str, stored: Option<&str>) -> bool {
    match Argon2::default().verify_password(password.as_bytes(), stored.unwrap_or(dummy_hash())) {
        Ok(()) => stored.is_some(),
        Err(argon2::password_hash::Error::PasswordInvalid) => false,
        Err(error) => {
            tracing::warn!(%error, "a stored password hash cannot be checked");
            false
        }
    }
}

/// A hash of no one's password, with the same parameters as real ones, made once per process.
pub(super) fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        // A fixed salt: this hash guards nothing, it only has to cost what a real verification costs.
        Argon2::default()
            .hash_password_with_salt(b"kiln: no such user", b"kiln-dummy-salt!")
            .map(|hash| hash.to_string())
            .unwrap_or_default()
    })
}
