//! What an authorization leaves behind: pending consent requests and authorization codes (in memory, minutes
//! long), and grants with their refresh tokens (in the database).
//!
//! - A **pending request** is an authorization request waiting for the user's decision: single use, 10
//!   minutes, bound to the browser session that made it.
//! - A **code** is single use, 5 minutes, bound to client, redirect URI, PKCE challenge and resource. Redeeming
//!   a code twice with all the right inputs revokes the grant the first redemption made (RFC 6749 §4.1.2); a
//!   replay with a wrong input is refused without revoking anything (anyone who saw the code could send it).
//! - A **grant** is one approved consent; its refresh tokens rotate on every use. A used refresh token that
//!   comes back is reuse and revokes the whole grant, except within a short grace window while its successor is
//!   still unused: two processes of one client refreshing at once then both get the same successor. The
//!   successor is stored sealed with a pad derived from the used token, so the database alone cannot produce it.
//!
//! Codes, pending ids, refresh tokens: 32 random bytes, base64url; only their SHA-256 is kept.

use std::collections::HashMap;
use std::sync::Mutex;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest as _, Sha256};
use sqlx::AnyPool;

use super::clients::{Client, StoreError};
use crate::accounts::{new_secret, secret_hash};

/// How long a pending request waits for the user.
pub(crate) const PENDING_SECONDS: i64 = 10 * 60;
/// How long a code may be redeemed.
pub(crate) const CODE_SECONDS: i64 = 5 * 60;
/// How long a refresh token lives unused.
pub(crate) const REFRESH_IDLE_SECONDS: i64 = 30 * 24 * 60 * 60;
/// How long a grant's refresh tokens live at most.
pub(crate) const GRANT_SECONDS: i64 = 90 * 24 * 60 * 60;
/// How long after a rotation the previous token still yields the same successor, while that is unused.
pub(crate) const REFRESH_GRACE_SECONDS: i64 = 30;

/// The most pending requests kept at once (the oldest are dropped first when more arrive).
const MAX_PENDING: usize = 10_000;
/// The most pending requests one browser session keeps.
const PENDING_PER_SESSION: usize = 20;
/// The most unredeemed codes one user holds.
const CODES_PER_USER: usize = 20;
/// The most codes kept at once.
const MAX_CODES: usize = 10_000;

/// Removes the entry of `map` that expires first among those `which` selects.
fn evict_oldest<T: Expiring>(map: &mut HashMap<String, T>, which: impl Fn(&T) -> bool) {
    let oldest = map
        .iter()
        .filter(|(_, v)| which(v))
        .min_by_key(|(_, v)| v.expires_at())
        .map(|(k, _)| k.clone());
    if let Some(oldest) = oldest {
        map.remove(&oldest);
    }
}

/// What [`evict_oldest`] orders by.
trait Expiring {
    fn expires_at(&self) -> i64;
}

impl Expiring for Pending {
    fn expires_at(&self) -> i64 {
        self.expires_at
    }
}

impl Expiring for IssuedCode {
    fn expires_at(&self) -> i64 {
        self.expires_at
    }
}

/// An authorization request waiting for consent.
#[derive(Debug, Clone)]
pub(crate) struct Pending {
    /// The client asking.
    pub(crate) client: Client,
    /// Where the answer goes (validated against the client).
    pub(crate) redirect_uri: String,
    /// Whether the request named it (then the token request must name it too, RFC 6749 §4.1.3).
    pub(crate) redirect_uri_sent: bool,
    /// The client's `state`, returned unchanged when it sent one.
    pub(crate) state: Option<String>,
    /// The scopes asked for (known ones only).
    pub(crate) scopes: Vec<String>,
    /// The resource (canonical form).
    pub(crate) resource: String,
    /// The PKCE S256 challenge.
    pub(crate) code_challenge: String,
    /// When it expires (unix seconds).
    pub(crate) expires_at: i64,
    /// The hash of the browser session that made it (set when it is kept).
    session: String,
}

