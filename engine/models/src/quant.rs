//! ComfyUI's quantized weight files (weight-formats.md §3, §4): which layers of a file are quantized, in which
//! format, and the quantization a load plan's weights carry.
//!
//! Three encodings say the same thing, and ComfyUI reads them in this order:
//! - the header's `__metadata__["_quantization_metadata"]`: `{"layers": {"<layer>": {"format": "..."}}}`;
//! - a `<layer>.comfy_quant` tensor per layer: U8 bytes of the same per-layer JSON;
//! - the legacy `scaled_fp8` marker (`<prefix>scaled_fp8`): every `<layer>.scale_weight` makes its layer
//!   `float8_e4m3fn`, scaled by that value.
//!
//! Kiln runs the formats ComfyUI's CPU path runs, as it runs them: the per-tensor fp8 formats and the block
//! formats (`mxfp8`, `nvfp4`) dequantized (activation scales, `input_scale`, belong to the GEMMs of recent GPUs
//! and are not used), and `int8_tensorwise` (with or without ConvRot) with int8 activations, as comfy-kitchen
//! runs it on every device. The weights stay quantized in memory: a slot holds the stored values and, for the
//! row and block formats, their scale table right after them ([`kiln_compute::quant::Quant`]). The 4-bit
//! integer formats (`convrot_w4a4`, `asym_w4a8_int8`) and AWQ smoothing (`pre_quant_scale`) are refused
//! naming the format and the layer.

use std::collections::BTreeMap;

use kiln_compute::DType;
use kiln_compute::memory::{LoadPlan, SafetensorsFile};
use kiln_compute::quant::Quant;

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
    /// ConvRot's group size (`int8_tensorwise` with `"convrot": true`).
    convrot: Option<usize>,
}

/// How a model runs its quantized linear layers, as ComfyUI builds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinearPath {
    /// Int8 weights with int8 activations (ComfyUI's diffusion models, on every device).
    Quantized,
    /// Every quantized weight dequantized first (ComfyUI's text encoders and VAEs: `full_precision_mm`).
    Dequantized,
}

/// The quantized layers of one file, by layer key (the weight's key without `.weight`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Quantization {
    layers: BTreeMap<String, Layer>,
}

