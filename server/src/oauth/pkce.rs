//! PKCE (RFC 7636), `S256` only: Kiln requires it from every client, public or confidential.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq as _;

/// Whether `challenge` has the shape of an S256 challenge: 43 base64url characters (a SHA-256 digest).
pub(crate) fn is_s256_challenge(challenge: &str) -> bool {
    challenge.len() == 43 && challenge.bytes().all(is_base64url)
}

/// Whether `verifier` is well formed (43 to 128 of `[A-Za-z0-9-._~]`) and hashes to `challenge`, compared in
/// constant time.
pub(crate) fn verifies(verifier: &str, challenge: &str) -> bool {
    let well_formed = (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
    if !well_formed {
        return false;
    }
    let computed = URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()));
    computed.as_bytes().ct_eq(challenge.as_bytes()).into()
}

fn is_base64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rfc_7636_example_verifies() {
        // RFC 7636 appendix B.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        let challenge = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";
        assert!(is_s256_challenge(challenge));
        assert!(verifies(verifier, challenge));
        assert!(
            !verifies("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXK", challenge),
            "wrong verifier"
        );
    }

    #[test]
    fn malformed_verifiers_and_challenges_are_refused() {
        let short = "a".repeat(42);
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(short.as_bytes()));
        assert!(!verifies(&short, &challenge), "42 characters is too short");
        let long = "a".repeat(129);
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(long.as_bytes()));
        assert!(!verifies(&long, &challenge), "129 characters is too long");
        let odd = format!("{}!", "a".repeat(50));
        let challenge = URL_SAFE_NO_PAD.encode(Sha256::digest(odd.as_bytes()));
        assert!(!verifies(&odd, &challenge), "`!` is not a verifier character");
        assert!(!is_s256_challenge("plain-challenge"));
        assert!(!is_s256_challenge(&"a".repeat(44)));
    }
}
