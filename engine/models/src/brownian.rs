//! torchsde's Brownian tree as ComfyUI's SDE samplers draw their noise from it (`BrownianTreeNoiseSampler`:
//! `torchsde.BrownianTree(t0, zeros, t1, entropy=seed)` on the CPU), bit for bit.
//!
//! The tree is torchsde 0.2.6's `BrownianInterval` with `halfway_tree=True`, `tol=1e-6`, `pool_size=24` and no
//! Lévy area: an interval splits at its midpoint (times rounded to 6 decimals, as Python's `round`), the left
//! child's increment is a Brownian bridge sample `mean + √var · z` from its parent's increment, and the right
//! child's is the rest. Each split's `z` is `torch.randn` from a generator seeded by numpy's `SeedSequence` of
//! (seed, spawn key, depth), where a node's spawn key is its path from the root. A query returns the sum of the
//! increments of the intervals it covers, found from the last interval queried as torchsde searches; the times
//! are the f32 sigmas as Python floats, and the arithmetic on the increments f32 as torch's.
//!
//! References: torchsde `_brownian/brownian_interval.py` and `derived.py`; numpy `bit_generator.pyx`
//! (`SeedSequence`); ComfyUI `comfy/k_diffusion/sampling.py` (`BatchedBrownianTree`,
//! `BrownianTreeNoiseSampler`).

use crate::noise::TorchGenerator;

/// numpy's `SeedSequence` hashing constants.
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;

/// torchsde's `pool_size` for `BrownianTree`.
const POOL_SIZE: usize = 24;

/// numpy's `SeedSequence(entropy, spawn_key, pool_size).generate_state(n)` (uint32 words).
pub fn seed_sequence(entropy: u64, spawn_key: &[u64], pool_size: usize, n: usize) -> Vec<u32> {
    // An int becomes its 32-bit words, least significant first (0 is one word).
    let words = |mut v: u64| {
        let mut out = vec![(v & 0xffff_ffff) as u32];
        v >>= 32;
        while v > 0 {
            out.push((v & 0xffff_ffff) as u32);
            v >>= 32;
        }
        out
    };
    let mut entropy_words = words(entropy);
    let spawn: Vec<u32> = spawn_key.iter().flat_map(|&k| words(k)).collect();
    if !spawn.is_empty() && entropy_words.len() < pool_size {
        entropy_words.resize(pool_size, 0);
    }
    entropy_words.extend(spawn);

    let mut hash_const = INIT_A;
    let mut hashmix = |value: u32| {
        let mut v = value ^ hash_const;
        hash_const = hash_const.wrapping_mul(MULT_A);
        v = v.wrapping_mul(hash_const);
        v ^ (v >> XSHIFT)
    };
    let mix = |x: u32, y: u32| {
        let r = MIX_MULT_L.wrapping_mul(x).wrapping_sub(MIX_MULT_R.wrapping_mul(y));
        r ^ (r >> XSHIFT)
    };
    let mut pool: Vec<u32> =
        (0..pool_size).map(|i| hashmix(entropy_words.get(i).copied().unwrap_or(0))).collect();
    for src in 0..pool_size {
        for dst in 0..pool_size {
            if src != dst {
                let h = hashmix(pool[src]);
                pool[dst] = mix(pool[dst], h);
            }
        }
    }
    for &e in entropy_words.iter().skip(pool_size) {
        for slot in pool.iter_mut() {
            let h = hashmix(e);
            *slot = mix(*slot, h);
        }
    }

    let mut hash_const = INIT_B;
    (0..n)
        .map(|i| {
            let mut v = pool[i % pool_size] ^ hash_const;
            hash_const = hash_const.wrapping_mul(MULT_B);
            v = v.wrapping_mul(hash_const);
            v ^ (v >> XSHIFT)
        })
        .collect()
}

/// Python's `round(x, 6)`: the nearest 6-decimal value, as correctly rounded decimal digits read back.
fn round6(x: f64) -> f64 {
    format!("{x:.6}").parse().unwrap_or(x)
}

/// `torch.randn(n)` from a generator seeded with `seed`.
fn randn(seed: u32, n: usize) -> Vec<f32> {
    TorchGenerator::new(u64::from(seed)).randn(n)
}

