//! Tests of the accounts store against a real `kiln.sqlite` in a temporary data directory.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::*;

/// A fresh, empty data directory for one test.
fn data_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-accounts-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The database file and its WAL, as raw bytes (what an attacker with a copy of the data directory sees).
fn raw_database(dir: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(dir.join("kiln.sqlite")).unwrap();
    bytes.extend(std::fs::read(dir.join("kiln.sqlite-wal")).unwrap_or_default());
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle.as_bytes())
}

/// An opened store with the user `alice` (password `correct horse`), a member of `default`.
async fn with_alice(name: &str) -> (PathBuf, Accounts, User) {
    let dir = data_dir(name);
    let accounts = Accounts::open(&dir, &crate::config::Database::Embedded).await.unwrap();
    let alice = accounts.add_user("alice", "correct horse").await.unwrap();
    accounts.grant("default", "alice", Role::Member).await.unwrap();
    (dir, accounts, alice)
}

#[tokio::test]
async fn the_default_workspace_exists_after_migration_and_opening_twice_is_harmless() {
    let dir = data_dir("default");
    Accounts::open(&dir, &crate::config::Database::Embedded).await.unwrap();
    let accounts = Accounts::open(&dir, &crate::config::Database::Embedded).await.unwrap();
    let default = accounts.workspace("default").await.unwrap();
    assert_eq!(default.id, WorkspaceId::default_workspace());
    let list = accounts.list_workspaces().await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].workspace, default);
    assert!(list[0].members.is_empty());
}

#[tokio::test]
async fn accounts_share_the_database_with_the_queue_storage() {
    let dir = data_dir("shared");
    let storage = crate::storage::Storage::open(&dir, &crate::config::Database::Embedded, false)
        .await
        .unwrap();
    let accounts = Accounts::open(&dir, &crate::config::Database::Embedded).await.unwrap();
    accounts.add_user("alice", "correct horse").await.unwrap();
    storage.clear_history("default").await.unwrap();
    let reopened = Accounts::open(&dir, &crate::config::Database::Embedded).await.unwrap();
    assert_eq!(reopened.user("alice").await.unwrap().username, "alice");
}

#[tokio::test]
async fn a_taken_username_bad_names_and_weak_passwords_are_refused() {
    let (_dir, accounts, _alice) = with_alice("names").await;
    let again = accounts.add_user("alice", "another password").await;
    assert!(matches!(again, Err(AccountError::Exists(_))), "{again:?}");
    // Usernames are compared as given: another case is another user.
    accounts.add_user("Alice", "another password").await.unwrap();
    for bad in ["", "al ice", "al/ice", "älice", &"a".repeat(65)] {
        let added = accounts.add_user(bad, "long enough").await;
        assert!(matches!(added, Err(AccountError::InvalidName { .. })), "{bad:?}: {added:?}");
    }
    let weak = accounts.add_user("bob", "1234567").await;
    assert!(matches!(weak, Err(AccountError::WeakPassword)), "{weak:?}");
    accounts.add_user("bob.b@example-1_x", "12345678").await.unwrap();
    let names: Vec<String> =
        accounts.list_users().await.unwrap().into_iter().map(|u| u.username).collect();
    assert_eq!(names, ["Alice", "alice", "bob.b@example-1_x"]);
}

#[tokio::test]
async fn authenticate_accepts_the_right_password_only_and_hides_whether_the_user_exists() {
    let (dir, accounts, alice) = with_alice("login").await;
    assert_eq!(accounts.authenticate("alice", "correct horse").await.unwrap(), alice);
    let wrong = accounts.authenticate("alice", "correct horsE").await;
    assert!(matches!(wrong, Err(AccountError::BadCredentials)), "{wrong:?}");
    let unknown = accounts.authenticate("mallory", "correct horse").await;
    assert!(matches!(unknown, Err(AccountError::BadCredentials)), "{unknown:?}");
    assert!(!contains(&raw_database(&dir), "correct horse"));

    // An unknown user costs a password check too (the fastest of a few tries, to damp scheduling noise).
    let fastest = |times: Vec<Duration>| times.into_iter().min().unwrap();
    let mut wrong_times = Vec::new();
    let mut unknown_times = Vec::new();
    for _ in 0..2 {
        let start = Instant::now();
        let _ = accounts.authenticate("alice", "wrong password").await;
        wrong_times.push(start.elapsed());
        let start = Instant::now();
        let _ = accounts.authenticate("mallory", "wrong password").await;
        unknown_times.push(start.elapsed());
    }
    let (wrong, unknown) = (fastest(wrong_times), fastest(unknown_times));
    assert!(unknown * 3 > wrong, "unknown user {unknown:?} vs wrong password {wrong:?}");
}

