//! A LoRA file turned into patches for the memory manager's in-place LoRA (`kiln_compute::memory::lora`), as
//! ComfyUI's LoRA loaders read it, for any family: the family says which stems name which of its weights
//! ([`Aliases`]: `zimage_lora`, `qwen3::lora`), this module reads the adapters.
//!
//! **Names.** A LoRA file names each adapted weight by a *stem* followed by a suffix saying what the tensor
//! is (`.lora_up.weight`, `.alpha`, `.hada_w1_a`, `.diff`, ...).
//!
//! **Fused weights.** A stem may name a row block of a fused weight ([`Target::Part`]: diffusers' `to_q`,
//! `to_k`, `to_v` of Z-Image's `attention.qkv`, three equal blocks; FLUX.1's `to_q`, `to_k`, `to_v`, `proj_mlp`
//! of a single block's `linear1`, blocks of the sizes [`Aliases::split`] gives); ComfyUI patches each on its row
//! range. A patch here has no row offset, so the parts of one weight are fused into one adapter whose ΔW is the
//! blocks stacked: LoRA and LoHa as block-diagonal `up` (each part's `strength`-free scale alpha/rank folded into
//! its block, the fused adapter without alpha) over stacked `down`; a part without an adapter contributes zero
//! rows. LoKr and diff
//! parts become one full-size diff (computed on the host in f32). A DoRA or `set_weight` part cannot be fused
//! and is refused.
//!
//! **What is refused.** What the patch format cannot express is [`Error::Unsupported`] naming the file and the
//! key, never dropped: Tucker/CP mids (`lora_mid`, `hada_t1`/`hada_t2`, `lokr_t2`), GLoRA, OFT/BOFT,
//! `reshape_weight`, an adapter missing a tensor, a tensor that does not fit its weight (a LoRA for another
//! model) and one in a type Kiln cannot read. Keys that name no weight of the model (a text encoder's, another
//! family's) are returned in [`LoraPatches::unmatched`] for a warning, as ComfyUI logs "lora key not loaded".
//!
//! When one stem holds several adapters, the last in ComfyUI's order wins (LoRA, LoHa, LoKr, `w_norm`, `diff`,
//! `set_weight`); when several stems name one weight, the last stem in name order wins.

use std::collections::{BTreeMap, BTreeSet};

use kiln_compute::DType;
use kiln_compute::dtype::widen;
use kiln_compute::memory::SafetensorsFile;
use kiln_compute::memory::lora::{Adapter, Factor, Patch, PatchSet, PatchTensor};
use kiln_compute::tensor::numel;

use crate::error::{Error, Result};

/// A LoRA file's patches for a model.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoraPatches {
    /// `(slot name, patches)` in the order of the model's slots, for `Model::set_patches`.
    pub patches: Vec<(String, PatchSet)>,
    /// The file's keys that adapt no weight of the model, in name order (worth a warning).
    pub unmatched: Vec<String>,
}

