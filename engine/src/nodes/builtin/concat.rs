//! The channels a channel-concat model reads beside the latents (FLUX.1 Fill's 80, Canny's and Depth's 16), as
//! ComfyUI's `Flux.concat_cond` builds them from the conditioning: the image latent (`InpaintModelConditioning`,
//! `InstructPixToPixConditioning`; zeros without one) resized to the latents and put in the model's latent space,
//! then for an inpainting model the mask, resized to the pixels and folded 8 × 8 into 64 channels. Wan's are
//! built by [`super::wan_concat`], HunyuanVideo 1.5's and Kandinsky 5's video models' by [`super::hunyuan_video`],
//! HuMo 17B's are fixed ones.

use kiln_models::family::DiffusionFamily;

use super::latent::transpose;
use super::resize::resize;
use crate::models::{CondExtras, DiffusionModel, LatentFormat};
use crate::nodes::NodeError;
use crate::tensor::Tensor;

/// The extra input channels for latents of `shape` `[B, C, h, w]`, or `None` for a model that reads none.
/// `denoise_mask` is the latent's noise mask at the latents' shape, the mask an inpainting model falls back on
/// when the conditioning has none.
pub(super) fn concat_channels(
    model: &DiffusionModel,
    extras: &CondExtras,
    shape: &[usize],
    denoise_mask: Option<&[f32]>,
) -> Result<Option<Tensor>, NodeError> {
    let extra = model.net.concat_channels();
    if model.net.is_humo() && extra > 0 {
        return humo_channels(extra, shape).map(Some);
    }
    let mask = extras.concat_mask.as_ref();
    match model.net.family() {
        DiffusionFamily::HunyuanVideo15 => {
            let channels = (extras.concat_latent_image.as_ref(), mask);
            let latent = &model.latent;
            return super::hunyuan_video::concat_channels(
                extra,
                latent,
                channels,
                shape,
                denoise_mask,
            );
        }
        // ComfyUI's `Kandinsky5.concat_cond`: a zero image latent whatever the conditioning holds, then the mask.
        DiffusionFamily::Kandinsky5Video => {
            let latent = &model.latent;
            return super::hunyuan_video::concat_channels(
                extra,
                latent,
                (None, mask),
                shape,
                denoise_mask,
            );
        }
        _ => {}
    }
    if let Some(image_to_video) = model.net.wan_image_to_video() {
        return super::wan_concat::build(
            extra,
            image_to_video,
            &model.latent,
            extras,
            shape,
            denoise_mask,
        );
    }
    build(extra, &model.latent, extras, shape, denoise_mask)
}

/// HuMo 17B's channels beside latents of `shape` `[B, C, T, h, w]` ([`kiln_models::wan::humo::concat_channels`]:
/// ComfyUI's `WAN21_HuMo` sets them whatever the conditioning holds).
fn humo_channels(extra: usize, shape: &[usize]) -> Result<Tensor, NodeError> {
    use kiln_models::wan::humo;
    let &[batch, _, frames, h, w] = shape else {
        return Err(NodeError::new(format!(
            "a HuMo model takes video latents [B, C, T, h, w], not {shape:?}"
        )));
    };
    if extra != humo::CONCAT_CHANNELS {
        return Err(NodeError::new(format!(
            "a HuMo model reading {extra} channels beside the latents (HuMo 17B reads {})",
            humo::CONCAT_CHANNELS
        )));
    }
    let values = humo::concat_channels(batch, frames, h, w);
    tensor(vec![batch, extra, frames, h, w], values)
}

