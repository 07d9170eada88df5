//! ComfyUI's quantized weight files (weight-formats.md §3, §4): which layers of a file are quantized, in which
//! format, and the per-tensor scales a load plan's weights carry.
//!
//! Three encodings say the same thing, and ComfyUI reads them in this order:
//! - the header's `__metadata__["_quantization_metadata"]`: `{"layers": {"<layer>": {"format": "..."}}}`;
//! - a `<layer>.comfy_quant` tensor per layer: U8 bytes of the same per-layer JSON;
//! - the legacy `scaled_fp8` marker (`<prefix>scaled_fp8`): every `<layer>.scale_weight` makes its layer
//!   `float8_e4m3fn`, scaled by that value.
//!
//! Kiln runs the per-tensor fp8 formats (`float8_e4m3fn`, `float8_e5m2`) as ComfyUI's dequantizing path does:
//! the weight stays fp8 in memory and is read as `fp8 · scale` (`Weight::scale`). Activation scales
//! (`input_scale`) belong to the fp8 GEMM path ComfyUI takes on recent GPUs only and are not used. Every other
//! format (int8, nvfp4, mxfp8, the int4 ones) is refused naming the format and the layer.

use std::collections::BTreeMap;

use kiln_compute::DType;
use kiln_compute::memory::{LoadPlan, SafetensorsFile};

use crate::error::{Error, Result};

/// The header metadata key of ComfyUI's per-layer quantization map.
const METADATA_KEY: &str = "_quantization_metadata";
/// The suffix of a layer's quantization marker tensor.
const MARKER_SUFFIX: &str = ".comfy_quant";
/// The key suffix of the legacy scaled-fp8 marker.
const SCALED_FP8_MARKER: &str = "scaled_fp8";

/// One quantized layer of a file.
#[derive(Debug, Clone, PartialEq)]
struct Layer {
    /// ComfyUI's format name (`float8_e4m3fn`, `int8_tensorwise`, ...).
    format: String,
    /// The key of the weight's scale tensor.
    scale_key: String,
}

/// The quantized layers of one file, by layer key (the weight's key without `.weight`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quantization {
    layers: BTreeMap<String, Layer>,
}

