//! Helpers every test module of this binary uses: the CPU backend with a memory manager, and the fixtures.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::Backend as _;
use kiln_compute::backend::cpu::Cpu;
use kiln_compute::memory::{ManagerConfig, MemoryManager};

/// A fixture file under `tests/fixtures/`.
pub(crate) fn fixture(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(relative)
}

/// The CPU backend with `device_memory` bytes of simulated VRAM, and a memory manager on it (pinning off, so
/// tests never page-lock host memory).
pub(crate) fn cpu(device_memory: u64) -> (Arc<Cpu>, Arc<MemoryManager>) {
    let cpu = Arc::new(Cpu::new(device_memory));
    let manager = MemoryManager::new(cpu.memory().clone(), ManagerConfig::for_this_machine(false))
        .expect("a memory manager on the simulated device");
    (cpu, manager)
}

/// Every tensor of a safetensors fixture as f32 (f32, bf16 and f16 files), by name, with its shape.
pub(crate) fn read_tensors(relative: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let path = fixture(relative);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let data = view.data();
            let values = match view.dtype() {
                safetensors::Dtype::F32 => data
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::BF16 => data
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
                other => {
                    panic!("{}: {name} is {other:?}; fixtures hold f32 or bf16", path.display())
                }
            };
            (name, (view.shape().to_vec(), values))
        })
        .collect()
}

/// A safetensors file of f32 tensors (name → shape and values) in the temporary folder, removed on drop.
pub(crate) struct TempTensors(pub(crate) PathBuf);

impl TempTensors {
    /// Writes `tensors` to `kiln-<name>-<pid>.safetensors` in the temporary folder.
    pub(crate) fn new(
        name: &str,
        tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    ) -> TempTensors {
        TempTensors::with_metadata(name, tensors, &[])
    }

    /// [`TempTensors::new`] with header metadata entries.
    pub(crate) fn with_metadata(
        name: &str,
        tensors: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
        metadata: &[(&str, &str)],
    ) -> TempTensors {
        let path =
            std::env::temp_dir().join(format!("kiln-{name}-{}.safetensors", std::process::id()));
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, (shape, values))| {
                (name, shape, values.iter().flat_map(|v| v.to_le_bytes()).collect())
            })
            .collect();
        let views = data.iter().map(|(name, shape, bytes)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .expect("a tensor");
            (name.clone(), view)
        });
        let metadata = (!metadata.is_empty())
            .then(|| metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
        safetensors::serialize_to_file(views, metadata, &path).expect("writes the file");
        TempTensors(path)
    }
}

impl Drop for TempTensors {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Asserts `got` is within relative error `tol` of `want`: ‖got − want‖∞ ≤ tol · max(‖want‖∞, 1e-6).
#[track_caller]
pub(crate) fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    assert_within(what, got, want, tol * scale);
}

/// Asserts every value of `got` is within `tol` of `want`'s (an absolute bound; NaN fails).
#[track_caller]
pub(crate) fn assert_within(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: {} values, want {}", got.len(), want.len());
    let (worst, at) = got
        .iter()
        .zip(want)
        .enumerate()
        .map(|(i, (g, w))| ((g - w).abs(), i))
        .fold((0f32, 0), |a, b| if b.0 > a.0 || b.0.is_nan() { b } else { a });
    assert!(
        worst <= tol,
        "{what}: max error {worst} at {at} (got {}, want {}) exceeds {tol}",
        got[at],
        want[at]
    );
}

/// Writes a safetensors file whose bf16 tensors of `shapes` are all zero, as a sparse file (real-sized VAEs
/// cost no disk).
pub(crate) fn write_header_only(path: &Path, shapes: &[(String, Vec<usize>)]) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in shapes {
        let len = shape.iter().product::<usize>() * 2;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut json = serde_json::to_vec(&serde_json::Value::Object(header)).expect("a header");
    json.resize(json.len().next_multiple_of(8), b' ');
    let mut bytes = (json.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&json);
    std::fs::write(path, &bytes).expect("writing a header");
    let file = std::fs::OpenOptions::new().write(true).open(path).expect("reopening");
    file.set_len((bytes.len() + offset) as u64).expect("extending the file");
}

/// The JSON fixture at `relative` (a reference script's recorded inputs and outputs).
pub(crate) fn json(relative: &str) -> serde_json::Value {
    let path = fixture(relative);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON list of token ids.
pub(crate) fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().expect("an id list").iter().map(|id| id.as_u64().expect("an id") as u32).collect()
}

/// The fixture `file`'s tensors with its token table `table` (a tiny network's first rows) tiled to `vocab` rows, so
/// that row `id % rows` answers every real id as the reference read it, written to a scratch file.
pub(crate) fn tiled_table(file: &str, table: &str, vocab: usize) -> TempTensors {
    let mut tensors = read_tensors(file);
    let (shape, values) = tensors.remove(table).expect("the token table");
    let (rows, width) = (shape[0], shape[1]);
    let tiled: Vec<f32> =
        (0..vocab).flat_map(|id| values[(id % rows) * width..][..width].to_vec()).collect();
    tensors.insert(table.to_owned(), (vec![vocab, width], tiled));
    TempTensors::new(file.replace('/', "-").trim_end_matches(".safetensors"), tensors)
}
