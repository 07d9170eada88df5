//! Model folders under the models directory: `<models>/<kind>/...`, the kinds ComfyUI knows.

use std::path::Path;

use kiln_spec::types;

/// The model folder kinds, in ComfyUI's order.
pub(crate) const KINDS: [&str; 16] = [
    "checkpoints",
    "configs",
    "loras",
    "vae",
    "text_encoders",
    "diffusion_models",
    "clip_vision",
    "style_models",
    "embeddings",
    "diffusers",
    "vae_approx",
    "controlnet",
    "gligen",
    "upscale_models",
    "hypernetworks",
    "photomaker",
];

const MODEL_EXTENSIONS: [&str; 7] = ["ckpt", "pt", "pt2", "bin", "pth", "safetensors", "sft"];

/// Files of one kind, relative to its folder (recursively), sorted; `None` for an unknown kind.
pub(crate) fn files(models_dir: &Path, kind: &str) -> Option<Vec<String>> {
    if !KINDS.contains(&kind) {
        return None;
    }
    let base = models_dir.join(kind);
    let mut out = Vec::new();
    let mut stack = vec![base.clone()];
    while let Some(folder) = stack.pop() {
        for entry in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
                MODEL_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()) || kind == "configs"
            }) && let Ok(relative) = path.strip_prefix(&base)
            {
                out.push(relative.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Some(out)
}

/// Each kind with its folder and extensions (without `configs`, as ComfyUI).
pub(crate) fn folders(models_dir: &Path) -> Vec<types::ModelFolder> {
    KINDS
        .iter()
        .filter(|k| **k != "configs")
        .map(|kind| types::ModelFolder {
            extensions: MODEL_EXTENSIONS.iter().map(|e| format!(".{e}")).collect(),
            folders: vec![models_dir.join(kind).to_string_lossy().into_owned()],
            name: (*kind).to_owned(),
        })
        .collect()
}

/// Files of one kind with size and times; `None` for an unknown kind.
pub(crate) fn details(models_dir: &Path, kind: &str) -> Option<Vec<types::ModelFile>> {
    let base = models_dir.join(kind);
    let seconds = |t: std::io::Result<std::time::SystemTime>| {
        t.ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs_f64())
    };
    Some(
        files(models_dir, kind)?
            .into_iter()
            .map(|name| {
                let meta = std::fs::metadata(base.join(&name)).ok();
                types::ModelFile {
                    created: meta.as_ref().and_then(|m| seconds(m.created())),
                    modified: meta.as_ref().and_then(|m| seconds(m.modified())),
                    name,
                    path_index: 0,
                    size: meta.map(|m| m.len() as i64),
                }
            })
            .collect(),
    )
}

/// The `__metadata__` map of a safetensors file (its JSON header, read at most 1 MiB).
pub(crate) fn safetensors_metadata(path: &Path) -> Option<kiln_spec::IndexMap<String, String>> {
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
