//! ComfyUI's model folders (`folder_paths.py`): each folder name with the directories searched for it, in
//! order, and the extensions it lists; the legacy names `unet` and `clip`; and the listing and lookup rules
//! that every route listing or reading model files goes through.
//!
//! The folders and their order are ComfyUI's (`folder_names_and_paths`), so `/models` lists the same names in
//! the same order; a folder named by an extra model paths file that ComfyUI does not know is added at the end
//! and lists every file, as ComfyUI does.
//!
//! Legacy names are mapped where ComfyUI maps them (`map_legacy`): in extra model paths files and in lookups
//! by name ([`ModelFolders::resolve`], ComfyUI's `get_folder_paths`, `get_filename_list`, `get_full_path`).
//! The listing routes ask for a folder by its exact name ([`ModelFolders::get`]), so `/models/unet` is a 404 as
//! in ComfyUI.
//!
//! Containment: a name read through HTTP must be a plain relative path (no `..`, no root, no prefix), so a
//! request can never name a file outside the folder's directories. Symlinks inside a configured directory
//! are part of it, as in ComfyUI (`os.walk(followlinks=True)`): that is how model files are shared between
//! installs, and only someone who can write the directory can place them. Listings and metadata reads follow
//! them; a link that leads back to one of its own parent directories is skipped, so listing always ends.
//! Preview images are the exception (see `service/models.rs`): like ComfyUI's `is_within_directory`, they must
//! resolve inside the directory.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// ComfyUI's `supported_pt_extensions`: what most folders list, and what `/experiment/models/{folder}` lists.
pub(crate) const PT_EXTENSIONS: [&str; 8] =
    [".ckpt", ".pt", ".pt2", ".bin", ".pth", ".safetensors", ".pkl", ".sft"];

/// Legacy folder names and the folder each stands for (ComfyUI's `map_legacy`).
const LEGACY: [(&str, &str); 2] = [("unet", "diffusion_models"), ("clip", "text_encoders")];

/// Directory names a listing never enters.
const EXCLUDED_DIRS: [&str; 1] = [".git"];

/// Where a default folder's directories are.
#[derive(Clone, Copy)]
enum Under {
    /// The models directory.
    Models,
    /// The base directory (ComfyUI's install folder; Kiln's data directory).
    Base,
}

/// Which files a default folder lists.
#[derive(Clone, Copy)]
enum Listed {
    /// `supported_pt_extensions`.
    Pt,
    /// `.yaml` only (`configs`).
    Yaml,
    /// The extension `folder`, which no file has (`diffusers`, whose models are directories).
    Folder,
    /// Files without an extension (`classifiers`).
    NoExtension,
    /// Every file.
    Any,
}

/// ComfyUI's `folder_names_and_paths`, in its order: name, where, directories, listed files.
const DEFAULTS: [(&str, Under, &[&str], Listed); 27] = [
    ("checkpoints", Under::Models, &["checkpoints"], Listed::Pt),
    ("configs", Under::Models, &["configs"], Listed::Yaml),
    ("loras", Under::Models, &["loras"], Listed::Pt),
    ("vae", Under::Models, &["vae"], Listed::Pt),
    ("text_encoders", Under::Models, &["text_encoders", "clip"], Listed::Pt),
    ("diffusion_models", Under::Models, &["unet", "diffusion_models"], Listed::Pt),
    ("clip_vision", Under::Models, &["clip_vision"], Listed::Pt),
    ("style_models", Under::Models, &["style_models"], Listed::Pt),
    ("embeddings", Under::Models, &["embeddings"], Listed::Pt),
    ("diffusers", Under::Models, &["diffusers"], Listed::Folder),
    ("vae_approx", Under::Models, &["vae_approx"], Listed::Pt),
    ("controlnet", Under::Models, &["controlnet", "t2i_adapter"], Listed::Pt),
    ("gligen", Under::Models, &["gligen"], Listed::Pt),
    ("upscale_models", Under::Models, &["upscale_models"], Listed::Pt),
    ("latent_upscale_models", Under::Models, &["latent_upscale_models"], Listed::Pt),
    ("custom_nodes", Under::Base, &["custom_nodes"], Listed::Any),
    ("datasets", Under::Base, &["datasets"], Listed::Any),
    ("hypernetworks", Under::Models, &["hypernetworks"], Listed::Pt),
    ("photomaker", Under::Models, &["photomaker"], Listed::Pt),
    ("classifiers", Under::Models, &["classifiers"], Listed::NoExtension),
    ("model_patches", Under::Models, &["model_patches"], Listed::Pt),
    ("audio_encoders", Under::Models, &["audio_encoders"], Listed::Pt),
    ("background_removal", Under::Models, &["background_removal"], Listed::Pt),
    ("frame_interpolation", Under::Models, &["frame_interpolation"], Listed::Pt),
    ("geometry_estimation", Under::Models, &["geometry_estimation"], Listed::Pt),
    ("optical_flow", Under::Models, &["optical_flow"], Listed::Pt),
    ("detection", Under::Models, &["detection"], Listed::Pt),
];

