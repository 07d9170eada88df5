//! Accounts for the cloud runtime: users, workspaces and memberships, browser sessions and API keys, in the
//! same database as the queue: `kiln.sqlite` (tables from `migrations/sqlite/0004_accounts.sql`) or the
//! Postgres database of `--database-url` (`migrations/postgres/0002_accounts_and_oauth.sql`). The SQL is the
//! same for both (`$N` parameters), run through sqlx's `Any` driver.
//!
//! The invariant a reader must not break: **no secret is stored or logged.** Passwords are kept as argon2id
//! hashes (`password.rs`); session cookies and API keys are 32 random bytes, base64url, and only their SHA-256
//! is stored, so a lookup by hash is the comparison (`secret.rs`). The CSRF token of a session is derived from
//! the session secret, not stored.
//!
//! Who may act in a workspace is decided live on every lookup: a session or an API key whose user is no longer
//! a member of its workspace is refused, with the role read from `memberships` at that moment.
//!
//! Names: usernames and workspace names are 1 to 64 characters of `A-Z a-z 0-9 _ . @ -`, compared exactly as
//! given (`Alice` and `alice` are two users). The workspace `default` (id `default`) exists from the migration
//! on: the queue and history of the local runtime belong to it.
//!
//! [`Accounts`] has its own small pool on the database (on SQLite: the file in WAL mode, sqlx's 5 s busy timeout
//! and foreign keys, so it shares the file with the queue's writer) and writes with single statements or short
//! transactions that start with a write.
//! Password hashing is CPU-bound, so it runs on blocking threads behind a semaphore.
//!
//! Times are unix seconds. Each time-dependent operation has a `pub(crate)` `…_at(…, now)` twin that the
//! tests drive with their own clock.

use std::path::Path;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::AnyPool;
use tokio::sync::Semaphore;

use crate::config::Database;

mod api_keys;
mod password;
mod secret;
mod sessions;
mod users;
mod workspaces;

#[cfg(test)]
mod tests;

pub use api_keys::API_KEY_PREFIX;
pub use secret::{csrf_matches, csrf_token};
pub(crate) use secret::{hash as secret_hash, new_secret};

/// How long a session lives without being used (it slides: each use, at most once a minute, extends it).
pub const SESSION_IDLE_SECONDS: i64 = 12 * 60 * 60;

/// How long a session lives at most, however often it is used.
pub const SESSION_ABSOLUTE_SECONDS: i64 = 7 * 24 * 60 * 60;

/// How often at most a session's `last_seen_at` or a key's `last_used_at` is written (not once per request).
const TOUCH_EVERY_SECONDS: i64 = 60;

