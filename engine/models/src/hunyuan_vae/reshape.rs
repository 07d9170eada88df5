//! The HunyuanVideo 1.5 VAE's parameter-free rearrangements on frames `[n, C, H, W]`, in ComfyUI's orders:
//! space (and time) folded into channels by a downsample and unfolded by an upsample, the channel-group means
//! of the downsample's and the encoder head's shortcuts, and the channel repeats of the upsample's and the
//! decoder input's.

use kiln_compute::backend::BinaryOp;
use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};

/// `[n, C, H, W]` of `x`, or an error naming `what`.
fn dims<B: Backend>(x: &Tensor<B>, what: &str) -> Result<[usize; 4]> {
    match *x.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        ref other => Err(Error::Invalid(format!("{what}: frames {other:?} are not [n, C, H, W]"))),
    }
}

/// Frames `[n, C, H, W]` → `[n/r, r·4·C, H/2, W/2]`: each group of `r` frames and each 2×2 patch folded into
/// channels, channel `t·4C + y·2C + x·C + c` holding frame t, row offset y and column offset x of channel c.
pub(crate) fn fold<B: Backend>(b: &B, x: &Tensor<B>, r: usize) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "fold")?;
    if r == 0 || !n.is_multiple_of(r) || !h.is_multiple_of(2) || !w.is_multiple_of(2) {
        return Err(Error::Invalid(format!(
            "a downsample folds {r} frames and 2×2 pixels, got {n} frames of {w}×{h}"
        )));
    }
    let x = x.reshape(&[n / r, r, c, h / 2, 2, w / 2, 2])?;
    // [m, t, c, h', y, w', x] → [m, t, y, x, c, h', w'].
    let x = b.permute(&x, &[0, 1, 4, 6, 2, 3, 5])?;
    Ok(x.reshape(&[n / r, r * 4 * c, h / 2, w / 2])?)
}

/// The inverse order of [`fold`]: `[n, r·4·C, H, W]` → `[n·r, C, 2H, 2W]`, channel `t·4C + y·2C + x·C + c`
/// going to frame t, row offset y and column offset x of channel c.
pub(crate) fn unfold<B: Backend>(b: &B, x: &Tensor<B>, r: usize) -> Result<Tensor<B>> {
    let [n, cr, h, w] = dims(x, "unfold")?;
    if r == 0 || !cr.is_multiple_of(4 * r) {
        return Err(Error::Invalid(format!("an upsample unfolds {cr} channels into {r} frames")));
    }
    let c = cr / (4 * r);
    let x = x.reshape(&[n, r, 2, 2, c, h, w])?;
    // [n, t, y, x, c, h, w] → [n, t, c, h, y, w, x].
    let x = b.permute(&x, &[0, 1, 4, 5, 2, 6, 3])?;
    Ok(x.reshape(&[n * r, c, 2 * h, 2 * w])?)
}

/// The means of consecutive groups of channels of `x` `[n, C, H, W]` → `[n, out, H, W]` (ComfyUI's
/// `view(B, out, C/out, …).mean(2)`).
pub(crate) fn group_mean<B: Backend>(b: &B, x: &Tensor<B>, out: usize) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "group mean")?;
    if out == 0 || !c.is_multiple_of(out) {
        return Err(Error::Invalid(format!("a mean of {c} channels in {out} groups")));
    }
    let group = c / out;
    if group == 1 {
        return Ok(x.clone());
    }
    let grouped = x.reshape(&[n, out, group, h * w])?;
    let mut sum = b.slice(&grouped, 2, 0, 1)?;
    for g in 1..group {
        sum = b.binary(&sum, &b.slice(&grouped, 2, g, 1)?, BinaryOp::Add)?;
    }
    Ok(b.affine(&sum, 1.0 / group as f32, 0.0)?.reshape(&[n, out, h, w])?)
}

/// Each channel of `x` `[n, C, H, W]` repeated `times` times in place → `[n, C·times, H, W]` (torch's
/// `repeat_interleave` on dimension 1).
pub(crate) fn repeat_channels<B: Backend>(b: &B, x: &Tensor<B>, times: usize) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "channel repeat")?;
    if times == 1 {
        return Ok(x.clone());
    }
    let x4 = x.reshape(&[n, c, 1, h * w])?;
    let copies: Vec<&Tensor<B>> = std::iter::repeat_n(&x4, times).collect();
    Ok(b.concat(&copies, 2)?.reshape(&[n, c * times, h, w])?)
}

/// `num / den` when it is a whole positive number, or an error naming `what`.
pub(crate) fn ratio(num: usize, den: usize, what: &str) -> Result<usize> {
    if den == 0 || num == 0 || !num.is_multiple_of(den) {
        return Err(Error::Invalid(format!("{what}: {num} is not a whole multiple of {den}")));
    }
    Ok(num / den)
}