impl Pending {
    /// A new pending request valid from `now`.
    pub(crate) fn new(
        client: Client,
        (redirect_uri, redirect_uri_sent): (String, bool),
        state: Option<String>,
        scopes: Vec<String>,
        resource: String,
        code_challenge: String,
        now: i64,
    ) -> Self {
        Pending {
            client,
            redirect_uri,
            redirect_uri_sent,
            state,
            scopes,
            resource,
            code_challenge,
            expires_at: now + PENDING_SECONDS,
            session: String::new(),
        }
    }
}

/// Why a pending request cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PendingError {
    /// Unknown, expired or already decided.
    #[error("the authorization request is unknown, expired or already decided")]
    Unknown,
    /// Another browser session made it.
    #[error("the authorization request belongs to another session")]
    OtherSession,
}

/// The pending requests.
#[derive(Debug, Default)]
pub(crate) struct PendingRequests(Mutex<HashMap<String, Pending>>);

impl PendingRequests {
    /// Keeps `pending` for the session with this secret and answers its id (a UUID v4). A session keeps at most
    /// [`PENDING_PER_SESSION`] requests (its oldest makes room), and the server [`MAX_PENDING`].
    pub(crate) fn insert(&self, mut pending: Pending, session_secret: &str, now: i64) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let session = secret_hash(session_secret);
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.retain(|_, p| p.expires_at > now);
        let mine = |p: &Pending| p.session == session;
        if map.values().filter(|p| mine(p)).count() >= PENDING_PER_SESSION {
            evict_oldest(&mut map, |p| mine(p));
        }
        if map.len() >= MAX_PENDING {
            evict_oldest(&mut map, |_| true);
        }
        pending.session = session;
        map.insert(id.clone(), pending);
        id
    }

    /// The pending request `id` for the session with this secret.
    pub(crate) fn view(
        &self,
        id: &str,
        session_secret: &str,
        now: i64,
    ) -> Result<Pending, PendingError> {
        let map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        checked(&map, id, session_secret, now).cloned()
    }

    /// Removes and answers the pending request `id` for the decision of the session with this secret.
    pub(crate) fn take(
        &self,
        id: &str,
        session_secret: &str,
        now: i64,
    ) -> Result<Pending, PendingError> {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        checked(&map, id, session_secret, now)?;
        map.remove(id).ok_or(PendingError::Unknown)
    }
}

/// The pending request `id` of `map` if it is live and belongs to the session with this secret.
fn checked<'a>(
    map: &'a HashMap<String, Pending>,
    id: &str,
    session_secret: &str,
    now: i64,
) -> Result<&'a Pending, PendingError> {
    let pending = map.get(id).filter(|p| p.expires_at > now).ok_or(PendingError::Unknown)?;
    if pending.session != secret_hash(session_secret) {
        return Err(PendingError::OtherSession);
    }
    Ok(pending)
}

/// What an authorization code stands for.
#[derive(Debug, Clone)]
pub(crate) struct CodeGrant {
    /// The client it was issued to.
    pub(crate) client_id: String,
    /// The redirect URI the authorization request named (`None` when it relied on the only registered one,
    /// and the token request must then not name one either).
    pub(crate) redirect_uri: Option<String>,
    /// The PKCE challenge.
    pub(crate) code_challenge: String,
    /// The resource (canonical).
    pub(crate) resource: String,
    /// The granted scopes, space-separated.
    pub(crate) scope: String,
    /// The user who approved.
    pub(crate) user_id: String,
    /// The workspace granted.
    pub(crate) workspace_id: String,
}

#[derive(Debug)]
struct IssuedCode {
    grant: CodeGrant,
    expires_at: i64,
    /// The grant made by the first redemption.
    redeemed: Option<String>,
}

