//! `SaveLatent` and `LoadLatent` (`nodes.py`): latents as ComfyUI's `.latent` files, safetensors holding
//! `latent_tensor` (the samples as they are, any shape: a video latent keeps its frames) and the empty marker
//! `latent_format_version_0`, with the prompt and workflow in the metadata. A file without the marker is of
//! the first format, whose latents were scaled by SD 1's 0.18215; `LoadLatent` divides them back.
//!
//! Invariant: only the samples are saved and loaded; the noise mask and batch indices do not travel.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kiln_compute::DType;

use super::files::{file_fingerprint, input_files, save_target};
use super::video::input_path;
use crate::media::python_json;
use crate::nodes::{
    Context, ErrorKind, FileKind, FileRef, Fingerprint, Hidden, InputDef, InputType, Inputs, Node,
    NodeError, NodeResult, NodeSpec, Output, OutputDef, UiOutput,
};
use crate::tensor::Tensor;
use crate::value::{Latent, Value};

/// The samples' tensor in a `.latent` file.
const TENSOR: &str = "latent_tensor";
/// The marker of the current format (an empty tensor).
const VERSION_0: &str = "latent_format_version_0";
/// SD 1's latent scale, which files without the marker carry.
const LEGACY_SCALE: f64 = 0.18215;

/// `SaveLatent`: the samples to `<prefix>_<counter:05>_.latent` in the output folder, passed on.
pub(super) struct SaveLatent(Arc<NodeSpec>);

impl SaveLatent {
    pub(super) fn new() -> SaveLatent {
        SaveLatent(Arc::new(
            NodeSpec::new("SaveLatent", "Save Latent", "model/latent")
                .input(InputDef::typed("samples", "LATENT"))
                .input(InputDef::string("filename_prefix", "latents/ComfyUI"))
                .hidden("prompt", Hidden::Prompt)
                .hidden("extra_pnginfo", Hidden::ExtraPngInfo)
                .output(OutputDef::new("LATENT").named("samples"))
                .output_node()
                .aliases(&["export latent"]),
        ))
    }
}

impl Node for SaveLatent {
    fn spec(&self) -> Arc<NodeSpec> {
        self.0.clone()
    }

    fn execute(&self, inputs: &Inputs, ctx: &Context) -> Result<NodeResult, NodeError> {
        let latent = inputs.latent("samples")?;
        let bytes = latent_file(&latent.samples, &metadata(ctx))?;
        let target = save_target(inputs.string("filename_prefix")?, ctx, FileKind::Output, (0, 0))?;
        let name = target.name.clone();
        let claimed =
            target.claim(target.counter, |counter| format!("{name}_{counter:05}_.latent"))?;
        let filename = claimed.fill(|path, mut file| {
            file.write_all(&bytes).map_err(|e| {
                NodeError::of_kind(ErrorKind::Io, format!("cannot write {}: {e}", path.display()))
            })
        })?;
        let file =
            FileRef { filename, subfolder: target.subfolder.clone(), kind: FileKind::Output };
        Ok(NodeResult {
            outputs: vec![Output::One(Value::Latent(latent.clone()))],
            ui: Some(UiOutput {
                named: vec![("latents".to_owned(), vec![file])],
                ..UiOutput::default()
            }),
        })
    }
}

/// SaveLatent's metadata: `prompt` (as Python's `json.dumps` writes it, empty without a prompt) and each
/// key of the workflow's `extra_pnginfo`.
fn metadata(ctx: &Context) -> HashMap<String, String> {
    let prompt = if ctx.prompt.is_null() { String::new() } else { python_json(&ctx.prompt) };
    let mut metadata = HashMap::from([("prompt".to_owned(), prompt)]);
    if let Some(extra) = ctx.extra_pnginfo.as_object() {
        metadata.extend(extra.iter().map(|(k, v)| (k.clone(), python_json(v))));
    }
    metadata
}

/// A `.latent` file's bytes: `samples` in f32 and the version marker, with `metadata`.
fn latent_file(samples: &Tensor, metadata: &HashMap<String, String>) -> Result<Vec<u8>, NodeError> {
    let data: Vec<u8> = samples.data().iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensors = [
        (VERSION_0, tensor_view(vec![0], &[])?),
        (TENSOR, tensor_view(samples.shape().to_vec(), &data)?),
    ];
    safetensors::serialize(tensors, Some(metadata.clone()))
        .map_err(|e| NodeError::new(format!("cannot write the latent: {e}")))
}

