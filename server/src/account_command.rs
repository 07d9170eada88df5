//! `kiln user …`, `kiln workspace …`, `kiln key …`: managing the cloud runtime's accounts from the command
//! line, on the `kiln.sqlite` under `--data-dir` (the server may be running: the database is shared).
//!
//! The invariant: a password never comes from the command line (it would sit in the shell history and in
//! `ps`). It is read as one line from standard input; when that is a terminal, Kiln asks for it on standard
//! error and the typed characters **are shown** (no terminal control is used). Pipe it in to avoid that:
//! `printf '%s\n' "$PASSWORD" | kiln user add alice`.
//!
//! An API key's secret is printed once, alone on standard output (so `KEY=$(kiln key add …)` works), with a
//! note on standard error that it cannot be shown again.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use kiln_server::{AccountError, Accounts, ApiKeyId, Database, Role};

/// The account subcommands (flattened into `kiln`'s own, so they are `kiln user`, `kiln workspace` and
/// `kiln key`).
#[derive(Debug, Subcommand)]
pub(crate) enum AccountCommand {
    /// Cloud runtime users.
    User(UserArgs),
    /// Cloud runtime workspaces and who belongs to them.
    Workspace(WorkspaceArgs),
    /// API keys (for scripts; each acts as its user in one workspace).
    Key(KeyArgs),
}

/// Where the accounts are.
#[derive(Debug, Args)]
pub(crate) struct DataDir {
    /// Where Kiln keeps its state (the accounts are in DATA_DIR/kiln.sqlite unless --database-url says otherwise).
    #[arg(long, global = true, default_value = "kiln-data")]
    data_dir: PathBuf,
    /// The Postgres database the server keeps its accounts in (as `kiln --database-url`).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "KILN_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Option<String>,
}

/// `kiln user`.
#[derive(Debug, Args)]
pub(crate) struct UserArgs {
    #[command(flatten)]
    store: DataDir,
    #[command(subcommand)]
    command: UserCommand,
}

/// The `user` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum UserCommand {
    /// Adds a user; the password (8 characters or more) is read from standard input.
    Add {
        /// The username: 1 to 64 characters of A-Z a-z 0-9 _ . @ - (case matters).
        name: String,
        /// The workspace the user joins.
        #[arg(long, default_value = "default")]
        workspace: String,
        /// The user's role there (owner or member).
        #[arg(long, default_value = "member")]
        role: Role,
    },
    /// Sets a user's password (read from standard input) and logs the user out of every browser.
    Passwd {
        /// The username.
        name: String,
    },
    /// Lists the users and their workspaces.
    List,
}

/// `kiln workspace`.
#[derive(Debug, Args)]
pub(crate) struct WorkspaceArgs {
    #[command(flatten)]
    store: DataDir,
    #[command(subcommand)]
    command: WorkspaceCommand,
}

/// The `workspace` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum WorkspaceCommand {
    /// Adds a workspace with no members.
    Add {
        /// The name: 1 to 64 characters of A-Z a-z 0-9 _ . @ -.
        name: String,
    },
    /// Makes a user a member of a workspace, or changes the user's role there.
    Grant {
        /// The workspace.
        workspace: String,
        /// The username.
        user: String,
        /// The role (owner or member).
        #[arg(long, default_value = "member")]
        role: Role,
    },
    /// Removes a user from a workspace (its browser sessions there end, its API keys there stop working).
    Revoke {
        /// The workspace.
        workspace: String,
        /// The username.
        user: String,
    },
    /// Lists the workspaces and their members.
    List,
}

/// `kiln key`.
#[derive(Debug, Args)]
pub(crate) struct KeyArgs {
    #[command(flatten)]
    store: DataDir,
    #[command(subcommand)]
    command: KeyCommand,
}

/// The `key` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Makes an API key and prints its secret (shown only this once).
    Add {
        /// The user the key acts as.
        user: String,
        /// The workspace it acts in (the user must be a member).
        #[arg(long)]
        workspace: String,
        /// A name to recognise it by.
        #[arg(long)]
        name: String,
    },
    /// Lists a user's API keys (never their secrets).
    List {
        /// The username.
        user: String,
    },
    /// Revokes one of a user's API keys.
    Revoke {
        /// The username.
        user: String,
        /// The key's id (from `kiln key list`).
        key_id: String,
    },
}

/// Runs an account subcommand.
pub(crate) async fn run(command: AccountCommand) -> anyhow::Result<()> {
    let store = match &command {
        AccountCommand::User(args) => &args.store,
        AccountCommand::Workspace(args) => &args.store,
        AccountCommand::Key(args) => &args.store,
    };
    let accounts = open(store).await?;
    match command {
        AccountCommand::User(args) => user(&accounts, args.command).await,
        AccountCommand::Workspace(args) => workspace(&accounts, args.command).await,
        AccountCommand::Key(args) => key(&accounts, args.command).await,
    }
}

