//! SDXL's unCLIP image conditioning (ComfyUI's `model_base.sdxl_pooled` → `unclip_adm`, `unCLIPConditioning`'s
//! `unclip_conditioning`): each CLIP vision image embedding is noised to its noise level by the UNet's
//! `CLIPEmbeddingNoiseAugmentation` (a 1000-step `squaredcos_cap_v2` schedule, zero mean and unit deviation, so
//! only the noising acts) and scaled by its strength; several are summed and noised once more at level 0. The
//! first 1280 values (the noised embedding, not its level's embedding) replace the prompt's pooled vector.

use crate::error::{Error, Result};
use crate::noise::TorchGenerator;

/// Steps of the noise augmentor's schedule (and its `max_noise_level`).
const STEPS: usize = 1000;
/// The schedule's largest β (`betas_for_alpha_bar`'s `max_beta`).
const MAX_BETA: f64 = 0.999;

/// One image embedding in a prompt's `unclip_conditioning`.
#[derive(Debug, Clone, Copy)]
pub struct UnclipImage<'a> {
    /// `image_embeds` of one image (CLIP vision's projection: 1280 values for ViT-bigG).
    pub embeds: &'a [f32],
    /// `unCLIPConditioning`'s `strength`.
    pub strength: f32,
    /// `unCLIPConditioning`'s `noise_augmentation` in [0, 1].
    pub noise_augmentation: f64,
}

/// `sqrt(ᾱ_t)` and `sqrt(1 − ᾱ_t)` of the `squaredcos_cap_v2` schedule, computed in f64 and stored as f32, as
/// ComfyUI registers them.
fn schedule() -> (Vec<f32>, Vec<f32>) {
    let alpha_bar = |t: f64| ((t + 0.008) / 1.008 * std::f64::consts::PI / 2.0).cos().powi(2);
    let mut cumulative = 1.0f64;
    let mut kept = Vec::with_capacity(STEPS);
    let mut noise = Vec::with_capacity(STEPS);
    for i in 0..STEPS {
        let (t1, t2) = (i as f64 / STEPS as f64, (i + 1) as f64 / STEPS as f64);
        let beta = (1.0 - alpha_bar(t2) / alpha_bar(t1)).min(MAX_BETA);
        cumulative *= 1.0 - beta;
        kept.push(cumulative.sqrt() as f32);
        noise.push((1.0 - cumulative).sqrt() as f32);
    }
    (kept, noise)
}

/// The noise level of `augmentation` (`round((max_noise_level − 1) · augmentation)`, half to even).
fn level(augmentation: f64) -> Result<usize> {
    if !(0.0..=1.0).contains(&augmentation) {
        return Err(Error::Invalid(format!(
            "unCLIP noise augmentation {augmentation} is outside [0, 1]"
        )));
    }
    Ok(((STEPS - 1) as f64 * augmentation).round_ties_even() as usize)
}

/// SDXL's pooled vector from `images` (in the order the prompt's `unclip_conditioning` lists them) for a run of
/// seed `seed`: each embedding noised with the torch CPU generator seeded `seed − 10` (wrapping, as
/// `torch.manual_seed` takes a negative seed), scaled by its strength; more than one summed and noised at
/// level 0 with the generator's next values. `width` values come back (the embeddings must have them).
pub fn sdxl_pooled(images: &[UnclipImage<'_>], width: usize, seed: u64) -> Result<Vec<f32>> {
    if images.is_empty() {
        return Err(Error::Invalid("unCLIP conditioning with no image embedding".to_owned()));
    }
    if let Some(image) = images.iter().find(|image| image.embeds.len() != width) {
        return Err(Error::Invalid(format!(
            "a {}-wide CLIP vision embedding for SDXL's {width}-wide pooled vector: SDXL's unCLIP takes CLIP \
             ViT-bigG's image embeddings (clip_vision_g)",
            image.embeds.len()
        )));
    }
    let (kept, noised) = schedule();
    let seed = seed.wrapping_sub(10);
    let mut generator = TorchGenerator::new(seed);
    let mut sum = vec![0f32; width];
    for image in images {
        // `q_sample` reseeds the generator for every embedding.
        generator = TorchGenerator::new(seed);
        let noise = generator.randn(width);
        let t = level(image.noise_augmentation)?;
        for ((s, &x), n) in sum.iter_mut().zip(image.embeds).zip(noise) {
            *s += (kept[t] * x + noised[t] * n) * image.strength;
        }
    }
    if images.len() == 1 {
        return Ok(sum);
    }
    // The merge's `randn_like` draws from the same (global) generator, after the last embedding's noise.
    let noise = generator.randn(width);
    Ok(sum.iter().zip(noise).map(|(&s, n)| kept[0] * s + noised[0] * n).collect())
}
