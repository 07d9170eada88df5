//! Test support: the f32 tensors of a fixture file under `engine/tests/fixtures/` (written by a
//! `scripts/reference/` script from the reference's own code).

use std::collections::BTreeMap;

use crate::tensor::Tensor;

/// Every tensor of `tests/fixtures/<path>` (a safetensors file of f32 tensors), by name.
pub(crate) fn tensors(path: &str) -> BTreeMap<String, Tensor> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(path);
    read_f32(&file)
        .into_iter()
        .map(|(name, (shape, values))| (name, Tensor::new(shape, values).expect("a tensor")))
        .collect()
}

/// Every tensor of the safetensors file `file` (f32 or bf16) as f32 with its shape, by name.
fn read_f32(file: &std::path::Path) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let read = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    read.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values = match view.dtype() {
                safetensors::Dtype::BF16 => view
                    .data()
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
                safetensors::Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                other => panic!("{}: {name} is {other:?}", file.display()),
            };
            (name, (view.shape().to_vec(), values))
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

/// The tensors of a kiln-models fixture (`engine/models/tests/fixtures/<path>`, f32 or bf16) as f32 with their
/// shapes, by name.
pub(crate) fn model_tensors(path: &str) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    read_f32(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/tests/fixtures").join(path),
    )
}

/// The tiny Wan DiT's expert variant (`scripts/reference/wan.py`'s `variant(.., "expert", ..)`): kiln-models'
/// `wan/weights.safetensors` without the image branch (36 channels in: latent, mask and image latent).
pub(crate) fn tiny_wan_expert() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    model_tensors("wan/weights.safetensors")
        .into_iter()
        .filter(|(name, _)| !name.starts_with("img_emb.") && !name.contains("_img."))
        .collect()
}

/// The tiny Wan DiT's t2v variant (`wan.py`'s `variant(.., "t2v", ..)`): the expert variant with its patch
/// embedding cut to the 16 latent channels.
pub(crate) fn tiny_wan_t2v() -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let mut t = tiny_wan_expert();
    let (shape, values) = t["patch_embedding.weight"].clone();
    let row = values.len() / shape[0];
    let keep = 16 * row / shape[1];
    let latent_only = values.chunks(row).flat_map(|r| r[..keep].iter().copied()).collect();
    let mut cut = shape.clone();
    cut[1] = 16;
    t.insert("patch_embedding.weight".into(), (cut, latent_only));
    t
}

/// Writes f32 `tensors` (name → shape and values) to `path` as a safetensors file, creating its folder.
pub(crate) fn write_f32(
    path: &std::path::Path,
    tensors: &BTreeMap<String, (Vec<usize>, Vec<f32>)>,
) {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, (shape, values))| {
            (name.clone(), shape.clone(), values.iter().flat_map(|v| v.to_le_bytes()).collect())
        })
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = bytes
        .iter()
        .map(|(name, shape, data)| {
            let view =
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                    .expect("a consistent tensor");
            (name.clone(), view)
        })
        .collect();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("the fixture's folder");
    }
    safetensors::serialize_to_file(views, None, path).expect("writing a safetensors file");
}

/// The context windows the Wan window fixtures use (`scripts/reference/wan_windows.py`): 3 latent frames
/// overlapping by 1, static standard schedule, pyramid fuse, no FreeNoise, the first frame's conditioning
/// retained, the causal fix.
pub(crate) fn wan_windows() -> crate::models::context_windows::ContextWindows {
    use crate::models::context_windows::{ContextWindows, Fuse, Schedule};
    ContextWindows {
        schedule: Schedule::StaticStandard,
        fuse: Fuse::Pyramid,
        length: 3,
        overlap: 1,
        stride: 1,
        closed_loop: false,
        dim: 2,
        freenoise: false,
        cond_retain: vec![0],
        split_conds: false,
        latent_retain: Vec::new(),
        causal_fix: true,
    }
}

/// Runs `node` on `inputs` (name, value) with [`quiet_context`] in the temporary folder and returns its
/// outputs' values, one per output.
pub(crate) fn node_outputs(
    node: &dyn crate::nodes::Node,
    inputs: Vec<(&str, crate::value::Value)>,
) -> Result<Vec<crate::value::Value>, crate::nodes::NodeError> {
    let inputs =
        crate::nodes::Inputs::from_values(inputs.into_iter().map(|(k, v)| (k.to_owned(), v)));
    let ctx = quiet_context(&std::env::temp_dir());
    let result = node.execute(&inputs, &ctx)?;
    Ok(result
        .outputs
        .into_iter()
        .map(|o| match o {
            crate::nodes::Output::One(v) => v,
            other => panic!("one value per output, not {other:?}"),
        })
        .collect())
}

/// The tensors `node` outputs for `inputs` (each an `IMAGE` or a `MASK`), in order.
pub(crate) fn node_tensors(
    node: &dyn crate::nodes::Node,
    inputs: Vec<(&str, crate::value::Value)>,
) -> Vec<crate::tensor::Tensor> {
    let name = node.spec().name.clone();
    node_outputs(node, inputs)
        .unwrap_or_else(|e| panic!("{name}: {}", e.message))
        .into_iter()
        .map(|v| match v {
            crate::value::Value::Image(t) | crate::value::Value::Mask(t) => t,
            other => panic!("{name}: not an image or a mask: {other:?}"),
        })
        .collect()
}

/// kiln-models' tiny Wan 2.1 VAE (`wan_vae/weights.safetensors`, ComfyUI's names) written as f32 into `dir`
/// and loaded on the CPU, with the model environment it was loaded in.
pub(crate) fn tiny_wan_vae(dir: &std::path::Path) -> (crate::models::ModelEnv, crate::models::Vae) {
    let path = dir.join("vae.safetensors");
    write_f32(&path, &model_tensors("wan_vae/weights.safetensors"));
    let env = crate::models::ModelEnv::cpu(dir);
    let vae = crate::models::load::load_vae(&env, &path, &mut |_, _| {}).expect("the tiny VAE");
    (env, vae)
}

/// The tiny Wan DiT's t2v variant ([`tiny_wan_t2v`]) written as f32 into `dir` and loaded on the CPU as a
/// `MODEL` (WAN21's sampling, shift 8), with the model environment it was loaded in.
pub(crate) fn tiny_wan_t2v_model(
    dir: &std::path::Path,
) -> (crate::models::ModelEnv, crate::models::DiffusionModel) {
    let path = dir.join("t2v.safetensors");
    write_f32(&path, &tiny_wan_t2v());
    let env = crate::models::ModelEnv::cpu(dir);
    let model = crate::models::load::load_diffusion_model(&env, &path, None, &mut |_, _| {})
        .expect("the tiny Wan model");
    (env, model)
}