impl Quantization {
    /// Reads which layers of `file` are quantized, from whichever encoding it uses (none: no layer).
    pub fn read(file: &SafetensorsFile) -> Result<Quantization> {
        let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
        let mut layers = BTreeMap::new();
        if let Some(json) = file.metadata().get(METADATA_KEY) {
            let parsed: serde_json::Value = serde_json::from_str(json)
                .map_err(|e| unsupported(format!("`{METADATA_KEY}` is not JSON: {e}")))?;
            let Some(entries) = parsed.get("layers").and_then(serde_json::Value::as_object) else {
                return Err(unsupported(format!("`{METADATA_KEY}` has no `layers` object")));
            };
            for (layer, config) in entries {
                layers.insert(layer.clone(), comfy_quant_layer(layer, config, &unsupported)?);
            }
            return Ok(Quantization { layers });
        }
        let markers: Vec<String> = file
            .unsupported()
            .filter(|(name, _)| name.ends_with(MARKER_SUFFIX))
            .map(|(name, _)| name.to_owned())
            .collect();
        for marker in markers {
            let layer = marker.trim_end_matches(MARKER_SUFFIX).to_owned();
            let bytes = file
                .unsupported_bytes(&marker)
                .ok_or_else(|| unsupported(format!("no tensor `{marker}`")))??;
            let config: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| unsupported(format!("`{marker}` is not JSON: {e}")))?;
            let parsed = comfy_quant_layer(&layer, &config, &unsupported)?;
            layers.insert(layer, parsed);
        }
        if !layers.is_empty() {
            return Ok(Quantization { layers });
        }
        let scaled_fp8 = file
            .tensors()
            .map(|(name, _)| name)
            .chain(file.unsupported().map(|(name, _)| name))
            .any(|name| {
                name == SCALED_FP8_MARKER || name.ends_with(&format!(".{SCALED_FP8_MARKER}"))
            });
        if scaled_fp8 {
            for (name, _) in file.tensors() {
                if let Some(layer) = name.strip_suffix(".scale_weight") {
                    let format = "float8_e4m3fn".to_owned();
                    layers.insert(layer.to_owned(), Layer { format, scale_key: name.to_owned() });
                }
            }
        }
        Ok(Quantization { layers })
    }

    /// Whether no layer is quantized.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Whether `key` is quantization bookkeeping rather than a weight of the model: a marker, a scale, the
    /// legacy marker.
    pub fn is_bookkeeping(key: &str) -> bool {
        key == SCALED_FP8_MARKER
            || key.ends_with(&format!(".{SCALED_FP8_MARKER}"))
            || [MARKER_SUFFIX, ".weight_scale", ".scale_weight", ".input_scale", ".scale_input"]
                .iter()
                .any(|suffix| key.ends_with(suffix))
    }

    /// Refuses a file with a layer under `prefix` in a format Kiln cannot run, naming the format and the layer.
    pub fn refuse_unsupported(&self, file: &SafetensorsFile, prefix: &str) -> Result<()> {
        let refused = self
            .layers
            .iter()
            .find(|(layer, l)| layer.starts_with(prefix) && !is_per_tensor_fp8(&l.format));
        match refused {
            None => Ok(()),
            Some((layer, l)) => Err(Error::Unsupported {
                path: file.path().to_path_buf(),
                msg: format!(
                    "`{layer}` is quantized as `{}` ({}), which Kiln cannot run yet; use a bf16, fp8 or \
                     scaled fp8 file",
                    l.format,
                    describe(&l.format)
                ),
            }),
        }
    }

    /// Gives each weight of `plan` made of quantized layers of `file` (plan file 0) its scale. A weight joined
    /// from several parts needs all of them quantized with one scale.
    pub fn apply(&self, file: &SafetensorsFile, plan: &mut LoadPlan) -> Result<()> {
        if self.layers.is_empty() {
            return Ok(());
        }
        let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
        for slot in &mut plan.slots {
            let mut scales = Vec::with_capacity(slot.parts.len());
            for (_, key) in &slot.parts {
                let layer = key.strip_suffix(".weight").and_then(|l| self.layers.get(l));
                scales.push(match layer {
                    Some(layer) => Some(self.scale(file, key, layer)?),
                    None => None,
                });
            }
            let first = scales.first().copied().flatten();
            if scales.iter().any(|s| *s != first) {
                return Err(unsupported(format!(
                    "`{}` is joined from parts quantized with different scales ({scales:?}); Kiln cannot \
                     run such a file yet",
                    slot.name
                )));
            }
            slot.scale = first;
        }
        Ok(())
    }

    /// The per-tensor scale of `layer`'s weight `key`, checking the weight is stored as its format says.
    fn scale(&self, file: &SafetensorsFile, key: &str, layer: &Layer) -> Result<f32> {
        let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
        let want = match layer.format.as_str() {
            "float8_e4m3fn" => DType::F8E4M3,
            "float8_e5m2" => DType::F8E5M2,
            other => {
                return Err(unsupported(format!(
                    "`{key}` is quantized as `{other}` ({}), which Kiln cannot run yet",
                    describe(other)
                )));
            }
        };
        let weight = file.tensor(key)?;
        if weight.dtype != want {
            return Err(unsupported(format!(
                "`{key}` is {} but its layer is quantized as `{}`",
                weight.dtype, layer.format
            )));
        }
        let scale = file.tensor(&layer.scale_key).map_err(|_| {
            unsupported(format!("`{key}` is quantized but `{}` is missing", layer.scale_key))
        })?;
        if scale.shape.iter().product::<usize>() != 1 {
            return Err(unsupported(format!(
                "`{}` is {:?}: Kiln runs per-tensor fp8 scales only",
                layer.scale_key, scale.shape
            )));
        }
        let bytes = file.source().read_vec(scale.offset, scale.len)?;
        let value = kiln_compute::dtype::widen(scale.dtype, &bytes)
            .first()
            .copied()
            .ok_or_else(|| unsupported(format!("`{}` holds no value", layer.scale_key)))?;
        if !value.is_finite() {
            return Err(unsupported(format!("`{}` is {value}", layer.scale_key)));
        }
        Ok(value)
    }
}

/// A layer of the `comfy_quant` encodings: its format, and its scale under `<layer>.weight_scale`.
fn comfy_quant_layer(
    layer: &str,
    config: &serde_json::Value,
    unsupported: &dyn Fn(String) -> Error,
) -> Result<Layer> {
    let format = config
        .get("format")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| unsupported(format!("the quantization of `{layer}` names no format")))?;
    Ok(Layer { format: format.to_owned(), scale_key: format!("{layer}.weight_scale") })
}

/// Whether Kiln runs `format`: the per-tensor fp8 formats.
fn is_per_tensor_fp8(format: &str) -> bool {
    matches!(format, "float8_e4m3fn" | "float8_e5m2")
}

/// A format in words, for refusals.
fn describe(format: &str) -> &'static str {
    match format {
        "float8_e4m3fn" | "float8_e5m2" => "ComfyUI's per-tensor fp8",
        "mxfp8" => "ComfyUI's block-scaled MXFP8",
        "nvfp4" => "ComfyUI's NVFP4 4-bit",
        "int8_tensorwise" => "ComfyUI's int8 with int8 activations",
        "convrot_w4a4" => "ComfyUI's rotated 4-bit weights and activations",
        "asym_w4a8_int8" => "ComfyUI's 4-bit weights with int8 activations",
        _ => "a quantization format ComfyUI's loader does not list either",
    }
}
