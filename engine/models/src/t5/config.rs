//! [`Config`]: a T5 v1.1 encoder's widths, detected from a file's tensor shapes, and the [`LoadPlan`] of the
//! weights its last hidden state needs (models-flux.md §5.1); the same for umT5, T5 v1.1 with a relative position
//! bias table in every block (models-wan-video.md §2.4), which [`detect`] refuses and [`detect_umt5`] claims.

use kiln_compute::memory::{LoadPlan, SlotPlan};

use crate::error::Result;
use crate::header::Header;
use crate::qwen3::{check_shape, dims};

/// T5's RMSNorm ε (`layer_norm_epsilon` of every T5 v1.1 size).
pub const RMS_EPS: f32 = 1e-6;
/// The relative distance past which positions share a bucket (`relative_attention_max_distance`; the shapes do
/// not give it, every T5 v1.1 size uses 128).
pub const MAX_DISTANCE: usize = 128;

/// The token embedding table.
pub(super) const EMBED: &str = "shared.weight";
/// The relative position bias table `[buckets, heads]`, in block 0 only and shared by every block (umT5: block
/// 0's own, [`position_bias_name`]).
pub(super) const POSITION_BIAS: &str =
    "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
/// umT5's vocabulary (its SentencePiece model's 256 000 pieces, the embedding padded to a multiple of 128), by
/// which a one-block file is known as umT5.
pub const UMT5_VOCAB: usize = 256_384;
/// The norm after the last block.
pub(super) const FINAL_NORM: &str = "encoder.final_layer_norm.weight";

/// The tensors of one block, after `encoder.block.{i}.`, in the order [`Config::block_names`] lists them.
const BLOCK_TENSORS: [&str; 9] = [
    "layer.0.layer_norm.weight",
    "layer.0.SelfAttention.q.weight",
    "layer.0.SelfAttention.k.weight",
    "layer.0.SelfAttention.v.weight",
    "layer.0.SelfAttention.o.weight",
    "layer.1.layer_norm.weight",
    "layer.1.DenseReluDense.wi_0.weight",
    "layer.1.DenseReluDense.wi_1.weight",
    "layer.1.DenseReluDense.wo.weight",
];

/// A T5 v1.1 encoder's hyperparameters (T5-XXL: vocab 32128, d_model 4096, 24 blocks, 64 heads of width 64,
/// FFN 10240, 32 buckets).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Rows of the embedding table.
    pub vocab: usize,
    /// Hidden size.
    pub d_model: usize,
    /// Encoder blocks.
    pub blocks: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of one head (the q/k/v projections have `heads · d_kv` rows).
    pub d_kv: usize,
    /// Feed-forward (gated-GELU) width.
    pub d_ff: usize,
    /// Relative position buckets (rows of the bias table).
    pub buckets: usize,
    /// The distance past which relative positions share a bucket.
    pub max_distance: usize,
    /// RMSNorm ε.
    pub rms_eps: f32,
}

impl Config {
    /// The names of block `i`'s weights, in the order the model fetches them: attention norm, q, k, v, o,
    /// feed-forward norm, wi_0 (gate), wi_1, wo.
    pub fn block_names(&self, i: usize) -> Vec<String> {
        BLOCK_TENSORS.iter().map(|t| format!("encoder.block.{i}.{t}")).collect()
    }

    /// Every weight with its shape, in load order (what `kiln model synth` writes).
    pub(crate) fn expected(&self) -> Vec<(String, Vec<usize>)> {
        let mut all = vec![
            (EMBED.to_owned(), vec![self.vocab, self.d_model]),
            (POSITION_BIAS.to_owned(), vec![self.buckets, self.heads]),
        ];
        for i in 0..self.blocks {
            all.extend(self.block_names(i).into_iter().zip(self.block_shapes()));
        }
        all.push((FINAL_NORM.to_owned(), vec![self.d_model]));
        all
    }

