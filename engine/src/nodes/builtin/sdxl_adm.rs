//! SDXL's class vectors for a run (ComfyUI's `encode_model_conds` → `SDXL.encode_adm`, `SDXLRefiner.encode_adm`):
//! each prompt's pooled vector becomes the UNet's `label_emb` input, CLIP-G's pooled vector joined with the
//! embeddings of the latent's size in pixels (no crop), and for the refiner the aesthetic score of a positive or
//! the negative prompt. A prompt with `unCLIPConditioning`'s image embeddings takes its pooled vector from them
//! instead (`sdxl_pooled`: [`unclip::sdxl_pooled`]).

use kiln_models::unet::unclip::{self, UnclipImage};
use kiln_models::unet::{AdmSize, sdxl};

use crate::models::{Conditioning, DiffusionModel};
use crate::nodes::{ErrorKind, NodeError};

/// Replaces each prompt's pooled vector on `sides` (a side and whether it is the negative one) with its SDXL
/// class vector for a latent of `shape` `[B, C, H, W]`, when `model` is an SDXL UNet; leaves them as they are
/// otherwise. A prompt with unCLIP images pools them, noised for the run's `seed`. A prompt without a pooled
/// vector, or with one of another width, is an error naming what it needs.
pub(super) fn prepare(
    model: &DiffusionModel,
    sides: &mut [(&mut Conditioning, bool)],
    shape: &[usize],
    seed: u64,
) -> Result<(), NodeError> {
    let Some((kind, width)) = model.net.sdxl_adm() else { return Ok(()) };
    let &[_, _, h, w, ..] = shape else {
        return Err(NodeError::of_kind(
            ErrorKind::InvalidValue,
            format!("SDXL samples an image latent [B, C, H, W]; got {shape:?}"),
        ));
    };
    let name = model.net.family().name();
    for (side, negative) in sides.iter_mut() {
        let size = AdmSize::of_latent(w * 8, h * 8, *negative);
        for entry in &mut side.entries {
            if !entry.extras.unclip.is_empty() {
                entry.pooled = Some(unclip_pooled(&entry.extras.unclip, width, seed)?);
            }
            let pooled = entry.pooled.as_ref().ok_or_else(|| {
                NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "{name} conditions on CLIP-G's pooled vector and this prompt has none: encode it with \
                         SDXL's text encoders (its checkpoint's CLIP, or DualCLIPLoader type sdxl)"
                    ),
                )
            })?;
            if pooled.data().len() != width {
                return Err(NodeError::of_kind(
                    ErrorKind::InvalidValue,
                    format!(
                        "{name} takes a {width}-wide pooled vector (CLIP-G's); this prompt's is {:?}: encode it \
                         with the model's own text encoders",
                        pooled.shape()
                    ),
                ));
            }
            let adm = sdxl::adm(kind, pooled.data(), width, &size)
                .map_err(|e| NodeError::of_kind(ErrorKind::InvalidValue, e.to_string()))?;
            let tensor = crate::tensor::Tensor::new(vec![1, adm.len()], adm)
                .map_err(|e| NodeError::new(e.to_string()))?;
            entry.pooled = Some(tensor);
        }
    }
    Ok(())
}

/// The pooled vector `width` wide that `unclip`'s images make for a run of `seed` (every image of every
/// `unCLIPConditioning`, in order).
fn unclip_pooled(
    unclip: &[crate::models::Unclip],
    width: usize,
    seed: u64,
) -> Result<crate::tensor::Tensor, NodeError> {
    let mut images = Vec::new();
    for u in unclip {
        let &[_, dim] = u.image_embeds.shape() else {
            return Err(NodeError::new(format!(
                "unCLIP image embeddings {:?}: expected [B, D]",
                u.image_embeds.shape()
            )));
        };
        for embeds in u.image_embeds.data().chunks_exact(dim.max(1)) {
            images.push(UnclipImage {
                embeds,
                strength: u.strength as f32,
                noise_augmentation: u.noise_augmentation,
            });
        }
    }
    let pooled = unclip::sdxl_pooled(&images, width, seed)
        .map_err(|e| NodeError::of_kind(ErrorKind::InvalidValue, e.to_string()))?;
    crate::tensor::Tensor::new(vec![1, width], pooled).map_err(|e| NodeError::new(e.to_string()))
}
