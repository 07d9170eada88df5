//! Workspaces and memberships: who belongs to which workspace, as owner or member.
//!
//! The invariant: a user's role in a workspace is only ever read from `memberships`, at the moment it is
//! needed; nothing caches it. Removing a membership also ends the user's browser sessions in that workspace.

use super::{
    AccountError, Accounts, Member, Membership, Role, UserId, WorkspaceId, WorkspaceMembers,
    WorkspaceRecord, check_name, is_unique_violation, new_id, now, users::user_from_row,
};

/// The columns of a workspace, as selected (`id, name, created_at`).
type WorkspaceRow = (String, String, i64);

/// A workspace with one of its members (all `None` for a workspace without members), as selected.
type WorkspaceMemberRow =
    (String, String, i64, Option<String>, Option<String>, Option<i64>, Option<String>);

/// Builds a [`Workspace`] from its selected columns.
fn workspace_from_row((id, name, created_at): WorkspaceRow) -> WorkspaceRecord {
    WorkspaceRecord { id: WorkspaceId(id), name, created_at }
}

impl Accounts {
    /// Adds a workspace with no members. A taken name is [`AccountError::Exists`].
    pub async fn add_workspace(&self, name: &str) -> Result<WorkspaceRecord, AccountError> {
        check_name("workspace", name)?;
        let workspace =
            WorkspaceRecord { id: WorkspaceId(new_id()), name: name.to_owned(), created_at: now() };
        let inserted =
            sqlx::query("INSERT INTO workspaces (id, name, created_at) VALUES ($1, $2, $3)")
                .bind(workspace.id.as_str())
                .bind(&workspace.name)
                .bind(workspace.created_at)
                .execute(&self.pool)
                .await;
        match inserted {
            Ok(_) => Ok(workspace),
            Err(e) if is_unique_violation(&e) => {
                Err(AccountError::Exists(format!("the workspace `{name}`")))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The workspace with this name ([`AccountError::NotFound`] if none).
    pub async fn workspace(&self, name: &str) -> Result<WorkspaceRecord, AccountError> {
        let row: Option<WorkspaceRow> =
            sqlx::query_as("SELECT id, name, created_at FROM workspaces WHERE name = $1")
                .bind(name)
                .fetch_optional(&self.pool)
                .await?;
        row.map(workspace_from_row)
            .ok_or_else(|| AccountError::NotFound(format!("the workspace `{name}`")))
    }

    /// Makes the user a member of the workspace with this role, or changes the role of a member.
    pub async fn grant(
        &self,
        workspace_name: &str,
        username: &str,
        role: Role,
    ) -> Result<(), AccountError> {
        let workspace = self.workspace(workspace_name).await?;
        let user = self.user(username).await?;
        sqlx::query(
            "INSERT INTO memberships (workspace_id, user_id, role) VALUES ($1, $2, $3) \
             ON CONFLICT (workspace_id, user_id) DO UPDATE SET role = excluded.role",
        )
        .bind(workspace.id.as_str())
        .bind(user.id.as_str())
        .bind(role.as_str())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Removes the user from the workspace and ends the user's browser sessions there. The user's API keys
    /// for the workspace stop working (they are refused while the user is not a member).
    pub async fn revoke(&self, workspace_name: &str, username: &str) -> Result<(), AccountError> {
        let workspace = self.workspace(workspace_name).await?;
        let user = self.user(username).await?;
        let mut transaction = self.pool.begin().await?;
        let removed =
            sqlx::query("DELETE FROM memberships WHERE workspace_id = $1 AND user_id = $2")
                .bind(workspace.id.as_str())
                .bind(user.id.as_str())
                .execute(&mut *transaction)
                .await?;
        if removed.rows_affected() == 0 {
            return Err(AccountError::NotMember {
                user: username.to_owned(),
                workspace: workspace_name.to_owned(),
            });
        }
        sqlx::query("DELETE FROM web_sessions WHERE workspace_id = $1 AND user_id = $2")
            .bind(workspace.id.as_str())
            .bind(user.id.as_str())
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        Ok(())
    }

    /// Every workspace with its members, by name.
    pub async fn list_workspaces(&self) -> Result<Vec<WorkspaceMembers>, AccountError> {
        let rows: Vec<WorkspaceMemberRow> = sqlx::query_as(
            "SELECT w.id, w.name, w.created_at, u.id, u.username, u.created_at, m.role \
                 FROM workspaces w \
                 LEFT JOIN memberships m ON m.workspace_id = w.id \
                 LEFT JOIN users u ON u.id = m.user_id \
                 ORDER BY w.name, u.username",
        )
        .fetch_all(&self.pool)
        .await?;
        let mut list: Vec<WorkspaceMembers> = Vec::new();
        for (id, name, created_at, user_id, username, user_created_at, role) in rows {
            if list.last().is_none_or(|last| last.workspace.id.as_str() != id) {
                let workspace = workspace_from_row((id, name, created_at));
                list.push(WorkspaceMembers { workspace, members: Vec::new() });
            }
            if let (Some(user_id), Some(username), Some(user_created_at), Some(role), Some(last)) =
                (user_id, username, user_created_at, role, list.last_mut())
            {
                let user = user_from_row((user_id, username, user_created_at));
                last.members.push(Member { user, role: role.parse()? });
            }
        }
        Ok(list)
    }

    /// The workspaces the user belongs to, with the role in each, by workspace name.
    pub async fn memberships(&self, user_id: &UserId) -> Result<Vec<Membership>, AccountError> {
        let rows: Vec<(String, String, i64, String)> = sqlx::query_as(
            "SELECT w.id, w.name, w.created_at, m.role \
             FROM memberships m JOIN workspaces w ON w.id = m.workspace_id \
             WHERE m.user_id = $1 ORDER BY w.name",
        )
        .bind(user_id.as_str())
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|(id, name, created_at, role)| {
                Ok(Membership {
                    workspace: workspace_from_row((id, name, created_at)),
                    role: role.parse()?,
                })
            })
            .collect()
    }

    /// The user's role in the workspace, if a member.
    pub async fn role(
        &self,
        user_id: &UserId,
        workspace_id: &WorkspaceId,
    ) -> Result<Option<Role>, AccountError> {
        let role: Option<String> = sqlx::query_scalar(
            "SELECT role FROM memberships WHERE user_id = $1 AND workspace_id = $2",
        )
        .bind(user_id.as_str())
        .bind(workspace_id.as_str())
        .fetch_optional(&self.pool)
        .await?;
        role.map(|role| role.parse()).transpose()
    }
}