    /// Every weight of a umT5 encoder of these widths with its shape, in load order: the embedding, each block
    /// with its own position bias table, the final norm (what `kiln model synth` writes).
    pub(crate) fn umt5_expected(&self) -> Vec<(String, Vec<usize>)> {
        let mut all = vec![(EMBED.to_owned(), vec![self.vocab, self.d_model])];
        for i in 0..self.blocks {
            all.push((position_bias_name(i), vec![self.buckets, self.heads]));
            all.extend(self.block_names(i).into_iter().zip(self.block_shapes()));
        }
        all.push((FINAL_NORM.to_owned(), vec![self.d_model]));
        all
    }

    /// The shapes of one block's weights, in [`Config::block_names`] order.
    fn block_shapes(&self) -> [Vec<usize>; 9] {
        let (d, inner, f) = (self.d_model, self.heads * self.d_kv, self.d_ff);
        [
            vec![d],
            vec![inner, d],
            vec![inner, d],
            vec![inner, d],
            vec![d, inner],
            vec![d],
            vec![f, d],
            vec![f, d],
            vec![d, f],
        ]
    }
}

/// The config of a T5 v1.1 encoder (`None` when the file is not a T5 encoder: it lacks
/// `encoder.block.0.layer.0.SelfAttention.q.weight`), every width derived from the tensor shapes: d_model and
/// the vocabulary from `shared.weight`, heads from the position bias table's columns, the head width from q's
/// rows, the FFN width from `wi_0`, blocks by counting `encoder.block.{i}.`. Decoder tensors (a whole T5 file)
/// are not read.
///
/// [`crate::Error::Unsupported`] names what is wrong with a T5 layout Kiln cannot run: a tensor missing, of an
/// unsupported dtype or of a disagreeing shape; umT5 (Wan's encoder, a position bias in every block, another
/// tokenizer); the ungated T5 v1.0 feed-forward (`DenseReluDense.wi`).
pub fn detect(h: &Header) -> Result<Option<Config>> {
    // Once the file looks like one, what is wrong with it is said as such.
    detect_t5(h).map_err(|e| match e {
        crate::Error::Unsupported { path, msg } if !msg.contains("a T5 encoder") => {
            crate::Error::Unsupported { path, msg: format!("a T5 encoder file, but {msg}") }
        }
        e => e,
    })
}

/// [`detect`] before its errors are worded.
fn detect_t5(h: &Header) -> Result<Option<Config>> {
    if !present(h, "encoder.block.0.layer.0.SelfAttention.q.weight") {
        return Ok(None);
    }
    let blocks = count_blocks(h)?;
    if let Some(i) = (1..blocks).find(|&i| present(h, &position_bias_name(i))) {
        return Err(h.unsupported(format!(
            "an umT5 encoder (block {i} has its own relative position bias; Wan's text encoder), not the T5 \
             v1.1 encoder Flux conditions on"
        )));
    }
    check_gated(h)?;
    read_config(h, blocks, Bias::Shared).map(Some)
}

/// The config of a umT5 encoder (`None` when the file is no umT5: it lacks
/// `encoder.block.0.layer.0.SelfAttention.q.weight`, or block 1 has no relative position bias of its own and the
/// vocabulary is not umT5's [`UMT5_VOCAB`]), every width derived from the shapes as [`detect`] derives them.
/// Every block must have its own position bias table, all of one shape.
///
/// [`crate::Error::Unsupported`] names what is wrong with a umT5 layout Kiln cannot run, as for T5.
pub fn detect_umt5(h: &Header) -> Result<Option<Config>> {
    detect_umt5_unworded(h).map_err(|e| match e {
        crate::Error::Unsupported { path, msg } if !msg.contains("an umT5 encoder") => {
            crate::Error::Unsupported { path, msg: format!("an umT5 encoder file, but {msg}") }
        }
        e => e,
    })
}

/// [`detect_umt5`] before its errors are worded.
fn detect_umt5_unworded(h: &Header) -> Result<Option<Config>> {
    if !present(h, "encoder.block.0.layer.0.SelfAttention.q.weight") {
        return Ok(None);
    }
    let vocab = h.values_shape(EMBED).and_then(|shape| shape.first().copied());
    if !present(h, &position_bias_name(1)) && vocab != Some(UMT5_VOCAB) {
        return Ok(None);
    }
    let blocks = count_blocks(h)?;
    check_gated(h)?;
    read_config(h, blocks, Bias::PerBlock).map(Some)
}

