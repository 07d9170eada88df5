//! The authorization server's stores on a real database (SQLite, and Postgres for the grants): codes, grants and
//! refresh-token rotation.

use kiln_tests::postgres::Postgres;

use super::grants::{
    CodeGrant, Codes, Grants, Redemption, RefreshRefusal, RefreshWanted, Refreshed,
};

const ANY: RefreshWanted<'static> = RefreshWanted { scope: None, resource: None };
use super::pkce;

const VERIFIER: &str = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
const CHALLENGE: &str = "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM";

fn code_grant(client: &str) -> CodeGrant {
    CodeGrant {
        client_id: client.to_owned(),
        redirect_uri: Some("http://127.0.0.1:9/cb".to_owned()),
        code_challenge: CHALLENGE.to_owned(),
        resource: "https://kiln.example/mcp".to_owned(),
        scope: "kiln:read kiln:run".to_owned(),
        user_id: "u1".to_owned(),
        workspace_id: "default".to_owned(),
    }
}

/// The grant store, with its user `u1`, in `kiln.sqlite` of a temporary directory or in a Postgres cluster's
/// database (kept running as long as the returned store's [`Stores`] lives).
async fn grants_in(postgres: Option<Postgres>) -> (Stores, Grants) {
    let dir = tempfile::tempdir().expect("temp dir");
    let database = match &postgres {
        Some(cluster) => crate::config::Database::Postgres(cluster.url()),
        None => crate::config::Database::Embedded,
    };
    let accounts = crate::accounts::Accounts::open(dir.path(), &database).await.expect("accounts");
    sqlx::query("INSERT INTO users (id, username, password_hash, created_at) VALUES ('u1', 'alice', 'x', 0)")
        .execute(accounts.pool())
        .await
        .expect("user");
    (Stores { dir, _postgres: postgres }, Grants::new(accounts.pool().clone()))
}

/// What a test's stores live in.
struct Stores {
    dir: tempfile::TempDir,
    _postgres: Option<Postgres>,
}

async fn grants() -> (Stores, Grants) {
    grants_in(None).await
}