/// The patches the LoRA file `lora` makes at `strength` (ComfyUI's `strength_model` or `strength_clip`: each
/// adapter's ΔW is scaled by it, the weight itself is left at 1) for a model whose weights are `slots`:
/// `(name, shape)` in the family's layout without prefix, as `Model::names`/`Model::info` list them; `aliases`
/// (built for the same slots) says which stems name which of them.
pub fn patches(
    lora: &SafetensorsFile,
    slots: &[(&str, &[usize])],
    strength: f32,
    aliases: &Aliases,
) -> Result<LoraPatches> {
    let reader = Reader { file: lora };
    let lookup = |name| lookup(aliases, name);
    for (name, dtype) in lora.unsupported() {
        if lookup(name).is_some() {
            return Err(reader.unsupported(format!("`{name}` is {dtype}, a type Kiln cannot read")));
        }
    }
    let mut stems: BTreeMap<&str, Stem<'_>> = BTreeMap::new();
    let mut unmatched = BTreeSet::new();
    for (name, _) in lora.tensors() {
        match lookup(name) {
            Some((stem, role, target)) => {
                let entry =
                    stems.entry(stem).or_insert_with(|| Stem { target, roles: BTreeMap::new() });
                entry.roles.insert(role, name);
            }
            None => {
                unmatched.insert(name.to_owned());
            }
        }
    }
    unmatched.extend(lora.unsupported().map(|(name, _)| name.to_owned()));

    // One adapter per weight (or qkv part): the last stem wins.
    let mut whole: BTreeMap<usize, Adapter<PatchTensor>> = BTreeMap::new();
    let mut parts: BTreeMap<usize, Vec<Option<Keyed>>> = BTreeMap::new();
    for stem in stems.values() {
        let built = reader.stem(stem, &mut unmatched)?;
        let target_shape = target_shape(slots, aliases, stem.target);
        if let Some((adapter, key)) = built.weight {
            check_fit(&reader, &adapter, &key, slots, stem.target, &target_shape)?;
            match stem.target {
                Target::Whole(slot) => {
                    whole.insert(slot, adapter);
                }
                Target::Part { slot, index } => {
                    let count = aliases.rows(slot, slots[slot].1).len();
                    parts.entry(slot).or_insert_with(|| vec![None; count])[index] =
                        Some((adapter, key));
                }
            }
        }
        if let Some((adapter, key)) = built.bias {
            // ComfyUI patches `<weight name without .weight>.bias`, which only a whole weight has.
            let bias = match stem.target {
                Target::Whole(slot) => slots[slot].0.strip_suffix(".weight").and_then(|s| {
                    let name = format!("{s}.bias");
                    slots.iter().position(|(n, _)| *n == name)
                }),
                Target::Part { .. } => None,
            };
            match bias {
                Some(slot) => {
                    check_fit(&reader, &adapter, &key, slots, Target::Whole(slot), slots[slot].1)?;
                    whole.insert(slot, adapter);
                }
                None => {
                    unmatched.insert(key);
                }
            }
        }
    }

    let mut out = Vec::new();
    for (i, (name, shape)) in slots.iter().enumerate() {
        let mut adapters: Vec<Adapter<PatchTensor>> = whole.remove(&i).into_iter().collect();
        if let Some(p) = parts.remove(&i) {
            adapters.extend(fuse_parts(&reader, p, shape, &aliases.rows(i, shape))?);
        }
        if adapters.is_empty() {
            continue;
        }
        let patches = adapters
            .into_iter()
            .map(|adapter| Patch { strength, strength_model: 1.0, adapter })
            .collect();
        out.push(((*name).to_owned(), PatchSet { patches }));
    }
    Ok(LoraPatches { patches: out, unmatched: unmatched.into_iter().collect() })
}

/// The stem of a LoRA key, its role and the weight it adapts; `None` for a key that adapts none.
fn lookup<'n>(aliases: &Aliases, name: &'n str) -> Option<(&'n str, Role, Target)> {
    SUFFIXES.iter().find_map(|&(suffix, role)| {
        let stem = name.strip_suffix(suffix)?;
        aliases.stems.get(stem).map(|&target| (stem, role, target))
    })
}

/// The stems ComfyUI's `model_lora_keys_unet` maps to a DiT's weights `slots` (for `S.weight`): `lora_unet_S` with
/// dots as underscores (kohya), `diffusion_model.S`, and SimpleTuner's `transformer.S` and `lycoris_S` with
/// underscores; with `bare`, `S` itself too (Qwen-Image's own format).
pub(crate) fn dit_aliases(slots: &[(&str, &[usize])], bare: bool) -> Aliases {
    let mut aliases = Aliases::new();
    for (i, (name, _)) in slots.iter().enumerate() {
        let Some(stem) = name.strip_suffix(".weight") else { continue };
        let underscored = stem.replace('.', "_");
        let mut names = vec![
            format!("lora_unet_{underscored}"),
            format!("diffusion_model.{stem}"),
            format!("transformer.{stem}"),
            format!("lycoris_{underscored}"),
        ];
        if bare {
            names.push(stem.to_owned());
        }
        for alias in names {
            aliases.add(alias, Target::Whole(i));
        }
    }
    aliases
}

/// Every stem a LoRA file may use for a model's weights, and the weight each adapts (built by the family).
#[derive(Debug, Clone, Default)]
pub struct Aliases {
    stems: BTreeMap<String, Target>,
    /// The row blocks of fused slots whose parts are not three equal blocks.
    splits: BTreeMap<usize, Vec<usize>>,
}

impl Aliases {
    /// No stem yet.
    pub fn new() -> Aliases {
        Aliases::default()
    }

