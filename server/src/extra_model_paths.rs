//! ComfyUI's `extra_model_paths.yaml` (`utils/extra_config.py`), read with ComfyUI's semantics so Kiln can use
//! the models of an existing ComfyUI (or A1111) install where they are.
//!
//! The file is a mapping of sections (`comfyui:`, `a111:`, any name); each section maps folder names to
//! directories, one per line (a YAML block scalar holds several), plus two optional keys: `base_path` (`~` and
//! `$VAR`/`${VAR}` expanded, relative to the file's directory) and `is_default` (the section's directories
//! are searched first). A directory is relative to `base_path` if the section has one, otherwise to the file's
//! directory; every directory is made absolute and normalized (`..` folded) as written, without resolving
//! symlinks. An empty section is skipped. Anything else ComfyUI would trip over (a section or value of the
//! wrong type, a key that is not a name) is an error naming the file and the key.

use std::path::{Component, Path, PathBuf};

use serde_yaml::Value;

/// One directory an extra model paths file adds to a model folder.
#[derive(Debug, Clone, PartialEq)]
pub struct ExtraModelPath {
    /// The folder name as written; a legacy name (`unet`, `clip`) is mapped when the path is added.
    pub folder: String,
    /// The directory, absolute and normalized.
    pub path: PathBuf,
    /// Whether it is searched before the folder's other directories (the section's `is_default`).
    pub is_default: bool,
}

/// Why an extra model paths file cannot be used. The cause's words are part of the message (there is no
/// `source()`), so the binary's error is one line naming the file.
#[derive(Debug, thiserror::Error)]
pub enum ExtraModelPathsError {
    /// The file cannot be read.
    #[error("extra model paths config {}: cannot read it: {reason}", path.display())]
    Read {
        /// The file as given.
        path: PathBuf,
        /// The operating system's words.
        reason: String,
    },
    /// The file is not YAML.
    #[error("extra model paths config {}: not valid YAML: {reason}", path.display())]
    Yaml {
        /// The file as given.
        path: PathBuf,
        /// The parser's words, with the line and column.
        reason: String,
    },
    /// The file is YAML of another shape.
    #[error("extra model paths config {}: {problem}", path.display())]
    Shape {
        /// The file as given.
        path: PathBuf,
        /// What is wrong, naming the key.
        problem: String,
    },
}

/// Reads an extra model paths file: the directories it adds, in the order ComfyUI adds them.
pub fn read_extra_model_paths(file: &Path) -> Result<Vec<ExtraModelPath>, ExtraModelPathsError> {
    let text = std::fs::read_to_string(file).map_err(|e| ExtraModelPathsError::Read {
        path: file.to_path_buf(),
        reason: e.to_string(),
    })?;
    let absolute = std::path::absolute(file).map_err(|e| ExtraModelPathsError::Read {
        path: file.to_path_buf(),
        reason: e.to_string(),
    })?;
    let dir = normalize(absolute.parent().unwrap_or(Path::new("/")));
    let env = |name: &str| std::env::var(name).ok();
    parse(&text, &dir, &env).map_err(|problem| match problem {
        Problem::Yaml(reason) => ExtraModelPathsError::Yaml { path: file.to_path_buf(), reason },
        Problem::Shape(problem) => {
            ExtraModelPathsError::Shape { path: file.to_path_buf(), problem }
        }
    })
}

/// What is wrong with a file's text.
#[derive(Debug, PartialEq)]
enum Problem {
    Yaml(String),
    Shape(String),
}

