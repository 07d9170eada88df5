//! Helpers every test module of this binary uses.

/// `n` deterministic values in [-scale, scale) (xorshift64 from `seed`), the same on every machine.
pub(crate) fn values_scaled(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `n` deterministic values in [-1, 1).
pub(crate) fn values(n: usize, seed: u64) -> Vec<f32> {
    values_scaled(n, seed, 1.0)
}
