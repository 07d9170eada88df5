//! Browser sessions: the cookie is a random secret; the row is found by its hash.
//!
//! The invariant: a session is valid only before both its idle expiry (which slides with use, written at most
//! once a minute) and its absolute expiry, and only while its user is a member of its workspace. An expired
//! session found by a lookup is deleted; expired rows are also swept whenever a session is created.

use super::{
    AccountError, Accounts, SESSION_ABSOLUTE_SECONDS, SESSION_IDLE_SECONDS, Session,
    TOUCH_EVERY_SECONDS, User, UserId, WorkspaceId, now, secret,
};

/// A session joined with its user and the user's role in its workspace, as selected.
type SessionRow = (String, String, i64, String, Option<String>, i64, i64, i64);

impl Accounts {
    /// Starts a session for a member of the workspace; returns the cookie secret (to be sent to the browser
    /// and nowhere else) and the session. Not a member: [`AccountError::NotMember`].
    pub async fn create_session(
        &self,
        user_id: &UserId,
        workspace_id: &WorkspaceId,
    ) -> Result<(String, Session), AccountError> {
        self.create_session_at(user_id, workspace_id, now()).await
    }

    /// [`Accounts::create_session`] at time `now`.
    pub(crate) async fn create_session_at(
        &self,
        user_id: &UserId,
        workspace_id: &WorkspaceId,
        now: i64,
    ) -> Result<(String, Session), AccountError> {
        sqlx::query("DELETE FROM web_sessions WHERE expires_at <= $1")
            .bind(now)
            .execute(&self.pool)
            .await?;
        let secret = secret::new_secret()?;
        let absolute = now + SESSION_ABSOLUTE_SECONDS;
        let inserted = sqlx::query(
            "INSERT INTO web_sessions \
             (id_hash, user_id, workspace_id, created_at, last_seen_at, expires_at, absolute_expires_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS \
             (SELECT 1 FROM memberships WHERE user_id = $8 AND workspace_id = $9)",
        )
        .bind(secret::hash(&secret))
        .bind(user_id.as_str())
        .bind(workspace_id.as_str())
        .bind(now)
        .bind(now)
        .bind((now + SESSION_IDLE_SECONDS).min(absolute))
        .bind(absolute)
        .bind(user_id.as_str())
        .bind(workspace_id.as_str())
        .execute(&self.pool)
        .await?;
        let session = match inserted.rows_affected() {
            0 => None,
            _ => self.session_at(&secret, now).await?,
        };
        match session {
            Some(session) => Ok((secret, session)),
            None => Err(AccountError::NotMember {
                user: user_id.to_string(),
                workspace: workspace_id.to_string(),
            }),
        }
    }

    /// The live session with this cookie secret, if any (unknown, expired, or its user no longer a member of
    /// its workspace: `None`). A use extends the idle expiry, at most once a minute.
    pub async fn session(&self, secret: &str) -> Result<Option<Session>, AccountError> {
        self.session_at(secret, now()).await
    }

    /// [`Accounts::session`] at time `now`.
    pub(crate) async fn session_at(
        &self,
        secret: &str,
        now: i64,
    ) -> Result<Option<Session>, AccountError> {
        let id_hash = secret::hash(secret);
        let row: Option<SessionRow> = sqlx::query_as(
            "SELECT s.user_id, u.username, u.created_at, s.workspace_id, m.role, \
             s.last_seen_at, s.expires_at, s.absolute_expires_at \
             FROM web_sessions s JOIN users u ON u.id = s.user_id \
             LEFT JOIN memberships m ON m.user_id = s.user_id AND m.workspace_id = s.workspace_id \
             WHERE s.id_hash = $1",
        )
        .bind(&id_hash)
        .fetch_optional(&self.pool)
        .await?;
        let Some((user_id, username, created_at, workspace_id, role, last_seen, expires, absolute)) =
            row
        else {
            return Ok(None);
        };
        if now >= expires || now >= absolute {
            sqlx::query("DELETE FROM web_sessions WHERE id_hash = $1")
                .bind(&id_hash)
                .execute(&self.pool)
                .await?;
            return Ok(None);
        }
        let Some(role) = role else {
            return Ok(None);
        };
        let mut expires_at = expires;
        if now - last_seen >= TOUCH_EVERY_SECONDS {
            expires_at = (now + SESSION_IDLE_SECONDS).min(absolute);
            sqlx::query(
                "UPDATE web_sessions SET last_seen_at = $1, expires_at = $2 WHERE id_hash = $3",
            )
            .bind(now)
            .bind(expires_at)
            .bind(&id_hash)
            .execute(&self.pool)
            .await?;
        }
        Ok(Some(Session {
            user: User { id: UserId(user_id), username, created_at },
            workspace_id: WorkspaceId(workspace_id),
            role: role.parse()?,
            expires_at,
            absolute_expires_at: absolute,
            csrf_token: secret::csrf_token(secret),
        }))
    }

    /// Ends the session with this cookie secret (logout); whether there was one.
    pub async fn end_session(&self, secret: &str) -> Result<bool, AccountError> {
        let deleted = sqlx::query("DELETE FROM web_sessions WHERE id_hash = $1")
            .bind(secret::hash(secret))
            .execute(&self.pool)
            .await?;
        Ok(deleted.rows_affected() > 0)
    }

    /// Ends every session of the user; how many there were.
    pub async fn end_sessions_of(&self, user_id: &UserId) -> Result<u64, AccountError> {
        let deleted = sqlx::query("DELETE FROM web_sessions WHERE user_id = $1")
            .bind(user_id.as_str())
            .execute(&self.pool)
            .await?;
        Ok(deleted.rows_affected())
    }
}
