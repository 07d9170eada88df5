//! ComfyUI's `ar_video` sampler (`sample_ar_video`, chosen by `SamplerARVideo`): a causal video model (Causal
//! Forcing, Self-Forcing) denoised a block of latent frames at a time, each block at every sigma of the
//! schedule and re-noised between them with fresh noise, its self-attention reading the clean frames before.
//!
//! The model keeps the keys and values of what it has seen ([`BlockDenoiser`]), each call replacing what it held
//! from the call's first frame on: a block's noisy calls replace one another, and once the block is done it
//! runs once more at σ = 0 on its result, so the frames after attend to clean frames (ComfyUI rewinds its cache
//! after each call of a block instead; the keys and values read are the same). An image-to-video run first
//! shows the model the start image's latent frames at σ = 0 and keeps them as the output's first frames.

use super::Step;
use crate::Result;
use crate::error::Error;
use crate::noise::TorchGenerator;

/// The model as the `ar_video` sampler sees it: x̂₀ for a block of frames, with a cache of the keys and values
/// of the frames before.
pub trait BlockDenoiser {
    /// x̂₀ for `x`, the latent frames `start_frame..start_frame + frames` (`[B, C, frames, h, w]`), at `sigma`,
    /// attending to the first `start_frame` frames the model has seen; the call's keys and values replace what
    /// the model held from `start_frame` on.
    fn denoise_block(
        &mut self,
        x: &[f32],
        frames: usize,
        start_frame: usize,
        sigma: f32,
    ) -> Result<Vec<f32>>;
}

/// What an `ar_video` run takes beside the model.
#[derive(Debug, Clone, Copy)]
pub struct ArVideo<'a> {
    /// The latent's shape `[B, C, T, h, w]`.
    pub shape: [usize; 5],
    /// Frames per block (`SamplerARVideo`'s `num_frame_per_block`: 1 framewise, 3 chunkwise).
    pub frames_per_block: usize,
    /// The run's seed (the noise's): block k's re-noising at step i draws from torch's generator seeded with
    /// `seed + 1000·k + i`.
    pub seed: u64,
    /// The start image's latent frames in model space `[B, C, n, h, w]` (`ARVideoI2V`'s), if any.
    pub initial: Option<&'a [f32]>,
}

