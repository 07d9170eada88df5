//! [`Header`]: the tensors of a safetensors file seen under a key prefix, as detection reads them (names,
//! dtypes, shapes; the values of a small tensor only where ComfyUI's detection reads them).

use std::path::Path;

use kiln_compute::memory::{LoadPlan, SafetensorsFile, SlotPlan, TensorInfo};

use crate::error::{Error, Result};

/// Where transformers' multimodal files (Qwen3-VL's, `qwen3vl_4b_bf16.safetensors`) keep their language model's
/// `model.*` tensors.
pub const NESTED_LANGUAGE_MODEL: &str = "model.language_model.";

/// How such a file's names map to the ones Kiln reads (ComfyUI's `state_dict_prefix_replace` in
/// `load_text_encoder_state_dicts`, read backwards): `(Kiln's prefix, the file's)`, the first that matches.
const NESTED_NAMES: [(&str, &str); 3] = [
    ("model.lm_head.", "lm_head."),
    ("model.", NESTED_LANGUAGE_MODEL),
    ("visual.", "model.visual."),
];

/// A safetensors file's tensors whose names start with `prefix`, by their names without it (a checkpoint's
/// `model.diffusion_model.`, `vae.`, `text_encoders.qwen3_4b.transformer.`; empty for a standalone file).
///
/// A file whose language model is nested under [`NESTED_LANGUAGE_MODEL`] (transformers' layout) is read under
/// ComfyUI's names for it: `model.layers.0.…` is the file's `model.language_model.layers.0.…`, `visual.…` its
/// `model.visual.…`, `model.lm_head.…` its `lm_head.…` ([`Header::key`]; [`Header::names`] and
/// [`Header::unsupported_dtypes`] list the file's own names).
#[derive(Debug, Clone, Copy)]
pub struct Header<'f> {
    file: &'f SafetensorsFile,
    prefix: &'f str,
    nested_language_model: bool,
}

