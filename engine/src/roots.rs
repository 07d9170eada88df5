//! The three file roots nodes read and write, and the rule that keeps every path inside its root.

use std::path::{Component, Path, PathBuf};

/// The three file roots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileKind {
    /// The input directory.
    Input,
    /// The output directory.
    Output,
    /// The temp directory.
    Temp,
}

impl FileKind {
    /// The name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            FileKind::Input => "input",
            FileKind::Output => "output",
            FileKind::Temp => "temp",
        }
    }
}

/// Where nodes read and write files.
#[derive(Debug, Clone)]
pub struct Roots {
    /// The input directory.
    pub input: PathBuf,
    /// The output directory.
    pub output: PathBuf,
    /// The temp directory.
    pub temp: PathBuf,
}

impl Roots {
    /// The directory of one kind of file.
    pub fn get(&self, kind: FileKind) -> &Path {
        match kind {
            FileKind::Input => &self.input,
            FileKind::Output => &self.output,
            FileKind::Temp => &self.temp,
        }
    }
}

/// Where the files of the roots live beyond this machine (the server's object store, which the workers of a
/// cluster share): a save node claims its file's name there as well as in its folder, so that no two machines
/// write one name, and publishes the file there once it is written. Calls block; nodes make them.
pub trait SharedFiles: Send + Sync {
    /// The names of the shared files of `kind` directly in `subfolder` (`""`: the root) that start with
    /// `prefix`.
    fn names(&self, kind: FileKind, subfolder: &str, prefix: &str) -> std::io::Result<Vec<String>>;
    /// Claims `filename` in `subfolder` of `kind`: false when a file of that name exists there already.
    fn claim(&self, kind: FileKind, subfolder: &str, filename: &str) -> std::io::Result<bool>;
    /// Publishes the file written at `path` under the name claimed.
    fn publish(
        &self,
        kind: FileKind,
        subfolder: &str,
        filename: &str,
        path: &Path,
    ) -> std::io::Result<()>;
    /// Gives a claimed name up (its file could not be written).
    fn release(&self, kind: FileKind, subfolder: &str, filename: &str);
}

/// `root/relative` if `relative` is a plain relative path (no `..`, not absolute) that, once symlinks are
/// resolved as far as the path exists, stays inside `root` (which must exist).
pub fn within(root: &Path, relative: &str) -> Option<PathBuf> {
    let rel = Path::new(relative);
    if rel.is_absolute()
        || rel.components().any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return None;
    }
    let joined = root.join(rel);
    let real_root = root.canonicalize().ok()?;
    // Resolve the longest existing prefix: a symlink anywhere along it must not lead out of the root.
    let mut existing = joined.as_path();
    while !existing.exists() {
        existing = existing.parent()?;
    }
    let real = existing.canonicalize().ok()?;
    real.starts_with(&real_root).then_some(joined)
}

/// The file a widget's annotated name refers to (ComfyUI's `get_annotated_filepath`): `name [output]` and
/// `name [temp]` under those directories (where given), anything else (`name [input]` too) under the input
/// directory; never outside them, and only an existing file.
pub fn annotated(
    name: &str,
    input: &Path,
    output: Option<&Path>,
    temp: Option<&Path>,
) -> Option<PathBuf> {
    let (relative, root) = if let Some(n) = name.strip_suffix(" [output]") {
        (n, output)
    } else if let Some(n) = name.strip_suffix(" [temp]") {
        (n, temp)
    } else {
        (name.strip_suffix(" [input]").unwrap_or(name), Some(input))
    };
    root.and_then(|root| within(root, relative)).filter(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn paths_stay_inside_their_root() {
        let root = std::env::temp_dir();
        assert!(within(&root, "a.png").is_some());
        assert!(within(&root, "sub/a.png").is_some());
        assert!(within(&root, "../a.png").is_none());
        assert!(within(&root, "/etc/passwd").is_none());
        assert!(within(&root, "sub/../../a.png").is_none());
    }
}
