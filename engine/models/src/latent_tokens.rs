//! Latents as the MMDiTs' image tokens (Qwen-Image, FLUX.1): padded circularly to the patch size, then cut
//! into `p × p` patches whose features are channel-major, `c·p² + py·p + px` (diffusers' packing, ComfyUI's
//! `rearrange(x, "b c (h ph) (w pw) -> b (h w) (c ph pw)")`), unlike the backend's NextDiT order; and the
//! reference latents an edit model appends after them (checked, batched, and placed side by side as ComfyUI's
//! `offset` method places them); and `to_batch`, a tensor repeated to the batch as ComfyUI repeats a
//! conditioning.

use kiln_compute::backend::PadMode;
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};

/// `x` `[B, C, h, w]` padded circularly at the bottom and right to multiples of `p` (ComfyUI's
/// `pad_to_patch_size`), and its token grid (rows, cols).
pub(crate) fn padded<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    p: usize,
) -> Result<(Tensor<B>, usize, usize)> {
    let (h, w) = (x.dim(2)?, x.dim(3)?);
    let (hp, wp) = (h.div_ceil(p) * p, w.div_ceil(p) * p);
    let mut x = x.clone();
    if hp > h {
        x = b.pad(&x, 2, 0, hp - h, PadMode::Circular)?;
    }
    if wp > w {
        x = b.pad(&x, 3, 0, wp - w, PadMode::Circular)?;
    }
    Ok((x, hp / p, wp / p))
}

/// Latents `[B, C, H, W]` (H, W multiples of `p`) → tokens `[B, (H/p)·(W/p), C·p²]`, token (r, s) row-major,
/// feature `c·p² + py·p + px` = x[c, p·r + py, p·s + px].
pub(crate) fn patchify<B: Backend>(b: &B, x: &Tensor<B>, p: usize) -> Result<Tensor<B>> {
    let &[batch, c, h, w] = x.shape() else {
        return Err(Error::Invalid(format!("latents {:?} are not [B, C, H, W]", x.shape())));
    };
    let (rows, cols) = (h / p, w / p);
    let t = x.reshape(&[batch, c, rows, p, cols, p])?;
    let t = b.permute(&t, &[0, 2, 4, 1, 3, 5])?;
    Ok(t.reshape(&[batch, rows * cols, c * p * p])?)
}

/// Where a patch token keeps its channels among its `channels·p²` features.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchOrder {
    /// Channel-major, `c·p² + py·p + px` ([`patchify`]'s: FLUX, Qwen-Image).
    ChannelMajor,
    /// Channels last, `(py·p + px)·channels + c` (HiDream's `(p1 p2 C)`, the MMDiT's `nhwpqc`).
    ChannelsLast,
}

/// Tokens `[B, rows·cols, channels·p²]` with features in `order` → latents `[B, channels, p·rows, p·cols]` (the
/// inverse of [`patchify`] for [`PatchOrder::ChannelMajor`]).
pub(crate) fn unpatchify<B: Backend>(
    b: &B,
    y: &Tensor<B>,
    channels: usize,
    (rows, cols): (usize, usize),
    p: usize,
    order: PatchOrder,
) -> Result<Tensor<B>> {
    let batch = y.dim(0)?;
    let t = match order {
        PatchOrder::ChannelMajor => {
            let t = y.reshape(&[batch, rows, cols, channels, p, p])?;
            b.permute(&t, &[0, 3, 1, 4, 2, 5])?
        }
        PatchOrder::ChannelsLast => {
            let t = y.reshape(&[batch, rows, cols, p, p, channels])?;
            b.permute(&t, &[0, 5, 1, 3, 2, 4])?
        }
    };
    Ok(t.reshape(&[batch, channels, rows * p, cols * p])?)
}

/// The sides `(h, w)` of a reference latent `[1 or batch, channels, h, w]`; an error for another shape.
pub(crate) fn reference_sides<B: Backend>(
    reference: &Tensor<B>,
    batch: usize,
    channels: usize,
) -> Result<(usize, usize)> {
    let &[rb, c, rh, rw] = reference.shape() else {
        return Err(Error::Invalid(format!(
            "a reference latent must be [B, {channels}, h, w], got {:?}",
            reference.shape()
        )));
    };
    if c != channels || !(rb == 1 || rb == batch) || rh == 0 || rw == 0 {
        return Err(Error::Invalid(format!(
            "a reference latent {:?} for latents of batch {batch} and {channels} channels",
            reference.shape()
        )));
    }
    Ok((rh, rw))
}

/// A reference latent (checked by [`reference_sides`]) in the compute type, repeated to `batch`, padded to
/// `p`: the latent and its token grid (rows, cols).
pub(crate) fn batched_reference<B: Backend>(
    b: &B,
    reference: &Tensor<B>,
    batch: usize,
    p: usize,
) -> Result<(Tensor<B>, usize, usize)> {
    let reference = b.cast(reference, b.compute_dtype())?;
    let reference = if reference.dim(0)? < batch {
        let copies: Vec<&Tensor<B>> = std::iter::repeat_n(&reference, batch).collect();
        b.concat(&copies, 0)?
    } else {
        reference
    };
    padded(b, &reference, p)
}

/// ComfyUI's `offset` placement of references (Flux Kontext's): each goes right of the union of those before
/// it when that keeps the union squarer (its height plus the union's beats its width plus the union's), else
/// below it.
#[derive(Debug, Default)]
pub(crate) struct SideBySide {
    h: usize,
    w: usize,
}

impl SideBySide {
    /// The offset `(h, w)`, in latent pixels, of the next reference of sides `(rh, rw)`.
    pub(crate) fn place(&mut self, rh: usize, rw: usize) -> (usize, usize) {
        let (h_offset, w_offset) =
            if rh + self.h > rw + self.w { (0, self.w) } else { (self.h, 0) };
        self.h = self.h.max(rh + h_offset);
        self.w = self.w.max(rw + w_offset);
        (h_offset, w_offset)
    }
}

/// `t` `[n, …]` as a batch of `batch` (ComfyUI's `repeat_to_batch_size`: repeated, or cut, to the size).
pub(crate) fn to_batch<B: Backend>(b: &B, t: &Tensor<B>, batch: usize) -> Result<Tensor<B>> {
    let n = t.dim(0)?;
    if n == batch {
        return Ok(t.clone());
    }
    let copies = vec![t; batch.div_ceil(n.max(1))];
    Ok(b.slice(&b.concat(&copies, 0)?, 0, 0, batch)?)
}