/// Whether `name` is bytes a file carries beside its weights, not a weight (FLUX.2 dev's Mistral file keeps its
/// Tekken tokenizer's JSON in the uint8 tensor `tekken_model`, a umT5 file its SentencePiece model in
/// `spiece_model`).
fn is_embedded_data(name: &str) -> bool {
    let last = name.rsplit('.').next();
    last == Some(crate::mistral3::TEKKEN) || last == Some(crate::t5::SPIECE_MODEL)
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
        let markers: Vec<String> =
            file.names().filter(|name| name.ends_with(MARKER_SUFFIX)).map(str::to_owned).collect();
        for marker in markers {
            let layer = marker.trim_end_matches(MARKER_SUFFIX).to_owned();
            let bytes = file.raw_bytes(&marker)?;
            let config: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| unsupported(format!("`{marker}` is not JSON: {e}")))?;
            let parsed = comfy_quant_layer(&layer, &config, &unsupported)?;
            layers.insert(layer, parsed);
        }
        if !layers.is_empty() {
            return Ok(Quantization { layers });
        }
        let scaled_fp8 = file.names().any(|name| {
            name == SCALED_FP8_MARKER || name.ends_with(&format!(".{SCALED_FP8_MARKER}"))
        });
        if scaled_fp8 {
            for (name, _) in file.tensors() {
                if let Some(layer) = name.strip_suffix(".scale_weight") {
                    let format = "float8_e4m3fn".to_owned();
                    let scale_key = name.to_owned();
                    layers.insert(layer.to_owned(), Layer { format, scale_key, convrot: None });
                }
            }
        }
        Ok(Quantization { layers })
    }

    /// Whether no layer is quantized.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Whether a layer is quantized in a format whose weights keep a scale table (int8, MXFP8, NVFP4): such
    /// a weight cannot be cast to another dtype at load.
    pub fn has_tables(&self) -> bool {
        self.layers
            .values()
            .any(|l| matches!(l.format.as_str(), "int8_tensorwise" | "mxfp8" | "nvfp4"))
    }

    /// Whether `key` is quantization bookkeeping rather than a weight of the model: a marker, a scale, the
    /// legacy marker.
    pub fn is_bookkeeping(key: &str) -> bool {
        key == SCALED_FP8_MARKER
            || key.ends_with(&format!(".{SCALED_FP8_MARKER}"))
            || [
                MARKER_SUFFIX,
                ".weight_scale",
                ".weight_scale_2",
                ".scale_weight",
                ".input_scale",
                ".scale_input",
            ]
            .iter()
            .any(|suffix| key.ends_with(suffix))
    }

    /// Refuses a file with a layer under `prefix` in a format Kiln cannot run, naming the format and the layer,
    /// and integer tensors under `prefix` that no quantized layer explains.
    pub fn refuse_unsupported(&self, file: &SafetensorsFile, prefix: &str) -> Result<()> {
        let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
        for (layer, l) in self.layers.iter().filter(|(layer, _)| layer.starts_with(prefix)) {
            if !is_supported(&l.format) {
                return Err(unsupported(format!(
                    "`{layer}` is quantized as `{}` ({}), which Kiln cannot run yet; use a bf16, fp8, scaled \
                     fp8, int8, MXFP8 or NVFP4 file",
                    l.format,
                    describe(&l.format)
                )));
            }
            if file.names().any(|n| n == format!("{layer}.pre_quant_scale")) {
                return Err(unsupported(format!(
                    "`{layer}` has AWQ smoothing (`pre_quant_scale`), which Kiln cannot run yet"
                )));
            }
        }
        let stray = file.tensors().find(|(name, info)| {
            name.starts_with(prefix)
                && matches!(info.dtype, DType::I8 | DType::U8)
                && !Self::is_bookkeeping(name)
                && !is_embedded_data(name)
                && !name.strip_suffix(".weight").is_some_and(|l| self.layers.contains_key(l))
        });
        match stray {
            Some((name, info)) => Err(unsupported(format!(
                "`{name}` is {}, but no quantization format says what its integers stand for",
                info.dtype
            ))),
            None => Ok(()),
        }
    }

    /// Gives each weight of `plan` made of quantized layers of `file` (plan file 0) its quantization. A
    /// weight joined from several parts needs all of them quantized per tensor with one scale.
    pub fn apply(
        &self,
        file: &SafetensorsFile,
        plan: &mut LoadPlan,
        path: LinearPath,
    ) -> Result<()> {
        if self.layers.is_empty() {
            return Ok(());
        }
        let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
        for slot in &mut plan.slots {
            let mut quants = Vec::with_capacity(slot.parts.len());
            for (_, key) in &slot.parts {
                let layer = key.strip_suffix(".weight").and_then(|l| self.layers.get(l));
                quants.push(match layer {
                    Some(layer) => Some(self.quant(file, key, layer, path)?),
                    None => None,
                });
            }
            match &quants[..] {
                [Some((quant, table))] => {
                    slot.quant = *quant;
                    slot.table.clone_from(table);
                }
                [first, rest @ ..] => {
                    let first = first.as_ref().map(|(q, _)| *q);
                    let same = rest.iter().all(|q| q.as_ref().map(|(q, _)| *q) == first);
                    match first {
                        _ if !same => {
                            return Err(unsupported(format!(
                                "`{}` is joined from parts quantized differently; Kiln cannot run such a file \
                                 yet",
                                slot.name
                            )));
                        }
                        Some(quant) if quant.has_table() => {
                            return Err(unsupported(format!(
                                "`{}` is joined from parts quantized as {}, whose scale tables cannot be \
                                 joined yet; use a file in ComfyUI's layout",
                                slot.name,
                                quant.name()
                            )));
                        }
                        Some(quant) => slot.quant = quant,
                        None => {}
                    }
                }
                [] => {}
            }
        }
        Ok(())
    }

    /// The quantization of `layer`'s weight `key` and its table's tensors, checking the weight and its scales
    /// are stored as its format says.
    fn quant(
        &self,
        file: &SafetensorsFile,
        key: &str,
        layer: &Layer,
        path: LinearPath,
    ) -> Result<(Quant, Vec<(usize, String)>)> {
        let unsupported = |msg: String| Error::Unsupported { path: file.path().to_path_buf(), msg };
        let (want, what) = match layer.format.as_str() {
            "float8_e4m3fn" => (DType::F8E4M3, "fp8 e4m3fn"),
            "float8_e5m2" => (DType::F8E5M2, "fp8 e5m2"),
            "int8_tensorwise" => (DType::I8, "int8"),
            "mxfp8" => (DType::F8E4M3, "fp8 e4m3fn"),
            "nvfp4" => (DType::U8, "packed 4-bit codes (U8)"),
            other => {
                return Err(unsupported(format!(
                    "`{key}` is quantized as `{other}` ({}), which Kiln cannot run yet",
                    describe(other)
                )));
            }
        };
        let weight = file.tensor(key)?;
        let &[rows, stored] = &weight.shape[..] else {
            return Err(unsupported(format!(
                "`{key}` is {:?}: a quantized weight is a matrix",
                weight.shape
            )));
        };
        if weight.dtype != want {
            return Err(unsupported(format!(
                "`{key}` is {} but its layer is quantized as `{}`, stored as {what}",
                weight.dtype, layer.format
            )));
        }
        let (_, scale_len) = file.raw_range(&layer.scale_key).map_err(|_| {
            unsupported(format!("`{key}` is quantized but `{}` is missing", layer.scale_key))
        })?;
        let scalar = |name: &str| -> Result<f32> {
            let info = file.tensor(name).map_err(|_| {
                unsupported(format!(
                    "`{key}` is quantized as `{}` but `{name}` is missing",
                    layer.format
                ))
            })?;
            if info.shape.iter().product::<usize>() != 1 {
                return Err(unsupported(format!("`{name}` is {:?}, not one value", info.shape)));
            }
            let bytes = file.source().read_vec(info.offset, info.len)?;
            let value = kiln_compute::dtype::widen(info.dtype, &bytes)
                .first()
                .copied()
                .ok_or_else(|| unsupported(format!("`{name}` holds no value")))?;
            if !value.is_finite() {
                return Err(unsupported(format!("`{name}` is {value}")));
            }
            Ok(value)
        };
        let table = vec![(0, layer.scale_key.clone())];
        let block_table = |quant: Quant, block: usize| -> Result<(Quant, Vec<(usize, String)>)> {
            let cols = quant.row_values(stored);
            let want = quant.table_bytes(rows, cols) as u64;
            if !cols.is_multiple_of(block) || scale_len != want {
                return Err(unsupported(format!(
                    "`{}` holds {scale_len} bytes; a {} weight of {rows} rows of {cols} values needs {want} \
                     (blocks of {block}, swizzled)",
                    layer.scale_key,
                    quant.name()
                )));
            }
            Ok((quant, table.clone()))
        };
        match layer.format.as_str() {
            "int8_tensorwise" => {
                let scale = file.tensor(&layer.scale_key)?;
                let count = scale.shape.iter().product::<usize>();
                if scale.dtype != DType::F32 || (count != 1 && count != rows) {
                    return Err(unsupported(format!(
                        "`{}` is {} {:?}; int8 scales are f32, one or one per row of {rows}",
                        layer.scale_key, scale.dtype, scale.shape
                    )));
                }
                if let Some(g) = layer.convrot
                    && (kiln_compute::quant::hadamard(g).is_none() || !stored.is_multiple_of(g))
                {
                    return Err(unsupported(format!(
                        "`{key}` is rotated in groups of {g} (ConvRot): the group must be a power of 4 \
                         dividing its {stored} columns"
                    )));
                }
                let activations = path == LinearPath::Quantized;
                Ok((
                    Quant::Int8 { per_row: count != 1, convrot: layer.convrot, activations },
                    table,
                ))
            }
            "mxfp8" => block_table(Quant::Mxfp8, kiln_compute::quant::MXFP8_BLOCK),
            "nvfp4" => {
                let global = scalar(&format!("{}_2", layer.scale_key))?;
                block_table(Quant::Nvfp4 { global }, kiln_compute::quant::NVFP4_BLOCK)
            }
            _ => {
                let value = scalar(&layer.scale_key)?;
                Ok((Quant::Tensor(value), Vec::new()))
            }
        }
    }
}

/// A layer of the `comfy_quant` encodings: its format, its scale under `<layer>.weight_scale`, and ConvRot's
/// group (`convrot` and `convrot_groupsize` at the top level or under `params`; 256 by default).
fn comfy_quant_layer(
    layer: &str,
    config: &serde_json::Value,
    unsupported: &dyn Fn(String) -> Error,
) -> Result<Layer> {
    let format = config
        .get("format")
        .and_then(serde_json::Value::as_str)
        .ok_or_else(|| unsupported(format!("the quantization of `{layer}` names no format")))?;
    let get = |name: &str| config.get(name).or_else(|| config.get("params")?.get(name));
    let convrot = get("convrot").and_then(serde_json::Value::as_bool).unwrap_or(false);
    let group = get("convrot_groupsize").and_then(serde_json::Value::as_u64).unwrap_or(256);
    Ok(Layer {
        format: format.to_owned(),
        scale_key: format!("{layer}.weight_scale"),
        convrot: convrot.then_some(group as usize),
    })
}

/// Whether Kiln runs `format`.
fn is_supported(format: &str) -> bool {
    matches!(format, "float8_e4m3fn" | "float8_e5m2" | "int8_tensorwise" | "mxfp8" | "nvfp4")
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
