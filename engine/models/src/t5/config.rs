//! [`Config`]: a T5 v1.1 encoder's widths, detected from a file's tensor shapes, and the [`LoadPlan`] of the
//! weights its last hidden state needs (models-flux.md §5.1).

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
/// The relative position bias table `[buckets, heads]`, in block 0 only and shared by every block.
pub(super) const POSITION_BIAS: &str =
    "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight";
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
    let present = |name: &str| h.has(name) || h.unsupported_dtypes().any(|(n, _)| n == name);
    if !present("encoder.block.0.layer.0.SelfAttention.q.weight") {
        return Ok(None);
    }
    let blocks = count_blocks(h)?;
    if let Some(i) = (1..blocks).find(|i| {
        present(&format!("encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight"))
    }) {
        return Err(h.unsupported(format!(
            "an umT5 encoder (block {i} has its own relative position bias; Wan's text encoder), not the T5 \
             v1.1 encoder Flux conditions on"
        )));
    }
    if present("encoder.block.0.layer.1.DenseReluDense.wi.weight") {
        return Err(h.unsupported(
            "a T5 encoder with an ungated feed-forward (`DenseReluDense.wi`, T5 v1.0), not T5 v1.1's gated-GELU",
        ));
    }
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
    }
    check_shape(h, FINAL_NORM, &[d_model])?;
    Ok(Some(config))
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

/// The number of encoder blocks: indices `encoder.block.{i}.` must run 0, 1, … without a gap.
fn count_blocks(h: &Header) -> Result<usize> {
    h.gapless_blocks("encoder.block.", "a T5 layout whose blocks")
}
