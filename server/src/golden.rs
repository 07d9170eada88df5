//! Test support: reading ComfyUI's recorded exchanges (`tests/golden/comfyui`, or `KILN_GOLDEN_DIR`).

use std::path::PathBuf;

/// The golden captures' folder.
pub(crate) fn dir() -> PathBuf {
    kiln_tests::golden_dir()
}

/// One capture, parsed.
pub(crate) fn case(name: &str) -> serde_json::Value {
    let path = dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("golden {} unreadable ({e}); set KILN_GOLDEN_DIR", path.display())
    });
    serde_json::from_str(&text).expect("golden JSON")
}
