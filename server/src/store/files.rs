//! One workspace's files in the store, beside its local roots: what uploads, prompts, listings and save nodes
//! do with them.

use std::path::Path as LocalPath;
use std::sync::Arc;

use kiln_engine::nodes::FileKind;
use kiln_engine::roots::{Roots, SharedFiles, within};

use super::{Store, StoreError, key, write_replacing};

/// What the store holds under a name, against an upload's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoredRead {
    /// No object.
    Absent,
    /// An object with these very bytes.
    Same,
    /// An object with other bytes.
    Different,
}

/// One workspace's files in the store.
#[derive(Debug)]
pub(crate) struct WorkspaceFiles {
    store: Arc<Store>,
    workspace: Arc<str>,
    roots: Roots,
}

impl WorkspaceFiles {
    /// The files of `workspace`, whose local roots are `roots`.
    pub(crate) fn new(store: Arc<Store>, workspace: Arc<str>, roots: Roots) -> WorkspaceFiles {
        WorkspaceFiles { store, workspace, roots }
    }

    /// Brings `relative` of `kind` into its local root when the store has it (and the local copy is not the
    /// store's current one): whether the store has it. A path leaving the root is left alone.
    pub(crate) fn bring(&self, kind: FileKind, relative: &str) -> Result<bool, StoreError> {
        let Some(local) = within(self.roots.get(kind), relative) else { return Ok(false) };
        self.store.bring(&key(&self.workspace, kind, relative), &local)
    }

    /// The size of `relative` of `kind` in the store, or `None` when the store does not hold it (or the path
    /// leaves the root).
    pub(crate) fn size(&self, kind: FileKind, relative: &str) -> Result<Option<u64>, StoreError> {
        if within(self.roots.get(kind), relative).is_none() {
            return Ok(None);
        }
        self.store.size(&key(&self.workspace, kind, relative))
    }

    /// Bytes `range` of `relative` of `kind` in the store.
    pub(crate) fn read(
        &self,
        kind: FileKind,
        relative: &str,
        range: std::ops::Range<u64>,
    ) -> Result<Vec<u8>, StoreError> {
        self.store.read(&key(&self.workspace, kind, relative), range)
    }

    /// Brings in every file `prompt` (API format) names: each string input that reads as a file name, in the
    /// folder a `[input]`, `[output]` or `[temp]` annotation names (input without one).
    pub(crate) fn bring_named(&self, prompt: &serde_json::Value) -> Result<(), StoreError> {
        let mut named: Vec<(FileKind, &str)> =
            crate::service::queued::string_inputs(prompt).filter_map(named_file).collect();
        named.sort_unstable_by_key(|(kind, name)| (kind.name(), *name));
        named.dedup();
        for (kind, name) in named {
            self.bring(kind, name)?;
        }
        Ok(())
    }

    /// Brings in the files directly in the `kind` folder (what its listings show).
    pub(crate) fn bring_folder(&self, kind: FileKind) -> Result<(), StoreError> {
        let folder = key(&self.workspace, kind, "");
        for listed in self.store.list(&folder)? {
            if let Some(local) = within(self.roots.get(kind), &listed.name) {
                self.store.bring_version(&listed.key, listed.version, &local)?;
            }
        }
        Ok(())
    }

    /// What the store holds as `relative` of `kind`, against `bytes`.
    pub(crate) fn compare(
        &self,
        kind: FileKind,
        relative: &str,
        bytes: &[u8],
    ) -> Result<StoredRead, StoreError> {
        if !self.bring(kind, relative)? {
            return Ok(StoredRead::Absent);
        }
        let local = self.roots.get(kind).join(relative);
        let same = std::fs::read(&local).is_ok_and(|existing| existing == bytes);
        Ok(if same { StoredRead::Same } else { StoredRead::Different })
    }

    /// Stores an upload as `relative` of `kind` (checked to stay in its root) and writes the local copy; with
    /// `create`, only if the name is free in the store (false when another node took it meanwhile).
    pub(crate) fn put(
        &self,
        kind: FileKind,
        relative: &str,
        bytes: &[u8],
        create: bool,
    ) -> Result<bool, StoreError> {
        let local = self.roots.get(kind).join(relative);
        let _one_at_a_time = self.store.lock(&local);
        let key = key(&self.workspace, kind, relative);
        let Some(version) = self.store.put(&key, bytes.to_vec(), create)? else { return Ok(false) };
        write_replacing(&local, bytes)?;
        self.store.record(&local, version);
        Ok(true)
    }