/// Runs the `ar_video` sampler from `x` (already noise-scaled, `[B, C, T, h, w]`) through `sigmas` and returns
/// the latent, as ComfyUI's `sample_ar_video`. `on_step` sees each model call that starts a step, with the
/// step's index scaled to the schedule's steps (ComfyUI's progress: `steps` ticks over the whole video).
///
/// With a schedule ending at σ = 0 (every scheduler's) the calls are ComfyUI's; with one ending above 0,
/// ComfyUI's cache rewinds twice before a block's clean pass and loses the block before, where here the clean
/// pass follows the frames before as always.
pub fn sample_ar_video(
    denoiser: &mut dyn BlockDenoiser,
    run: ArVideo<'_>,
    x: &[f32],
    sigmas: &[f32],
    on_step: &mut dyn FnMut(Step<'_>) -> Result<()>,
) -> Result<Vec<f32>> {
    let [batch, channels, frames, h, w] = run.shape;
    let plane = h * w;
    if x.len() != batch * channels * frames * plane
        || run.frames_per_block == 0
        || sigmas.is_empty()
    {
        return Err(Error::Invalid(format!(
            "the ar_video sampler takes a video latent [B, C, T, h, w] = {:?} of {} values, a block of at \
             least one frame and at least one sigma; got {} values, {} frames per block, {} sigmas",
            run.shape,
            batch * channels * frames * plane,
            x.len(),
            run.frames_per_block,
            sigmas.len()
        )));
    }
    let video = Frames { batch, channels, frames, plane };
    let mut output = vec![0f32; x.len()];
    let mut start = 0;
    if let Some(initial) = run.initial {
        let n = initial.len() / (batch * channels * plane).max(1);
        if n == 0 || n > frames || initial.len() != batch * channels * n * plane {
            return Err(Error::Invalid(format!(
                "ARVideoI2V's start latent has {} values, not [{batch}, {channels}, n ≤ {frames}, {h}, {w}]",
                initial.len()
            )));
        }
        video.put(&mut output, initial, 0, n);
        denoiser.denoise_block(initial, n, 0, 0.0)?;
        start = n;
    }
    let steps = sigmas.len() - 1;
    let blocks = (frames - start).div_ceil(run.frames_per_block);
    let total = blocks * steps;
    let mut count = 0;
    for block in 0..blocks {
        let n = run.frames_per_block.min(frames - start);
        let mut noisy = video.take(x, start, n);
        for i in 0..steps {
            let denoised = denoiser.denoise_block(&noisy, n, start, sigmas[i])?;
            on_step(Step {
                index: count * steps / total,
                total: steps,
                x: &noisy,
                denoised: &denoised,
                sigma: sigmas[i],
            })?;
            let next = sigmas[i + 1];
            if next == 0.0 {
                noisy = denoised;
            } else {
                let seed = run.seed.wrapping_add(block as u64 * 1000).wrapping_add(i as u64);
                let fresh = TorchGenerator::new(seed).randn(denoised.len());
                // (1 − σ')·x̂₀ + σ'·ε, as torch rounds each product and the sum.
                noisy =
                    denoised.iter().zip(&fresh).map(|(d, e)| (1.0 - next) * d + next * e).collect();
            }
            count += 1;
        }
        video.put(&mut output, &noisy, start, n);
        denoiser.denoise_block(&noisy, n, start, 0.0)?;
        start += n;
    }
    Ok(output)
}

/// Frame ranges of a `[B, C, T, h, w]` latent.
#[derive(Debug, Clone, Copy)]
struct Frames {
    batch: usize,
    channels: usize,
    frames: usize,
    /// h·w.
    plane: usize,
}

impl Frames {
    /// Frames `start..start + n` of `x`, as `[B, C, n, h, w]`.
    fn take(&self, x: &[f32], start: usize, n: usize) -> Vec<f32> {
        let series = self.frames * self.plane;
        let mut out = Vec::with_capacity(self.batch * self.channels * n * self.plane);
        for chunk in x.chunks_exact(series) {
            out.extend_from_slice(&chunk[start * self.plane..(start + n) * self.plane]);
        }
        out
    }

    /// Writes `block` (`[B, C, n, h, w]`) into frames `start..start + n` of `x`.
    fn put(&self, x: &mut [f32], block: &[f32], start: usize, n: usize) {
        let series = self.frames * self.plane;
        for (chunk, part) in x.chunks_exact_mut(series).zip(block.chunks_exact(n * self.plane)) {
            chunk[start * self.plane..(start + n) * self.plane].copy_from_slice(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model whose x̂₀ is half its input, recording its calls and the frames its cache holds.
    #[derive(Default)]
    struct Halving {
        calls: Vec<(usize, usize, f32)>,
        cached: usize,
    }

    impl BlockDenoiser for Halving {
        fn denoise_block(
            &mut self,
            x: &[f32],
            frames: usize,
            start: usize,
            sigma: f32,
        ) -> Result<Vec<f32>> {
            assert!(start <= self.cached, "a block follows frames the model has seen");
            self.calls.push((start, frames, sigma));
            self.cached = start + frames;
            Ok(x.iter().map(|v| v * 0.5).collect())
        }
    }

    #[test]
    fn each_block_runs_every_sigma_then_once_clean_after_the_start_frames() {
        let shape = [1, 1, 4, 1, 1];
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let initial = [9.0f32];
        let mut model = Halving::default();
        let mut steps = Vec::new();
        let run = ArVideo { shape, frames_per_block: 2, seed: 7, initial: Some(&initial) };
        let out = sample_ar_video(&mut model, run, &x, &[1.0, 0.0], &mut |s| {
            steps.push((s.index, s.total));
            Ok(())
        })
        .unwrap();
        // The start frame kept, then two blocks (frames 1-2, then 3) each denoised in one step.
        assert_eq!(out, vec![9.0, 1.0, 1.5, 2.0]);
        assert_eq!(
            model.calls,
            vec![(0, 1, 0.0), (1, 2, 1.0), (1, 2, 0.0), (3, 1, 1.0), (3, 1, 0.0)]
        );
        assert_eq!(model.cached, 4);
        assert_eq!(steps, vec![(0, 1), (0, 1)]);
    }
}