/// An f32 tensor of `shape` over `data`.
fn tensor_view(
    shape: Vec<usize>,
    data: &[u8],
) -> Result<safetensors::tensor::TensorView<'_>, NodeError> {
    safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape, data)
        .map_err(|e| NodeError::new(format!("cannot lay out the latent: {e}")))
}

/// `LoadLatent`: a `.latent` file of the input folder.
pub(super) struct LoadLatent {
    input_dir: PathBuf,
}

impl LoadLatent {
    pub(super) fn new(input_dir: PathBuf) -> LoadLatent {
        LoadLatent { input_dir }
    }
}

impl Node for LoadLatent {
    fn spec(&self) -> Arc<NodeSpec> {
        let mut latent = InputDef::typed("latent", "COMBO");
        latent.ty = InputType::Choices(input_files(&self.input_dir, &["latent"]));
        Arc::new(
            NodeSpec::new("LoadLatent", "Load Latent", "model/latent")
                .input(latent)
                .output(OutputDef::new("LATENT"))
                .validates(&["latent"])
                .aliases(&["import latent", "open latent"]),
        )
    }

    fn validate(&self, inputs: &Inputs) -> Result<(), String> {
        let name = inputs.string("latent").map_err(|e| e.message)?;
        input_path(&self.input_dir, name)
            .map(|_| ())
            .ok_or_else(|| format!("Invalid latent file: {name}"))
    }

    fn fingerprint(&self, inputs: &Inputs) -> Fingerprint {
        file_fingerprint(
            inputs.string("latent").ok().and_then(|n| input_path(&self.input_dir, n)).as_deref(),
        )
    }

    fn execute(&self, inputs: &Inputs, _: &Context) -> Result<NodeResult, NodeError> {
        let name = inputs.string("latent")?;
        let path = input_path(&self.input_dir, name).ok_or_else(|| {
            NodeError::of_kind(ErrorKind::FileNotFound, format!("Invalid latent file: {name}"))
        })?;
        let samples = read_latent(&path, name)?;
        Ok(NodeResult::values([Value::Latent(Latent::new(samples))]))
    }
}