/// What redeeming a code found.
#[derive(Debug)]
pub(crate) enum Redemption {
    /// The first redemption: make the grant with this id from this.
    First(String, CodeGrant),
    /// The code was already redeemed and made this grant, which must now be revoked.
    Replayed(String),
    /// Unknown, expired, or an input does not match (nothing is revoked).
    Refused(&'static str),
}

/// The authorization codes.
#[derive(Debug, Default)]
pub(crate) struct Codes(Mutex<HashMap<String, IssuedCode>>);

impl Codes {
    /// Issues a code for `grant` at `now`. A user holds at most [`CODES_PER_USER`] unexpired codes (their
    /// oldest makes room), the server [`MAX_CODES`].
    pub(crate) fn issue(&self, grant: CodeGrant, now: i64) -> Result<String, StoreError> {
        let code = new_secret()?;
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // Redeemed codes are kept until they expire, so a replay is recognised.
        map.retain(|_, c| c.expires_at > now);
        let user = grant.user_id.clone();
        let theirs = |c: &IssuedCode| c.grant.user_id == user && c.redeemed.is_none();
        if map.values().filter(|c| theirs(c)).count() >= CODES_PER_USER {
            evict_oldest(&mut map, |c| theirs(c));
        }
        if map.len() >= MAX_CODES {
            evict_oldest(&mut map, |_| true);
        }
        map.insert(
            secret_hash(&code),
            IssuedCode { grant, expires_at: now + CODE_SECONDS, redeemed: None },
        );
        Ok(code)
    }

    /// Redeems `code`: it must be unexpired, issued to `client_id` for `redirect_uri` (when the authorization
    /// request named one), and `verifier` must match its challenge. The first redemption claims the code at
    /// once for a new grant id, so concurrent redemptions cannot both succeed.
    pub(crate) fn redeem(
        &self,
        code: &str,
        client_id: &str,
        redirect_uri: Option<&str>,
        verifier: &str,
        now: i64,
    ) -> Redemption {
        let mut map = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(issued) = map.get_mut(&secret_hash(code)) else {
            return Redemption::Refused("unknown or expired code");
        };
        if issued.expires_at <= now {
            return Redemption::Refused("unknown or expired code");
        }
        if issued.grant.client_id != client_id {
            return Redemption::Refused("the code was issued to another client");
        }
        let redirect_matches = match (&issued.grant.redirect_uri, redirect_uri) {
            (Some(sent), asked) => asked == Some(sent.as_str()),
            (None, asked) => asked.is_none(),
        };
        if !redirect_matches {
            return Redemption::Refused("redirect_uri differs from the authorization request's");
        }
        if !super::pkce::verifies(verifier, &issued.grant.code_challenge) {
            return Redemption::Refused("the code_verifier does not match the code_challenge");
        }
        match &issued.redeemed {
            Some(grant_id) => Redemption::Replayed(grant_id.clone()),
            None => {
                let grant_id = uuid::Uuid::new_v4().to_string();
                issued.redeemed = Some(grant_id.clone());
                Redemption::First(grant_id, issued.grant.clone())
            }
        }
    }
}

/// A grant with a usable refresh token.
#[derive(Debug, Clone)]
pub(crate) struct Grant {
    /// The grant id (`gid` in access tokens).
    pub(crate) id: String,
    /// The client.
    pub(crate) client_id: String,
    /// The user.
    pub(crate) user_id: String,
    /// The workspace.
    pub(crate) workspace_id: String,
    /// The scopes, space-separated.
    pub(crate) scope: String,
}

/// What a refresh asks for beyond the token: a narrower scope, the resource.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RefreshWanted<'a> {
    /// Space-separated scopes, a subset of the grant's; `None` for the grant's.
    pub(crate) scope: Option<&'a str>,
    /// The resource; `None` for the grant's.
    pub(crate) resource: Option<&'a str>,
}

/// What a refresh found.
#[derive(Debug)]
pub(crate) enum Refreshed {
    /// The grant, the refresh token to hand out (new, or the same successor within the grace window) and the
    /// scope of the new access token.
    Rotated(Grant, String, String),
    /// Refused; the token is untouched unless the refusal is reuse (which revokes the grant).
    Refused(RefreshRefusal),
}

/// Why a refresh was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefreshRefusal {
    /// Unknown, expired, revoked, another client's, or reused (`invalid_grant`).
    Grant(&'static str),
    /// A scope the grant does not have (`invalid_scope`).
    Scope,
    /// Another resource than the grant's (`invalid_target`).
    Target,
}

