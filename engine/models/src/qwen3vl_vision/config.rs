//! [`Config`]: the widths of a Qwen3-VL vision tower (`visual.*`, a `qwen3vl_4b` / `qwen3vl_8b` file's
//! `model.visual.*` read through [`Header`]), detected from the tensor shapes, the DeepStack indexes, and the
//! names of its weights.
//!
//! Invariant: [`Config::weight_names`] and [`Config::expected`] list the same tensors in the same order, the
//! order the tower fetches them in.

use kiln_compute::memory::LoadPlan;

use crate::error::Result;
use crate::header::Header;
use crate::qwen_vl::{MERGE, Patching};
use crate::qwen3::{check_shape, dims};

/// Attention heads. ComfyUI's `QWEN3VL_VISION_COMMON` fixes 16 for every size (4B: 16 of 64, 8B: 16 of 72); the
/// shapes give only their total width.
pub const HEADS: usize = 16;
/// The DeepStack indexes ComfyUI fixes for the released towers (`QWEN3VL_VISION`), by (width, blocks): 4B's
/// and 8B's (32B's is 8B's tower).
pub const RELEASED_DEEPSTACK: [(usize, usize, [usize; 3]); 2] =
    [(1024, 24, [5, 11, 17]), (1152, 27, [8, 16, 24])];
/// LayerNorm ε of every norm.
pub(super) const EPS: f32 = 1e-6;
/// RoPE base θ of the patch positions.
pub(super) const ROPE_THETA: f32 = 10_000.0;
/// Qwen3-VL's pixel normalisation: to [-1, 1] (mean and deviation 0.5, not CLIP's).
const NORMALISATION: f32 = 0.5;

/// The patch embedding (a 3-D convolution whose kernel is its stride: one linear map per patch) and its bias.
pub(super) const PATCH_EMBED: [&str; 2] =
    ["visual.patch_embed.proj.weight", "visual.patch_embed.proj.bias"];
/// The learned position table, `[side², hidden]`, interpolated to each image's patch grid.
pub(super) const POS_EMBED: &str = "visual.pos_embed.weight";

/// The tensors of one block, after `visual.blocks.{i}.`, in the order the tower fetches them.
const BLOCK_TENSORS: [&str; 12] = [
    "norm1.weight",
    "norm1.bias",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "norm2.weight",
    "norm2.bias",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc1.bias",
    "mlp.linear_fc2.weight",
    "mlp.linear_fc2.bias",
];

/// The tensors of a merger (the final one after `visual.merger.`, a DeepStack one after
/// `visual.deepstack_merger_list.{k}.`), in the order the tower fetches them.
const MERGER_TENSORS: [&str; 6] = [
    "norm.weight",
    "norm.bias",
    "linear_fc1.weight",
    "linear_fc1.bias",
    "linear_fc2.weight",
    "linear_fc2.bias",
];

/// A Qwen3-VL vision tower's hyperparameters (4B: width 1024, 24 blocks, MLP 4096, DeepStack after blocks 5, 11
/// and 17; 8B: 1152, 27, 4304, [8, 16, 24]; both 16 heads, patches of 16 × 16 pixels × 2 frames, a 48 × 48
/// position table, output the language model's width).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Width of the blocks.
    pub hidden: usize,
    /// Blocks.
    pub depth: usize,
    /// Attention heads ([`HEADS`] as detected; the shapes do not tell them).
    pub heads: usize,
    /// MLP (GELU, tanh) width.
    pub intermediate: usize,
    /// Width of the merged tokens it gives the language model (its hidden size).
    pub out_hidden: usize,
    /// Side of a patch in pixels.
    pub patch: usize,
    /// Frames in a patch (an image is repeated to fill them).
    pub temporal_patch: usize,
    /// Side of the learned position table (48: 2304 entries).
    pub position_side: usize,
    /// The blocks after which a DeepStack merger reads the patches, in merger order (`deepstack_merger_list.k`
    /// reads after block `deepstack[k]`; its output is added after language-model layer `k`).
    pub deepstack: Vec<usize>,
}