/// The samples of the `.latent` file at `path` (`name` in messages) in f32, scaled back from the first
/// format's 0.18215 where the file has no version marker.
fn read_latent(path: &Path, name: &str) -> Result<Tensor, NodeError> {
    let bytes = std::fs::read(path)
        .map_err(|e| NodeError::of_kind(ErrorKind::Io, format!("cannot read {name}: {e}")))?;
    let invalid = |why: String| {
        NodeError::of_kind(ErrorKind::InvalidValue, format!("{name} is not a latent file: {why}"))
    };
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let tensor = file.tensor(TENSOR).map_err(|_| invalid(format!("it holds no `{TENSOR}`")))?;
    let dtype = DType::from_safetensors(tensor.dtype())
        .filter(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
        .ok_or_else(|| {
            invalid(format!("its samples are {:?}, not a float type", tensor.dtype()))
        })?;
    if tensor.shape().len() < 3 {
        return Err(invalid(format!(
            "its samples are {:?}, not a latent [B, C, H, W] or [B, C, T, H, W]",
            tensor.shape()
        )));
    }
    let mut values = kiln_compute::dtype::widen(dtype, tensor.data());
    if file.tensor(VERSION_0).is_err() {
        // Python's `1.0 / 0.18215`, a double, multiplies the f32 samples as an f32.
        let multiplier = (1.0 / LEGACY_SCALE) as f32;
        values.iter_mut().for_each(|v| *v *= multiplier);
    }
    Tensor::new(tensor.shape().to_vec(), values).map_err(|e| invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_path(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/latent_ops").join(name)
    }

    #[test]
    fn comfyuis_latent_files_load_and_the_first_format_is_scaled_back() {
        let io = crate::fixtures::tensors("latent_ops/io.safetensors");
        // SaveLatent's file of a video latent (`scripts/reference/latent_ops.py`): the samples as saved.
        let video = read_latent(&fixture_path("comfyui.latent"), "comfyui.latent").unwrap();
        assert_eq!(video, io["video"]);
        // A file without the version marker (f16 here) is divided by SD 1's 0.18215.
        let legacy = read_latent(&fixture_path("legacy.latent"), "legacy.latent").unwrap();
        let half = kiln_compute::dtype::narrow(DType::F16, io["a"].data());
        let want: Vec<f32> = kiln_compute::dtype::widen(DType::F16, &half)
            .iter()
            .map(|v| v * (1.0 / 0.18215f64) as f32)
            .collect();
        assert_eq!(legacy.shape(), io["a"].shape());
        assert_eq!(legacy.data(), want.as_slice());
        // Anything else is refused, naming the file.
        let Err(err) = read_latent(&fixture_path("io.safetensors"), "io.safetensors") else {
            panic!("a file without latent_tensor")
        };
        assert!(err.message.contains("io.safetensors") && err.message.contains(TENSOR), "{err:?}");
    }

    #[test]
    fn saved_latents_carry_the_workflow_and_load_back() {
        let dir = std::env::temp_dir().join(format!("kiln-save-latent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut ctx = crate::fixtures::quiet_context(&dir);
        ctx.prompt = Arc::new(serde_json::json!({"1": {"class_type": "SaveLatent"}}));
        ctx.extra_pnginfo = Arc::new(serde_json::json!({"workflow": {"nodes": []}}));
        let samples = Tensor::new(vec![1, 2, 3, 1, 2], (0..12).map(|v| v as f32 - 5.5).collect());
        let latent = Latent { batch_index: Some(vec![4]), ..Latent::new(samples.unwrap()) };
        let inputs = Inputs::from_values([
            ("samples".to_owned(), Value::Latent(latent.clone())),
            ("filename_prefix".to_owned(), Value::String("latents/wan".into())),
        ]);
        let node = SaveLatent::new();
        for counter in 1..=2 {
            let result = node.execute(&inputs, &ctx).unwrap();
            // The latent passes on whole; the file is listed under `latents`, ComfyUI's name.
            assert_eq!(result.outputs, vec![Output::One(Value::Latent(latent.clone()))]);
            let ui = result.ui.unwrap();
            let name = format!("wan_{counter:05}_.latent");
            let (key, files) = &ui.named[0];
            assert_eq!((key.as_str(), files[0].filename.as_str()), ("latents", name.as_str()));
            assert_eq!(files[0].subfolder, "latents");
            let path = dir.join("latents").join(&name);
            // The samples load back (without the batch indices), and the metadata holds the prompt and
            // workflow as ComfyUI writes them.
            assert_eq!(read_latent(&path, &name).unwrap(), latent.samples);
            let bytes = std::fs::read(&path).unwrap();
            let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
            let metadata = header.metadata().clone().unwrap();
            assert_eq!(metadata["prompt"], r#"{"1": {"class_type": "SaveLatent"}}"#);
            assert_eq!(metadata["workflow"], r#"{"nodes": []}"#);
            let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            assert_eq!(file.tensor(VERSION_0).unwrap().shape(), [0]);
        }
        // LoadLatent lists the input folder's `.latent` files and reads them.
        std::fs::copy(dir.join("latents/wan_00001_.latent"), dir.join("wan.latent")).unwrap();
        let load = LoadLatent::new(dir.clone());
        let spec = load.spec();
        let (input, _) = spec.input_def("latent").unwrap();
        assert_eq!(input.choices_list(), Some(vec!["wan.latent"]));
        let inputs =
            Inputs::from_values([("latent".to_owned(), Value::String("wan.latent".into()))]);
        assert_eq!(load.validate(&inputs), Ok(()));
        let loaded = load.execute(&inputs, &ctx).unwrap();
        assert_eq!(
            loaded.outputs,
            vec![Output::One(Value::Latent(Latent::new(latent.samples.clone())))]
        );
        let missing =
            Inputs::from_values([("latent".to_owned(), Value::String("gone.latent".into()))]);
        assert_eq!(load.validate(&missing), Err("Invalid latent file: gone.latent".to_owned()));
        let _ = std::fs::remove_dir_all(dir);
    }
}