    fn folder_key(
        &self,
        kind: FileKind,
        subfolder: &str,
        filename: &str,
    ) -> object_store::path::Path {
        let relative = if subfolder.is_empty() {
            filename.to_owned()
        } else {
            format!("{subfolder}/{filename}")
        };
        key(&self.workspace, kind, &relative)
    }
}

impl SharedFiles for WorkspaceFiles {
    fn names(&self, kind: FileKind, subfolder: &str, prefix: &str) -> std::io::Result<Vec<String>> {
        let listed = self.store.list(&key(&self.workspace, kind, subfolder))?;
        Ok(listed
            .into_iter()
            .map(|listed| listed.name)
            .filter(|name| name.starts_with(prefix))
            .collect())
    }

    fn claim(&self, kind: FileKind, subfolder: &str, filename: &str) -> std::io::Result<bool> {
        let key = self.folder_key(kind, subfolder, filename);
        Ok(self.store.put(&key, Vec::new(), true)?.is_some())
    }

    fn publish(
        &self,
        kind: FileKind,
        subfolder: &str,
        filename: &str,
        path: &LocalPath,
    ) -> std::io::Result<()> {
        let bytes = std::fs::read(path)?;
        let key = self.folder_key(kind, subfolder, filename);
        if let Some(version) = self.store.put(&key, bytes, false)? {
            self.store.record(path, version);
        }
        Ok(())
    }

    fn release(&self, kind: FileKind, subfolder: &str, filename: &str) {
        self.store.delete(&self.folder_key(kind, subfolder, filename));
    }
}

/// Runs `work` (a store call) on the blocking pool and logs its failure as `what`: for a request that goes on
/// without what the store could not give (a listing shows the local files, validation names a missing file).
pub(crate) async fn logged(
    what: &'static str,
    work: impl FnOnce() -> Result<(), StoreError> + Send + 'static,
) {
    let done = tokio::task::spawn_blocking(work).await;
    if let Err(error) = done.map_err(|e| e.to_string()).and_then(|d| d.map_err(|e| e.to_string())) {
        tracing::warn!(%error, "{what}");
    }
}

/// The file a string input names, if it reads as one: a relative name with a short extension (not a model
/// file's), in the folder its annotation names.
fn named_file(value: &str) -> Option<(FileKind, &str)> {
    let (name, kind) = match value.rsplit_once(" [") {
        Some((name, "input]")) => (name, FileKind::Input),
        Some((name, "output]")) => (name, FileKind::Output),
        Some((name, "temp]")) => (name, FileKind::Temp),
        _ => (value, FileKind::Input),
    };
    // 255 bytes: a file name's limit on common file systems (an S3 key of 1024 bytes holds it encoded).
    if name.is_empty() || name.len() > 255 || name.contains(['\n', '\r']) || name.starts_with('/') {
        return None;
    }
    let (_, extension) = name.rsplit_once('.')?;
    // Model files are never inputs: their names are not looked for in the store.
    let plain = (1..=5).contains(&extension.len())
        && extension.chars().all(|c| c.is_ascii_alphanumeric())
        && !crate::service::queued::is_model_file(name);
    plain.then_some((kind, name))
}

#[cfg(test)]
mod named_tests {
    use super::{FileKind, named_file};

    #[test]
    fn string_inputs_that_name_files() {
        assert_eq!(named_file("cat.png"), Some((FileKind::Input, "cat.png")));
        assert_eq!(named_file("clips/a b (1).mp4"), Some((FileKind::Input, "clips/a b (1).mp4")));
        assert_eq!(
            named_file("ComfyUI_00001_.png [output]"),
            Some((FileKind::Output, "ComfyUI_00001_.png"))
        );
        assert_eq!(named_file("x.webp [temp]"), Some((FileKind::Temp, "x.webp")));
        for not_a_file in [
            "a cat on a mat",
            "a cat.",
            "flux1-dev.safetensors",
            "/etc/passwd.txt",
            "two\nlines.png",
            "",
        ] {
            assert_eq!(named_file(not_a_file), None, "{not_a_file:?}");
        }
    }
}