/// The directories a file's text adds; `dir` is the file's directory (absolute), `env` looks up variables.
fn parse(
    text: &str,
    dir: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ExtraModelPath>, Problem> {
    let document: Value = serde_yaml::from_str(text).map_err(|e| Problem::Yaml(e.to_string()))?;
    let sections = match document {
        Value::Null => return Ok(Vec::new()),
        Value::Mapping(sections) => sections,
        _ => {
            return Err(Problem::Shape(
                "expected sections such as `comfyui:` mapping folder names to paths".to_owned(),
            ));
        }
    };
    let mut out = Vec::new();
    for (section, conf) in sections {
        let section = key_name(&section)
            .ok_or_else(|| Problem::Shape(format!("section name {section:?} is not a string")))?;
        let conf = match conf {
            Value::Null => continue,
            Value::Mapping(conf) => conf,
            _ => {
                return Err(Problem::Shape(format!(
                    "section `{section}` is not a mapping of folder names to paths"
                )));
            }
        };
        let mut base = None;
        let mut is_default = false;
        let mut folders = Vec::new();
        for (key, value) in conf {
            let key = key_name(&key).ok_or_else(|| {
                Problem::Shape(format!("section `{section}`: key {key:?} is not a folder name"))
            })?;
            match key.as_str() {
                "base_path" => {
                    let Value::String(path) = value else {
                        return Err(Problem::Shape(format!("`{section}.base_path` is not a path")));
                    };
                    let expanded = expand_vars(&expand_user(&path, env), env);
                    if !expanded.is_empty() {
                        base = Some(normalize(&dir.join(expanded)));
                    }
                }
                "is_default" => {
                    is_default = truth(&value).ok_or_else(|| {
                        Problem::Shape(format!("`{section}.is_default` is not true or false"))
                    })?;
                }
                _ => {
                    let Value::String(paths) = value else {
                        return Err(Problem::Shape(format!(
                            "`{section}.{key}` is not a path (or several, one per line)"
                        )));
                    };
                    folders.push((key, paths));
                }
            }
        }
        for (folder, paths) in folders {
            for line in paths.split('\n').filter(|l| !l.is_empty()) {
                let path = normalize(&base.as_deref().unwrap_or(dir).join(line));
                out.push(ExtraModelPath { folder: folder.clone(), path, is_default });
            }
        }
    }
    Ok(out)
}

/// A mapping key as a name: strings, and the numbers and booleans YAML reads from bare words.
fn key_name(key: &Value) -> Option<String> {
    match key {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A YAML boolean, including the YAML 1.1 words (`yes`, `on`, ...) ComfyUI's parser reads as booleans.
fn truth(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::String(s) => match s.as_str() {
            "yes" | "Yes" | "YES" | "on" | "On" | "ON" | "true" | "True" | "TRUE" => Some(true),
            "no" | "No" | "NO" | "off" | "Off" | "OFF" | "false" | "False" | "FALSE" => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// `~` or `~/...` with the home directory (Python's `os.path.expanduser`; `~user` is left as written).
fn expand_user(path: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    let rest = match path.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest,
        _ => return path.to_owned(),
    };
    match env("HOME") {
        Some(home) if rest.is_empty() => home,
        Some(home) => format!("{}{rest}", home.trim_end_matches('/')),
        None => path.to_owned(),
    }
}

/// `$NAME` and `${NAME}` replaced by the variable's value; unknown variables are left as written (Python's
/// `os.path.expandvars` on POSIX: a name is ASCII letters, digits and `_`).
fn expand_vars(path: &str, env: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(path.len());
    let mut rest = path;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, len) = if let Some(braced) = after.strip_prefix('{') {
            match braced.find('}') {
                Some(end) => (&braced[..end], end + 2),
                None => ("", 0),
            }
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], end)
        };
        match (len, env(name)) {
            (0, _) => {
                out.push('$');
                rest = after;
            }
            (_, Some(value)) if !name.is_empty() => {
                out.push_str(&value);
                rest = &after[len..];
            }
            _ => {
                out.push_str(&rest[at..at + 1 + len]);
                rest = &after[len..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A path with `.` dropped and `..` folded into its parent, without touching the file system (Python's
/// `os.path.normpath`).
pub(crate) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    let mut depth = 0usize;
    for component in path.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => out.push(component),
            Component::CurDir => {}
            Component::ParentDir if depth > 0 => {
                out.pop();
                depth -= 1;
            }
            Component::ParentDir if path.has_root() => {}
            Component::ParentDir => out.push(".."),
            Component::Normal(name) => {
                out.push(name);
                depth += 1;
            }
        }
    }
    if out.as_os_str().is_empty() { PathBuf::from(".") } else { out }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::{ExtraModelPath, Problem, expand_vars, normalize, parse};

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/me".to_owned()),
            "MODELS" => Some("/srv/models".to_owned()),
            _ => None,
        }
    }

    fn entry(folder: &str, path: &str, is_default: bool) -> ExtraModelPath {
        ExtraModelPath { folder: folder.to_owned(), path: PathBuf::from(path), is_default }
    }

    #[test]
    fn sections_base_paths_and_multi_line_values_read_like_comfyui() {
        let text = "\
a111:
    base_path: ../sd-webui
    checkpoints: models/Stable-diffusion
    loras: |
        models/Lora
        models/LyCORIS
    upscale_models: /abs/ESRGAN
comfyui:
    base_path: ~/ComfyUI/
    is_default: true
    unet: models/unet
    clip: models/clip
other:
    base_path: $MODELS/${MODELS}x/$NOPE
    vae: vae
empty:
no_base:
    embeddings: emb
    hypernetworks: /abs/hn
";
        let paths = parse(text, Path::new("/etc/kiln"), &env).expect("valid");
        assert_eq!(
            paths,
            [
                entry("checkpoints", "/etc/sd-webui/models/Stable-diffusion", false),
                entry("loras", "/etc/sd-webui/models/Lora", false),
                entry("loras", "/etc/sd-webui/models/LyCORIS", false),
                entry("upscale_models", "/abs/ESRGAN", false),
                entry("unet", "/home/me/ComfyUI/models/unet", true),
                entry("clip", "/home/me/ComfyUI/models/clip", true),
                entry("vae", "/srv/models/srv/modelsx/$NOPE/vae", false),
                entry("embeddings", "/etc/kiln/emb", false),
                entry("hypernetworks", "/abs/hn", false),
            ]
        );
    }

    #[test]
    fn bad_shapes_name_the_key() {
        let shape = |text: &str| match parse(text, Path::new("/d"), &env) {
            Err(Problem::Shape(problem)) => problem,
            other => panic!("{text:?}: {other:?}"),
        };
        assert!(shape("- a\n- b\n").contains("expected sections"));
        assert!(shape("a111: models\n").contains("section `a111`"));
        assert!(shape("a111:\n  base_path: [1]\n").contains("`a111.base_path`"));
        assert!(shape("a111:\n  is_default: maybe\n").contains("`a111.is_default`"));
        assert!(shape("a111:\n  checkpoints: [a, b]\n").contains("`a111.checkpoints`"));
        assert!(shape("a111:\n  checkpoints:\n").contains("`a111.checkpoints`"));
        assert!(matches!(parse("a: [b\n", Path::new("/d"), &env), Err(Problem::Yaml(_))));
        assert_eq!(parse("", Path::new("/d"), &env), Ok(Vec::new()));
        assert_eq!(parse("# all commented out\n", Path::new("/d"), &env), Ok(Vec::new()));
    }

    #[test]
    fn variables_and_paths_expand_like_python() {
        assert_eq!(expand_vars("$MODELS/a", &env), "/srv/models/a");
        assert_eq!(expand_vars("${MODELS}a", &env), "/srv/modelsa");
        assert_eq!(expand_vars("$NOPE/${NOPE}/${MODELS", &env), "$NOPE/${NOPE}/${MODELS");
        assert_eq!(expand_vars("a$/b$", &env), "a$/b$");
        assert_eq!(normalize(Path::new("/a/./b/../../../c")), Path::new("/c"));
        assert_eq!(normalize(Path::new("a/../../b")), Path::new("../b"));
    }
}
