//! [`T5`]: the T5 v1.1 encoder run to its last hidden state, as ComfyUI's `comfy.text_encoders.t5.T5` runs it
//! for Flux (models-flux.md §5.1), and umT5, the same encoder with a relative position bias table in every block,
//! run under an attention mask as ComfyUI runs it for Wan (models-wan-video.md §5.2).
//!
//! ComfyUI looks the embeddings up in f32 (`out_dtype=torch.float32`) and its manual-cast layers cast each
//! weight to the activations' type, so the whole encoder runs in f32 whatever the weights are stored in; the
//! same holds here: every op follows its input's type, and the input is f32.

use kiln_compute::backend::{BinaryOp, PadMode, UnaryOp};
use kiln_compute::memory::Model;
use kiln_compute::{Backend, DType, Tensor, Weight};

use super::config::{Config, EMBED, FINAL_NORM, POSITION_BIAS, position_bias_name};
use crate::error::{Error, Result};
use crate::named::embed_f32;

/// A T5 v1.1 or umT5 encoder: its config and its weights under the memory manager (loaded from
/// [`super::load_plan`] or [`super::umt5_load_plan`]).
#[derive(Debug)]
pub struct T5 {
    /// The hyperparameters.
    pub config: Config,
    /// The weights, by the file's names without prefix.
    pub weights: Model,
    /// Where the relative position bias tables are.
    bias: Bias,
}

/// Which relative position bias table a block adds to its attention scores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bias {
    /// Block 0's, in every block (T5 v1.1).
    Shared,
    /// The block's own (umT5).
    PerBlock,
}

impl T5 {
    /// The T5 v1.1 encoder made of `weights` (loaded from [`super::load_plan`] of the same config).
    pub fn new(config: Config, weights: Model) -> T5 {
        T5 { config, weights, bias: Bias::Shared }
    }

    /// The umT5 encoder made of `weights` (loaded from [`super::umt5_load_plan`] of the same config): each block
    /// adds its own relative position bias.
    pub fn umt5(config: Config, weights: Model) -> T5 {
        T5 { config, weights, bias: Bias::PerBlock }
    }

    /// The last hidden state of `ids` `[1, N, d_model]` (f32): the embeddings, every block (pre-norm
    /// self-attention with the relative position bias of block 0 (umT5: the block's own) and no score scaling,
    /// then the pre-norm gated-GELU feed-forward, each added to the residual), then the final RMSNorm. Every
    /// position attends to every other (no mask, as Flux's ComfyUI encoder runs with `attention_mask=False`).
    /// The ids are taken as given: the caller adds the EOS and padding. One block's weights are on the device
    /// at a time.
    pub fn hidden_state<B: Backend>(&self, b: &B, ids: &[u32]) -> Result<Tensor<B>> {
        self.run(b, ids, None)
    }

