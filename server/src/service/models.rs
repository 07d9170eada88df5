//! The model routes' answers, over the configured [`ModelFolders`]: folder names, file listings (plain and
//! with details), the directories of each folder, safetensors metadata and preview images.
//!
//! Each route finds its folder as ComfyUI's does: the listings by exact name (`/models/unet` is a 404), the
//! metadata read through `get_full_path`'s legacy mapping. Everything here touches the file system, so the
//! handlers call it off the async threads.

use std::path::Path;

use kiln_spec::types;

use crate::model_folders::{
    Hidden, ModelFolders, PT_EXTENSIONS, extension, walk, without_extension,
};

/// Folders `/experiment/models` leaves out, as ComfyUI.
const NOT_EXPERIMENT_FOLDERS: [&str; 2] = ["configs", "custom_nodes"];

/// Every folder name, in order (`/models`).
pub(crate) fn names(folders: &ModelFolders) -> Vec<String> {
    folders.iter().map(|f| f.name.clone()).collect()
}

/// The files of one folder (`/models/{folder}`); `None` for an unknown folder.
pub(crate) fn files(folders: &ModelFolders, name: &str) -> Option<Vec<String>> {
    folders.get(name).map(|f| f.files())
}

/// The embeddings' names, without extension (`/embeddings`).
pub(crate) fn embeddings(folders: &ModelFolders) -> Vec<String> {
    let files = folders.resolve("embeddings").map(|f| f.files()).unwrap_or_default();
    files.iter().map(|f| without_extension(f).to_owned()).collect()
}

/// Each folder with its directories and extensions, sorted (`/experiment/models`).
pub(crate) fn folder_list(folders: &ModelFolders) -> Vec<types::ModelFolder> {
    folders
        .iter()
        .filter(|f| !NOT_EXPERIMENT_FOLDERS.contains(&f.name.as_str()))
        .map(|f| {
            let mut extensions = f.extensions.clone();
            extensions.sort();
            types::ModelFolder {
                extensions,
                folders: f.paths.iter().map(|p| p.to_string_lossy().into_owned()).collect(),
                name: f.name.clone(),
            }
        })
        .collect()
}

/// The directories of every folder (`/internal/folder_paths`).
pub(crate) fn folder_paths(folders: &ModelFolders) -> types::FolderPaths {
    types::FolderPaths(
        folders
            .iter()
            .map(|f| {
                let paths = f.paths.iter().map(|p| p.to_string_lossy().into_owned()).collect();
                (f.name.clone(), types::StringList(paths))
            })
            .collect(),
    )
}

/// The model files of one folder with their directory's index, size and times (`/experiment/models/{folder}`):
/// as ComfyUI, hidden files and directories are skipped and only model extensions are listed, whatever the
/// folder lists; `None` for an unknown folder.
pub(crate) fn details(folders: &ModelFolders, name: &str) -> Option<Vec<types::ModelFile>> {
    let folder = folders.get(name)?;
    let seconds = |t: std::io::Result<std::time::SystemTime>| {
        t.ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs_f64())
    };
    let mut out = Vec::new();
    for (index, dir) in folder.paths.iter().enumerate() {
        let mut found = walk(dir, Hidden::Skipped);
        found.retain(|(name, _)| PT_EXTENSIONS.contains(&extension(name).to_lowercase().as_str()));
        found.sort();
        out.extend(found.into_iter().map(|(name, path)| {
            let meta = std::fs::metadata(path).ok();
            types::ModelFile {
                created: meta.as_ref().and_then(|m| seconds(m.created())),
                modified: meta.as_ref().and_then(|m| seconds(m.modified())),
                name,
                path_index: index as i64,
                size: meta.map(|m| m.len() as i64),
            }
        }));
    }
    Some(out)
}

/// The `__metadata__` of a `.safetensors` file of a folder (`/view_metadata/{folder}`; legacy folder names
/// are mapped, as ComfyUI's `get_full_path` does).
pub(crate) fn metadata(
    folders: &ModelFolders,
    folder: &str,
    filename: &str,
) -> Option<Vec<(String, String)>> {
    if !filename.ends_with(".safetensors") {
        return None;
    }
    safetensors_metadata(&folders.resolve(folder)?.find(filename)?)
}

/// What the preview route answers.
#[derive(Debug, PartialEq)]
pub(crate) enum Preview {
    /// The WebP image.
    Found(Vec<u8>),
    /// The file name leads out of its directory.
    Forbidden,
    /// An unknown folder, no directory at that index, no such directory, or no preview: nothing is there.
    NotFound,
}

/// The `<stem>.webp` beside a model file in one directory of a folder. Unlike listings, a preview must
/// resolve inside its directory, symlinks included (ComfyUI's `is_within_directory`): it is served to browsers.
pub(crate) fn preview(
    folders: &ModelFolders,
    folder: &str,
    path_index: i64,
    filename: &str,
) -> Preview {
    let Some(dir) = folders
        .get(folder)
        .and_then(|f| usize::try_from(path_index).ok().and_then(|i| f.paths.get(i)))
    else {
        return Preview::NotFound;
    };
    if !dir.is_dir() {
        return Preview::NotFound;
    }
    let stem = without_extension(filename);
    let Some(path) = kiln_engine::roots::within(dir, &format!("{stem}.webp")) else {
        return Preview::Forbidden;
    };
    match std::fs::read(&path) {
        Ok(bytes) => Preview::Found(bytes),
        Err(_) => Preview::NotFound,
    }
}

/// The `__metadata__` map of a safetensors file, in its order (its JSON header, read at most 1 MiB).
fn safetensors_metadata(path: &Path) -> Option<Vec<(String, String)>> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).ok()?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).ok()?;
    let len = u64::from_le_bytes(len);
    if len > 1 << 20 {
        return None;
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).ok()?;
    let header: serde_json::Value = serde_json::from_slice(&header).ok()?;
    let metadata = header.get("__metadata__")?.as_object()?;
    Some(metadata.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned()))).collect())
}