#[tokio::test]
async fn changing_the_password_ends_the_sessions() {
    let (_dir, accounts, alice) = with_alice("passwd").await;
    let default = WorkspaceId::default_workspace();
    let (first, _) = accounts.create_session(&alice.id, &default).await.unwrap();
    let (second, _) = accounts.create_session(&alice.id, &default).await.unwrap();
    assert!(accounts.session(&first).await.unwrap().is_some());

    let weak = accounts.set_password("alice", "short").await;
    assert!(matches!(weak, Err(AccountError::WeakPassword)), "{weak:?}");
    assert!(accounts.session(&first).await.unwrap().is_some());

    accounts.set_password("alice", "battery staple").await.unwrap();
    assert_eq!(accounts.session(&first).await.unwrap(), None);
    assert_eq!(accounts.session(&second).await.unwrap(), None);
    assert!(accounts.authenticate("alice", "correct horse").await.is_err());
    assert_eq!(accounts.authenticate("alice", "battery staple").await.unwrap(), alice);
    let missing = accounts.set_password("nobody", "battery staple").await;
    assert!(matches!(missing, Err(AccountError::NotFound(_))), "{missing:?}");
}

#[tokio::test]
async fn a_session_slides_with_use_until_its_absolute_expiry() {
    let (dir, accounts, alice) = with_alice("expiry").await;
    let default = WorkspaceId::default_workspace();
    let t0 = 1_000_000;
    let (secret, session) = accounts.create_session_at(&alice.id, &default, t0).await.unwrap();
    assert_eq!(session.user, alice);
    assert_eq!(session.role, Role::Member);
    assert_eq!(session.expires_at, t0 + SESSION_IDLE_SECONDS);
    assert_eq!(session.absolute_expires_at, t0 + SESSION_ABSOLUTE_SECONDS);
    assert!(!contains(&raw_database(&dir), &secret));

    // Used within the minute: not written again.
    let soon = accounts.session_at(&secret, t0 + 30).await.unwrap().unwrap();
    assert_eq!(soon.expires_at, t0 + SESSION_IDLE_SECONDS);
    // Used just before the idle expiry: it slides.
    let mut now = t0 + SESSION_IDLE_SECONDS - 1;
    let later = accounts.session_at(&secret, now).await.unwrap().unwrap();
    assert_eq!(later.expires_at, now + SESSION_IDLE_SECONDS);
    // Kept in use, it still ends at the absolute expiry.
    while now + SESSION_IDLE_SECONDS - 1 < t0 + SESSION_ABSOLUTE_SECONDS {
        now += SESSION_IDLE_SECONDS - 1;
        let used = accounts.session_at(&secret, now).await.unwrap().unwrap();
        assert!(used.expires_at <= t0 + SESSION_ABSOLUTE_SECONDS);
    }
    assert!(
        accounts.session_at(&secret, t0 + SESSION_ABSOLUTE_SECONDS - 1).await.unwrap().is_some()
    );
    assert_eq!(accounts.session_at(&secret, t0 + SESSION_ABSOLUTE_SECONDS).await.unwrap(), None);
    // The expired row is gone: even an earlier clock does not bring it back.
    assert_eq!(accounts.session_at(&secret, t0 + 1).await.unwrap(), None);

    // Unused, a session ends at its idle expiry.
    let (idle, _) = accounts.create_session_at(&alice.id, &default, t0).await.unwrap();
    assert_eq!(accounts.session_at(&idle, t0 + SESSION_IDLE_SECONDS).await.unwrap(), None);
}