async fn grants_on_postgres() -> (Stores, Grants) {
    let cluster = tokio::task::spawn_blocking(|| Postgres::start("grants"))
        .await
        .expect("the cluster starts");
    grants_in(Some(cluster)).await
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
    assert!(
        refused(codes.redeem(&code, "a", None, VERIFIER, 1001)),
        "redirect_uri was sent, so it is required"
    );
    assert!(refused(codes.redeem(&code, "a", redirect, &VERIFIER.replace('d', "e"), 1001)));
    let Redemption::First(grant_id, _) = codes.redeem(&code, "a", redirect, VERIFIER, 1001) else {
        panic!("the first valid redemption")
    };
    assert!(
        matches!(codes.redeem(&code, "a", redirect, VERIFIER, 1002), Redemption::Replayed(ref g) if *g == grant_id),
        "a second valid redemption, even at once, names the grant of the first, to revoke"
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
    rotate_and_reuse(grants().await.1).await;
}

#[tokio::test]
async fn on_postgres_refresh_tokens_rotate_and_reuse_revokes_the_grant() {
    let (_stores, grants) = grants_on_postgres().await;
    rotate_and_reuse(grants).await;
}

async fn rotate_and_reuse(grants: Grants) {
    let (grant, rt1) = grants.create("g1".into(), &code_grant("a"), 1000).await.expect("grant");
    // A refused refresh (wider scope, other resource) leaves the token usable.
    let wider = RefreshWanted { scope: Some("kiln:read admin"), resource: None };
    let refused = grants.refresh(&rt1, "a", wider, 1001).await;
    assert!(matches!(refused, Ok(Refreshed::Refused(RefreshRefusal::Scope))));
    let other = RefreshWanted { scope: None, resource: Some("https://other.example/mcp") };
    let refused = grants.refresh(&rt1, "a", other, 1001).await;
    assert!(matches!(refused, Ok(Refreshed::Refused(RefreshRefusal::Target))));
    let Ok(Refreshed::Rotated(_, rt2, _)) = grants.refresh(&rt1, "a", ANY, 1010).await else {
        panic!("first refresh rotates")
    };
    assert_ne!(rt1, rt2);
    assert!(
        matches!(grants.refresh(&rt2, "b", ANY, 1011).await, Ok(Refreshed::Refused(_))),
        "other client"
    );
    // A concurrent refresh with rt1 within the grace window gets the same successor.
    let Ok(Refreshed::Rotated(_, again, _)) = grants.refresh(&rt1, "a", ANY, 1012).await else {
        panic!("grace window")
    };
    assert_eq!(again, rt2);
    let Ok(Refreshed::Rotated(_, rt3, _)) = grants.refresh(&rt2, "a", ANY, 1020).await else {
        panic!("second refresh")
    };
    assert!(grants.is_live(&grant.id, 1020).await.expect("live"));
    // rt1 again, now that its successor was used: reuse. The grant and every token of it are revoked.
    assert!(matches!(grants.refresh(&rt1, "a", ANY, 1021).await, Ok(Refreshed::Refused(_))));
    assert!(!grants.is_live(&grant.id, 1021).await.expect("live"));
    assert!(matches!(grants.refresh(&rt3, "a", ANY, 1022).await, Ok(Refreshed::Refused(_))));
}

#[tokio::test]
async fn a_used_token_after_the_grace_window_is_reuse() {
    late_reuse(grants().await.1).await;
}

#[tokio::test]
async fn on_postgres_a_used_token_after_the_grace_window_is_reuse() {
    let (_stores, grants) = grants_on_postgres().await;
    late_reuse(grants).await;
}

async fn late_reuse(grants: Grants) {
    let (grant, rt1) = grants.create("g1".into(), &code_grant("a"), 1000).await.expect("grant");
    assert!(matches!(grants.refresh(&rt1, "a", ANY, 1000).await, Ok(Refreshed::Rotated(..))));
    let late = 1001 + super::grants::REFRESH_GRACE_SECONDS;
    assert!(matches!(grants.refresh(&rt1, "a", ANY, late).await, Ok(Refreshed::Refused(_))));
    assert!(!grants.is_live(&grant.id, late).await.expect("live"));
}

#[tokio::test]
async fn only_hashes_are_stored() {
    let (stores, grants) = grants().await;
    let (_, rt) = grants.create("g1".into(), &code_grant("a"), 1000).await.expect("grant");
    let Ok(Refreshed::Rotated(_, successor, _)) = grants.refresh(&rt, "a", ANY, 1001).await else {
        panic!("refresh")
    };
    drop(grants);
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(stores.dir.path()).expect("dir") {
        let path = entry.expect("entry").path();
        if path.is_file() {
            stored.extend(std::fs::read(path).expect("read"));
        }
    }
    let text = String::from_utf8_lossy(&stored);
    assert!(!text.contains(&rt) && !text.contains(&successor), "refresh tokens must not be stored");
}

#[test]
fn a_code_for_a_request_without_redirect_uri_is_redeemed_without_one() {
    let codes = Codes::default();
    let grant = CodeGrant { redirect_uri: None, ..code_grant("a") };
    let code = codes.issue(grant, 1000).expect("code");
    let named = codes.redeem(&code, "a", Some("http://127.0.0.1:9/cb"), VERIFIER, 1001);
    assert!(matches!(named, Redemption::Refused(_)));
    assert!(matches!(codes.redeem(&code, "a", None, VERIFIER, 1001), Redemption::First(..)));
}

#[test]
fn a_user_holds_a_bounded_number_of_codes() {
    let codes = Codes::default();
    let first = codes.issue(code_grant("a"), 1000).expect("code");
    for _ in 0..40 {
        codes.issue(code_grant("a"), 1001).expect("code");
    }
    let redeemed = codes.redeem(&first, "a", Some("http://127.0.0.1:9/cb"), VERIFIER, 1002);
    assert!(matches!(redeemed, Redemption::Refused(_)), "the oldest made room");
}