    /// Adds `alias` for `target`; the first alias added for a stem wins.
    pub fn add(&mut self, alias: String, target: Target) {
        self.stems.entry(alias).or_insert(target);
    }

    /// Says that slot `slot` is fused from row blocks of `rows` rows, in order ([`Target::Part`]'s `index`);
    /// without it a fused slot is three equal blocks (q, k, v).
    pub fn split(&mut self, slot: usize, rows: Vec<usize>) {
        self.splits.insert(slot, rows);
    }

    /// The row blocks of slot `slot` of `shape`.
    fn rows(&self, slot: usize, shape: &[usize]) -> Vec<usize> {
        match self.splits.get(&slot) {
            Some(rows) => rows.clone(),
            None => vec![shape.first().copied().unwrap_or(0) / 3; 3],
        }
    }
}

/// The weight a stem adapts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A whole slot (by index).
    Whole(usize),
    /// Row block `index` of a fused slot (q, k, v; FLUX.1's linear1 also its MLP input).
    Part {
        /// The fused slot.
        slot: usize,
        /// Which block, in row order: 0 q, 1 k, 2 v, 3 FLUX.1's MLP input.
        index: usize,
    },
}

/// What a tensor of a LoRA file is, by its suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Role {
    /// A LoRA up of naming variant `n` (ComfyUI's order of preference).
    Up(usize),
    /// A LoRA down of naming variant `n`.
    Down(usize),
    /// A LoCon Tucker mid.
    Mid,
    Alpha,
    DoraScale,
    Reshape,
    HadaW1a,
    HadaW1b,
    HadaW2a,
    HadaW2b,
    HadaTucker,
    LokrW1,
    LokrW2,
    LokrW1a,
    LokrW1b,
    LokrW2a,
    LokrW2b,
    LokrTucker,
    Glora,
    Oft,
    WNorm,
    BNorm,
    Diff,
    DiffBias,
    Set,
}

/// The LoRA naming variants, `(up, down)`, in ComfyUI's order of preference.
const LORA_VARIANTS: usize = 7;

/// Every suffix after a stem and its role.
const SUFFIXES: &[(&str, Role)] = &[
    (".lora_up.weight", Role::Up(0)),
    (".lora_down.weight", Role::Down(0)),
    ("_lora.up.weight", Role::Up(1)),
    ("_lora.down.weight", Role::Down(1)),
    (".lora_B.weight", Role::Up(2)),
    (".lora_A.weight", Role::Down(2)),
    (".lora.up.weight", Role::Up(3)),
    (".lora.down.weight", Role::Down(3)),
    (".lora_B", Role::Up(4)),
    (".lora_A", Role::Down(4)),
    (".lora_linear_layer.up.weight", Role::Up(5)),
    (".lora_linear_layer.down.weight", Role::Down(5)),
    (".lora_B.default.weight", Role::Up(6)),
    (".lora_A.default.weight", Role::Down(6)),
    (".lora_mid.weight", Role::Mid),
    (".alpha", Role::Alpha),
    (".dora_scale", Role::DoraScale),
    (".reshape_weight", Role::Reshape),
    (".hada_w1_a", Role::HadaW1a),
    (".hada_w1_b", Role::HadaW1b),
    (".hada_w2_a", Role::HadaW2a),
    (".hada_w2_b", Role::HadaW2b),
    (".hada_t1", Role::HadaTucker),
    (".hada_t2", Role::HadaTucker),
    (".lokr_w1", Role::LokrW1),
    (".lokr_w2", Role::LokrW2),
    (".lokr_w1_a", Role::LokrW1a),
    (".lokr_w1_b", Role::LokrW1b),
    (".lokr_w2_a", Role::LokrW2a),
    (".lokr_w2_b", Role::LokrW2b),
    (".lokr_t2", Role::LokrTucker),
    (".a1.weight", Role::Glora),
    (".a2.weight", Role::Glora),
    (".b1.weight", Role::Glora),
    (".b2.weight", Role::Glora),
    (".oft_blocks", Role::Oft),
    (".rescale", Role::Oft),
    (".w_norm", Role::WNorm),
    (".b_norm", Role::BNorm),
    (".diff", Role::Diff),
    (".diff_b", Role::DiffBias),
    (".set_weight", Role::Set),
];

/// The tensors of one stem, by role.
struct Stem<'f> {
    target: Target,
    roles: BTreeMap<Role, &'f str>,
}