/// Opens the accounts in the database (under `data_dir` unless a URL is given), creating the directory if
/// needed.
async fn open(store: &DataDir) -> anyhow::Result<Accounts> {
    let data_dir = &store.data_dir;
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let database = match &store.database_url {
        Some(url) => Database::from_url(url).map_err(anyhow::Error::msg)?,
        None => Database::Embedded,
    };
    let place = match &database {
        Database::Embedded => data_dir.join("kiln.sqlite").display().to_string(),
        Database::Postgres(url) => kiln_server::hide_password(url),
    };
    Accounts::open(data_dir, &database)
        .await
        .with_context(|| format!("cannot open the accounts in {place}"))
}

async fn user(accounts: &Accounts, command: UserCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        UserCommand::Add { name, workspace, role } => {
            // Checked before asking for the password, so a typo does not cost one.
            match accounts.user(&name).await {
                Err(AccountError::NotFound(_)) => {}
                Ok(_) => bail!("the user `{name}` already exists"),
                Err(error) => return Err(error.into()),
            }
            let workspace = accounts.workspace(&workspace).await?;
            let password = read_password(&format!("Password for {name}"))?;
            let user = accounts.add_user(&name, &password).await?;
            accounts.grant(&workspace.name, &user.username, role).await?;
            writeln!(
                out,
                "added user {} ({role} of {}), id {}",
                user.username, workspace.name, user.id
            )?;
        }
        UserCommand::Passwd { name } => {
            accounts.user(&name).await?;
            let password = read_password(&format!("New password for {name}"))?;
            accounts.set_password(&name, &password).await?;
            writeln!(
                out,
                "changed the password of {name}, ended their browser sessions and revoked their OAuth grants"
            )?;
        }
        UserCommand::List => {
            let mut rows = Vec::new();
            for user in accounts.list_users().await? {
                let workspaces: Vec<String> = accounts
                    .memberships(&user.id)
                    .await?
                    .into_iter()
                    .map(|m| format!("{} ({})", m.workspace.name, m.role))
                    .collect();
                rows.push(vec![
                    user.username,
                    user.id.to_string(),
                    date(user.created_at),
                    workspaces.join(", "),
                ]);
            }
            write_table(&mut out, &["USER", "ID", "ADDED", "WORKSPACES"], &rows)?;
        }
    }
    Ok(())
}

async fn workspace(accounts: &Accounts, command: WorkspaceCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        WorkspaceCommand::Add { name } => {
            let workspace = accounts.add_workspace(&name).await?;
            writeln!(out, "added workspace {}, id {}", workspace.name, workspace.id)?;
        }
        WorkspaceCommand::Grant { workspace, user, role } => {
            accounts.grant(&workspace, &user, role).await?;
            writeln!(out, "{user} is now {role} of {workspace}")?;
        }
        WorkspaceCommand::Revoke { workspace, user } => {
            accounts.revoke(&workspace, &user).await?;
            writeln!(out, "{user} is no longer a member of {workspace}")?;
        }
        WorkspaceCommand::List => {
            let rows: Vec<Vec<String>> = accounts
                .list_workspaces()
                .await?
                .into_iter()
                .map(|w| {
                    let members: Vec<String> = w
                        .members
                        .iter()
                        .map(|m| format!("{} ({})", m.user.username, m.role))
                        .collect();
                    vec![w.workspace.name, w.workspace.id.to_string(), members.join(", ")]
                })
                .collect();
            write_table(&mut out, &["WORKSPACE", "ID", "MEMBERS"], &rows)?;
        }
    }
    Ok(())
}

async fn key(accounts: &Accounts, command: KeyCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match command {
        KeyCommand::Add { user, workspace, name } => {
            let user = accounts.user(&user).await?;
            let workspace = accounts.workspace(&workspace).await?;
            let (secret, info) = accounts
                .create_api_key(&user.id, &workspace.id, &name)
                .await
                .map_err(|error| match error {
                    AccountError::NotMember { .. } => anyhow::anyhow!(
                        "{} is not a member of {}: `kiln workspace grant {} {}` first",
                        user.username,
                        workspace.name,
                        workspace.name,
                        user.username
                    ),
                    other => other.into(),
                })?;
            writeln!(out, "{secret}")?;
            eprintln!(
                "API key {} ({name}) for {} in {}: the secret above is shown only once; Kiln keeps only \
                 its hash",
                info.id, user.username, workspace.name
            );
        }
        KeyCommand::List { user } => {
            let user = accounts.user(&user).await?;
            let names: std::collections::BTreeMap<String, String> = accounts
                .list_workspaces()
                .await?
                .into_iter()
                .map(|w| (w.workspace.id.to_string(), w.workspace.name))
                .collect();
            let rows: Vec<Vec<String>> = accounts
                .list_api_keys(&user.id)
                .await?
                .into_iter()
                .map(|k| {
                    let workspace = k.workspace_id.to_string();
                    vec![
                        k.id.to_string(),
                        k.name,
                        names.get(&workspace).cloned().unwrap_or(workspace),
                        format!("…{}", k.hint),
                        date(k.created_at),
                        k.last_used_at.map_or_else(|| "never".to_owned(), date),
                        if k.revoked { "revoked" } else { "active" }.to_owned(),
                    ]
                })
                .collect();
            let headers = ["ID", "NAME", "WORKSPACE", "ENDS IN", "CREATED", "LAST USED", "STATUS"];
            write_table(&mut out, &headers, &rows)?;
        }
        KeyCommand::Revoke { user, key_id } => {
            let user = accounts.user(&user).await?;
            if !accounts.revoke_api_key(&user.id, &ApiKeyId::from(key_id.as_str())).await? {
                bail!("{} has no API key {key_id}", user.username);
            }
            writeln!(out, "revoked API key {key_id} of {}", user.username)?;
        }
    }
    Ok(())
}