/// One interval of the tree.
struct Node {
    start: f64,
    end: f64,
    parent: Option<usize>,
    is_left: bool,
    /// Set once split: the midpoint, the children, and the seed of the left child's bridge sample.
    split: Option<Split>,
    /// The increment over the interval, once computed.
    w: Option<Vec<f32>>,
}

struct Split {
    midway: f64,
    left: usize,
    right: usize,
    w_seed: u32,
}

/// torchsde's `BrownianTree` over `[t0, t1]` for tensors of `size` values.
pub struct BrownianTree {
    nodes: Vec<Node>,
    entropy: u64,
    size: usize,
    last: usize,
}

impl BrownianTree {
    /// The tree of `entropy` (ComfyUI's seed) on `[t0, t1]` (t0 < t1).
    pub fn new(t0: f64, t1: f64, entropy: u64, size: usize) -> BrownianTree {
        let state = seed_sequence(entropy, &[], POOL_SIZE, 3);
        let w = randn(state[0], size);
        let scale = (t1 - t0).sqrt() as f32;
        let root = Node {
            start: round6(t0),
            end: round6(t1),
            parent: None,
            is_left: false,
            split: None,
            w: Some(w.iter().map(|v| v * scale).collect()),
        };
        BrownianTree { nodes: vec![root], entropy, size, last: 0 }
    }

    /// The path key and depth of node `i` (`_spawn_key`, `_depth`): the root is (0, 0), a left child 2k, a
    /// right child 2k + 1.
    fn key(&self, i: usize) -> (u64, u64) {
        match self.nodes[i].parent {
            None => (0, 0),
            Some(p) => {
                let (k, d) = self.key(p);
                (2 * k + u64::from(!self.nodes[i].is_left), d + 1)
            }
        }
    }

    /// `_split_exact`: children at `midway`.
    fn split_exact(&mut self, i: usize, midway: f64) {
        let midway = round6(midway);
        let (key, depth) = self.key(i);
        let w_seed = seed_sequence(self.entropy, &[key, depth], POOL_SIZE, 4)[0];
        let (start, end) = (self.nodes[i].start, self.nodes[i].end);
        let child = |start: f64, end: f64, is_left| Node {
            start: round6(start),
            end: round6(end),
            parent: Some(i),
            is_left,
            split: None,
            w: None,
        };
        let left = self.nodes.len();
        self.nodes.push(child(start, midway, true));
        self.nodes.push(child(midway, end, false));
        self.nodes[i].split = Some(Split { midway, left, right: left + 1, w_seed });
    }

    /// `_split` of the halfway tree: at the rounded midpoint, then down the side of `midway` until a midpoint
    /// lands on it.
    fn split(&mut self, mut i: usize, midway: f64) {
        loop {
            let half = 0.5 * (self.nodes[i].end + self.nodes[i].start);
            self.split_exact(i, half);
            let split = self.nodes[i].split.as_ref().expect("just split");
            i = if midway > split.midway {
                split.right
            } else if midway < split.midway {
                split.left
            } else {
                return;
            };
        }
    }

    /// `_loc_inner`: appends the intervals that make up `[ta, tb]`, searching from node `i`.
    fn locate(&mut self, mut i: usize, ta: f64, tb: f64, out: &mut Vec<usize>) {
        loop {
            let (start, end) = (self.nodes[i].start, self.nodes[i].end);
            if ta < start || tb > end {
                i = self.nodes[i].parent.expect("the root covers every query");
                continue;
            }
            if ta == start && tb == end {
                out.push(i);
                return;
            }
            match &self.nodes[i].split {
                None => {
                    if ta == start {
                        self.split(i, tb);
                        i = self.nodes[i].split.as_ref().expect("split").left;
                    } else {
                        self.split(i, ta);
                        i = self.nodes[i].split.as_ref().expect("split").right;
                    }
                }
                Some(split) => {
                    let (midway, left, right) = (split.midway, split.left, split.right);
                    if tb <= midway {
                        i = left;
                    } else if ta >= midway {
                        i = right;
                    } else {
                        self.locate(left, ta, midway, out);
                        return self.locate(right, midway, tb, out);
                    }
                }
            }
        }
    }