#[tokio::test]
async fn sessions_end_on_logout_and_when_the_membership_goes() {
    let (_dir, accounts, alice) = with_alice("logout").await;
    let default = WorkspaceId::default_workspace();
    let team = accounts.add_workspace("team").await.unwrap();
    let outside = accounts.create_session(&alice.id, &team.id).await;
    assert!(matches!(outside, Err(AccountError::NotMember { .. })), "{outside:?}");

    let (secret, _) = accounts.create_session(&alice.id, &default).await.unwrap();
    assert!(accounts.end_session(&secret).await.unwrap());
    assert_eq!(accounts.session(&secret).await.unwrap(), None);
    assert!(!accounts.end_session(&secret).await.unwrap());

    let (secret, _) = accounts.create_session(&alice.id, &default).await.unwrap();
    accounts.revoke("default", "alice").await.unwrap();
    assert_eq!(accounts.session(&secret).await.unwrap(), None);
    accounts.grant("default", "alice", Role::Member).await.unwrap();
    assert_eq!(accounts.session(&secret).await.unwrap(), None, "a new grant revives no session");
    let again = accounts.revoke("team", "alice").await;
    assert!(matches!(again, Err(AccountError::NotMember { .. })), "{again:?}");

    let (_, _) = accounts.create_session(&alice.id, &default).await.unwrap();
    let (_, _) = accounts.create_session(&alice.id, &default).await.unwrap();
    assert_eq!(accounts.end_sessions_of(&alice.id).await.unwrap(), 2);
}

#[tokio::test]
async fn the_csrf_token_is_derived_from_the_session_secret() {
    let (_dir, accounts, alice) = with_alice("csrf").await;
    let default = WorkspaceId::default_workspace();
    let (secret, session) = accounts.create_session(&alice.id, &default).await.unwrap();
    let (other, other_session) = accounts.create_session(&alice.id, &default).await.unwrap();
    assert_eq!(session.csrf_token, csrf_token(&secret));
    assert_eq!(accounts.session(&secret).await.unwrap().unwrap().csrf_token, session.csrf_token);
    assert_eq!(session.csrf_token.len(), 43);
    assert_ne!(session.csrf_token, secret);
    assert!(csrf_matches(&secret, &session.csrf_token));
    assert!(!csrf_matches(&secret, &other_session.csrf_token));
    assert!(!csrf_matches(&other, &session.csrf_token));
    assert!(!csrf_matches(&secret, ""));
    assert!(!csrf_matches(&secret, &session.csrf_token[..42]));
    assert!(!format!("{session:?}").contains(&session.csrf_token));
}

#[tokio::test]
async fn roles_are_granted_changed_listed_and_revoked() {
    let (_dir, accounts, alice) = with_alice("roles").await;
    let team = accounts.add_workspace("team").await.unwrap();
    let taken = accounts.add_workspace("team").await;
    assert!(matches!(taken, Err(AccountError::Exists(_))), "{taken:?}");
    assert_eq!(accounts.role(&alice.id, &team.id).await.unwrap(), None);
    accounts.grant("team", "alice", Role::Member).await.unwrap();
    accounts.grant("team", "alice", Role::Owner).await.unwrap();
    assert_eq!(accounts.role(&alice.id, &team.id).await.unwrap(), Some(Role::Owner));
    let memberships = accounts.memberships(&alice.id).await.unwrap();
    let listed: Vec<(&str, Role)> =
        memberships.iter().map(|m| (m.workspace.name.as_str(), m.role)).collect();
    assert_eq!(listed, [("default", Role::Member), ("team", Role::Owner)]);
    let missing = accounts.grant("nowhere", "alice", Role::Member).await;
    assert!(matches!(missing, Err(AccountError::NotFound(_))), "{missing:?}");
    let missing = accounts.grant("team", "nobody", Role::Member).await;
    assert!(matches!(missing, Err(AccountError::NotFound(_))), "{missing:?}");

    let workspaces = accounts.list_workspaces().await.unwrap();
    let names: Vec<&str> = workspaces.iter().map(|w| w.workspace.name.as_str()).collect();
    assert_eq!(names, ["default", "team"]);
    assert_eq!(workspaces[1].members, [Member { user: alice.clone(), role: Role::Owner }]);

    accounts.revoke("team", "alice").await.unwrap();
    assert_eq!(accounts.role(&alice.id, &team.id).await.unwrap(), None);
    assert_eq!("owner".parse::<Role>().unwrap(), Role::Owner);
    assert!(matches!("admin".parse::<Role>(), Err(AccountError::UnknownRole(_))));
}