impl<'f> Header<'f> {
    /// The tensors of `file` under `prefix` (its language model's, when nested: see [`Header`]).
    pub fn new(file: &'f SafetensorsFile, prefix: &'f str) -> Header<'f> {
        let nested_embedding = format!("{prefix}{NESTED_LANGUAGE_MODEL}embed_tokens.weight");
        let nested_language_model = file.tensor(&nested_embedding).is_ok();
        Header { file, prefix, nested_language_model }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// The value of the file's header metadata entry `key` (`__metadata__`), if it has one.
    pub fn metadata(&self, key: &str) -> Option<&'f str> {
        self.file.metadata().get(key).map(String::as_str)
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        self.prefix
    }

    /// The full key of `name` in the file (the prefix put back, and a nested language model's names mapped).
    pub fn key(&self, name: &str) -> String {
        let nested = NESTED_NAMES.iter().find_map(|&(kiln, file)| {
            let rest = name.strip_prefix(kiln)?;
            self.nested_language_model.then(|| format!("{}{file}{rest}", self.prefix))
        });
        nested.unwrap_or_else(|| format!("{}{name}", self.prefix))
    }

    /// A load plan (this file alone) whose slots are `names`, each read from the tensor of that name.
    pub fn plan_by_name(&self, names: impl IntoIterator<Item = String>) -> LoadPlan {
        let slots = names
            .into_iter()
            .map(|name| {
                let key = self.key(&name);
                SlotPlan::new(name, vec![(0, key)])
            })
            .collect();
        LoadPlan { files: vec![self.path().to_path_buf()], slots }
    }

    /// How many numbered blocks `prefix0.`, `prefix1.`, … the header has before the first gap (`prefix` ends in
    /// a dot; tensors of any dtype count), and the first index after a gap, if any.
    fn numbered(&self, prefix: &str) -> (usize, Option<usize>) {
        let blocks = self.key(prefix);
        let indices: std::collections::BTreeSet<usize> = self
            .file
            .tensors()
            .map(|(n, _)| n)
            .chain(self.file.unsupported().map(|(n, _)| n))
            .filter_map(|n| n.strip_prefix(blocks.as_str())?.split_once('.')?.0.parse().ok())
            .collect();
        let count = indices.iter().zip(0..).take_while(|&(&i, want)| i == want).count();
        (count, indices.iter().nth(count).copied())
    }

    /// How many blocks `prefix0.`, `prefix1.`, … run from 0 without a gap (`prefix` ends in a dot).
    pub fn count_blocks(&self, prefix: &str) -> usize {
        self.numbered(prefix).0
    }

    /// [`Header::count_blocks`], where a gap is [`Error::Unsupported`]: "`what` stop at N but go on at …"
    /// (`what`: "a T5 layout whose blocks").
    pub fn gapless_blocks(&self, prefix: &str, what: &str) -> Result<usize> {
        match self.numbered(prefix) {
            (count, None) => Ok(count),
            (count, Some(gap)) => Err(self.unsupported(format!(
                "{what} stop at {count} but go on at {}",
                self.key(&format!("{prefix}{gap}."))
            ))),
        }
    }

    /// A tensor by its name under the prefix.
    pub fn get(&self, name: &str) -> Option<&'f TensorInfo> {
        self.file.tensor(&self.key(name)).ok()
    }

    /// Whether the tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A tensor's shape.
    pub fn shape(&self, name: &str) -> Option<&'f [usize]> {
        self.get(name).map(|t| t.shape.as_slice())
    }

    /// The shape of the values a tensor stands for: its own, except for an NVFP4 weight (U8 codes with a
    /// `<layer>.weight_scale_2` global scale beside it), whose rows hold two values per stored byte.
    pub fn values_shape(&self, name: &str) -> Option<Vec<usize>> {
        let info = self.get(name)?;
        let mut shape = info.shape.clone();
        let nvfp4 = info.dtype == kiln_compute::DType::U8
            && shape.len() == 2
            && name
                .strip_suffix(".weight")
                .is_some_and(|layer| self.has(&format!("{layer}.weight_scale_2")));
        if nvfp4 {
            shape[1] *= 2;
        }
        Some(shape)
    }

    /// The dtype that holds the most elements under the prefix (ComfyUI's `weight_dtype`, which picks the type a
    /// model computes in); `None` for an empty header. A tie goes to the type named first in the file.
    pub fn weight_dtype(&self) -> Option<kiln_compute::DType> {
        let mut counts: Vec<(kiln_compute::DType, usize)> = Vec::new();
        for (_, info) in self.file.tensors().filter(|(name, _)| name.starts_with(self.prefix)) {
            let n = info.shape.iter().product::<usize>();
            match counts.iter_mut().find(|(dt, _)| *dt == info.dtype) {
                Some((_, count)) => *count += n,
                None => counts.push((info.dtype, n)),
            }
        }
        let most = counts.iter().map(|&(_, n)| n).max()?;
        counts.into_iter().find(|&(_, n)| n == most).map(|(dt, _)| dt)
    }

    /// The values of a float tensor (f32, f16 or bf16) as f32 with its stored type, read from the file (ComfyUI's
    /// detection reads a few small ones); `None` when it is missing, of another type, or cannot be read.
    pub fn float_values(&self, name: &str) -> Option<(kiln_compute::DType, Vec<f32>)> {
        use kiln_compute::DType;
        let info = self.get(name)?;
        if !matches!(info.dtype, DType::F32 | DType::F16 | DType::BF16) {
            return None;
        }
        let bytes = self.file.raw_bytes(&self.key(name)).ok()?;
        Some((info.dtype, kiln_compute::dtype::widen(info.dtype, &bytes)))
    }

    /// A tensor that must exist: its absence is [`Error::Unsupported`] naming the file and the key.
    pub fn require(&self, name: &str) -> Result<&'f TensorInfo> {
        self.get(name).ok_or_else(|| self.unsupported(format!("no tensor `{}`", self.key(name))))
    }

    /// The names under the prefix (without it), in the file's order.
    pub fn names(&self) -> impl Iterator<Item = &'f str> + '_ {
        let prefix = self.prefix;
        self.file.tensors().filter_map(move |(name, _)| name.strip_prefix(prefix))
    }

    /// Tensors under the prefix whose dtype Kiln cannot compute with: `(name, dtype)`.
    pub fn unsupported_dtypes(&self) -> impl Iterator<Item = (&'f str, &'f str)> + '_ {
        let prefix = self.prefix;
        self.file
            .unsupported()
            .filter_map(move |(name, dtype)| Some((name.strip_prefix(prefix)?, dtype)))
    }

    /// An [`Error::Unsupported`] about this file.
    pub fn unsupported(&self, msg: impl Into<String>) -> Error {
        Error::Unsupported { path: self.path().to_path_buf(), msg: msg.into() }
    }

    /// The shape of tensor `name`, which must be of rank `rank`: [`Error::Unsupported`] otherwise (`… is [found],
    /// expected rank r`, or `{what} without …` when it is missing).
    pub fn shape_of_rank(&self, name: &str, rank: usize, what: &str) -> Result<Vec<usize>> {
        match self.shape(name) {
            Some(s) if s.len() == rank => Ok(s.to_vec()),
            Some(s) => {
                Err(self
                    .unsupported(format!("`{}` is {s:?}, expected rank {rank}", self.key(name))))
            }
            None => Err(self.unsupported(format!("{what} without `{}`", self.key(name)))),
        }
    }

    /// Checks that tensor `name` is there with shape `want`: [`Error::Unsupported`] naming it otherwise (`no
    /// tensor …`, or `… is [found], expected [want] for {what}`).
    pub fn expect_shape(&self, name: &str, want: &[usize], what: &str) -> Result<()> {
        match self.shape(name) {
            Some(found) if found == want => Ok(()),
            Some(found) => Err(self.unsupported(format!(
                "`{}` is {found:?}, expected {want:?} for {what}",
                self.key(name)
            ))),
            None => Err(self.unsupported(format!("no tensor `{}`", self.key(name)))),
        }
    }
}

/// The key prefix of a diffusion model in a file (ComfyUI's `unet_prefix_from_state_dict`, models.md §2.2 step 1): of `model.diffusion_model.`,
/// `model.model.` and `net.`, the one most keys start with if more than 5 do; else `model.` if any key starts
/// with it; else none (a bare file, used as is).
pub fn diffusion_prefix<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    const CANDIDATES: [&str; 3] = ["model.diffusion_model.", "model.model.", "net."];
    let mut counts = [0usize; 3];
    let mut model = false;
    for name in names {
        for (count, prefix) in counts.iter_mut().zip(CANDIDATES) {
            if name.starts_with(prefix) {
                *count += 1;
            }
        }
        model |= name.starts_with("model.");
    }
    // The first of the largest counts wins.
    let (best, count) =
        counts.iter().enumerate().fold((0, 0), |a, (i, &c)| if c > a.1 { (i, c) } else { a });
    if count > 5 {
        CANDIDATES[best].to_owned()
    } else if model {
        "model.".to_owned()
    } else {
        String::new()
    }
}