/// The scope a refresh may have: `wanted` when it is a subset of `granted`, the grant's when absent.
fn refreshed_scope(granted: &str, wanted: Option<&str>) -> Option<String> {
    let granted: Vec<&str> = granted.split(' ').collect();
    match wanted.map(str::trim).filter(|s| !s.is_empty()) {
        None => Some(granted.join(" ")),
        Some(asked) => {
            let asked: Vec<&str> = asked.split(' ').filter(|s| !s.is_empty()).collect();
            asked.iter().all(|s| granted.contains(s)).then(|| asked.join(" "))
        }
    }
}

/// The one-time pad a used refresh token seals its successor with.
fn pad(token: &str) -> [u8; 32] {
    Sha256::new().chain_update(b"kiln-refresh-successor\0").chain_update(token).finalize().into()
}

fn seal(successor: &str, token: &str) -> Option<String> {
    let bytes = URL_SAFE_NO_PAD.decode(successor).ok()?;
    let pad = pad(token);
    (bytes.len() == pad.len()).then(|| {
        URL_SAFE_NO_PAD.encode(bytes.iter().zip(pad).map(|(b, p)| b ^ p).collect::<Vec<_>>())
    })
}

/// The grants and refresh tokens in the database.
#[derive(Debug, Clone)]
pub(crate) struct Grants {
    pool: AnyPool,
}

/// A refresh token's row joined with its grant's.
#[derive(sqlx::FromRow)]
struct RefreshRow {
    id: String,
    client_id: String,
    user_id: String,
    workspace_id: String,
    scope: String,
    resource: String,
    grant_expires_at: i64,
    revoked_at: Option<i64>,
    token_expires_at: i64,
    used_at: Option<i64>,
    successor_hash: Option<String>,
    successor_sealed: Option<String>,
}

impl Grants {
    /// The grants in `pool`'s database.
    pub(crate) fn new(pool: AnyPool) -> Self {
        Grants { pool }
    }

    /// Makes grant `id` from a redeemed code and answers it with its first refresh token.
    pub(crate) async fn create(
        &self,
        id: String,
        code: &CodeGrant,
        now: i64,
    ) -> Result<(Grant, String), StoreError> {
        let token = new_secret()?;
        let mut tx = self.pool.begin().await?;
        // Dead grants go, with their refresh tokens (cascade): a revoked or ended grant is refused whether its
        // row is there or not, and used refresh tokens are kept only while their grant lives, for reuse
        // detection.
        sqlx::query("DELETE FROM oauth_grants WHERE revoked_at IS NOT NULL OR expires_at <= $1")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO oauth_grants (id, client_id, user_id, workspace_id, scope, resource, created_at, \
             expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&id)
        .bind(&code.client_id)
        .bind(&code.user_id)
        .bind(&code.workspace_id)
        .bind(&code.scope)
        .bind(&code.resource)
        .bind(now)
        .bind(now + GRANT_SECONDS)
        .execute(&mut *tx)
        .await?;
        insert_token(&mut tx, &token, &id, now).await?;
        tx.commit().await?;
        let grant = Grant {
            id,
            client_id: code.client_id.clone(),
            user_id: code.user_id.clone(),
            workspace_id: code.workspace_id.clone(),
            scope: code.scope.clone(),
        };
        Ok((grant, token))
    }