impl Config {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }

    /// Values in one flattened patch: channels × frames × side × side (1536).
    pub fn patch_values(&self) -> usize {
        3 * self.temporal_patch * self.patch * self.patch
    }

    /// How an image becomes this tower's patches (ComfyUI's `process_qwen2vl_images` with `patch_size=16`,
    /// mean and deviation 0.5).
    pub fn patching(&self) -> Patching {
        Patching {
            patch: self.patch,
            temporal_patch: self.temporal_patch,
            mean: [NORMALISATION; 3],
            std: [NORMALISATION; 3],
            min_pixels: crate::qwen_vl::MIN_PIXELS,
            max_pixels: crate::qwen_vl::MAX_PIXELS,
            resample: crate::qwen_vl::Resample::Bilinear,
        }
    }

    /// The names of block `i`'s weights, in the order the tower fetches them.
    pub fn block_names(&self, i: usize) -> Vec<String> {
        BLOCK_TENSORS.iter().map(|t| format!("visual.blocks.{i}.{t}")).collect()
    }

    /// The names of the final merger's weights, in the order the tower fetches them.
    pub fn merger_names(&self) -> Vec<String> {
        MERGER_TENSORS.iter().map(|t| format!("visual.merger.{t}")).collect()
    }

    /// The names of DeepStack merger `k`'s weights, in the order the tower fetches them.
    pub fn deepstack_names(&self, k: usize) -> Vec<String> {
        MERGER_TENSORS.iter().map(|t| format!("visual.deepstack_merger_list.{k}.{t}")).collect()
    }

    /// Every weight's name: patch embedding, position table, the blocks, the final merger, the DeepStack
    /// mergers.
    pub fn weight_names(&self) -> Vec<String> {
        let mut names: Vec<String> = PATCH_EMBED.iter().map(|&n| n.to_owned()).collect();
        names.push(POS_EMBED.to_owned());
        for i in 0..self.depth {
            names.extend(self.block_names(i));
        }
        names.extend(self.merger_names());
        for k in 0..self.deepstack.len() {
            names.extend(self.deepstack_names(k));
        }
        names
    }

    /// Every weight's name and shape, in [`Config::weight_names`] order (what detection expects).
    pub fn expected(&self) -> Vec<(String, Vec<usize>)> {
        let (p, d) = (self.patch, self.hidden);
        let mut shapes = vec![
            vec![d, 3, self.temporal_patch, p, p],
            vec![d],
            vec![self.position_side * self.position_side, d],
        ];
        for _ in 0..self.depth {
            shapes.extend(self.block_shapes());
        }
        shapes.extend(self.merger_shapes(d));
        for _ in 0..self.deepstack.len() {
            shapes.extend(self.merger_shapes(MERGE * MERGE * d));
        }
        self.weight_names().into_iter().zip(shapes).collect()
    }

    /// A merger's shapes, in [`MERGER_TENSORS`] order, for a norm over `norm` features (the final merger
    /// normalises each patch, a DeepStack merger each merged 2 × 2 group).
    fn merger_shapes(&self, norm: usize) -> [Vec<usize>; 6] {
        let merged = MERGE * MERGE * self.hidden;
        [
            vec![norm],
            vec![norm],
            vec![merged, merged],
            vec![merged],
            vec![self.out_hidden, merged],
            vec![self.out_hidden],
        ]
    }

    /// The shapes of one block's weights, in [`BLOCK_TENSORS`] order.
    fn block_shapes(&self) -> [Vec<usize>; 12] {
        let (d, f) = (self.hidden, self.intermediate);
        [
            vec![d],
            vec![d],
            vec![3 * d, d],
            vec![3 * d],
            vec![d, d],
            vec![d],
            vec![d],
            vec![d],
            vec![f, d],
            vec![f],
            vec![d, f],
            vec![d],
        ]
    }
}