/// The folder a possibly legacy name stands for (ComfyUI's `map_legacy`).
pub(crate) fn map_legacy(name: &str) -> &str {
    LEGACY.iter().find(|(old, _)| *old == name).map_or(name, |(_, new)| new)
}

/// One model folder: its name, the directories searched in order, and the extensions it lists.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Folder {
    /// The folder name, e.g. `checkpoints`.
    pub(crate) name: String,
    /// The directories, in search order (`pathIndex` is an index into this list).
    pub(crate) paths: Vec<PathBuf>,
    /// The extensions listed, lowercase with their dot (`""` for files without one); empty lists every file.
    pub(crate) extensions: Vec<String>,
}

/// The model folders, in ComfyUI's order, with the directories of each.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ModelFolders {
    folders: Vec<Folder>,
}

impl ModelFolders {
    /// ComfyUI's folders: model folders under `models_dir`, `custom_nodes` and `datasets` under `base_dir`.
    pub(crate) fn comfyui(models_dir: &Path, base_dir: &Path) -> ModelFolders {
        let folders = DEFAULTS
            .iter()
            .map(|(name, under, dirs, listed)| {
                let parent = match under {
                    Under::Models => models_dir,
                    Under::Base => base_dir,
                };
                let extensions: &[&str] = match listed {
                    Listed::Pt => &PT_EXTENSIONS,
                    Listed::Yaml => &[".yaml"],
                    Listed::Folder => &["folder"],
                    Listed::NoExtension => &[""],
                    Listed::Any => &[],
                };
                Folder {
                    name: (*name).to_owned(),
                    paths: dirs.iter().map(|d| parent.join(d)).collect(),
                    extensions: extensions.iter().map(|e| (*e).to_owned()).collect(),
                }
            })
            .collect();
        ModelFolders { folders }
    }

    /// Adds a directory to a folder, as ComfyUI's `add_model_folder_path`: a legacy name is mapped; a default
    /// directory goes first (moved there if already listed), another one last unless already listed; an
    /// unknown folder is created at the end of the list, listing every file.
    pub(crate) fn add(&mut self, name: &str, path: PathBuf, is_default: bool) {
        let name = map_legacy(name);
        let Some(folder) = self.folders.iter_mut().find(|f| f.name == name) else {
            self.folders.push(Folder {
                name: name.to_owned(),
                paths: vec![path],
                extensions: Vec::new(),
            });
            return;
        };
        match folder.paths.iter().position(|p| *p == path) {
            Some(0) => {}
            Some(at) if is_default => {
                let path = folder.paths.remove(at);
                folder.paths.insert(0, path);
            }
            Some(_) => {}
            None if is_default => folder.paths.insert(0, path),
            None => folder.paths.push(path),
        }
    }

    /// Every folder, in order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Folder> {
        self.folders.iter()
    }

    /// The folder with exactly this name (how ComfyUI's routes check `folder in folder_names_and_paths`).
    pub(crate) fn get(&self, name: &str) -> Option<&Folder> {
        self.folders.iter().find(|f| f.name == name)
    }

    /// The folder a name stands for, legacy names included (ComfyUI's lookups by name).
    pub(crate) fn resolve(&self, name: &str) -> Option<&Folder> {
        self.get(map_legacy(name))
    }
}

/// The loader nodes list and read the same folders the model routes do.
impl kiln_engine::models::ModelFiles for ModelFolders {
    fn list(&self, folder: &str) -> Vec<String> {
        self.resolve(folder).map(Folder::files).unwrap_or_default()
    }

    fn find(&self, folder: &str, name: &str) -> Option<PathBuf> {
        self.resolve(folder).filter(|f| f.lists(name)).and_then(|f| f.find(name))
    }
}

impl Folder {
    /// Whether the folder lists a file of this (relative) name.
    pub(crate) fn lists(&self, name: &str) -> bool {
        self.extensions.is_empty()
            || self.extensions.iter().any(|e| *e == extension(name).to_lowercase())
    }

    /// Every listed file of every directory, relative to its directory, without duplicates, sorted (ComfyUI's
    /// `get_filename_list`).
    pub(crate) fn files(&self) -> Vec<String> {
        let mut names = BTreeSet::new();
        for dir in &self.paths {
            names.extend(walk(dir, Hidden::Listed).into_iter().map(|(n, _)| n));
        }
        names.into_iter().filter(|n| self.lists(n)).collect()
    }

