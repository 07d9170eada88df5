//! API keys: long-lived secrets a user makes for scripts, each acting in one workspace.
//!
//! The invariant: the secret is returned once, by [`Accounts::create_api_key`]; only its hash and its last 4
//! characters are stored, and listings never carry either secret or hash. A key acts only while it is not
//! revoked and its user is still a member of its workspace, with the role the membership has at that moment.

use super::{
    AccountError, Accounts, ApiKeyId, ApiKeyInfo, ApiKeyPrincipal, TOUCH_EVERY_SECONDS, User,
    UserId, WorkspaceId, new_id, now, secret,
};

/// What every API key starts with (so a key is recognisable in a config file or a leak scanner).
pub const API_KEY_PREFIX: &str = "comfyui-";

/// The most characters an API key's name may have.
const MAX_NAME_CHARS: usize = 64;

/// An API key's listed columns, as selected.
type ApiKeyRow = (String, String, String, String, i64, Option<i64>, Option<i64>);

/// A valid key joined with its user and the user's role in its workspace, as selected.
type PrincipalRow = (String, String, String, i64, String, String, Option<i64>);

/// Builds an [`ApiKeyInfo`] from its selected columns.
fn info_from_row(
    (id, name, workspace_id, hint, created_at, last_used_at, revoked_at): ApiKeyRow,
) -> ApiKeyInfo {
    ApiKeyInfo {
        id: ApiKeyId(id),
        name,
        workspace_id: WorkspaceId(workspace_id),
        hint,
        created_at,
        last_used_at,
        revoked: revoked_at.is_some(),
    }
}

/// Checks an API key's name: 1 to 64 characters, no control characters, not only spaces.
fn check_key_name(name: &str) -> Result<(), AccountError> {
    let count = name.chars().count();
    if !name.trim().is_empty() && count <= MAX_NAME_CHARS && !name.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(AccountError::InvalidName {
            what: "API key",
            name: name.to_owned(),
            rule: "1 to 64 characters, no control characters",
        })
    }
}

impl Accounts {
    /// Makes an API key for a member of the workspace; returns the secret (shown once: it cannot be read
    /// back) and the key as listed. Not a member: [`AccountError::NotMember`].
    pub async fn create_api_key(
        &self,
        user_id: &UserId,
        workspace_id: &WorkspaceId,
        name: &str,
    ) -> Result<(String, ApiKeyInfo), AccountError> {
        check_key_name(name)?;
        let secret = format!("{API_KEY_PREFIX}{}", secret::new_secret()?);
        // The secret is ASCII (the prefix and base64url), so its last 4 bytes are its last 4 characters.
        let hint = secret[secret.len() - 4..].to_owned();
        let info = ApiKeyInfo {
            id: ApiKeyId(new_id()),
            name: name.to_owned(),
            workspace_id: workspace_id.clone(),
            hint,
            created_at: now(),
            last_used_at: None,
            revoked: false,
        };
        let inserted = sqlx::query(
            "INSERT INTO api_keys (id, user_id, workspace_id, name, secret_hash, hint, created_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7 WHERE EXISTS \
             (SELECT 1 FROM memberships WHERE user_id = $8 AND workspace_id = $9)",
        )
        .bind(info.id.as_str())
        .bind(user_id.as_str())
        .bind(workspace_id.as_str())
        .bind(&info.name)
        .bind(secret::hash(&secret))
        .bind(&info.hint)
        .bind(info.created_at)
        .bind(user_id.as_str())
        .bind(workspace_id.as_str())
        .execute(&self.pool)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(AccountError::NotMember {
                user: user_id.to_string(),
                workspace: workspace_id.to_string(),
            });
        }
        Ok((secret, info))
    }

    /// Who the API key with this secret acts as, if it is valid (unknown, revoked, or its user no longer a
    /// member of its workspace: `None`). Notes the use, at most once a minute.
    pub async fn api_key(&self, secret: &str) -> Result<Option<ApiKeyPrincipal>, AccountError> {
        self.api_key_at(secret, now()).await
    }

    /// [`Accounts::api_key`] at time `now`.
    pub(crate) async fn api_key_at(
        &self,
        secret: &str,
        now: i64,
    ) -> Result<Option<ApiKeyPrincipal>, AccountError> {
        if !secret.starts_with(API_KEY_PREFIX) {
            return Ok(None);
        }
        let row: Option<PrincipalRow> = sqlx::query_as(
            "SELECT k.id, u.id, u.username, u.created_at, k.workspace_id, m.role, k.last_used_at \
                 FROM api_keys k JOIN users u ON u.id = k.user_id \
                 JOIN memberships m ON m.user_id = k.user_id AND m.workspace_id = k.workspace_id \
                 WHERE k.secret_hash = $1 AND k.revoked_at IS NULL",
        )
        .bind(secret::hash(secret))
        .fetch_optional(&self.pool)
        .await?;
        let Some((key_id, user_id, username, created_at, workspace_id, role, last_used)) = row
        else {
            return Ok(None);
        };
        if last_used.is_none_or(|last| now - last >= TOUCH_EVERY_SECONDS) {
            sqlx::query("UPDATE api_keys SET last_used_at = $1 WHERE id = $2")
                .bind(now)
                .bind(&key_id)
                .execute(&self.pool)
                .await?;
        }
        Ok(Some(ApiKeyPrincipal {
            key_id: ApiKeyId(key_id),
            user: User { id: UserId(user_id), username, created_at },
            workspace_id: WorkspaceId(workspace_id),
            role: role.parse()?,
        }))
    }

    /// The user's API keys, revoked ones included, oldest first (never a secret or hash).
    pub async fn list_api_keys(&self, user_id: &UserId) -> Result<Vec<ApiKeyInfo>, AccountError> {
        let rows: Vec<ApiKeyRow> = sqlx::query_as(
            "SELECT id, name, workspace_id, hint, created_at, last_used_at, revoked_at \
             FROM api_keys WHERE user_id = $1 ORDER BY created_at, id",
        )
        .bind(user_id.as_str())
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(info_from_row).collect())
    }

    /// Revokes one of the user's API keys; whether the user has a key with this id (revoking twice is fine).
    /// Another user's key id answers `false`, as an unknown one does.
    pub async fn revoke_api_key(
        &self,
        user_id: &UserId,
        key_id: &ApiKeyId,
    ) -> Result<bool, AccountError> {
        let updated = sqlx::query(
            "UPDATE api_keys SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2 AND user_id = $3",
        )
        .bind(now())
        .bind(key_id.as_str())
        .bind(user_id.as_str())
        .execute(&self.pool)
        .await?;
        Ok(updated.rows_affected() > 0)
    }
}
