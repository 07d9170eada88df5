//! Choosing each generated token from a language model's logits, as ComfyUI's `BaseGenerate.sample_token`
//! does on the CPU (`TextGenerate`): greedy, or sampled after the repetition and presence penalties,
//! temperature, top-k, min-p and top-p, with torch's `multinomial` on a generator seeded once per run. All of it
//! is f32 as there (the top-p cumulative sum accumulates in f64, as torch's CPU `cumsum` does), so the same seed
//! picks the same tokens from the same logits.

use crate::noise::TorchGenerator;

/// The sampling settings of `TextGenerate`'s `on` mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingSettings {
    /// Divides the logits (0 is greedy).
    pub temperature: f32,
    /// Keeps the k likeliest tokens (0: all).
    pub top_k: usize,
    /// Keeps the likeliest tokens up to this total probability (1: all).
    pub top_p: f32,
    /// Drops tokens less likely than this fraction of the likeliest (0: none).
    pub min_p: f32,
    /// Divides positive (multiplies negative) logits of tokens generated so far (1: none).
    pub repetition_penalty: f32,
    /// Subtracted from the logits of tokens generated so far (0: none).
    pub presence_penalty: f32,
    /// The generator's seed (only its low 32 bits count, as `manual_seed`).
    pub seed: u64,
}

/// How tokens are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decoding {
    /// The likeliest token (`sampling_mode` off).
    Greedy,
    /// Sampled.
    Sample(SamplingSettings),
}

/// How `TextGenerate` asks the tokenizer to frame its prompt (ComfyUI's `thinking` and `use_default_template`),
/// for the encoders whose tokenizers read them (Qwen3-VL's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChatOptions {
    /// Leave the assistant turn open for a reasoning block (without it, an empty `<think>` block follows the
    /// template).
    pub thinking: bool,
    /// Put the prompt in the encoder's template (without it, the prompt goes in as written).
    pub default_template: bool,
}

impl Default for ChatOptions {
    /// ComfyUI's defaults: no thinking, the default template.
    fn default() -> ChatOptions {
        ChatOptions { thinking: false, default_template: true }
    }
}

/// Chooses tokens one after another; remembers what it generated (the penalties' history) and the
/// generator's state.
#[derive(Debug)]
pub struct TokenPicker {
    decoding: Decoding,
    generator: Option<TorchGenerator>,
    history: Vec<u32>,
}

impl TokenPicker {
    /// A picker for one generation run.
    pub fn new(decoding: Decoding) -> TokenPicker {
        let generator = match decoding {
            Decoding::Sample(s) => Some(TorchGenerator::new(s.seed)),
            Decoding::Greedy => None,
        };
        TokenPicker { decoding, generator, history: Vec::new() }
    }

    /// The next token from `logits` `[vocab]`.
    pub fn pick(&mut self, mut logits: Vec<f32>) -> u32 {
        let token = match (self.decoding, self.generator.as_mut()) {
            (Decoding::Sample(s), Some(generator)) if s.temperature != 0.0 => {
                sample(&mut logits, &s, &self.history, generator)
            }
            _ => argmax(&logits),
        };
        self.history.push(token);
        token
    }
}

