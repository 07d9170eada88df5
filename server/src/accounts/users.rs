//! Users: adding them, changing their password, listing them, and checking a login.
//!
//! The invariant: a login takes about as long for an unknown username as for a wrong password (the missing
//! user's password is checked against a stand-in hash), and says only "wrong username or password".

use super::{
    AccountError, Accounts, User, UserId, check_name, is_unique_violation, new_id, now, password,
};

/// The columns of a user, as selected (`id, username, created_at`).
type UserRow = (String, String, i64);

/// Builds a [`User`] from its selected columns.
pub(super) fn user_from_row((id, username, created_at): UserRow) -> User {
    User { id: UserId(id), username, created_at }
}

impl Accounts {
    /// Adds a user with a password (at least 8 characters). A taken username is
    /// [`AccountError::Exists`]. The user belongs to no workspace until [`Accounts::grant`].
    pub async fn add_user(&self, username: &str, password: &str) -> Result<User, AccountError> {
        check_name("user", username)?;
        password::check_strength(password)?;
        let secret = password.to_owned();
        let hash = self.blocking_hash(move || password::hash(&secret)).await?;
        let user = User { id: UserId(new_id()), username: username.to_owned(), created_at: now() };
        let inserted = sqlx::query(
            "INSERT INTO users (id, username, password_hash, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(user.id.as_str())
        .bind(&user.username)
        .bind(&hash)
        .bind(user.created_at)
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(user),
            Err(e) if is_unique_violation(&e) => {
                Err(AccountError::Exists(format!("the user `{username}`")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Sets a user's password, ends all of the user's browser sessions and revokes their OAuth grants (API keys
    /// stay valid: they are revoked one by one).
    pub async fn set_password(&self, username: &str, password: &str) -> Result<(), AccountError> {
        password::check_strength(password)?;
        let user = self.user(username).await?;
        let secret = password.to_owned();
        let hash = self.blocking_hash(move || password::hash(&secret)).await?;
        let mut transaction = self.pool.begin().await?;
        let updated = sqlx::query("UPDATE users SET password_hash = $1 WHERE id = $2")
            .bind(&hash)
            .bind(user.id.as_str())
            .execute(&mut *transaction)
            .await?;
        if updated.rows_affected() == 0 {
            return Err(AccountError::NotFound(format!("the user `{username}`")));
        }
        sqlx::query("DELETE FROM web_sessions WHERE user_id = $1")
            .bind(user.id.as_str())
            .execute(&mut *transaction)
            .await?;
        // Whoever knew the old password may have approved OAuth clients (RFC 9700 §4.14.2).
        sqlx::query(
            "UPDATE oauth_grants SET revoked_at = $1 WHERE user_id = $2 AND revoked_at IS NULL",
        )
        .bind(super::now())
        .bind(user.id.as_str())
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        Ok(())
    }

    /// The user with this username ([`AccountError::NotFound`] if none).
    pub async fn user(&self, username: &str) -> Result<User, AccountError> {
        let row: Option<UserRow> =
            sqlx::query_as("SELECT id, username, created_at FROM users WHERE username = $1")
                .bind(username)
                .fetch_optional(&self.pool)
                .await?;
        row.map(user_from_row)
            .ok_or_else(|| AccountError::NotFound(format!("the user `{username}`")))
    }

    /// Every user, by username.
    pub async fn list_users(&self) -> Result<Vec<User>, AccountError> {
        let rows: Vec<UserRow> =
            sqlx::query_as("SELECT id, username, created_at FROM users ORDER BY username")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(user_from_row).collect())
    }

    /// The user with this username and password, or [`AccountError::BadCredentials`] (for an unknown user
    /// too, after the same work).
    pub async fn authenticate(&self, username: &str, password: &str) -> Result<User, AccountError> {
        // No stored password is longer: refuse before any hashing, so a huge password costs nothing.
        if password.len() > 4 * super::password::MAX_CHARS {
            return Err(AccountError::BadCredentials);
        }
        let row: Option<(String, String, i64, String)> = sqlx::query_as(
            "SELECT id, username, created_at, password_hash FROM users WHERE username = $1",
        )
        .bind(username)
        .fetch_optional(&self.pool)
        .await?;
        let (user, stored) = match row {
            Some((id, name, created_at, hash)) => {
                (Some(user_from_row((id, name, created_at))), Some(hash))
            }
            None => (None, None),
        };
        let secret = password.to_owned();
        let matches =
            self.blocking_hash(move || Ok(password::verify(&secret, stored.as_deref()))).await?;
        match user {
            Some(user) if matches => Ok(user),
            _ => Err(AccountError::BadCredentials),
        }
    }
}
