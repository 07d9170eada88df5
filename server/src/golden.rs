//! Test support: reading ComfyUI's recorded exchanges (`../shared/golden/comfyui`, or `KILN_GOLDEN_DIR`).

use std::path::PathBuf;

/// The golden captures' folder.
pub(crate) fn dir() -> PathBuf {
    std::env::var_os("KILN_GOLDEN_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/comfyui")
    })
}

/// One capture, parsed.
pub(crate) fn case(name: &str) -> serde_json::Value {
    let path = dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("golden {} unreadable ({e}); set KILN_GOLDEN_DIR", path.display())
    });
    serde_json::from_str(&text).expect("golden JSON")
}