    /// The first directory's file of this name (ComfyUI's `get_full_path`); `None` if the name is not a plain
    /// relative path or no directory has such a file.
    pub(crate) fn find(&self, name: &str) -> Option<PathBuf> {
        if !is_plain_relative(name) {
            return None;
        }
        self.paths.iter().map(|dir| dir.join(name)).find(|path| path.is_file())
    }
}

/// Whether hidden entries (names starting with `.`) are listed.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Hidden {
    /// Listed (ComfyUI's `get_filename_list`).
    Listed,
    /// Skipped, files and directories (ComfyUI's `/experiment/models/{folder}`).
    Skipped,
}

/// The files under `dir`, recursively, as (name relative to `dir` with `/` separators, full path), in no
/// particular order. Symlinks are followed; a directory that is one of its own ancestors once resolved is not
/// entered again; `.git` directories, broken links and names that are not UTF-8 are skipped.
pub(crate) fn walk(dir: &Path, hidden: Hidden) -> Vec<(String, PathBuf)> {
    let mut out = Vec::new();
    let Ok(real) = dir.canonicalize() else { return out };
    if !real.is_dir() {
        return out;
    }
    // Each directory still to read: its path, its name relative to `dir`, and the resolved paths of it and
    // the directories above it.
    let mut stack = vec![(dir.to_path_buf(), String::new(), vec![real])];
    while let Some((current, relative, ancestors)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&current) else { continue };
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                tracing::debug!(dir = %current.display(), "skipped a model file whose name is not UTF-8");
                continue;
            };
            if hidden == Hidden::Skipped && name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else { continue };
            let named =
                if relative.is_empty() { name.clone() } else { format!("{relative}/{name}") };
            if meta.is_dir() {
                if EXCLUDED_DIRS.contains(&name.as_str()) {
                    continue;
                }
                let Ok(real) = path.canonicalize() else { continue };
                if ancestors.contains(&real) {
                    tracing::debug!(path = %path.display(), "skipped a symlink back to a parent directory");
                    continue;
                }
                let mut below = ancestors.clone();
                below.push(real);
                stack.push((path, named, below));
            } else if meta.is_file() {
                out.push((named, path));
            }
        }
    }
    out
}

/// The extension of a path's last component, with its dot, as Python's `os.path.splitext` finds it (a name's
/// leading dots do not start an extension): `"a/b.tar.gz"` → `".gz"`, `".hidden"` → `""`.
pub(crate) fn extension(path: &str) -> &str {
    let base = path.rsplit('/').next().unwrap_or(path);
    let body = base.trim_start_matches('.');
    match body.rfind('.') {
        Some(dot) => &body[dot..],
        None => "",
    }
}

/// A path without its extension (Python's `os.path.splitext(path)[0]`).
pub(crate) fn without_extension(path: &str) -> &str {
    &path[..path.len() - extension(path).len()]
}