/// [`concat_channels`] for a model that reads `extra` channels beside latents in the space of `latent`.
fn build(
    extra: usize,
    latent: &LatentFormat,
    extras: &CondExtras,
    shape: &[usize],
    denoise_mask: Option<&[f32]>,
) -> Result<Option<Tensor>, NodeError> {
    if extra == 0 {
        return Ok(None);
    }
    let &[batch, channels, h, w] = shape else {
        return Err(NodeError::new(format!(
            "a channel-concat model takes [B, C, h, w] latents, not {shape:?}"
        )));
    };
    let image = match &extras.concat_latent_image {
        Some(image) => {
            let resized = resize(&transpose(image, true)?, w, h, "bilinear", true)?;
            resize_to_batch(&transpose(&resized, false)?, batch)?
        }
        None => tensor(vec![batch, channels, h, w], vec![0.0; batch * channels * h * w])?,
    };
    let image = tensor(image.shape().to_vec(), latent.process_in(image.data(), image.shape()))?;
    if extra <= channels {
        return Ok(Some(image));
    }
    let mask = match (&extras.concat_mask, denoise_mask) {
        (Some(mask), _) => mask.clone(),
        (None, Some(mask)) => tensor(shape.to_vec(), mask.to_vec())?,
        (None, None) => tensor(vec![batch, 1, h, w], vec![1.0; batch * h * w])?,
    };
    let mask = fold_8x8(&resize_mask(&mean_channels(&mask)?, 8 * w, 8 * h)?)?;
    let mask = resize_to_batch(&mask, batch)?;
    if image.shape()[1] + mask.shape()[1] != extra {
        return Err(NodeError::new(format!(
            "the model reads {extra} channels beside the latents; the image latent and mask make {}",
            image.shape()[1] + mask.shape()[1]
        )));
    }
    Ok(Some(join_channels(&image, &mask)?))
}

/// `t` `[B, C, H, W]` averaged over its channels → `[B, 1, H, W]`.
fn mean_channels(t: &Tensor) -> Result<Tensor, NodeError> {
    let dims = t.shape();
    let (b, c, plane) = match *dims {
        [b, c, h, w] => (b, c, h * w),
        [b, h, w] => (b, 1, h * w),
        _ => return Err(NodeError::new(format!("a mask of shape {dims:?}"))),
    };
    let mut out = vec![0.0f32; b * plane];
    for bi in 0..b {
        for ci in 0..c {
            let src = &t.data()[(bi * c + ci) * plane..][..plane];
            out[bi * plane..][..plane].iter_mut().zip(src).for_each(|(o, s)| *o += s);
        }
        out[bi * plane..][..plane].iter_mut().for_each(|o| *o /= c as f32);
    }
    let (h, w) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    tensor(vec![b, 1, h, w], out)
}

/// A `[B, 1, H, W]` mask resized bilinearly with ComfyUI's centre crop to `w` × `h`.
fn resize_mask(mask: &Tensor, w: usize, h: usize) -> Result<Tensor, NodeError> {
    let resized = resize(&transpose(mask, true)?, w, h, "bilinear", true)?;
    transpose(&resized, false)
}

/// A `[B, 1, 8h, 8w]` mask folded into `[B, 64, h, w]`: channel `py·8 + px` at (r, c) is the mask at
/// (8r + py, 8c + px).
fn fold_8x8(mask: &Tensor) -> Result<Tensor, NodeError> {
    let &[b, 1, hh, ww] = mask.shape() else {
        return Err(NodeError::new(format!("a mask of shape {:?}", mask.shape())));
    };
    let (h, w) = (hh / 8, ww / 8);
    let mut out = Vec::with_capacity(b * 64 * h * w);
    for bi in 0..b {
        let src = &mask.data()[bi * hh * ww..][..hh * ww];
        for py in 0..8 {
            for px in 0..8 {
                for r in 0..h {
                    out.extend((0..w).map(|c| src[(8 * r + py) * ww + 8 * c + px]));
                }
            }
        }
    }
    tensor(vec![b, 64, h, w], out)
}

/// ComfyUI's `resize_to_batch_size`: `batch` samples picked evenly from `t`'s.
pub(super) fn resize_to_batch(t: &Tensor, batch: usize) -> Result<Tensor, NodeError> {
    let n = t.shape()[0];
    if n == batch {
        return Ok(t.clone());
    }
    let sample = t.data().len() / n.max(1);
    let pick = |i: usize| -> usize {
        if batch < n {
            let scale = (n - 1) as f64 / (batch - 1).max(1) as f64;
            ((i as f64 * scale).round_ties_even() as usize).min(n - 1)
        } else {
            (((i as f64 + 0.5) * n as f64 / batch as f64).floor() as usize).min(n - 1)
        }
    };
    let mut out = Vec::with_capacity(batch * sample);
    for i in 0..batch {
        out.extend_from_slice(&t.data()[pick(i) * sample..][..sample]);
    }
    let mut shape = t.shape().to_vec();
    shape[0] = batch;
    tensor(shape, out)
}

