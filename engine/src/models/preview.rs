//! Latent previews (`--preview-method latent2rgb`): the sampler's current x̂₀ projected linearly to RGB, one
//! JPEG per step, as ComfyUI's latent-to-RGB previewer shows it — at latent resolution (an eighth of the
//! image), cheap enough for every step.

use image::ImageEncoder as _;

use super::LatentFormat;
use crate::nodes::{Preview, PreviewFormat};

/// The longest side of a preview (ComfyUI's `--preview-size` default).
const MAX_PREVIEW_SIDE: u32 = 512;

/// JPEG quality of previews (ComfyUI's).
const JPEG_QUALITY: u8 = 95;

/// The Flux VAE latent space's linear map to RGB in [-1, 1]: one row per channel, then the bias. These are
/// measured constants of that latent space (the least-squares fit of decoded colours on latents that ComfyUI
/// and InvokeAI publish alike), not code.
pub(crate) const FLUX_RGB: ([[f32; 3]; 16], [f32; 3]) = (
    [
        [-0.0346, 0.0244, 0.0681],
        [0.0034, 0.0210, 0.0687],
        [0.0275, -0.0668, -0.0433],
        [-0.0174, 0.0160, 0.0617],
        [0.0859, 0.0721, 0.0329],
        [0.0004, 0.0383, 0.0115],
        [0.0405, 0.0861, 0.0915],
        [-0.0236, -0.0185, -0.0259],
        [-0.0245, 0.0250, 0.1180],
        [0.1008, 0.0755, -0.0421],
        [-0.0515, 0.0201, 0.0011],
        [0.0428, -0.0012, -0.0036],
        [0.0817, 0.0765, 0.0749],
        [-0.1264, -0.0522, -0.1103],
        [-0.0280, -0.0881, -0.0499],
        [-0.1262, -0.0982, -0.0778],
    ],
    [-0.0329, -0.0718, -0.0851],
);

/// The first latent of `latent` `[B, C, h, w]` (model space, as the sampler's x̂₀) as a JPEG preview, or `None`
/// when the format has no projection or the shape does not fit it.
pub(crate) fn latent_preview(
    format: &LatentFormat,
    latent: &[f32],
    shape: &[usize],
) -> Option<Preview> {
    let (factors, bias) = format.rgb?;
    let &[_, channels, h, w] = shape else { return None };
    if channels != factors.len() || latent.len() < channels * h * w || h == 0 || w == 0 {
        return None;
    }
    let mut rgb = Vec::with_capacity(h * w * 3);
    for y in 0..h {
        for x in 0..w {
            for k in 0..3 {
                let v = (0..channels)
                    .fold(bias[k], |acc, c| acc + latent[(c * h + y) * w + x] * factors[c][k]);
                // [-1, 1] → 0..=255, truncated as ComfyUI's uint8 cast truncates.
                rgb.push((((v + 1.0) / 2.0).clamp(0.0, 1.0) * 255.0) as u8);
            }
        }
    }
    let mut image = image::RgbImage::from_raw(u32::try_from(w).ok()?, u32::try_from(h).ok()?, rgb)?;
    if image.width().max(image.height()) > MAX_PREVIEW_SIDE {
        let scale = f64::from(MAX_PREVIEW_SIDE) / f64::from(image.width().max(image.height()));
        let (tw, th) = (
            ((f64::from(image.width()) * scale) as u32).max(1),
            ((f64::from(image.height()) * scale) as u32).max(1),
        );
        image = image::imageops::thumbnail(&image, tw, th);
    }
    let mut bytes = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut bytes, JPEG_QUALITY)
        .write_image(image.as_raw(), image.width(), image.height(), image::ExtendedColorType::Rgb8)
        .ok()?;
    Some(Preview { format: PreviewFormat::Jpeg, bytes })
}
