//! Workspaces and callers: what one request, prompt or socket may see.
//!
//! Every request carries a [`Caller`] (put into its extensions by the authentication layer): the workspace it
//! acts in, the user, and the user's role there. The local runtime has one workspace, [`DEFAULT_WORKSPACE`],
//! whose files are the configured `--input-directory`, `--output-directory`, `--temp-directory` and
//! `--user-directory`. In the cloud runtime each workspace has its own file roots under
//! `DATA_DIR/workspaces/<id>/` and each user their own user directory under `DATA_DIR/users/<id>/`, and each
//! workspace its own node registry (`LoadImage` lists and reads that workspace's input directory).
//!
//! Invariant: everything a handler or the worker reads or writes for a prompt, a file, a setting or an event is
//! chosen through the caller's workspace (or the prompt's, stored with it); nothing is looked up in another.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use kiln_engine::exec::Scope;
use kiln_engine::models::ModelEnv;
use kiln_engine::nodes::{Registry, builtin_registry};
use kiln_engine::roots::{Roots, SharedFiles};

use crate::store::{Store, WorkspaceFiles};

/// The workspace of the local runtime, and of queue and history rows stored before workspaces existed.
pub(crate) const DEFAULT_WORKSPACE: &str = "default";

/// The workspace a request without a caller acts in, on the cloud runtime: it is no real workspace (ids are
/// `default` or UUIDs), so it sees nothing. The authentication layer lets no such request through; this is the
/// second line.
const NOBODY: &str = "-nobody";

/// The user of the local runtime (ComfyUI's single-user mode keeps its files under `<user dir>/default`).
pub(crate) const LOCAL_USER: &str = "default";

/// One workspace: its id and its scope (registry, file roots, cache partition).
pub(crate) struct Workspace {
    /// The workspace id.
    pub(crate) id: Arc<str>,
    /// What its prompts run in.
    pub(crate) scope: Scope,
    /// Its files in the object store (`--store`), if there is one.
    pub(crate) stored: Option<Arc<WorkspaceFiles>>,
}

impl Workspace {
    /// The input, output and temp directories.
    pub(crate) fn roots(&self) -> &Roots {
        &self.scope.roots
    }

    /// The node classes as this workspace sees them.
    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.scope.registry
    }
}

pub(crate) use crate::accounts::Role;

/// Who is asking: the workspace a request acts in, the user, and the role.
#[derive(Clone)]
pub(crate) struct Caller {
    /// The workspace.
    pub(crate) workspace: Arc<Workspace>,
    /// The user's id (the local runtime's is [`LOCAL_USER`]).
    pub(crate) user: Arc<str>,
    /// The user's role in the workspace.
    pub(crate) role: Role,
    /// The user's own directory (settings and user data).
    pub(crate) user_dir: PathBuf,
}

impl Caller {
    /// The workspace id.
    pub(crate) fn workspace_id(&self) -> &str {
        &self.workspace.id
    }
}

/// Where workspaces keep their files.
enum Layout {
    /// The local runtime: one workspace over the configured directories.
    Local { user_dir: PathBuf },
    /// The cloud runtime: `<data dir>/workspaces/<id>/{input,output,temp}`, `<data dir>/users/<id>/`.
    Cloud { data_dir: PathBuf },
}

/// Every workspace the server has opened, created on first use.
pub(crate) struct Workspaces {
    layout: Layout,
    models: ModelEnv,
    store: Option<Arc<Store>>,
    open: Mutex<HashMap<String, Arc<Workspace>>>,
}

impl Workspaces {
    /// The local runtime's single workspace over `roots` (the registry's `LoadImage` reads `roots.input`),
    /// its files kept in `store` too when there is one.
    pub(crate) fn local(
        roots: Roots,
        user_dir: PathBuf,
        models: ModelEnv,
        store: Option<Arc<Store>>,
    ) -> Workspaces {
        let workspaces = Workspaces {
            layout: Layout::Local { user_dir },
            models,
            store,
            open: Mutex::new(HashMap::new()),
        };
        let default = workspaces.build(DEFAULT_WORKSPACE, roots);
        workspaces.lock().insert(DEFAULT_WORKSPACE.to_owned(), default);
        workspaces
    }