/// `a` `[B, Ca, …]` and `b` `[B, Cb, …]` (the same trailing sizes) joined along the channels.
pub(super) fn join_channels(a: &Tensor, b: &Tensor) -> Result<Tensor, NodeError> {
    let (sa, sb) = (a.shape(), b.shape());
    let batch = sa[0];
    let (pa, pb) = (a.data().len() / batch, b.data().len() / batch);
    let mut out = Vec::with_capacity(a.data().len() + b.data().len());
    for i in 0..batch {
        out.extend_from_slice(&a.data()[i * pa..][..pa]);
        out.extend_from_slice(&b.data()[i * pb..][..pb]);
    }
    let mut shape = sa.to_vec();
    shape[1] = sa[1] + sb[1];
    tensor(shape, out)
}

/// A host tensor, or the error of a shape that does not fit its values.
fn tensor(shape: Vec<usize>, values: Vec<f32>) -> Result<Tensor, NodeError> {
    Tensor::new(shape, values).map_err(|e| NodeError::new(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_puts_each_8x8_cell_in_64_channels() {
        let values: Vec<f32> = (0..16 * 8).map(|v| v as f32).collect();
        let folded = fold_8x8(&Tensor::new(vec![1, 1, 8, 16], values).unwrap()).unwrap();
        assert_eq!(folded.shape(), &[1, 64, 1, 2]);
        // Channel py·8 + px at column c is row py, column 8c + px.
        assert_eq!(&folded.data()[..4], &[0.0, 8.0, 1.0, 9.0]);
        assert_eq!(folded.data()[2 * 9], 16.0 + 1.0);
    }

    #[test]
    fn batches_resize_as_comfyui_picks_them() {
        let t = Tensor::new(vec![3, 1], vec![0.0, 1.0, 2.0]).unwrap();
        assert_eq!(resize_to_batch(&t, 2).unwrap().data(), &[0.0, 2.0]);
        assert_eq!(resize_to_batch(&t, 5).unwrap().data(), &[0.0, 0.0, 1.0, 2.0, 2.0]);
        assert_eq!(resize_to_batch(&t, 1).unwrap().data(), &[0.0]);
    }

    /// Every case against ComfyUI's own `Flux.concat_cond` (`scripts/reference/flux_concat.py`): Fill with the
    /// image latent and mask at other sizes, with the noise mask or neither, across batch sizes, and Canny.
    #[test]
    fn matches_comfyuis_flux_concat_cond() {
        let fixture = crate::fixtures::tensors("flux_concat/cases.safetensors");
        let tensor = |name: &str| fixture.get(name).cloned();
        let mut cases: Vec<String> = fixture
            .keys()
            .filter_map(|name| name.strip_suffix(".out").map(str::to_string))
            .collect();
        cases.sort();
        assert_eq!(cases.len(), 7, "{cases:?}");
        let mut failures = Vec::new();
        for case in &cases {
            let field = |f: &str| tensor(&format!("{case}.{f}"));
            let shape: Vec<usize> = field("noise_shape")
                .expect("noise_shape")
                .data()
                .iter()
                .map(|&d| d as usize)
                .collect();
            let in_channels = field("in_channels").expect("in_channels").data()[0] as usize;
            let extras = CondExtras {
                concat_latent_image: field("image"),
                concat_mask: field("mask"),
                ..CondExtras::default()
            };
            let denoise_mask = field("denoise_mask");
            let got = build(
                in_channels - shape[1],
                &LatentFormat::FLUX,
                &extras,
                &shape,
                denoise_mask.as_ref().map(Tensor::data),
            )
            .expect("builds")
            .expect("channels");
            let want = field("out").expect("out");
            assert_eq!(got.shape(), want.shape(), "{case}");
            let (worst, at) = got
                .data()
                .iter()
                .zip(want.data())
                .map(|(g, w)| (g - w).abs())
                .enumerate()
                .fold((0.0f32, 0), |(m, i), (j, d)| if d > m { (d, j) } else { (m, i) });
            if worst > 1e-5 {
                failures.push(format!(
                    "{case}: max |Δ| {worst:e} at flat index {at} of {:?}",
                    got.shape()
                ));
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}