/// An adapter and the key it was read under (to name in errors).
type Keyed = (Adapter<PatchTensor>, String);

/// One low-rank pair of a qkv part, f32 row-major: `up` `[rows, rank]` (scale folded in), `down` `[rank, cols]`.
#[derive(Clone)]
struct Pair {
    up: Vec<f32>,
    down: Vec<f32>,
    rank: usize,
}

/// What one stem adapts: its weight's adapter and its bias's (each with the key to name in errors).
struct Built {
    weight: Option<Keyed>,
    bias: Option<Keyed>,
}

/// The shape a target's adapter must produce.
fn target_shape(slots: &[(&str, &[usize])], aliases: &Aliases, target: Target) -> Vec<usize> {
    match target {
        Target::Whole(slot) => slots[slot].1.to_vec(),
        Target::Part { slot, index } => {
            let mut shape = slots[slot].1.to_vec();
            shape[0] = aliases.rows(slot, &shape).get(index).copied().unwrap_or(0);
            shape
        }
    }
}

/// Reads a LoRA file's tensors and words its errors.
struct Reader<'f> {
    file: &'f SafetensorsFile,
}

impl Reader<'_> {
    fn unsupported(&self, msg: impl Into<String>) -> Error {
        Error::Unsupported { path: self.file.path().to_path_buf(), msg: msg.into() }
    }

    /// A tensor as stored.
    fn read(&self, name: &str) -> Result<PatchTensor> {
        let info = self.file.tensor(name)?;
        let bytes = self.file.source().read_vec(info.offset, info.len)?;
        Ok(PatchTensor { dtype: info.dtype, shape: info.shape.clone(), bytes })
    }

    /// A one-element tensor's value (an alpha).
    fn scalar(&self, name: &str) -> Result<f32> {
        let t = self.read(name)?;
        match widen(t.dtype, &t.bytes)[..] {
            [v] => Ok(v),
            _ => Err(self.unsupported(format!("`{name}` is {:?}, expected one value", t.shape))),
        }
    }

    /// The adapters of one stem; keys it leaves unused go to `unmatched`.
    fn stem(&self, stem: &Stem<'_>, unmatched: &mut BTreeSet<String>) -> Result<Built> {
        let roles = &stem.roles;
        for role in
            [Role::Mid, Role::HadaTucker, Role::LokrTucker, Role::Glora, Role::Oft, Role::Reshape]
        {
            if let Some(key) = roles.get(&role) {
                let what = match role {
                    Role::Mid | Role::HadaTucker | Role::LokrTucker => {
                        "a Tucker/CP decomposition (a mid tensor)"
                    }
                    Role::Glora => "a GLoRA adapter",
                    Role::Oft => "an OFT/BOFT adapter",
                    _ => "a weight reshape",
                };
                return Err(self.unsupported(format!(
                    "`{key}` is {what}, which Kiln's in-place LoRA cannot apply"
                )));
            }
        }
        let get = |role: Role| roles.get(&role).copied();
        let need = |role: Role, what: &str| -> Result<&str> {
            get(role).ok_or_else(|| {
                let any = roles.values().next().copied().unwrap_or_default();
                self.unsupported(format!("`{any}` has no {what}: an incomplete adapter"))
            })
        };
        let alpha = get(Role::Alpha).map(|k| self.scalar(k)).transpose()?;
        let dora_scale = get(Role::DoraScale).map(|k| self.read(k)).transpose()?;
        let mut weight = None;

        if let Some(variant) = (0..LORA_VARIANTS).find(|&v| roles.contains_key(&Role::Up(v))) {
            let up_key = need(Role::Up(variant), "up")?;
            let down_key = need(Role::Down(variant), "LoRA down matching its up")?;
            let adapter = Adapter::Lora {
                up: self.read(up_key)?,
                down: self.read(down_key)?,
                alpha,
                dora_scale: dora_scale.clone(),
            };
            weight = Some((adapter, up_key.to_owned()));
            for v in (0..LORA_VARIANTS).filter(|&v| v != variant) {
                for role in [Role::Up(v), Role::Down(v)] {
                    unmatched.extend(get(role).map(str::to_owned));
                }
            }
        } else {
            for v in 0..LORA_VARIANTS {
                unmatched.extend(get(Role::Down(v)).map(str::to_owned));
            }
        }
        if let Some(w1a) = get(Role::HadaW1a) {
            let adapter = Adapter::LoHa {
                w1a: self.read(w1a)?,
                w1b: self.read(need(Role::HadaW1b, "hada_w1_b")?)?,
                w2a: self.read(need(Role::HadaW2a, "hada_w2_a")?)?,
                w2b: self.read(need(Role::HadaW2b, "hada_w2_b")?)?,
                alpha,
                dora_scale: dora_scale.clone(),
            };
            weight = Some((adapter, w1a.to_owned()));
        } else {
            for role in [Role::HadaW1b, Role::HadaW2a, Role::HadaW2b] {
                unmatched.extend(get(role).map(str::to_owned));
            }
        }
        let lokr = [Role::LokrW1, Role::LokrW2, Role::LokrW1a, Role::LokrW2a];
        if let Some(key) = lokr.into_iter().find_map(get) {
            let factor = |full: Role, a: Role, b: Role, n: &str| -> Result<Factor<PatchTensor>> {
                match (get(full), get(a), get(b)) {
                    (Some(f), _, _) => Ok(Factor::Full(self.read(f)?)),
                    (None, Some(a), Some(b)) => Ok(Factor::Product(self.read(a)?, self.read(b)?)),
                    _ => Err(self.unsupported(format!(
                        "`{key}`: a LoKr adapter with neither lokr_{n} nor lokr_{n}_a and lokr_{n}_b"
                    ))),
                }
            };
            let adapter = Adapter::LoKr {
                w1: factor(Role::LokrW1, Role::LokrW1a, Role::LokrW1b, "w1")?,
                w2: factor(Role::LokrW2, Role::LokrW2a, Role::LokrW2b, "w2")?,
                alpha,
                dora_scale,
            };
            weight = Some((adapter, key.to_owned()));
        } else {
            unmatched.extend(get(Role::LokrW1b).map(str::to_owned));
            unmatched.extend(get(Role::LokrW2b).map(str::to_owned));
        }
        let mut bias = None;
        for (role, bias_role) in [(Role::WNorm, Role::BNorm), (Role::Diff, Role::DiffBias)] {
            if let Some(key) = get(role) {
                weight = Some((Adapter::Diff(self.read(key)?), key.to_owned()));
                // ComfyUI reads `b_norm` only beside a `w_norm`.
                if let Some(b) = get(bias_role) {
                    bias = Some((Adapter::Diff(self.read(b)?), b.to_owned()));
                }
            } else if role == Role::WNorm {
                unmatched.extend(get(bias_role).map(str::to_owned));
            } else if let Some(b) = get(bias_role) {
                bias = Some((Adapter::Diff(self.read(b)?), b.to_owned()));
            }
        }
        if let Some(key) = get(Role::Set) {
            weight = Some((Adapter::Set(self.read(key)?), key.to_owned()));
        }
        Ok(Built { weight, bias })
    }
}