/// Why an account operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AccountError {
    /// The user or workspace already exists (`what` names it, e.g. "the user `alice`").
    #[error("{0} already exists")]
    Exists(String),
    /// No such user, workspace or membership (`what` names it).
    #[error("{0} does not exist")]
    NotFound(String),
    /// The user is not a member of the workspace.
    #[error("the user `{user}` is not a member of the workspace `{workspace}`")]
    NotMember {
        /// The user (name or id).
        user: String,
        /// The workspace (name or id).
        workspace: String,
    },
    /// The password is too short (or absurdly long).
    #[error("a password must have {} to {} characters", password::MIN_CHARS, password::MAX_CHARS)]
    WeakPassword,
    /// The username is unknown or the password is wrong (deliberately not saying which).
    #[error("wrong username or password")]
    BadCredentials,
    /// A user, workspace or API key name breaks the naming rule.
    #[error("`{name}` is not a valid {what} name: {rule}")]
    InvalidName {
        /// What was being named ("user", "workspace", "API key").
        what: &'static str,
        /// The name given.
        name: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// A role other than `owner` or `member`.
    #[error("`{0}` is not a role (owner or member)")]
    UnknownRole(String),
    /// The database failed.
    #[error("the accounts database failed")]
    Database(#[from] sqlx::Error),
    /// The schema could not be brought up to date.
    #[error("the database schema could not be brought up to date")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The operating system's random number generator failed.
    #[error("the system's random number generator failed")]
    Random(#[source] getrandom::Error),
    /// Hashing a password failed (never a wrong password: that is [`AccountError::BadCredentials`]).
    #[error("hashing the password failed")]
    PasswordHash(#[source] argon2::password_hash::Error),
    /// The blocking task hashing a password did not finish.
    #[error("the password hashing task stopped")]
    Task(#[source] tokio::task::JoinError),
}

/// A user's id (a uuid; never the username).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserId(String);

/// A workspace's id (a uuid, or `default`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkspaceId(String);

/// An API key's id (a uuid; shown in listings, not a secret).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ApiKeyId(String);

macro_rules! id_type {
    ($($name:ident),*) => {$(
        impl $name {
            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> $name {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> $name {
                $name(id.to_owned())
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    )*};
}

id_type!(UserId, WorkspaceId, ApiKeyId);

impl WorkspaceId {
    /// The workspace every installation has (id and name `default`).
    pub fn default_workspace() -> WorkspaceId {
        WorkspaceId("default".to_owned())
    }
}

/// A user (never with the password hash).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The id.
    pub id: UserId,
    /// The login name.
    pub username: String,
    /// When the user was added (unix seconds).
    pub created_at: i64,
}

/// A workspace's account record (its id and name): the unit that owns prompts, history and files in the cloud
/// runtime. What a running server opens for it is `workspace::Workspace`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRecord {
    /// The id.
    pub id: WorkspaceId,
    /// The unique name.
    pub name: String,
    /// When it was added (unix seconds; 0 for `default`).
    pub created_at: i64,
}

/// What a member may do in a workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Manages the workspace and its members.
    Owner,
    /// Uses the workspace.
    Member,
}

impl Role {
    /// The stored and displayed name (`owner`, `member`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Owner => "owner",
            Role::Member => "member",
        }
    }
}

impl std::str::FromStr for Role {
    type Err = AccountError;

    fn from_str(text: &str) -> Result<Role, AccountError> {
        match text {
            "owner" => Ok(Role::Owner),
            "member" => Ok(Role::Member),
            other => Err(AccountError::UnknownRole(other.to_owned())),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A workspace a user belongs to, with the user's role there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The workspace.
    pub workspace: WorkspaceRecord,
    /// The user's role in it.
    pub role: Role,
}

/// A member of a workspace, with the role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The user.
    pub user: User,
    /// The role.
    pub role: Role,
}

/// A workspace with its members (for listings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceMembers {
    /// The workspace.
    pub workspace: WorkspaceRecord,
    /// Its members, by username.
    pub members: Vec<Member>,
}

/// A live browser session (what a valid session cookie stands for). Its `Debug` leaves the CSRF token out.
#[derive(Clone, PartialEq, Eq)]
pub struct Session {
    /// Who is logged in.
    pub user: User,
    /// The workspace the session acts in.
    pub workspace_id: WorkspaceId,
    /// The user's role there, read at this lookup.
    pub role: Role,
    /// When the session ends unless used before (unix seconds).
    pub expires_at: i64,
    /// When the session ends however often it is used (unix seconds).
    pub absolute_expires_at: i64,
    /// The token the client must echo in `X-CSRF-Token` on writes (see [`csrf_token`]).
    pub csrf_token: String,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("user", &self.user)
            .field("workspace_id", &self.workspace_id)
            .field("role", &self.role)
            .field("expires_at", &self.expires_at)
            .field("absolute_expires_at", &self.absolute_expires_at)
            .finish_non_exhaustive()
    }
}

/// An API key as listed: never its secret or hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyInfo {
    /// The id (to revoke it by).
    pub id: ApiKeyId,
    /// The name its owner gave it.
    pub name: String,
    /// The workspace it acts in.
    pub workspace_id: WorkspaceId,
    /// The last 4 characters of the secret, to tell keys apart.
    pub hint: String,
    /// When it was made (unix seconds).
    pub created_at: i64,
    /// When it was last used (unix seconds, to the minute), if ever.
    pub last_used_at: Option<i64>,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// Who a valid API key acts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyPrincipal {
    /// The key.
    pub key_id: ApiKeyId,
    /// Its owner.
    pub user: User,
    /// The workspace it acts in.
    pub workspace_id: WorkspaceId,
    /// The owner's role there, read at this lookup.
    pub role: Role,
}

/// The accounts store.
#[derive(Clone)]
pub struct Accounts {
    pool: AnyPool,
    /// Bounds the password hashes computed at once (each takes ~19 MiB and a core for tens of milliseconds).
    hashing: Arc<Semaphore>,
}

impl std::fmt::Debug for Accounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounts").finish_non_exhaustive()
    }
}

impl Accounts {
    /// Opens the accounts in `database` (`kiln.sqlite` in `data_dir` is created if needed) and brings the schema
    /// up to date (the same migrations `Storage::open` runs; running them again is a no-op, but two openings
    /// must not migrate a new database at the same moment: open this after `Storage::open` has returned, not
    /// alongside it).
    pub async fn open(data_dir: &Path, database: &Database) -> Result<Accounts, AccountError> {
        let pool = crate::storage::shared_pool(data_dir, database, 4).await?;
        let at_once = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
        let accounts = Accounts { pool, hashing: Arc::new(Semaphore::new(at_once)) };
        // The stand-in hash for unknown users, made now so the first failed login costs what the others do.
        accounts.blocking_hash(|| Ok(password::dummy_hash().len())).await?;
        Ok(accounts)
    }

    /// The pool on the database file, for the stores that keep their tables beside the accounts (the OAuth
    /// server's clients, grants and refresh tokens).
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Runs password hashing on a blocking thread, a few at a time.
    async fn blocking_hash<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> Result<T, AccountError> + Send + 'static,
    ) -> Result<T, AccountError> {
        // The semaphore is never closed, so acquiring only fails if it were; then hash without a permit.
        let _permit = self.hashing.acquire().await.ok();
        tokio::task::spawn_blocking(work).await.map_err(AccountError::Task)?
    }
}

/// Checks a user or workspace name: 1 to 64 characters of `A-Z a-z 0-9 _ . @ -`.
fn check_name(what: &'static str, name: &str) -> Result<(), AccountError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-');
    if (1..=64).contains(&name.len()) && name.chars().all(allowed) {
        Ok(())
    } else {
        Err(AccountError::InvalidName {
            what,
            name: name.to_owned(),
            rule: "1 to 64 characters of A-Z a-z 0-9 _ . @ -",
        })
    }
}

/// Whether a database error is a uniqueness violation (a name already taken).
fn is_unique_violation(error: &sqlx::Error) -> bool {
    matches!(error, sqlx::Error::Database(e) if e.is_unique_violation())
}

/// A new uuid (v4) as text, for ids.
fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// The current time in unix seconds.
pub(crate) fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}
