//! SDXL's conditioning vector (ComfyUI's `SDXL.encode_adm` and `SDXLRefiner.encode_adm`): CLIP-G's pooled vector
//! joined with 256-wide sinusoidal embeddings of the image's size, crop and (refiner) aesthetic score, what the
//! UNet's `label_emb` reads.

use crate::error::{Error, Result};

/// The width of CLIP-G's (projected) pooled vector and of its states (SDXL's second encoder, the refiner's only).
pub const SDXL_CLIP_G_WIDTH: usize = 1280;
/// The width of each size embedding (ComfyUI's `Timestep(256)`).
pub const ADM_EMBED_WIDTH: usize = 256;
/// The refiner's aesthetic score for a positive prompt (ComfyUI's default).
pub const POSITIVE_AESTHETIC_SCORE: f32 = 6.0;
/// The refiner's aesthetic score for the negative prompt (ComfyUI's default where `prompt_type` is `negative`).
pub const NEGATIVE_AESTHETIC_SCORE: f32 = 2.5;

/// Which UNet a configuration is, by its `label_emb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnetKind {
    /// Lotus depth (a 4-wide task embedding).
    Lotus,
    /// SDXL's base UNet (and SDXL Turbo's): pooled vector + 6 size embeddings.
    Sdxl,
    /// SDXL's refiner: pooled vector + 4 size embeddings + the aesthetic score's.
    SdxlRefiner,
}

impl UnetKind {
    /// The size embeddings after the pooled vector.
    fn embeddings(self) -> usize {
        match self {
            UnetKind::Lotus => 0,
            UnetKind::Sdxl => 6,
            UnetKind::SdxlRefiner => 5,
        }
    }

    /// The width of the pooled vector a `label_emb` of `adm` channels reads (0 for Lotus).
    pub fn pooled_width(self, adm: usize) -> usize {
        match self {
            UnetKind::Lotus => 0,
            _ => adm.saturating_sub(self.embeddings() * ADM_EMBED_WIDTH),
        }
    }

    /// The kind of a UNet with a `label_emb` of `adm` input channels and `context` wide cross-attention: Lotus
    /// by its 4-wide task embedding; SDXL's refiner where the vector is its context width (CLIP-G's states and
    /// pooled vector alike) plus five embeddings; SDXL's base where it is a pooled vector narrower than the
    /// context (CLIP-G's beside CLIP-L's states) plus six.
    pub fn of(adm: Option<usize>, context: usize) -> Option<UnetKind> {
        let six = 6 * ADM_EMBED_WIDTH;
        match adm? {
            super::LOTUS_ADM_CHANNELS => Some(UnetKind::Lotus),
            adm if adm == context + 5 * ADM_EMBED_WIDTH => Some(UnetKind::SdxlRefiner),
            adm if adm > six && adm - six < context => Some(UnetKind::Sdxl),
            _ => None,
        }
    }
}

/// The image size and crop SDXL is conditioned on (ComfyUI's `width`, `height`, `crop_w`, `crop_h`,
/// `target_width`, `target_height` and `aesthetic_score`; by default the latent's size in pixels, no crop).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdmSize {
    /// Width in pixels.
    pub width: f32,
    /// Height in pixels.
    pub height: f32,
    /// Left crop.
    pub crop_w: f32,
    /// Top crop.
    pub crop_h: f32,
    /// Target width (the base's).
    pub target_width: f32,
    /// Target height (the base's).
    pub target_height: f32,
    /// The aesthetic score (the refiner's).
    pub aesthetic_score: f32,
}

impl AdmSize {
    /// What a sampler gives a prompt without size settings for a latent of `width` × `height` pixels
    /// (`encode_model_conds`'s defaults): no crop, the target the size itself, the aesthetic score of a
    /// positive or the negative prompt.
    pub fn of_latent(width: usize, height: usize, negative: bool) -> AdmSize {
        let (width, height) = (width as f32, height as f32);
        AdmSize {
            width,
            height,
            crop_w: 0.0,
            crop_h: 0.0,
            target_width: width,
            target_height: height,
            aesthetic_score: if negative {
                NEGATIVE_AESTHETIC_SCORE
            } else {
                POSITIVE_AESTHETIC_SCORE
            },
        }
    }
}

/// The `label_emb` input of `kind` for `pooled` (one row per sample, `pooled_width` wide each): each row, then
/// the embeddings of height, width, crop_h, crop_w and target height and width (base) or the aesthetic score
/// (refiner), each `timestep_embedding(v, 256)` (cos then sin).
pub fn adm(
    kind: UnetKind,
    pooled: &[f32],
    pooled_width: usize,
    size: &AdmSize,
) -> Result<Vec<f32>> {
    if kind == UnetKind::Lotus || pooled_width == 0 || !pooled.len().is_multiple_of(pooled_width) {
        return Err(Error::Invalid(format!(
            "SDXL's conditioning vector takes {pooled_width}-wide pooled vectors; got {} values",
            pooled.len()
        )));
    }
    let values = match kind {
        UnetKind::SdxlRefiner => {
            vec![size.height, size.width, size.crop_h, size.crop_w, size.aesthetic_score]
        }
        _ => vec![
            size.height,
            size.width,
            size.crop_h,
            size.crop_w,
            size.target_height,
            size.target_width,
        ],
    };
    let embedded = crate::timestep::sinusoid(values, ADM_EMBED_WIDTH / 2, 1.0);
    let mut out = Vec::with_capacity(pooled.len() / pooled_width * (pooled_width + embedded.len()));
    for row in pooled.chunks(pooled_width) {
        out.extend_from_slice(row);
        out.extend_from_slice(&embedded);
    }
    Ok(out)
}