    /// The increment over node `i` (computed from its ancestors' and kept).
    fn increment(&mut self, i: usize) -> Vec<f32> {
        if let Some(w) = &self.nodes[i].w {
            return w.clone();
        }
        let p = self.nodes[i].parent.expect("the root has its increment");
        let w = self.increment(p);
        let (start, end) = (self.nodes[p].start, self.nodes[p].end);
        let split = self.nodes[p].split.as_ref().expect("a parent is split");
        let h_reciprocal = 1.0 / (end - start);
        let left_diff = split.midway - start;
        let right_diff = end - split.midway;
        let var = left_diff * right_diff * h_reciprocal;
        let noise = randn(split.w_seed, self.size);
        let (a, b, c) = (left_diff as f32, h_reciprocal as f32, var.sqrt() as f32);
        let left: Vec<f32> = w.iter().zip(&noise).map(|(w, z)| a * w * b + c * z).collect();
        let out = if self.nodes[i].is_left {
            left
        } else {
            w.iter().zip(&left).map(|(w, l)| w - l).collect()
        };
        self.nodes[i].w = Some(out.clone());
        out
    }

    /// The Brownian increment W(tb) − W(ta) (ta ≤ tb, clamped into the tree's span), as torchsde answers it.
    pub fn query(&mut self, ta: f64, tb: f64) -> Vec<f32> {
        let (lo, hi) = (self.nodes[0].start, self.nodes[0].end);
        let (ta, tb) = (ta.clamp(lo, hi), tb.clamp(lo, hi));
        if ta == tb {
            return vec![0.0; self.size];
        }
        let mut intervals = Vec::new();
        let (ta, tb) = (round6(ta), round6(tb));
        self.locate(self.last, ta, tb, &mut intervals);
        self.last = *intervals.last().expect("at least one interval");
        let mut w = self.increment(intervals[0]);
        for &i in &intervals[1..] {
            let wi = self.increment(i);
            w.iter_mut().zip(&wi).for_each(|(w, v)| *w += v);
        }
        w
    }
}

/// ComfyUI's `BrownianTreeNoiseSampler` for one seed: unit-variance noise for a step from σ to σ_next,
/// `(W(σ_next) − W(σ)) / √|σ_next − σ|` with the sign of the step.
pub struct BrownianNoise {
    tree: BrownianTree,
}

impl BrownianNoise {
    /// The sampler for sigmas in `[sigma_min, sigma_max]` (the schedule's smallest non-zero and largest).
    pub fn new(sigma_min: f32, sigma_max: f32, seed: u64, size: usize) -> BrownianNoise {
        let (t0, t1) =
            if sigma_min < sigma_max { (sigma_min, sigma_max) } else { (sigma_max, sigma_min) };
        BrownianNoise { tree: BrownianTree::new(f64::from(t0), f64::from(t1), seed, size) }
    }

    /// The tree's increment W(hi) − W(lo) (lo ≤ hi).
    pub fn increment(&mut self, lo: f32, hi: f32) -> Vec<f32> {
        self.tree.query(f64::from(lo), f64::from(hi))
    }

    /// The noise for the step from `sigma` to `next`. torch divides by the step's square root taken with MKL,
    /// which for some values rounds one ulp from the correctly rounded root taken here.
    pub fn sample(&mut self, sigma: f32, next: f32) -> Vec<f32> {
        let (t0, t1, sign) = if sigma < next { (sigma, next, 1.0) } else { (next, sigma, -1.0) };
        let w = self.increment(t0, t1);
        // The tree was built from (sigma_min, sigma_max), so its own sign is +1.
        let scale = (next - sigma).abs().sqrt();
        w.iter().map(|v| v * sign / scale).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_sequence_is_numpys() {
        // numpy 2.x: `SeedSequence(entropy, spawn_key, pool_size=24).generate_state(n)`.
        assert_eq!(seed_sequence(77, &[], 24, 3), [2036740624, 794572212, 3236796866]);
        assert_eq!(
            seed_sequence(77, &[5, 3], 24, 4),
            [1363805981, 2154188981, 2774708191, 41106064]
        );
        assert_eq!(
            seed_sequence((1 << 40) + 3, &[0, 0], 24, 4),
            [2818185428, 3486231666, 4234899130, 735342412]
        );
    }

    #[test]
    fn round6_is_pythons_round() {
        assert_eq!(round6(0.123_456_7), 0.123_457);
        assert_eq!(round6(0.5), 0.5);
        assert_eq!(round6(1e-7), 0.0);
    }
}
