//! Previews: the images a node shows while it runs ([`Preview`], sent as websocket frames, never saved),
//! whether sampling shows them ([`PreviewMethod`]), and latent previews (`--preview-method latent2rgb`): the
//! sampler's current x̂₀ projected linearly to RGB, one JPEG per step, as ComfyUI's latent-to-RGB previewer
//! shows it — at latent resolution (an eighth of the image), cheap enough for every step.

use image::ImageEncoder as _;

use kiln_models::latent::LatentFormat;

/// How a preview image is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviewFormat {
    /// `image/jpeg`.
    Jpeg,
    /// `image/png`.
    Png,
}

impl PreviewFormat {
    /// The media type.
    pub fn media_type(self) -> &'static str {
        match self {
            PreviewFormat::Jpeg => "image/jpeg",
            PreviewFormat::Png => "image/png",
        }
    }
}

/// An encoded preview image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preview {
    /// The encoding of `bytes`.
    pub format: PreviewFormat,
    /// The encoded image.
    pub bytes: Vec<u8>,
}

/// Whether and how sampling nodes show latent previews while they run (ComfyUI's `--preview-method`,
/// overridden per prompt by `extra_data.preview_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PreviewMethod {
    /// No previews (ComfyUI's default).
    #[default]
    None,
    /// A linear projection of the denoised latent to RGB, one preview per step.
    Latent2Rgb,
}

impl PreviewMethod {
    /// A method by ComfyUI's name: `none`, `auto`, `latent2rgb`, `taesd`. Kiln has no TAESD decoders, so `auto`
    /// and `taesd` mean `latent2rgb`, as they do in ComfyUI when no TAESD file is installed. `default` and
    /// unknown names are `None` (the caller keeps its setting).
    pub fn from_name(name: &str) -> Option<PreviewMethod> {
        match name {
            "none" => Some(PreviewMethod::None),
            "auto" | "latent2rgb" | "taesd" => Some(PreviewMethod::Latent2Rgb),
            _ => None,
        }
    }
}

/// The longest side of a preview (ComfyUI's `--preview-size` default).
const MAX_PREVIEW_SIDE: u32 = 512;

/// JPEG quality of previews (ComfyUI's).
const JPEG_QUALITY: u8 = 95;

/// The first latent of `latent` `[B, C, h, w]` (model space, as the sampler's x̂₀) as a JPEG preview, or `None`
/// when the format has no projection or the shape does not fit it; of a latent with frames `[B, C, T, h, w]`,
/// its first frame, as ComfyUI previews one.
pub(crate) fn latent_preview(
    format: &LatentFormat,
    latent: &[f32],
    shape: &[usize],
) -> Option<Preview> {
    let (factors, bias) = format.rgb?;
    let (channels, frames, h, w) = match *shape {
        [_, channels, h, w] => (channels, 1, h, w),
        [_, channels, frames, h, w] => (channels, frames, h, w),
        _ => return None,
    };
    if channels != factors.len() || latent.len() < channels * frames * h * w || h == 0 || w == 0 {
        return None;
    }
    // Channel c of frame 0 starts at c·T·h·w.
    let plane = frames * h * w;
    let mut rgb = Vec::with_capacity(h * w * 3);
    for y in 0..h {
        for x in 0..w {
            for k in 0..3 {
                let v = (0..channels)
                    .fold(bias[k], |acc, c| acc + latent[c * plane + y * w + x] * factors[c][k]);
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

#[cfg(test)]
mod tests {
    use super::latent_preview;
    use crate::models::LatentFormat;

    #[test]
    fn a_latent_with_frames_previews_its_first_frame() {
        let format = LatentFormat::WAN21;
        let (c, t, h, w) = (16, 3, 4, 6);
        let frames: Vec<f32> =
            (0..c * t * h * w).map(|i| ((i * 7919) % 17) as f32 / 8.0 - 1.0).collect();
        // Frame 0 alone, as an image latent.
        let first: Vec<f32> =
            (0..c).flat_map(|ch| frames[ch * t * h * w..][..h * w].to_vec()).collect();
        let framed = latent_preview(&format, &frames, &[1, c, t, h, w]).expect("a preview");
        let image = latent_preview(&format, &first, &[1, c, h, w]).expect("a preview");
        assert_eq!(framed, image);
    }
}
