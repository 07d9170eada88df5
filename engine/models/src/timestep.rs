//! The sinusoidal timestep features both DiTs embed (diffusers' `Timesteps` with `flip_sin_to_cos`, ComfyUI's
//! `timestep_embedding`), computed as torch computes them: f32 frequencies, f32 products.

/// `[ts.len(), 2·half]` row-major: for each t, cos then sin of `scale · (t · f_k)` with
/// f_k = exp(−ln(10⁴) · k / half), k < half. A `scale` of 1 leaves `t · f_k` exact.
pub(crate) fn sinusoid(ts: impl IntoIterator<Item = f32>, half: usize, scale: f32) -> Vec<f32> {
    let log_period = -(10000f64.ln() as f32);
    let freqs: Vec<f32> = (0..half).map(|k| (log_period * k as f32 / half as f32).exp()).collect();
    let mut emb = Vec::new();
    for t in ts {
        emb.extend(freqs.iter().map(|f| (scale * (t * f)).cos()));
        emb.extend(freqs.iter().map(|f| (scale * (t * f)).sin()));
    }
    emb
}
