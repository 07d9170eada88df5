//! The authorization server's stores on a real database: codes, grants and refresh-token rotation.

use super::grants::{CodeGrant, Codes, Grants, Redemption, Refreshed};
use super::pkce;

const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

fn code_grant(client: &str) -> CodeGrant {
    CodeGrant {
        client_id: client.to_owned(),
        redirect_uri: "http://127.0.0.1:9/cb".to_owned(),
        code_challenge: CHALLENGE.to_owned(),
        resource: "https://kiln.example/mcp".to_owned(),
        scope: "kiln:read kiln:run".to_owned(),
        user_id: "u1".to_owned(),
        workspace_id: "default".to_owned(),
    }
}

async fn grants() -> (tempfile::TempDir, Grants) {
    let dir = tempfile::tempdir().expect("temp dir");
    let accounts = crate::accounts::Accounts::open(dir.path()).await.expect("accounts");
    sqlx::query("INSERT INTO users (id, username, password_hash, created_at) VALUES ('u1', 'alice', 'x', 0)")
        .execute(accounts.pool())
        .await
        .expect("user");
    (dir, Grants::new(accounts.pool().clone()))
}

#[test]
fn codes_are_bound_single_use_and_expire() {
    assert!(pkce::verifies(VERIFIER, CHALLENGE));
    let codes = Codes::default();
    let code = codes.issue(code_grant("a"), 1000).expect("code");
    let redirect = Some("http://127.0.0.1:9/cb");
    let refused = |r: Redemption| matches!(r, Redemption::Refused(_));
    assert!(refused(codes.redeem(&code, "b", redirect, VERIFIER, 1001)), "another client");
    assert!(refused(codes.redeem(&code, "a", Some("http://127.0.0.1:9/x"), VERIFIER, 1001)));
    assert!(refused(codes.redeem(&code, "a", None, VERIFIER, 1001)), "redirect_uri is required");
    assert!(refused(codes.redeem(&code, "a", redirect, &VERIFIER.replace('d', "e"), 1001)));
    assert!(matches!(codes.redeem(&code, "a", redirect, VERIFIER, 1001), Redemption::First(_)));
    codes.redeemed(&code, "g1");
    assert!(
        matches!(codes.redeem(&code, "a", redirect, VERIFIER, 1002), Redemption::Replayed(ref g) if g == "g1"),
        "a second valid redemption names the grant to revoke"
    );
    assert!(
        refused(codes.redeem(&code, "a", redirect, "wrong", 1002)),
        "an invalid replay revokes nothing"
    );
    let late = codes.issue(code_grant("a"), 1000).expect("code");
    assert!(refused(codes.redeem(
        &late,
        "a",
        redirect,
        VERIFIER,
        1000 + super::grants::CODE_SECONDS
    )));
}

#[tokio::test]
async fn refresh_tokens_rotate_and_reuse_revokes_the_grant() {
    let (_dir, grants) = await_grants().await;
    let (grant, rt1) = grants.create(&code_grant("a"), 1000).await.expect("grant");
    let Ok(Refreshed::Rotated(_, rt2)) = grants.refresh(&rt1, "a", 1010).await else {
        panic!("first refresh rotates")
    };
    assert_ne!(rt1, rt2);
    assert!(
        matches!(grants.refresh(&rt2, "b", 1011).await, Ok(Refreshed::Refused(_))),
        "other client"
    );
    // A concurrent refresh with rt1 within the grace window gets the same successor.
    let Ok(Refreshed::Rotated(_, again)) = grants.refresh(&rt1, "a", 1012).await else {
        panic!("grace window")
    };
    assert_eq!(again, rt2);
    let Ok(Refreshed::Rotated(_, rt3)) = grants.refresh(&rt2, "a", 1020).await else {
        panic!("second refresh")
    };
    assert!(grants.is_live(&grant.id, 1020).await.expect("live"));
    // rt1 again, now that its successor was used: reuse. The grant and every token of it are revoked.
    assert!(matches!(grants.refresh(&rt1, "a", 1021).await, Ok(Refreshed::Refused(_))));
    assert!(!grants.is_live(&grant.id, 1021).await.expect("live"));
    assert!(matches!(grants.refresh(&rt3, "a", 1022).await, Ok(Refreshed::Refused(_))));
}

#[tokio::test]
async fn a_used_token_after_the_grace_window_is_reuse() {
    let (_dir, grants) = await_grants().await;
    let (grant, rt1) = grants.create(&code_grant("a"), 1000).await.expect("grant");
    assert!(matches!(grants.refresh(&rt1, "a", 1000).await, Ok(Refreshed::Rotated(..))));
    let late = 1001 + super::grants::REFRESH_GRACE_SECONDS;
    assert!(matches!(grants.refresh(&rt1, "a", late).await, Ok(Refreshed::Refused(_))));
    assert!(!grants.is_live(&grant.id, late).await.expect("live"));
}

#[tokio::test]
async fn only_hashes_are_stored() {
    let (dir, grants) = await_grants().await;
    let (_, rt) = grants.create(&code_grant("a"), 1000).await.expect("grant");
    let Ok(Refreshed::Rotated(_, successor)) = grants.refresh(&rt, "a", 1001).await else {
        panic!("refresh")
    };
    drop(grants);
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            stored.extend(std::fs::read(path).expect("read"));
        }
    }
    let text = String::from_utf8_lossy(&stored);
    assert!(!text.contains(&rt) && !text.contains(&successor), "refresh tokens must not be stored");
}

async fn await_grants() -> (tempfile::TempDir, Grants) {
    grants().await
}