    /// The cloud runtime's workspaces, under `data_dir`, their files kept in `store` too when there is one.
    pub(crate) fn cloud(
        data_dir: PathBuf,
        models: ModelEnv,
        store: Option<Arc<Store>>,
    ) -> Workspaces {
        Workspaces {
            layout: Layout::Cloud { data_dir },
            models,
            store,
            open: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Workspace>>> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn build(&self, id: &str, roots: Roots) -> Arc<Workspace> {
        let registry = Arc::new(builtin_registry(&roots, self.models.clone()));
        let id: Arc<str> = id.into();
        let stored = self
            .store
            .as_ref()
            .map(|store| Arc::new(WorkspaceFiles::new(store.clone(), id.clone(), roots.clone())));
        let shared = stored.clone().map(|files| files as Arc<dyn SharedFiles>);
        Arc::new(Workspace {
            scope: Scope { registry, roots, partition: id.to_string(), shared },
            id,
            stored,
        })
    }

    /// The workspace `id`, its directories created on first use. The local runtime has only
    /// [`DEFAULT_WORKSPACE`]: any other id (a row of a cloud database opened locally) maps to it.
    pub(crate) fn get(&self, id: &str) -> std::io::Result<Arc<Workspace>> {
        if let Some(open) = self.lock().get(id) {
            return Ok(open.clone());
        }
        let data_dir = match &self.layout {
            Layout::Local { .. } => {
                let default = self.lock().get(DEFAULT_WORKSPACE).cloned();
                return default.ok_or_else(|| std::io::Error::other("no default workspace"));
            }
            Layout::Cloud { data_dir } => data_dir,
        };
        let base = workspace_dir(data_dir, id)?;
        let roots = Roots {
            input: base.join("input"),
            output: base.join("output"),
            temp: base.join("temp"),
        };
        for dir in [&roots.input, &roots.output, &roots.temp] {
            std::fs::create_dir_all(dir)?;
        }
        let built = self.build(id, roots);
        Ok(self.lock().entry(id.to_owned()).or_insert(built).clone())
    }

    /// The local runtime's caller, for every request.
    pub(crate) fn local_caller(&self) -> std::io::Result<Caller> {
        let workspace = self.get(DEFAULT_WORKSPACE)?;
        Ok(Caller {
            workspace,
            user: LOCAL_USER.into(),
            role: Role::Owner,
            user_dir: self.user_dir(LOCAL_USER)?,
        })
    }

    /// The caller a request without one acts as: the local caller, or on the cloud runtime a caller that sees
    /// nothing.
    pub(crate) fn fallback_caller(&self) -> std::io::Result<Caller> {
        match &self.layout {
            Layout::Local { .. } => self.local_caller(),
            Layout::Cloud { .. } => self.caller(NOBODY, NOBODY, Role::Member),
        }
    }

    /// A cloud caller: `user` acting in `workspace` with `role`.
    pub(crate) fn caller(
        &self,
        workspace: &str,
        user: &str,
        role: Role,
    ) -> std::io::Result<Caller> {
        Ok(Caller {
            workspace: self.get(workspace)?,
            user: user.into(),
            role,
            user_dir: self.user_dir(user)?,
        })
    }

    /// A user's own directory (settings and user data). Only a path: the user data functions create what they
    /// write into, so a request costs no file system call here.
    fn user_dir(&self, user: &str) -> std::io::Result<PathBuf> {
        match &self.layout {
            Layout::Local { user_dir } => Ok(user_dir.clone()),
            Layout::Cloud { data_dir } => Ok(data_dir.join("users").join(safe_component(user)?)),
        }
    }
}

/// `<data dir>/workspaces/<id>`, for an id that is one plain path component.
fn workspace_dir(data_dir: &Path, id: &str) -> std::io::Result<PathBuf> {
    Ok(data_dir.join("workspaces").join(safe_component(id)?))
}

/// `name` if it can be a directory name of its own (ids are `default`, UUIDs or [`NOBODY`]).
fn safe_component(name: &str) -> std::io::Result<&str> {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        Ok(name)
    } else {
        Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("`{name}` is not an id")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models(root: &Path) -> ModelEnv {
        ModelEnv::cpu(root.to_path_buf())
    }

    #[test]
    fn cloud_workspaces_have_their_own_roots_and_users_their_own_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        let workspaces = Workspaces::cloud(dir.path().to_path_buf(), models(dir.path()), None);
        let a = workspaces.caller("a", "alice", Role::Member).expect("a");
        let b = workspaces.caller("b", "bob", Role::Owner).expect("b");
        assert_ne!(a.workspace.roots().input, b.workspace.roots().input);
        assert!(a.workspace.roots().output.is_dir());
        assert_ne!(a.user_dir, b.user_dir);
        assert_eq!(a.workspace.scope.partition, "a");
        // The same workspace is opened once.
        assert!(Arc::ptr_eq(&a.workspace, &workspaces.get("a").expect("a again")));
        assert!(workspaces.get("../x").is_err());
        assert!(workspaces.caller("a", "../../etc", Role::Member).is_err());
        let nobody = workspaces.fallback_caller().expect("nobody");
        assert_ne!(nobody.workspace.roots().input, a.workspace.roots().input);
    }

    #[test]
    fn the_local_runtime_has_one_workspace_over_the_configured_directories() {
        let dir = tempfile::tempdir().expect("temp dir");
        let roots = Roots {
            input: dir.path().join("in"),
            output: dir.path().join("out"),
            temp: dir.path().join("tmp"),
        };
        let workspaces =
            Workspaces::local(roots.clone(), dir.path().join("user"), models(dir.path()), None);
        let caller = workspaces.local_caller().expect("local");
        assert_eq!(caller.workspace_id(), DEFAULT_WORKSPACE);
        assert_eq!(caller.workspace.roots().input, roots.input);
        assert_eq!(caller.user_dir, dir.path().join("user"));
        assert!(Arc::ptr_eq(&caller.workspace, &workspaces.get("other").expect("mapped")));
    }
}