/// `t` as a matrix: first dimension by the product of the rest (a rank-0 tensor is 1×1).
fn matrix_shape(t: &PatchTensor) -> (usize, usize) {
    let rows = t.shape.first().copied().unwrap_or(1);
    (rows, numel(&t.shape) / rows.max(1))
}

/// The shape `(rows, cols)` of a LoKr factor, if its parts fit each other.
fn factor_shape(f: &Factor<PatchTensor>) -> Option<(usize, usize)> {
    match f {
        Factor::Full(t) => Some(matrix_shape(t)),
        Factor::Product(a, b) => {
            let ((ar, ac), (br, bc)) = (matrix_shape(a), matrix_shape(b));
            (ac == br).then_some((ar, bc))
        }
    }
}

/// Checks that `adapter` (read under `key`) produces a ΔW of `shape`; else [`Error::Unsupported`].
fn check_fit(
    reader: &Reader<'_>,
    adapter: &Adapter<PatchTensor>,
    key: &str,
    slots: &[(&str, &[usize])],
    target: Target,
    shape: &[usize],
) -> Result<()> {
    let rows = shape.first().copied().unwrap_or(1);
    let cols = numel(shape) / rows.max(1);
    let low_rank = |a: &PatchTensor, b: &PatchTensor| {
        let ((ar, ac), (br, bc)) = (matrix_shape(a), matrix_shape(b));
        ar == rows && ac == br && bc == cols
    };
    let dora_fits = |d: &Option<PatchTensor>| {
        d.as_ref().is_none_or(|d| numel(&d.shape) == rows || numel(&d.shape) == cols)
    };
    let fits = match adapter {
        Adapter::Lora { up, down, dora_scale, .. } => low_rank(up, down) && dora_fits(dora_scale),
        Adapter::LoHa { w1a, w1b, w2a, w2b, dora_scale, .. } => {
            low_rank(w1a, w1b) && low_rank(w2a, w2b) && dora_fits(dora_scale)
        }
        Adapter::LoKr { w1, w2, dora_scale, .. } => {
            matches!((factor_shape(w1), factor_shape(w2)), (Some((a0, a1)), Some((c0, c1)))
                if a0 * c0 == rows && a1 * c1 == cols)
                && dora_fits(dora_scale)
        }
        Adapter::Diff(t) | Adapter::Set(t) => numel(&t.shape) == numel(shape),
    };
    if fits {
        return Ok(());
    }
    let (slot, part) = match target {
        Target::Whole(slot) => (slot, String::new()),
        Target::Part { slot, index } => {
            let part = ["q", "k", "v", "the MLP input"].get(index).copied().unwrap_or("a part");
            (slot, format!(" (rows of {part})"))
        }
    };
    Err(reader.unsupported(format!(
        "`{key}` does not fit the model's `{}`{part} of shape {shape:?} (a LoRA for another model?)",
        slots[slot].0
    )))
}