    /// The last hidden state of `ids` `[1, N, d_model]` (f32) under ComfyUI's attention mask (`mask[j]` false: no
    /// position attends to key j, whose scores get `−f32::MAX` added, as ComfyUI's `T5Stack` adds
    /// `-finfo(float32).max`), with the rows of masked positions zeroed afterwards (`zero_out_masked`): how
    /// ComfyUI's umT5 encodes a Wan prompt. `mask` has one entry per id. A mask that attends a run of tokens and
    /// then none is encoded over that run alone, which gives the same states.
    pub fn masked_hidden_state<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        mask: &[bool],
    ) -> Result<Tensor<B>> {
        check_mask(ids, mask)?;
        // The usual prompt is a run of attended tokens, then padding nobody attends: the attended rows never
        // read the padding (each of its keys weighs exactly 0 in their softmax) and the padding's rows come
        // out zero, so encoding the run alone and appending zero rows gives the same states, without the
        // padding's share of the work (a short Wan prompt is padded to 512 tokens).
        let attended = mask.iter().take_while(|&&m| m).count();
        if attended > 0 && mask[attended..].iter().all(|&m| !m) {
            let x = self.run(b, &ids[..attended], None)?;
            return Ok(match ids.len() - attended {
                0 => x,
                more => b.pad(&x, 1, 0, more, PadMode::Constant(0.0))?,
            });
        }
        let x = self.run(b, ids, Some(mask))?;
        let keep: Vec<f32> = mask.iter().map(|&m| if m { 1.0 } else { 0.0 }).collect();
        let keep = b.from_f32(&[1, ids.len(), 1], &keep, DType::F32)?;
        Ok(b.binary(&x, &keep, BinaryOp::Mul)?)
    }

    /// The last hidden state of `ids` `[1, N, d_model]` (f32) under ComfyUI's attention mask, every row kept (no
    /// `zero_out_masked`: how ComfyUI's T5-XXL encodes HiDream's prompt, whose pads attend to the prompt).
    pub fn key_masked_hidden_state<B: Backend>(
        &self,
        b: &B,
        ids: &[u32],
        mask: &[bool],
    ) -> Result<Tensor<B>> {
        check_mask(ids, mask)?;
        self.run(b, ids, Some(mask))
    }

    /// The final-normed states of `ids`, keys outside `mask` (when given) never attended.
    fn run<B: Backend>(&self, b: &B, ids: &[u32], mask: Option<&[bool]>) -> Result<Tensor<B>> {
        let cfg = &self.config;
        self.check_ids(ids)?;
        let n = ids.len();
        let mut x = {
            let layer = self.weights.fetch(b, &[EMBED])?;
            embed_f32(b, &layer.weight(0), ids)?.reshape(&[1, n, cfg.d_model])?
        };
        let shared = match self.bias {
            Bias::Shared => {
                let layer = self.weights.fetch(b, &[POSITION_BIAS])?;
                Some(self.position_bias(b, &layer.weight(0), n, mask)?)
            }
            Bias::PerBlock => None,
        };
        for i in 0..cfg.blocks {
            x = self.block(b, i, &x, shared.as_ref(), mask)?;
        }
        let norm = self.weights.fetch(b, &[FINAL_NORM])?;
        Ok(b.rms_norm(&x, Some(&norm.weight(0)), cfg.rms_eps)?)
    }

    /// An error for an empty input or an id outside the vocabulary.
    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        if ids.is_empty() {
            return Err(Error::Invalid("the T5 encoder needs at least one token".into()));
        }
        match ids.iter().find(|&&id| id as usize >= self.config.vocab) {
            Some(id) => Err(Error::Invalid(format!(
                "token id {id} is outside the encoder's vocabulary of {}",
                self.config.vocab
            ))),
            None => Ok(()),
        }
    }

    /// The relative position bias `[1, heads, n, n]` (f32) a block adds to its attention scores: entry
    /// (h, i, j) is row `bucket(j − i)`, column h of `table` (block 0's, or umT5's block's own), gathered on the
    /// host from the table's exact values (ComfyUI's `compute_bias`, in the activations' f32), plus `−f32::MAX`
    /// where `mask` leaves key j out.
    fn position_bias<B: Backend>(
        &self,
        b: &B,
        table: &Weight<'_>,
        n: usize,
        mask: Option<&[bool]>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let table = b.to_f32(&b.weight_to_tensor(table, DType::F32)?)?;
        // The bucket of relative position r = j − i is at index r + n − 1.
        let buckets: Vec<usize> = (0..2 * n - 1)
            .map(|k| {
                let relative = k as i64 - (n as i64 - 1);
                relative_position_bucket(relative, cfg.buckets, cfg.max_distance)
            })
            .collect();
        let mut values = vec![0f32; cfg.heads * n * n];
        for (row, out) in values.chunks_exact_mut(n).enumerate() {
            let (head, i) = (row / n, row % n);
            for (j, v) in out.iter_mut().enumerate() {
                *v = table[buckets[j + n - 1 - i] * cfg.heads + head];
                if mask.is_some_and(|m| !m[j]) {
                    // ComfyUI's order: the mask plus the bias.
                    *v += -f32::MAX;
                }
            }
        }
        Ok(b.from_f32(&[1, cfg.heads, n, n], &values, DType::F32)?)
    }

    /// Block `i` on x `[1, N, d_model]`, with the shared position bias `[1, heads, N, N]` (T5 v1.1), or its own
    /// table's under `mask` (umT5: `shared` is `None`).
    fn block<B: Backend>(
        &self,
        b: &B,
        i: usize,
        x: &Tensor<B>,
        shared: Option<&Tensor<B>>,
        mask: Option<&[bool]>,
    ) -> Result<Tensor<B>> {
        let cfg = &self.config;
        let n = x.dim(1)?;
        let mut names = cfg.block_names(i);
        if shared.is_none() {
            names.push(position_bias_name(i));
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let layer = self.weights.fetch(b, &names)?;
        let weights: Vec<Weight<'_>> = (0..names.len()).map(|j| layer.weight(j)).collect();
        let [attn_norm, q, k, v, o, ff_norm, wi_0, wi_1, wo, own @ ..] = &weights[..] else {
            return Err(Error::Invalid(format!("{} weights for a T5 block", weights.len())));
        };
        let own = match (own, shared) {
            ([], Some(_)) => None,
            ([table], None) => Some(self.position_bias(b, table, n, mask)?),
            _ => return Err(Error::Invalid(format!("{} weights for a T5 block", weights.len()))),
        };
        let Some(bias) = own.as_ref().or(shared) else {
            return Err(Error::Invalid(format!("no position bias for T5 block {i}")));
        };

        // Self-attention: softmax(q·kᵀ + bias)·v, with no 1/√d_kv (T5 folds it into its initialisation).
        let h = b.rms_norm(x, Some(attn_norm), cfg.rms_eps)?;
        let q = heads(b, &h, q, cfg)?;
        let k = heads(b, &h, k, cfg)?;
        let v = heads(b, &h, v, cfg)?;
        let scores = b.binary(&b.matmul(&q, &k, true)?, bias, BinaryOp::Add)?;
        let a = b.matmul(&b.softmax(&scores)?, &v, false)?;
        let a = b.permute(&a, &[0, 2, 1, 3])?.reshape(&[1, n, cfg.heads * cfg.d_kv])?;
        let x = b.binary(x, &b.linear(&a, o, None)?, BinaryOp::Add)?;

        // Gated-GELU feed-forward: gelu_tanh(wi_0·h) ⊙ (wi_1·h), then wo.
        let h = b.rms_norm(&x, Some(ff_norm), cfg.rms_eps)?;
        let gated =
            b.gated(&b.linear(&h, wi_0, None)?, &b.linear(&h, wi_1, None)?, UnaryOp::GeluTanh)?;
        Ok(b.binary(&x, &b.linear(&gated, wo, None)?, BinaryOp::Add)?)
    }
}