/// Where a T5 layout keeps its relative position bias tables.
#[derive(Clone, Copy)]
enum Bias {
    /// Block 0 only (T5 v1.1).
    Shared,
    /// Every block (umT5).
    PerBlock,
}

/// Whether tensor `name` is in the file, whatever its dtype.
fn present(h: &Header, name: &str) -> bool {
    h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name)
}

/// An error for T5 v1.0's ungated feed-forward.
fn check_gated(h: &Header) -> Result<()> {
    if present(h, "encoder.block.0.layer.1.DenseReluDense.wi.weight") {
        return Err(h.unsupported(
            "a T5 encoder with an ungated feed-forward (`DenseReluDense.wi`, T5 v1.0), not T5 v1.1's gated-GELU",
        ));
    }
    Ok(())
}

/// The widths of a T5 layout of `blocks` blocks with its position bias tables where `bias` says, every tensor's
/// shape checked.
fn read_config(h: &Header, blocks: usize, bias: Bias) -> Result<Config> {
    let [vocab, d_model] = dims(h, EMBED)?;
    let [buckets, heads] = dims(h, POSITION_BIAS)?;
    let [inner, _] = dims(h, "encoder.block.0.layer.0.SelfAttention.q.weight")?;
    let [d_ff, _] = dims(h, "encoder.block.0.layer.1.DenseReluDense.wi_0.weight")?;
    if heads == 0 || inner % heads != 0 || buckets < 4 || buckets / 4 >= MAX_DISTANCE {
        return Err(h.unsupported(format!(
            "a T5 layout whose position bias table [{buckets}, {heads}] does not split q's {inner} rows into \
             whole heads, or has fewer than 4 or more than {} buckets",
            4 * MAX_DISTANCE - 1
        )));
    }
    let config = Config {
        vocab,
        d_model,
        blocks,
        heads,
        d_kv: inner / heads,
        d_ff,
        buckets,
        max_distance: MAX_DISTANCE,
        rms_eps: RMS_EPS,
    };
    for i in 0..blocks {
        for (name, want) in config.block_names(i).iter().zip(config.block_shapes()) {
            check_shape(h, name, &want)?;
        }
        if matches!(bias, Bias::PerBlock) {
            check_shape(h, &position_bias_name(i), &[buckets, heads])?;
        }
    }
    check_shape(h, FINAL_NORM, &[d_model])?;
    Ok(config)
}

/// The relative position bias table of block `i` (T5 v1.1 has block 0's only; umT5 every block's).
pub(super) fn position_bias_name(i: usize) -> String {
    format!("encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight")
}

/// What to load: the embedding table, the position bias table, every block and the final norm, under the
/// file's names without the prefix.
pub fn load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot(EMBED.to_owned()), slot(POSITION_BIAS.to_owned())];
    for i in 0..cfg.blocks {
        slots.extend(cfg.block_names(i).into_iter().map(slot));
    }
    slots.push(slot(FINAL_NORM.to_owned()));
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// What to load of a umT5 encoder: the embedding table, every block with its own position bias table, and the
/// final norm, under the file's names without the prefix (`spiece_model`, the tokenizer, is not a weight).
pub fn umt5_load_plan(h: &Header, cfg: &Config) -> LoadPlan {
    let slot = |name: String| SlotPlan::new(name.clone(), vec![(0, h.key(&name))]);
    let mut slots = vec![slot(EMBED.to_owned())];
    for i in 0..cfg.blocks {
        slots.push(slot(position_bias_name(i)));
        slots.extend(cfg.block_names(i).into_iter().map(slot));
    }
    slots.push(slot(FINAL_NORM.to_owned()));
    LoadPlan { files: vec![h.path().to_path_buf()], slots }
}

/// The number of encoder blocks: indices `encoder.block.{i}.` must run 0, 1, … without a gap.
fn count_blocks(h: &Header) -> Result<usize> {
    h.gapless_blocks("encoder.block.", "a T5 layout whose blocks")
}