/// A tensor's values in f32.
fn values(t: &PatchTensor) -> Vec<f32> {
    widen(t.dtype, &t.bytes)
}

/// `a · b` of row-major matrices `[m, k]`, `[k, n]`, in f32.
fn matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        for (p, &x) in a[i * k..(i + 1) * k].iter().enumerate() {
            for (o, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *o += x * y;
            }
        }
    }
    out
}

/// A LoKr factor as a row-major matrix, its shape, and its rank when given as a product.
fn factor_matrix(f: &Factor<PatchTensor>) -> (Vec<f32>, usize, usize, Option<usize>) {
    match f {
        Factor::Full(t) => {
            let (r, c) = matrix_shape(t);
            (values(t), r, c, None)
        }
        Factor::Product(a, b) => {
            let ((ar, ac), (_, bc)) = (matrix_shape(a), matrix_shape(b));
            (matmul(&values(a), &values(b), ar, ac, bc), ar, bc, Some(ac))
        }
    }
}

/// Scale alpha / rank, 1 without alpha.
fn rank_scale(alpha: Option<f32>, rank: usize) -> f32 {
    match alpha {
        Some(alpha) if rank > 0 => alpha / rank as f32,
        _ => 1.0,
    }
}

/// The adapters that patch a fused weight of `shape`, made of row blocks of `rows` rows, as its parts'
/// adapters would patch their blocks (see the module doc). Every part already fits its block.
fn fuse_parts(
    reader: &Reader<'_>,
    parts: Vec<Option<Keyed>>,
    shape: &[usize],
    rows: &[usize],
) -> Result<Vec<Adapter<PatchTensor>>> {
    let total_rows = shape[0];
    let cols = numel(shape) / total_rows.max(1);
    let starts: Vec<usize> =
        rows.iter().scan(0, |at, &r| Some(std::mem::replace(at, *at + r))).collect();
    // Per part: the LoRA pair; the LoHa's two pairs (w1a scaled).
    let mut lora: Vec<Option<Pair>> = vec![None; parts.len()];
    let mut loha: Vec<Option<[Pair; 2]>> = vec![None; parts.len()];
    let mut diff: Option<Vec<f32>> = None;
    for (index, part) in parts.into_iter().enumerate() {
        let Some((adapter, key)) = part else { continue };
        let refuse = |what: &str| {
            reader.unsupported(format!(
                "`{key}` is {what} on one of q, k, v, which Kiln cannot apply to the fused qkv weight"
            ))
        };
        match adapter {
            Adapter::Lora { dora_scale: Some(_), .. }
            | Adapter::LoHa { dora_scale: Some(_), .. }
            | Adapter::LoKr { dora_scale: Some(_), .. } => return Err(refuse("a DoRA adapter")),
            Adapter::Set(_) => return Err(refuse("a set_weight")),
            Adapter::Lora { up, down, alpha, dora_scale: None } => {
                let rank = matrix_shape(&down).0;
                let scale = rank_scale(alpha, rank);
                let up = values(&up).into_iter().map(|v| v * scale).collect();
                lora[index] = Some(Pair { up, down: values(&down), rank });
            }
            Adapter::LoHa { w1a, w1b, w2a, w2b, alpha, dora_scale: None } => {
                let (r1, r2) = (matrix_shape(&w1b).0, matrix_shape(&w2b).0);
                let scale = rank_scale(alpha, r1);
                let w1a = values(&w1a).into_iter().map(|v| v * scale).collect();
                loha[index] = Some([
                    Pair { up: w1a, down: values(&w1b), rank: r1 },
                    Pair { up: values(&w2a), down: values(&w2b), rank: r2 },
                ]);
            }
            Adapter::LoKr { w1, w2, alpha, dora_scale: None } => {
                let (a, a0, a1, ra) = factor_matrix(&w1);
                let (c, c0, c1, rc) = factor_matrix(&w2);
                let scale = rc.or(ra).map_or(1.0, |rank| rank_scale(alpha, rank));
                let d = diff.get_or_insert_with(|| vec![0f32; total_rows * cols]);
                let block = &mut d[starts[index] * cols..(starts[index] + rows[index]) * cols];
                for (i, j) in (0..a0).flat_map(|i| (0..a1).map(move |j| (i, j))) {
                    let x = a[i * a1 + j] * scale;
                    for (k, l) in (0..c0).flat_map(|k| (0..c1).map(move |l| (k, l))) {
                        block[(i * c0 + k) * cols + j * c1 + l] += x * c[k * c1 + l];
                    }
                }
            }
            Adapter::Diff(t) => {
                let d = diff.get_or_insert_with(|| vec![0f32; total_rows * cols]);
                let block = &mut d[starts[index] * cols..(starts[index] + rows[index]) * cols];
                for (o, v) in block.iter_mut().zip(values(&t)) {
                    *o += v;
                }
            }
        }
    }
    let mut out = Vec::new();
    if lora.iter().any(Option::is_some) {
        let (up, down) = block_diagonal(&lora, rows, cols);
        out.push(Adapter::Lora { up, down, alpha: None, dora_scale: None });
    }
    if loha.iter().any(Option::is_some) {
        let first: Vec<_> = loha.iter().map(|p| p.as_ref().map(|[w1, _]| w1.clone())).collect();
        let second: Vec<_> = loha.iter().map(|p| p.as_ref().map(|[_, w2]| w2.clone())).collect();
        let (w1a, w1b) = block_diagonal(&first, rows, cols);
        let (w2a, w2b) = block_diagonal(&second, rows, cols);
        out.push(Adapter::LoHa { w1a, w1b, w2a, w2b, alpha: None, dora_scale: None });
    }
    if let Some(d) = diff {
        out.push(Adapter::Diff(PatchTensor::from_f32(DType::F32, &[total_rows, cols], &d)));
    }
    Ok(out)
}

