use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use p256::elliptic_curve::Generate as _;
use p256::pkcs8::EncodePrivateKey as _;

use super::keys::{KEYS_DIR, KeyError, SigningKeys};
use super::tokens::{
    ApiTokenClaims, DEFAULT_LIFETIME, NewToken, TOKEN_TYPE, TokenError, TokenIssuer,
};

const ISSUER: &str = "https://cloud.example.com";
const AUDIENCE: &str = "https://cloud.example.com/api";
const ALICE: NewToken<'static> =
    NewToken { user_id: "user-1", workspace_id: "ws-1", role: "owner" };

/// An empty data directory for one test.
fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-auth-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn issuer(data_dir: &Path) -> TokenIssuer {
    let keys = SigningKeys::load_or_create(data_dir).expect("keys");
    TokenIssuer::new(Arc::new(keys), ISSUER, AUDIENCE)
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

fn kid(token: &str) -> String {
    jsonwebtoken::decode_header(token).expect("header").kid.expect("kid")
}

fn current_kid(data_dir: &Path) -> String {
    SigningKeys::load_or_create(data_dir).expect("keys").current().kid.clone()
}

/// Signs `claims` with `header` by the current key of `data_dir` (tokens `mint` would never make).
fn sign_with_current(data_dir: &Path, header: &Header, claims: &serde_json::Value) -> String {
    let keys = SigningKeys::load_or_create(data_dir).expect("keys");
    jsonwebtoken::encode(header, claims, &keys.current().encoding).expect("sign")
}

fn good_claims() -> serde_json::Value {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
    serde_json::json!({
        "iss": ISSUER, "sub": "user-1", "aud": AUDIENCE, "workspace_id": "ws-1", "role": "member",
        "jti": "j", "iat": now, "exp": now + 60,
    })
}

fn es256_header(kid: &str, typ: &str) -> Header {
    Header { typ: Some(typ.into()), kid: Some(kid.into()), ..Header::new(Algorithm::ES256) }
}

/// Asserts a rejection as invalid, for the reason the test means.
fn assert_invalid(result: Result<ApiTokenClaims, TokenError>, expected: &str) {
    let reason = match &result {
        Err(TokenError::Invalid { reason }) => reason,
        _ => panic!("{result:?} is not an invalid token"),
    };
    assert!(reason.contains(expected), "{reason:?} does not say {expected:?}");
}

#[test]
fn first_start_creates_a_private_key_that_later_starts_reuse() {
    let dir = data_dir("create");
    let kid = current_kid(&dir);
    assert_eq!(mode(&dir.join(KEYS_DIR)), 0o700);
    assert_eq!(mode(&dir.join(KEYS_DIR).join("es256-1.der")), 0o600);
    let files: Vec<_> = std::fs::read_dir(dir.join(KEYS_DIR)).expect("list").collect();
    assert_eq!(files.len(), 1, "no temporary file left behind");
    assert_eq!(current_kid(&dir), kid);
}

#[test]
fn a_minted_token_verifies_with_its_claims() {
    let dir = data_dir("mint");
    let issuer = issuer(&dir);
    let minted = issuer.mint(&ALICE).expect("mint");
    let header = jsonwebtoken::decode_header(&minted.token).expect("header");
    assert_eq!((header.alg, header.typ.as_deref()), (Algorithm::ES256, Some(TOKEN_TYPE)));
    assert_eq!(header.kid, Some(current_kid(&dir)));
    let claims = issuer.verify(&minted.token).expect("verify");
    assert_eq!(
        (claims.iss.as_str(), claims.aud.as_str(), claims.sub.as_str()),
        (ISSUER, AUDIENCE, "user-1")
    );
    assert_eq!((claims.workspace_id.as_str(), claims.role.as_str()), ("ws-1", "owner"));
    assert_eq!(claims.jti, minted.jti);
    assert_eq!(claims.exp - claims.iat, DEFAULT_LIFETIME.as_secs());
    assert_eq!(minted.expires_at.timestamp(), i64::try_from(claims.exp).expect("exp"));
    assert!(matches!(
        issuer.mint(&NewToken { role: "admin", ..ALICE }),
        Err(TokenError::UnknownRole(role)) if role == "admin"
    ));
}

#[test]
fn a_running_server_accepts_tokens_of_a_key_rotated_by_another_process() {
    let dir = data_dir("rotate");
    let server = issuer(&dir);
    let old = server.mint(&ALICE).expect("mint");
    let new_kid = SigningKeys::rotate(&dir).expect("rotate");
    let other = issuer(&dir);
    let new = other.mint(&ALICE).expect("mint");
    assert_eq!(kid(&new.token), new_kid);
    assert_ne!(kid(&old.token), new_kid);
    for issuer in [&server, &other] {
        issuer.verify(&new.token).expect("new key verifies");
        issuer.verify(&old.token).expect("previous key still verifies");
    }
}

#[test]
fn two_rotations_retire_the_oldest_key() {
    let dir = data_dir("retire");
    let server = issuer(&dir);
    let oldest = server.mint(&ALICE).expect("mint");
    SigningKeys::rotate(&dir).expect("rotate");
    let newest = SigningKeys::rotate(&dir).expect("rotate");
    let files: Vec<_> = std::fs::read_dir(dir.join(KEYS_DIR)).expect("list").collect();
    assert_eq!(files.len(), 2, "the oldest key file is deleted");
    assert_invalid(issuer(&dir).verify(&oldest.token), "unknown kid");
    // The running server still holds the oldest key until it looks at the directory again.
    assert!(server.verify(&oldest.token).is_ok());
    let fresh = issuer(&dir).mint(&ALICE).expect("mint");
    server.verify(&fresh.token).expect("unknown kid: reloaded");
    assert_invalid(server.verify(&oldest.token), "unknown kid");
    assert_eq!(kid(&server.mint(&ALICE).expect("mint").token), kid(&fresh.token));
    assert_eq!(kid(&fresh.token), newest);
}

#[test]
fn jwks_lists_current_then_previous_keys_that_verify_their_tokens() {
    let dir = data_dir("jwks");
    let old = issuer(&dir).mint(&ALICE).expect("mint");
    SigningKeys::rotate(&dir).expect("rotate");
    let new = issuer(&dir).mint(&ALICE).expect("mint");
    let jwks = SigningKeys::load_or_create(&dir).expect("keys").jwks();
    let kids: Vec<_> = jwks.keys.iter().map(|key| key.kid.clone()).collect();
    assert_eq!(kids, [kid(&new.token), kid(&old.token)]);
    let mut validation = Validation::new(Algorithm::ES256);
    validation.set_audience(&[AUDIENCE]);
    for (key, token) in jwks.keys.iter().zip([&new.token, &old.token]) {
        assert_eq!(
            (key.kty.as_str(), key.crv.as_str(), key.use_.as_deref(), key.alg.as_deref()),
            ("EC", "P-256", Some("sig"), Some("ES256"))
        );
        let jwk: jsonwebtoken::jwk::Jwk =
            serde_json::from_value(serde_json::to_value(key).expect("json"))
                .expect("a JWK jsonwebtoken reads");
        let thumbprint =
            jwk.thumbprint(jsonwebtoken::jwk::ThumbprintHash::SHA256).expect("thumbprint");
        assert_eq!(key.kid, thumbprint, "kid is the RFC 7638 thumbprint");
        let decoding = DecodingKey::from_jwk(&jwk).expect("decoding key");
        jsonwebtoken::decode::<ApiTokenClaims>(token, &decoding, &validation)
            .expect("verifies with the JWK");
    }
}

#[test]
fn a_corrupt_key_file_is_an_error_naming_it() {
    let dir = data_dir("corrupt");
    current_kid(&dir);
    let path = dir.join(KEYS_DIR).join("es256-1.der");
    std::fs::write(&path, b"not a key").expect("write");
    let error = SigningKeys::load_or_create(&dir).expect_err("corrupt");
    assert!(matches!(error, KeyError::Corrupt { .. }), "{error:?}");
    assert!(error.to_string().contains(&path.display().to_string()), "{error}");
}

#[test]
fn key_files_and_directories_open_to_other_users_are_refused() {
    let dir = data_dir("mode");
    current_kid(&dir);
    let keys = dir.join(KEYS_DIR);
    let path = keys.join("es256-1.der");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let error = SigningKeys::load_or_create(&dir).expect_err("mode");
    assert!(error.to_string().contains(&format!("chmod 600 {}", path.display())), "{error}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let error = SigningKeys::rotate(&dir).expect_err("mode");
    assert!(error.to_string().contains(&format!("chmod 700 {}", keys.display())), "{error}");
}

#[test]
fn a_failed_reload_keeps_the_keys_in_memory() {
    let dir = data_dir("reload");
    let keys = SigningKeys::load_or_create(&dir).expect("keys");
    let kid = keys.current().kid.clone();
    std::fs::write(dir.join(KEYS_DIR).join("es256-2.der"), b"half a key").expect("write");
    assert!(!keys.reload_if_changed());
    assert_eq!(keys.current().kid, kid);
    assert_eq!(keys.jwks().keys.len(), 1);
}

#[test]
fn expired_tokens_are_rejected() {
    let dir = data_dir("expired");
    let issuer = issuer(&dir);
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let expired = issuer.mint_at(&ALICE, hour_ago).expect("mint");
    assert!(matches!(issuer.verify(&expired.token), Err(TokenError::Expired)));
}

#[test]
fn tokens_for_another_audience_or_issuer_are_rejected() {
    let dir = data_dir("audience");
    let keys = Arc::new(SigningKeys::load_or_create(&dir).expect("keys"));
    let api = TokenIssuer::new(Arc::clone(&keys), ISSUER, AUDIENCE);
    let mcp = TokenIssuer::new(Arc::clone(&keys), ISSUER, "https://cloud.example.com/mcp");
    let elsewhere = TokenIssuer::new(keys, "https://other.example.com", AUDIENCE);
    assert_invalid(api.verify(&mcp.mint(&ALICE).expect("mint").token), "InvalidAudience");
    assert_invalid(api.verify(&elsewhere.mint(&ALICE).expect("mint").token), "InvalidIssuer");
}

#[test]
fn tokens_of_another_type_algorithm_or_key_are_rejected() {
    let dir = data_dir("forged");
    let issuer = issuer(&dir);
    let kid = current_kid(&dir);
    let claims = good_claims();
    let ours = es256_header(&kid, TOKEN_TYPE);
    let signed = |header: &Header, claims: &serde_json::Value| {
        issuer.verify(&sign_with_current(&dir, header, claims))
    };
    assert!(signed(&ours, &claims).is_ok());

    // A foreign key under a known kid.
    let foreign = p256::SecretKey::try_generate().expect("key").to_pkcs8_der().expect("der");
    let foreign = EncodingKey::from_ec_der(foreign.as_bytes());
    let forged = jsonwebtoken::encode(&ours, &claims, &foreign).expect("sign");
    assert_invalid(issuer.verify(&forged), "InvalidSignature");

    // HS256 with the kid of a real key, and alg none.
    let hs256 = Header { alg: Algorithm::HS256, ..ours.clone() };
    let secret = EncodingKey::from_secret(&[7; 32]).expect("hmac key");
    let hmac = jsonwebtoken::encode(&hs256, &claims, &secret).expect("sign");
    assert_invalid(issuer.verify(&hmac), "not ES256");
    let b64 = |value: &serde_json::Value| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(value.to_string())
    };
    let none = serde_json::json!({"alg": "none", "typ": TOKEN_TYPE, "kid": kid});
    assert_invalid(
        issuer.verify(&format!("{}.{}.", b64(&none), b64(&claims))),
        "unknown variant `none`",
    );

    // MCP access tokens, plain JWTs and untyped tokens signed by our own key.
    for typ in ["at+jwt", "JWT"] {
        assert_invalid(signed(&es256_header(&kid, typ), &claims), "typ is not");
    }
    assert_invalid(signed(&Header { typ: None, ..ours.clone() }, &claims), "typ is not");

    // No kid, a missing claim, an unknown role, a tampered payload, not a JWT.
    assert_invalid(signed(&Header { kid: None, ..ours.clone() }, &claims), "no kid");
    let mut partial = claims.clone();
    partial.as_object_mut().expect("object").remove("workspace_id");
    assert_invalid(signed(&ours, &partial), "missing field `workspace_id`");
    let mut admin = claims.clone();
    admin["role"] = "admin".into();
    assert_invalid(signed(&ours, &admin), "unknown role");
    let token = issuer.mint(&NewToken { role: "member", ..ALICE }).expect("mint").token;
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let mut owner = claims.clone();
    owner["role"] = "owner".into();
    parts[1] = b64(&owner);
    assert_invalid(issuer.verify(&parts.join(".")), "InvalidSignature");
    assert_invalid(issuer.verify("not a token"), "InvalidToken");
}

#[test]
fn access_tokens_are_only_for_their_resource_and_expire() {
    use super::access::{ACCESS_TOKEN_LIFETIME, AccessTokens, NewAccessToken};
    let dir = data_dir("access");
    let keys = Arc::new(SigningKeys::load_or_create(&dir).expect("keys"));
    let mcp = AccessTokens::new(keys.clone(), ISSUER, "https://cloud.example.com/mcp");
    let other = AccessTokens::new(keys.clone(), ISSUER, "https://other.example.com/mcp");
    let new = NewAccessToken {
        user_id: "user-1",
        client_id: "kiln-c1",
        scope: "kiln:read",
        workspace_id: "ws-1",
        grant_id: "g1",
    };
    let token = mcp.mint_at(&new, SystemTime::now()).expect("mint");
    let claims = mcp.verify(&token).expect("verifies");
    assert_eq!(
        (claims.aud.as_str(), claims.scope.as_str(), claims.gid.as_str()),
        ("https://cloud.example.com/mcp", "kiln:read", "g1")
    );
    assert!(matches!(other.verify(&token), Err(TokenError::Invalid { .. })), "another resource");
    // An access token is not a first-party API token, and the other way round.
    assert!(matches!(issuer(&dir).verify(&token), Err(TokenError::Invalid { .. })));
    let api = issuer(&dir).mint(&ALICE).expect("api token");
    assert!(matches!(mcp.verify(&api.token), Err(TokenError::Invalid { .. })));
    let old = SystemTime::now() - ACCESS_TOKEN_LIFETIME - Duration::from_secs(1);
    let expired = mcp.mint_at(&new, old).expect("mint");
    assert!(matches!(mcp.verify(&expired), Err(TokenError::Expired)));
    let _ = std::fs::remove_dir_all(&dir);
}