/// `h` `[1, N, d_model]` projected by `w` into `[1, heads, N, d_kv]`.
fn heads<B: Backend>(b: &B, h: &Tensor<B>, w: &Weight<'_>, cfg: &Config) -> Result<Tensor<B>> {
    let n = h.dim(1)?;
    let t = b.linear(h, w, None)?.reshape(&[1, n, cfg.heads, cfg.d_kv])?;
    Ok(b.permute(&t, &[0, 2, 1, 3])?)
}

/// An error for a mask without one entry per id.
fn check_mask(ids: &[u32], mask: &[bool]) -> Result<()> {
    if mask.len() != ids.len() {
        return Err(Error::Invalid(format!(
            "an attention mask of {} entries for {} tokens",
            mask.len(),
            ids.len()
        )));
    }
    Ok(())
}

/// The bucket of a relative position (key position − query position) in T5's bidirectional relative
/// attention, as transformers' `T5Attention._relative_position_bucket` computes it: half the buckets for
/// keys after the query; within a half, distances below a quarter of the buckets get a bucket each, longer
/// ones share logarithmically wider buckets up to `max_distance`, beyond which all share the last.
pub fn relative_position_bucket(relative: i64, buckets: usize, max_distance: usize) -> usize {
    let half = buckets / 2;
    let offset = if relative > 0 { half } else { 0 };
    let distance = relative.unsigned_abs() as usize;
    let max_exact = half / 2;
    if distance < max_exact {
        return offset + distance;
    }
    let log_ratio =
        (distance as f64 / max_exact as f64).ln() / (max_distance as f64 / max_exact as f64).ln();
    let large = max_exact + (log_ratio * (half - max_exact) as f64) as usize;
    offset + large.min(half - 1)
}