#[tokio::test]
async fn an_api_key_is_shown_once_stored_hashed_and_refused_once_revoked() {
    let (dir, accounts, alice) = with_alice("keys").await;
    let default = WorkspaceId::default_workspace();
    let (secret, info) = accounts.create_api_key(&alice.id, &default, "my script").await.unwrap();
    assert!(secret.starts_with("comfyui-"), "{secret}");
    assert_eq!(secret.len(), "comfyui-".len() + 43);
    assert_eq!(info.hint, secret[secret.len() - 4..]);
    assert!(!contains(&raw_database(&dir), &secret["comfyui-".len()..]));

    let listed = accounts.list_api_keys(&alice.id).await.unwrap();
    assert_eq!(listed, std::slice::from_ref(&info));
    assert!(!format!("{listed:?}").contains(&secret[..secret.len() - 4]));

    let principal = accounts.api_key_at(&secret, 1_000).await.unwrap().unwrap();
    assert_eq!(principal.key_id, info.id);
    assert_eq!(principal.user, alice);
    assert_eq!(principal.workspace_id, default);
    assert_eq!(principal.role, Role::Member);
    let used = accounts.list_api_keys(&alice.id).await.unwrap();
    assert_eq!(used[0].last_used_at, Some(1_000));
    accounts.api_key_at(&secret, 1_030).await.unwrap().unwrap();
    assert_eq!(accounts.list_api_keys(&alice.id).await.unwrap()[0].last_used_at, Some(1_000));

    assert_eq!(accounts.api_key("comfyui-not-a-key").await.unwrap(), None);
    assert_eq!(accounts.api_key(&secret["comfyui-".len()..]).await.unwrap(), None);

    // Someone else cannot revoke it, nor learn that it exists.
    let bob = accounts.add_user("bob", "bob's password").await.unwrap();
    assert!(!accounts.revoke_api_key(&bob.id, &info.id).await.unwrap());
    assert!(accounts.list_api_keys(&bob.id).await.unwrap().is_empty());
    assert!(accounts.api_key(&secret).await.unwrap().is_some());

    assert!(accounts.revoke_api_key(&alice.id, &info.id).await.unwrap());
    assert_eq!(accounts.api_key(&secret).await.unwrap(), None);
    assert!(accounts.list_api_keys(&alice.id).await.unwrap()[0].revoked);
    assert!(!accounts.revoke_api_key(&alice.id, &ApiKeyId::from("no-such-key")).await.unwrap());
}

#[tokio::test]
async fn an_api_key_acts_only_while_its_user_is_a_member() {
    let (_dir, accounts, alice) = with_alice("key-member").await;
    let team = accounts.add_workspace("team").await.unwrap();
    let outside = accounts.create_api_key(&alice.id, &team.id, "ci").await;
    assert!(matches!(outside, Err(AccountError::NotMember { .. })), "{outside:?}");
    let bad_name = accounts.create_api_key(&alice.id, &team.id, "a\nb").await;
    assert!(matches!(bad_name, Err(AccountError::InvalidName { .. })), "{bad_name:?}");

    accounts.grant("team", "alice", Role::Owner).await.unwrap();
    let (secret, _) = accounts.create_api_key(&alice.id, &team.id, "ci").await.unwrap();
    assert_eq!(accounts.api_key(&secret).await.unwrap().unwrap().role, Role::Owner);
    // The role is read live.
    accounts.grant("team", "alice", Role::Member).await.unwrap();
    assert_eq!(accounts.api_key(&secret).await.unwrap().unwrap().role, Role::Member);
    accounts.revoke("team", "alice").await.unwrap();
    assert_eq!(accounts.api_key(&secret).await.unwrap(), None);
}
