//! Test support: the f32 tensors of a fixture file under `engine/tests/fixtures/` (written by a
//! `scripts/reference/` script from the reference's own code).

use std::collections::BTreeMap;

use crate::tensor::Tensor;

/// Every tensor of `tests/fixtures/<path>` (a safetensors file of f32 tensors), by name.
pub(crate) fn tensors(path: &str) -> BTreeMap<String, Tensor> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path);
    let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let read = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    read.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values: Vec<f32> = view
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (name, Tensor::new(view.shape().to_vec(), values).expect("a tensor"))
        })
        .collect()
}

/// The text of `tests/fixtures/<path>`.
pub(crate) fn text(path: &str) -> String {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// Asserts `got` has `want`'s length and every value within `tol` of it (`what` names the case).
#[track_caller]
pub(crate) fn assert_within(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < tol, "{what}: max |difference| {worst}");
}

/// Asserts `got` has `want`'s length and every value within `tol` times `want`'s largest magnitude of it.
#[track_caller]
pub(crate) fn assert_relative(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    assert_within(what, got, want, tol * scale);
}

/// No progress reporting (a node run outside the executor).
struct Quiet;

impl crate::nodes::ProgressSink for Quiet {
    fn progress(&self, _: &crate::graph::NodeId, _: f64, _: f64) {}
    fn preview(&self, _: &crate::graph::NodeId, _: crate::preview::Preview) {}
}

/// A node's context outside the executor: node 1 of an empty prompt, every folder `dir`, no previews, no
/// progress reporting.
pub(crate) fn quiet_context(dir: &std::path::Path) -> crate::nodes::Context {
    use std::sync::Arc;
    crate::nodes::Context {
        node: crate::graph::NodeId::from("1"),
        prompt: Arc::new(serde_json::Value::Null),
        extra_pnginfo: Arc::new(serde_json::Value::Null),
        input_dir: dir.to_path_buf(),
        output_dir: dir.to_path_buf(),
        temp_dir: dir.to_path_buf(),
        shared: None,
        preview_method: crate::preview::PreviewMethod::None,
        interrupt: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        progress: Arc::new(Quiet),
    }
}