/// A non-empty relative path of plain names: no root, no prefix, no `..`.
pub(crate) fn is_plain_relative(name: &str) -> bool {
    let path = Path::new(name);
    !name.is_empty()
        && !path.is_absolute()
        && path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{Hidden, ModelFolders, extension, is_plain_relative, walk, without_extension};

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("kiln-folders-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("dirs");
        std::fs::write(path, b"x").expect("file");
    }

    #[test]
    fn the_folders_are_comfyuis_in_its_order() {
        let golden = kiln_tests::golden("get_models");
        let recorded: Vec<&str> = golden["response"]["body"]["json"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|v| v.as_str().expect("a name"))
            .collect();
        let folders = ModelFolders::comfyui(Path::new("/m"), Path::new("/b"));
        let ours: Vec<&str> = folders.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(ours, recorded);
        let paths = |name: &str| folders.get(name).expect("a folder").paths.clone();
        assert_eq!(
            paths("diffusion_models"),
            [Path::new("/m/unet"), Path::new("/m/diffusion_models")]
        );
        assert_eq!(paths("text_encoders"), [Path::new("/m/text_encoders"), Path::new("/m/clip")]);
        assert_eq!(paths("custom_nodes"), [Path::new("/b/custom_nodes")]);
        assert_eq!(paths("datasets"), [Path::new("/b/datasets")]);
    }

    #[test]
    fn legacy_names_stand_for_their_folder_in_lookups_and_additions() {
        let mut folders = ModelFolders::comfyui(Path::new("/m"), Path::new("/b"));
        assert!(folders.get("unet").is_none(), "listing routes see only real names");
        assert_eq!(folders.resolve("unet").map(|f| &f.name[..]), Some("diffusion_models"));
        assert_eq!(folders.resolve("clip").map(|f| &f.name[..]), Some("text_encoders"));
        folders.add("clip", PathBuf::from("/x/clip"), false);
        folders.add("unet", PathBuf::from("/x/unet"), true);
        assert_eq!(
            folders.get("text_encoders").expect("folder").paths.last(),
            Some(&"/x/clip".into())
        );
        assert_eq!(folders.get("diffusion_models").expect("folder").paths[0], Path::new("/x/unet"));
        assert_eq!(folders.iter().count(), 27, "no folder was created for a legacy name");
    }

    #[test]
    fn additions_follow_comfyuis_order_rules() {
        let mut folders = ModelFolders::comfyui(Path::new("/m"), Path::new("/b"));
        folders.add("loras", PathBuf::from("/a"), false);
        folders.add("loras", PathBuf::from("/b"), true);
        folders.add("loras", PathBuf::from("/a"), false);
        assert_eq!(
            folders.get("loras").expect("loras").paths,
            [Path::new("/b"), Path::new("/m/loras"), Path::new("/a")]
        );
        folders.add("loras", PathBuf::from("/a"), true);
        assert_eq!(folders.get("loras").expect("loras").paths[0], Path::new("/a"), "moved first");
        folders.add("ipadapter", PathBuf::from("/ip"), false);
        let last = folders.iter().last().expect("a folder");
        assert_eq!(
            (&last.name[..], last.extensions.len()),
            ("ipadapter", 0),
            "new folders list everything"
        );
    }

    #[test]
    fn listings_filter_by_extension_sort_merge_and_follow_links() {
        let root = temp("listing");
        let (first, second, outside) = (root.join("one"), root.join("two"), root.join("outside"));
        touch(&first.join("b.safetensors"));
        touch(&first.join("sub/a.CKPT"));
        touch(&first.join("notes.txt"));
        touch(&first.join(".git/c.safetensors"));
        touch(&first.join(".hidden.pt"));
        touch(&second.join("b.safetensors"));
        touch(&second.join("c.sft"));
        touch(&outside.join("linked.pth"));
        std::os::unix::fs::symlink(&outside, first.join("shared")).expect("symlink");
        std::os::unix::fs::symlink(&first, first.join("sub/loop")).expect("symlink");
        let mut folders = ModelFolders::comfyui(&root.join("models"), &root);
        folders.add("checkpoints", first.clone(), true);
        folders.add("checkpoints", second.clone(), false);
        let checkpoints = folders.get("checkpoints").expect("checkpoints");
        assert_eq!(
            checkpoints.files(),
            [".hidden.pt", "b.safetensors", "c.sft", "shared/linked.pth", "sub/a.CKPT"]
        );
        let mut visible: Vec<String> =
            walk(&first, Hidden::Skipped).into_iter().map(|(n, _)| n).collect();
        visible.sort();
        assert_eq!(visible, ["b.safetensors", "notes.txt", "shared/linked.pth", "sub/a.CKPT"]);
        assert_eq!(checkpoints.find("c.sft"), Some(second.join("c.sft")));
        assert_eq!(
            checkpoints.find("b.safetensors"),
            Some(first.join("b.safetensors")),
            "first wins"
        );
        assert_eq!(checkpoints.find("../outside/linked.pth"), None);
        assert_eq!(checkpoints.find(&outside.join("linked.pth").to_string_lossy()), None);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn special_folders_list_what_comfyui_lists() {
        let root = temp("special");
        let models = root.join("models");
        touch(&models.join("configs/a.yaml"));
        touch(&models.join("configs/b.ckpt"));
        touch(&models.join("classifiers/model"));
        touch(&models.join("classifiers/model.pt"));
        touch(&models.join("diffusers/sd/model_index.json"));
        touch(&root.join("datasets/any.csv"));
        let folders = ModelFolders::comfyui(&models, &root);
        let files = |name: &str| folders.get(name).expect("folder").files();
        assert_eq!(files("configs"), ["a.yaml"]);
        assert_eq!(files("classifiers"), ["model"]);
        assert!(files("diffusers").is_empty());
        assert_eq!(files("datasets"), ["any.csv"]);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn extensions_are_split_like_python() {
        assert_eq!(extension("a/b.tar.gz"), ".gz");
        assert_eq!(extension(".hidden"), "");
        assert_eq!(extension("dir.v2/model"), "");
        assert_eq!(extension("..x.pt"), ".pt");
        assert_eq!(without_extension("sub/emb.pt"), "sub/emb");
        assert_eq!(without_extension(".hidden"), ".hidden");
        assert!(is_plain_relative("a/b.pt"));
        assert!(!is_plain_relative(""));
        assert!(!is_plain_relative("../a.pt"));
        assert!(!is_plain_relative("/a.pt"));
    }
}
