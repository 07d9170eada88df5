//! [`VisionConfig`]: the widths of a Qwen2.5-VL vision tower (`visual.*` in a `qwen_2.5_vl_7b` file), detected
//! from the tensor shapes, and the names of its weights.

use crate::error::Result;
use crate::header::Header;
use crate::qwen3::{check_shape, dims};

/// Attention heads (ComfyUI's `Qwen2VLVisionTransformer` fixes 16; the shapes give only their total width).
pub const HEADS: usize = 16;
/// Blocks that attend over the whole image; the others attend within windows (ComfyUI's
/// `fullatt_block_indexes`, the released model's).
pub const FULL_ATTENTION_BLOCKS: [usize; 4] = [7, 15, 23, 31];
/// Side of a window in pixels (112: 4 × 4 merged patches of 28 pixels).
pub(super) const WINDOW: usize = 112;
/// Patches merged into one language-model token along each side.
pub const MERGE: usize = 2;
/// RMSNorm ε of every norm.
pub(super) const EPS: f32 = 1e-6;
/// RoPE base θ of the patch positions.
pub(super) const ROPE_THETA: f32 = 10_000.0;

/// The tensors of one block, after `visual.blocks.{i}.`, in the order the tower fetches them.
const BLOCK_TENSORS: [&str; 12] = [
    "norm1.weight",
    "attn.qkv.weight",
    "attn.qkv.bias",
    "attn.proj.weight",
    "attn.proj.bias",
    "norm2.weight",
    "mlp.gate_proj.weight",
    "mlp.gate_proj.bias",
    "mlp.up_proj.weight",
    "mlp.up_proj.bias",
    "mlp.down_proj.weight",
    "mlp.down_proj.bias",
];

/// The patch embedding (a 3-D convolution whose kernel is its stride: one linear map per patch).
pub(crate) const PATCH_EMBED: &str = "visual.patch_embed.proj.weight";

/// The merger's tensors, in the order the tower fetches them.
pub(crate) const MERGER: [&str; 5] = [
    "visual.merger.ln_q.weight",
    "visual.merger.mlp.0.weight",
    "visual.merger.mlp.0.bias",
    "visual.merger.mlp.2.weight",
    "visual.merger.mlp.2.bias",
];

/// A Qwen2.5-VL vision tower's hyperparameters (7B: width 1280, 32 blocks, MLP 3420, output 3584, patches of
/// 14 × 14 pixels × 2 frames).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VisionConfig {
    /// Width of the blocks.
    pub hidden: usize,
    /// Blocks.
    pub depth: usize,
    /// MLP (SwiGLU) width.
    pub intermediate: usize,
    /// Width of the merged tokens it gives the language model (its hidden size).
    pub out_hidden: usize,
    /// Side of a patch in pixels.
    pub patch: usize,
    /// Frames in a patch (an image is repeated to fill them).
    pub temporal_patch: usize,
}

impl VisionConfig {
    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.hidden / HEADS
    }

    /// Values in one flattened patch: channels × frames × side × side (1176).
    pub fn patch_values(&self) -> usize {
        3 * self.temporal_patch * self.patch * self.patch
    }

    /// The names of block `i`'s weights, in the order the tower fetches them.
    pub fn block_names(&self, i: usize) -> Vec<String> {
        BLOCK_TENSORS.iter().map(|t| format!("visual.blocks.{i}.{t}")).collect()
    }

    /// Every weight's name, patch embedding first, then the blocks, then the merger.
    pub fn weight_names(&self) -> Vec<String> {
        let mut names = vec![PATCH_EMBED.to_owned()];
        for i in 0..self.depth {
            names.extend(self.block_names(i));
        }
        names.extend(MERGER.iter().map(|&n| n.to_owned()));
        names
    }

    /// Every weight's name and shape, in [`VisionConfig::weight_names`] order (what detection expects; what
    /// `kiln model synth` writes).
    pub fn expected(&self) -> Vec<(String, Vec<usize>)> {
        let (p, d) = (self.patch, self.hidden);
        let mut shapes = vec![vec![d, 3, self.temporal_patch, p, p]];
        for _ in 0..self.depth {
            shapes.extend(self.block_shapes());
        }
        shapes.extend(self.merger_shapes());
        self.weight_names().into_iter().zip(shapes).collect()
    }

    /// The merger's shapes, in [`MERGER`] order.
    fn merger_shapes(&self) -> [Vec<usize>; 5] {
        let merged = MERGE * MERGE * self.hidden;
        [
            vec![self.hidden],
            vec![merged, merged],
            vec![merged],
            vec![self.out_hidden, merged],
            vec![self.out_hidden],
        ]
    }

    /// The shapes of one block's weights, in [`VisionConfig::block_names`] order.
    fn block_shapes(&self) -> [Vec<usize>; 12] {
        let (d, f) = (self.hidden, self.intermediate);
        [
            vec![d],
            vec![3 * d, d],
            vec![3 * d],
            vec![d, d],
            vec![d],
            vec![d],
            vec![f, d],
            vec![f],
            vec![f, d],
            vec![f],
            vec![d, f],
            vec![d],
        ]
    }
}

/// The vision tower in `h` (`None` when the file has no `visual.patch_embed.proj.weight`: a text-only file),
/// every width derived from the shapes. A tower with a tensor missing, of a dtype Kiln cannot compute with,
/// of a disagreeing shape, or a width the fixed 16 heads do not divide into RoPE-able heads is
/// [`crate::Error::Unsupported`] naming it.
pub fn detect(h: &Header) -> Result<Option<VisionConfig>> {
    if !h.has(PATCH_EMBED) && !h.unsupported_dtypes().any(|(n, _)| n == PATCH_EMBED) {
        return Ok(None);
    }
    let [hidden, channels, temporal_patch, patch, patch_w] = dims(h, PATCH_EMBED)?;
    if channels != 3 || patch != patch_w || hidden % (4 * HEADS) != 0 {
        return Err(h.unsupported(format!(
            "a Qwen2.5-VL vision tower whose patch embedding `{}` is {:?} (expected [16·4·k, 3, frames, \
             side, side])",
            h.key(PATCH_EMBED),
            [hidden, channels, temporal_patch, patch, patch_w]
        )));
    }
    let depth = h
        .names()
        .filter_map(|n| n.strip_prefix("visual.blocks.")?.split_once('.')?.0.parse::<usize>().ok())
        .map(|i| i + 1)
        .max()
        .unwrap_or(0);
    let [intermediate, _] = dims(h, "visual.blocks.0.mlp.gate_proj.weight")?;
    let [out_hidden, _] = dims(h, MERGER[3])?;
    let config = VisionConfig { hidden, depth, intermediate, out_hidden, patch, temporal_patch };
    for i in 0..depth {
        for (name, want) in config.block_names(i).iter().zip(config.block_shapes()) {
            check_shape(h, name, &want)?;
        }
    }
    for (name, want) in MERGER.iter().zip(config.merger_shapes()) {
        check_shape(h, name, &want)?;
    }
    Ok(Some(config))
}