/// The first index of the largest value (torch's `argmax`).
fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] || (values[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best as u32
}

/// `torch.softmax` over f32 values: exp(x − max) / Σ.
fn softmax(values: &[f32]) -> Vec<f32> {
    let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = values.iter().map(|&v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.into_iter().map(|e| e / sum).collect()
}

/// Sets the logits of tokens less likely than `min_p` times the likeliest to f32's lowest.
fn apply_min_p(logits: &mut [f32], min_p: f32) {
    if min_p <= 0.0 {
        return;
    }
    let probs = softmax(logits);
    let threshold = min_p * probs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for (l, p) in logits.iter_mut().zip(probs) {
        if p < threshold {
            *l = f32::MIN;
        }
    }
}

/// Keeps the likeliest tokens whose probabilities, summed in descending order (in f64), first pass `top_p`;
/// the others' logits become f32's lowest. The likeliest is always kept.
fn apply_top_p(logits: &mut [f32], top_p: f32) {
    if top_p >= 1.0 {
        return;
    }
    let mut order: Vec<usize> = (0..logits.len()).collect();
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    let sorted: Vec<f32> = order.iter().map(|&i| logits[i]).collect();
    let mut sum = 0.0f64;
    for (rank, p) in softmax(&sorted).into_iter().enumerate() {
        sum += f64::from(p);
        if rank > 0 && (sum as f32) > top_p {
            logits[order[rank]] = f32::MIN;
        }
    }
}

/// ComfyUI's sampled `sample_token` on `logits`.
fn sample(
    logits: &mut [f32],
    s: &SamplingSettings,
    history: &[u32],
    generator: &mut TorchGenerator,
) -> u32 {
    if !history.is_empty() && (s.repetition_penalty != 1.0 || s.presence_penalty != 0.0) {
        let mut seen = history.to_vec();
        seen.sort_unstable();
        seen.dedup();
        for id in seen {
            let Some(l) = logits.get_mut(id as usize) else { continue };
            if s.repetition_penalty != 1.0 {
                *l = if *l < 0.0 { *l * s.repetition_penalty } else { *l / s.repetition_penalty };
            }
            if s.presence_penalty != 0.0 {
                *l -= s.presence_penalty;
            }
        }
    }
    if s.temperature != 1.0 {
        logits.iter_mut().for_each(|l| *l /= s.temperature);
    }
    // Top-k: the k largest in descending order (ties by index), sampled among, mapped back to their ids.
    let (mut kept, ids): (Vec<f32>, Option<Vec<usize>>) = if s.top_k > 0 {
        let k = s.top_k.min(logits.len());
        let descending = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
        let mut order: Vec<usize> = (0..logits.len()).collect();
        if k < order.len() {
            order.select_nth_unstable_by(k, descending);
            order.truncate(k);
        }
        order.sort_by(descending);
        (order.iter().map(|&i| logits[i]).collect(), Some(order))
    } else {
        (logits.to_vec(), None)
    };
    apply_min_p(&mut kept, s.min_p);
    apply_top_p(&mut kept, s.top_p);
    let probs = softmax(&kept);
    // torch.multinomial(probs, 1): argmax of p / q with q ~ Exp(1) drawn for every entry.
    let q = generator.exponential(probs.len());
    let ratios: Vec<f32> = probs.iter().zip(&q).map(|(p, q)| p / q).collect();
    let chosen = argmax(&ratios) as usize;
    match ids {
        Some(ids) => ids[chosen] as u32,
        None => chosen as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SamplingSettings {
        SamplingSettings {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            seed: 0,
        }
    }

    #[test]
    fn greedy_takes_the_first_largest() {
        let mut picker = TokenPicker::new(Decoding::Greedy);
        assert_eq!(picker.pick(vec![0.0, 3.0, 1.0, 3.0]), 1);
    }

    #[test]
    fn a_certain_token_is_always_sampled() {
        let mut picker =
            TokenPicker::new(Decoding::Sample(SamplingSettings { seed: 5, ..settings() }));
        for _ in 0..20 {
            assert_eq!(picker.pick(vec![-1e9, 50.0, -1e9]), 1);
        }
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_seed() {
        for seed in 0..10 {
            let s = SamplingSettings { top_k: 1, seed, ..settings() };
            assert_eq!(TokenPicker::new(Decoding::Sample(s)).pick(vec![0.1, 0.3, 0.2]), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_likeliest_even_alone() {
        let mut logits = vec![5.0, 0.0, -1.0];
        apply_top_p(&mut logits, 0.1);
        assert_eq!(logits, [5.0, f32::MIN, f32::MIN]);
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative_logits() {
        let mut generator = TorchGenerator::new(0);
        let s = SamplingSettings { repetition_penalty: 2.0, top_k: 2, ..settings() };
        // Token 0 was generated: its 4.0 becomes 2.0, below token 1's 3.0; top-k 2 keeps 1 then 0.
        let mut logits = vec![4.0, 3.0, -8.0];
        sample(&mut logits, &s, &[0, 2], &mut generator);
        assert_eq!(logits, [2.0, 3.0, -16.0]);
    }
}