/// The DeepStack indexes of a tower of `depth` blocks, `hidden` wide, with `count` DeepStack mergers: ComfyUI's
/// fixed ones for a released tower ([`RELEASED_DEEPSTACK`]); for any other (a tiny reference or synthetic file)
/// evenly spaced from block 0, `k · ⌊depth / count⌋` (4 blocks and 2 mergers: [0, 2]). `None` when a released
/// width and depth come with another count.
pub fn deepstack_indexes(hidden: usize, depth: usize, count: usize) -> Option<Vec<usize>> {
    match RELEASED_DEEPSTACK.iter().find(|&&(h, d, _)| (h, d) == (hidden, depth)) {
        Some((_, _, fixed)) => (fixed.len() == count).then(|| fixed.to_vec()),
        None => Some((0..count).map(|k| k * (depth / count.max(1))).collect()),
    }
}

/// The Qwen3-VL vision tower in `h` (`None` when the file has no `visual.deepstack_merger_list.0.norm.weight`,
/// ComfyUI's own test for Qwen3-VL: a text-only file, or Qwen2.5-VL's or Qwen3.5's tower), every width derived
/// from the shapes, the heads [`HEADS`] and the DeepStack indexes by [`deepstack_indexes`]. A tower with a
/// tensor missing, of a dtype Kiln cannot compute with or of a disagreeing shape, a position table that is not
/// square, or a released width and depth with other than 3 DeepStack mergers is [`crate::Error::Unsupported`]
/// naming it. (Whether the widths split into [`HEADS`] heads is checked when an image runs, so that a tiny
/// file's language model still loads.)
pub fn detect(h: &Header) -> Result<Option<Config>> {
    let first_deepstack = "visual.deepstack_merger_list.0.norm.weight";
    let key = h.key(first_deepstack);
    let unsupported = h.unsupported_dtypes().any(|(n, _)| format!("{}{n}", h.prefix()) == key);
    if !h.has(first_deepstack) && !unsupported {
        return Ok(None);
    }
    let [hidden, channels, temporal_patch, patch, patch_w] = dims(h, PATCH_EMBED[0])?;
    if channels != 3 || patch != patch_w || patch == 0 || temporal_patch == 0 {
        return Err(h.unsupported(format!(
            "a Qwen3-VL vision tower whose patch embedding `{}` is {:?} (expected [width, 3, frames, side, \
             side])",
            h.key(PATCH_EMBED[0]),
            [hidden, channels, temporal_patch, patch, patch_w]
        )));
    }
    let [positions, _] = dims(h, POS_EMBED)?;
    let position_side = (positions as f64).sqrt().round() as usize;
    if position_side == 0 || position_side * position_side != positions {
        return Err(h.unsupported(format!(
            "a Qwen3-VL vision tower whose position table `{}` has {positions} entries, not a square",
            h.key(POS_EMBED)
        )));
    }
    let depth = h.gapless_blocks("visual.blocks.", "a Qwen3-VL vision tower's blocks")?;
    let mergers = h.gapless_blocks(
        "visual.deepstack_merger_list.",
        "a Qwen3-VL vision tower's DeepStack mergers",
    )?;
    let deepstack = deepstack_indexes(hidden, depth, mergers).ok_or_else(|| {
        h.unsupported(format!(
            "a Qwen3-VL vision tower {hidden} wide with {depth} blocks has {mergers} DeepStack mergers \
             (ComfyUI's has 3)"
        ))
    })?;
    if depth == 0 || deepstack.iter().any(|&i| i >= depth) {
        return Err(h.unsupported(format!(
            "a Qwen3-VL vision tower with {depth} blocks and {mergers} DeepStack mergers"
        )));
    }
    let [intermediate, _] = dims(h, "visual.blocks.0.mlp.linear_fc1.weight")?;
    let [out_hidden, _] = dims(h, "visual.merger.linear_fc2.weight")?;
    let config = Config {
        hidden,
        depth,
        heads: HEADS,
        intermediate,
        out_hidden,
        patch,
        temporal_patch,
        position_side,
        deepstack,
    };
    for (name, want) in config.expected() {
        check_shape(h, &name, &want)?;
    }
    Ok(Some(config))
}

/// What to load: every weight of the tower ([`Config::weight_names`]), under ComfyUI's names (`visual.*`),
/// read from the file's (transformers' `model.visual.*` where the file nests its language model).
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    h.plan_by_name(cfg.weight_names())
}