/// The low-rank pair `(up, down)` whose product stacks each part's `up_p · down_p` in row block `p`
/// (`rows[p]` rows; zero for an absent part): `up` block-diagonal `[Σrows, Σr]`, `down` stacked `[Σr, cols]`,
/// both f32.
fn block_diagonal(
    parts: &[Option<Pair>],
    rows: &[usize],
    cols: usize,
) -> (PatchTensor, PatchTensor) {
    let total: usize = parts.iter().flatten().map(|p| p.rank).sum();
    let total_rows: usize = rows.iter().sum();
    let mut up = vec![0f32; total_rows * total];
    let mut down = Vec::with_capacity(total * cols);
    let (mut offset, mut start) = (0, 0);
    for (part, &block_rows) in parts.iter().zip(rows) {
        if let Some(Pair { up: u, down: d, rank }) = part {
            for r in 0..block_rows {
                let dst = (start + r) * total + offset;
                up[dst..dst + rank].copy_from_slice(&u[r * rank..(r + 1) * rank]);
            }
            down.extend_from_slice(d);
            offset += rank;
        }
        start += block_rows;
    }
    (
        PatchTensor::from_f32(DType::F32, &[total_rows, total], &up),
        PatchTensor::from_f32(DType::F32, &[total, cols], &down),
    )
}