#[cfg(test)]
mod tests {
    use kiln_compute::backend::cpu::Cpu;
    use kiln_compute::dtype::round_to;
    use kiln_compute::{Backend as _, DType, OwnedWeight};

    use super::{embed_f32, relative_position_bucket};

    #[test]
    fn embeddings_are_exact_f32_rows() {
        let cpu = Cpu::new(1 << 20);
        let values = [0.1f32, -2.0, 3.0, 65504.0, 1.0 / 3.0, 7.0];
        // A scaled f16 table goes row by row (the backend's lookup is for plain tables).
        let table = OwnedWeight::from_f32(cpu.memory(), DType::F16, &[3, 2], &values).unwrap();
        let scaled = table.view().with_scale(Some(2.0));
        let x = embed_f32(&cpu, &scaled, &[2, 0, 2]).unwrap();
        assert_eq!((x.shape(), x.dtype()), (&[3usize, 2][..], DType::F32));
        let f16 = |v: f32| round_to(DType::F16, v);
        let want: Vec<f32> = [4, 5, 0, 1, 4, 5].iter().map(|&i| 2.0 * f16(values[i])).collect();
        assert_eq!(cpu.to_f32(&x).unwrap(), want);
        // A plain table through the lookup.
        let x = embed_f32(&cpu, &table.view(), &[1]).unwrap();
        assert_eq!(cpu.to_f32(&x).unwrap(), [f16(3.0), 65504.0]);
    }

    #[test]
    fn fp8_embeddings_lose_nans_and_infinities() {
        let cpu = Cpu::new(1 << 20);
        let values = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1.5];
        let table = OwnedWeight::from_f32(cpu.memory(), DType::F8E5M2, &[2, 2], &values).unwrap();
        let x = embed_f32(&cpu, &table.view(), &[0, 1]).unwrap();
        assert_eq!(cpu.to_f32(&x).unwrap(), [0.0, f32::MAX, f32::MIN, 1.5]);
    }

    #[test]
    fn buckets_are_transformers() {
        // transformers' `_relative_position_bucket(bidirectional=True, num_buckets=32, max_distance=128)`:
        // each bucket's first distance at and after the query, and the bucket keys before it fall in.
        let after = [
            (0, 0),
            (1, 17),
            (7, 23),
            (8, 24),
            (12, 25),
            (16, 26),
            (23, 27),
            (32, 28),
            (46, 29),
            (64, 30),
            (91, 31),
            (128, 31),
            (10_000, 31),
        ];
        for (distance, bucket) in after {
            assert_eq!(relative_position_bucket(distance, 32, 128), bucket, "+{distance}");
        }
        for (distance, bucket) in [(1, 1), (7, 7), (8, 8), (11, 8), (12, 9), (90, 14), (91, 15)] {
            assert_eq!(relative_position_bucket(-distance, 32, 128), bucket, "-{distance}");
        }
        assert_eq!(relative_position_bucket(i64::MIN, 32, 128), 15);
        assert_eq!(relative_position_bucket(i64::MAX, 32, 128), 31);
    }
}