    /// Revokes a grant: its refresh tokens and access tokens stop working.
    pub(crate) async fn revoke(&self, grant_id: &str, now: i64) -> Result<(), StoreError> {
        sqlx::query("UPDATE oauth_grants SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL")
            .bind(now)
            .bind(grant_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Whether a grant is live (not revoked, not past its end) at `now`.
    pub(crate) async fn is_live(&self, grant_id: &str, now: i64) -> Result<bool, StoreError> {
        let live: Option<i64> = sqlx::query_scalar(
            "SELECT 1 FROM oauth_grants WHERE id = $1 AND revoked_at IS NULL AND expires_at > $2",
        )
        .bind(grant_id)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?;
        Ok(live.is_some())
    }

    /// Rotates `token` for `client_id` at `now`, if what the request wants fits the grant (checked before the
    /// token is used up: a refused request loses nothing).
    pub(crate) async fn refresh(
        &self,
        token: &str,
        client_id: &str,
        wanted: RefreshWanted<'_>,
        now: i64,
    ) -> Result<Refreshed, StoreError> {
        let refused = |why| Ok(Refreshed::Refused(RefreshRefusal::Grant(why)));
        let mut tx = self.pool.begin().await?;
        // A write first, so the transaction holds the write lock before it reads (two refreshes of one token
        // are then serialised, and the second sees the first's rotation).
        sqlx::query(
            "UPDATE oauth_refresh_tokens SET token_hash = token_hash WHERE token_hash = $1",
        )
        .bind(secret_hash(token))
        .execute(&mut *tx)
        .await?;
        let row: Option<RefreshRow> = sqlx::query_as(
            "SELECT g.id, g.client_id, g.user_id, g.workspace_id, g.scope, g.resource, \
             g.expires_at AS grant_expires_at, g.revoked_at, t.expires_at AS token_expires_at, t.used_at, \
             t.successor_hash, t.successor_sealed \
             FROM oauth_refresh_tokens t JOIN oauth_grants g ON g.id = t.grant_id WHERE t.token_hash = $1",
        )
        .bind(secret_hash(token))
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return refused("unknown refresh token");
        };
        if row.revoked_at.is_some() || row.grant_expires_at <= now || row.token_expires_at <= now {
            return refused("the refresh token has expired or was revoked");
        }
        if row.client_id != client_id {
            return refused("the refresh token was issued to another client");
        }
        if wanted.resource.is_some_and(|asked| !super::resource::names(&row.resource, asked)) {
            return Ok(Refreshed::Refused(RefreshRefusal::Target));
        }
        let Some(scope) = refreshed_scope(&row.scope, wanted.scope) else {
            return Ok(Refreshed::Refused(RefreshRefusal::Scope));
        };
        let (used_at, successor_hash, sealed) =
            (row.used_at, row.successor_hash, row.successor_sealed);
        let grant = Grant {
            id: row.id,
            client_id: row.client_id,
            user_id: row.user_id,
            workspace_id: row.workspace_id,
            scope: row.scope,
        };
        if let Some(used_at) = used_at {
            let successor_unused = match &successor_hash {
                Some(hash) => sqlx::query_scalar::<_, Option<i64>>(
                    "SELECT used_at FROM oauth_refresh_tokens WHERE token_hash = $1",
                )
                .bind(hash)
                .fetch_optional(&mut *tx)
                .await?
                .is_some_and(|used| used.is_none()),
                None => false,
            };
            let unsealed = sealed.as_deref().and_then(|s| seal(s, token));
            if now - used_at <= REFRESH_GRACE_SECONDS
                && successor_unused
                && let Some(successor) = unsealed
            {
                tx.commit().await?;
                return Ok(Refreshed::Rotated(grant, successor, scope));
            }
            sqlx::query(
                "UPDATE oauth_grants SET revoked_at = $1 WHERE id = $2 AND revoked_at IS NULL",
            )
            .bind(now)
            .bind(&grant.id)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            tracing::warn!(grant = %grant.id, client = %grant.client_id, "refresh token reused: grant revoked");
            return refused("the refresh token was already used; the grant is revoked");
        }
        let successor = new_secret()?;
        insert_token(&mut tx, &successor, &grant.id, now).await?;
        sqlx::query(
            "UPDATE oauth_refresh_tokens SET used_at = $1, successor_hash = $2, successor_sealed = $3 \
             WHERE token_hash = $4",
        )
        .bind(now)
        .bind(secret_hash(&successor))
        .bind(seal(&successor, token))
        .bind(secret_hash(token))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Refreshed::Rotated(grant, successor, scope))
    }
}

async fn insert_token(
    tx: &mut sqlx::Transaction<'_, sqlx::Any>,
    token: &str,
    grant_id: &str,
    now: i64,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO oauth_refresh_tokens (token_hash, grant_id, created_at, expires_at) \
         VALUES ($1, $2, $3, \
         (SELECT CASE WHEN $4 < expires_at THEN $4 ELSE expires_at END FROM oauth_grants WHERE id = $5))",
    )
    .bind(secret_hash(token))
    .bind(grant_id)
    .bind(now)
    .bind(now + REFRESH_IDLE_SECONDS)
    .bind(grant_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