/// Reads a password: one line of standard input, without its line ending. On a terminal, asks on standard
/// error first (the typed characters are shown).
fn read_password(prompt: &str) -> anyhow::Result<String> {
    let stdin = std::io::stdin();
    if stdin.is_terminal() {
        eprint!("{prompt} (shown as you type): ");
        std::io::stderr().flush()?;
    }
    let mut line = String::new();
    if stdin.lock().read_line(&mut line).context("cannot read the password")? == 0 {
        bail!("no password on standard input (Kiln never takes one from the command line)");
    }
    let password = line.strip_suffix('\n').unwrap_or(&line);
    Ok(password.strip_suffix('\r').unwrap_or(password).to_owned())
}

/// A unix time as a UTC date and time to the minute.
fn date(unix_seconds: i64) -> String {
    chrono::DateTime::from_timestamp(unix_seconds, 0)
        .map_or_else(|| unix_seconds.to_string(), |t| t.format("%Y-%m-%d %H:%M UTC").to_string())
}

/// Writes rows under headers, each column padded to its widest cell (the last column is not padded).
fn write_table(
    out: &mut impl std::io::Write,
    headers: &[&str],
    rows: &[Vec<String>],
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if i + 1 < row.len() {
                line.push_str(&format!("{cell:<width$}  "));
            } else {
                line.push_str(cell);
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    use super::*;

    /// `kiln`'s shape: its own `--data-dir`, subcommands that conflict with its arguments, the account
    /// commands flattened in.
    #[derive(Debug, Parser)]
    #[command(args_conflicts_with_subcommands = true)]
    struct Kiln {
        #[command(subcommand)]
        command: Option<Top>,
        #[arg(long, default_value = "kiln-data")]
        data_dir: PathBuf,
    }

    #[derive(Debug, Subcommand)]
    enum Top {
        #[command(flatten)]
        Account(AccountCommand),
    }

    fn parse(args: &[&str]) -> AccountCommand {
        let parsed = Kiln::try_parse_from(std::iter::once("kiln").chain(args.iter().copied()));
        match parsed.map(|k| k.command) {
            Ok(Some(Top::Account(command))) => command,
            other => panic!("{args:?}: {other:?}"),
        }
    }

    #[test]
    fn the_commands_parse_with_their_own_data_dir() {
        Kiln::command().debug_assert();
        let AccountCommand::User(args) =
            parse(&["user", "add", "alice", "--data-dir", "/srv/kiln"])
        else {
            panic!("not a user command");
        };
        assert_eq!(args.store.data_dir, std::path::Path::new("/srv/kiln"));
        assert!(matches!(
            args.command,
            UserCommand::Add { ref name, ref workspace, role: Role::Member }
                if name == "alice" && workspace == "default"
        ));
        let AccountCommand::Workspace(args) =
            parse(&["workspace", "grant", "team", "bob", "--role", "owner"])
        else {
            panic!("not a workspace command");
        };
        assert_eq!(args.store.data_dir, std::path::Path::new("kiln-data"));
        assert!(matches!(args.command, WorkspaceCommand::Grant { role: Role::Owner, .. }));
        assert!(matches!(
            parse(&["key", "add", "bob", "--workspace", "team", "--name", "ci"]),
            AccountCommand::Key(KeyArgs { command: KeyCommand::Add { .. }, .. })
        ));
        assert!(Kiln::try_parse_from(["kiln", "user", "add", "bob", "--role", "admin"]).is_err());
        assert!(Kiln::try_parse_from(["kiln", "user", "add", "bob", "--password", "x"]).is_err());
    }

    #[test]
    fn tables_are_aligned() {
        let mut out = Vec::new();
        let rows =
            vec![vec!["alice".to_owned(), "x".to_owned()], vec!["b".to_owned(), "yy".to_owned()]];
        write_table(&mut out, &["USER", "ID"], &rows).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "USER   ID\nalice  x\nb      yy\n");
    }
}
