//! The Wan 2.2 VAE's parameter-free rearrangements, on frames `[n, C, H, W]`: the 2×2 patchify around the
//! network, and the shortcuts of its residual down and up blocks, `AvgDown3D` (space and time folded into
//! channels, then groups of channels averaged) and `DupUp3D` (channels repeated, then unfolded into space and
//! time), with ComfyUI's orders.

use kiln_compute::backend::BinaryOp;
use kiln_compute::{Backend, Tensor};

use super::super::causal::Time;
use super::config::PATCH;
use crate::error::{Error, Result};

/// `[n, C, H, W]` of `x`, or an error naming `what`.
fn dims<B: Backend>(x: &Tensor<B>, what: &str) -> Result<[usize; 4]> {
    match *x.shape() {
        [n, c, h, w] => Ok([n, c, h, w]),
        ref other => Err(Error::Invalid(format!("{what}: frames {other:?} are not [n, C, H, W]"))),
    }
}

/// Frames `[n, C, H, W]` → `[n, 4C, H/2, W/2]`, channel `c·4 + r·2 + q` holding row offset q and column offset
/// r of each 2×2 patch (the column offset the slower index, as ComfyUI's `patchify`).
pub(crate) fn patchify<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "patchify")?;
    let p = PATCH;
    if h % p != 0 || w % p != 0 {
        return Err(Error::Invalid(format!("patchify: {w}×{h} is not a multiple of {p}")));
    }
    let x = x.reshape(&[n, c, h / p, p, w / p, p])?;
    // [n, c, h', q, w', r] → [n, c, r, q, h', w'].
    let x = b.permute(&x, &[0, 1, 5, 3, 2, 4])?;
    Ok(x.reshape(&[n, c * p * p, h / p, w / p])?)
}

/// The inverse of [`patchify`]: `[n, 4C, h, w]` → `[n, C, 2h, 2w]`.
pub(crate) fn unpatchify<B: Backend>(b: &B, x: &Tensor<B>) -> Result<Tensor<B>> {
    let [n, cp, h, w] = dims(x, "unpatchify")?;
    let p = PATCH;
    let c = cp / (p * p);
    let x = x.reshape(&[n, c, p, p, h, w])?;
    // [n, c, r, q, h, w] → [n, c, h, q, w, r].
    let x = b.permute(&x, &[0, 1, 4, 3, 5, 2])?;
    Ok(x.reshape(&[n, c, h * p, w * p])?)
}

/// `AvgDown3D(in, out, ft, fs)` of frames `x` `[n, in, H, W]`: time padded in front with zero frames to a
/// multiple of `ft` (each image alone: `ft − 1` zeros before it), each (ft, fs, fs) block folded into channels
/// (channel `c·ft·fs² + t·fs² + y·fs + x`), then consecutive groups of `in·ft·fs²/out` channels averaged →
/// `[n'/ft, out, H/fs, W/fs]`.
pub(crate) fn avg_down<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    out: usize,
    (ft, fs): (usize, usize),
    time: &Time<'_, B>,
) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "AvgDown3D")?;
    let factor = ft * fs * fs;
    if out == 0 || !(c * factor).is_multiple_of(out) || h % fs != 0 || w % fs != 0 {
        return Err(Error::Invalid(format!(
            "AvgDown3D of {c} → {out} channels by ({ft}, {fs}, {fs}) on {w}×{h} frames"
        )));
    }
    let group = c * factor / out;
    if factor == 1 && group == 1 {
        return Ok(x.clone());
    }
    let padded = match time {
        Time::Alone if ft > 1 => {
            let zeros = b.full(&[n, ft - 1, c, h, w], 0.0, x.dtype())?;
            b.concat(&[&zeros, &x.reshape(&[n, 1, c, h, w])?], 1)?.reshape(&[n * ft, c, h, w])?
        }
        Time::Stream(_) if n % ft != 0 => {
            let zeros = b.full(&[ft - n % ft, c, h, w], 0.0, x.dtype())?;
            b.concat(&[&zeros, x], 0)?
        }
        _ => x.clone(),
    };
    let t = padded.dim(0)? / ft;
    let (ho, wo) = (h / fs, w / fs);
    let folded = padded.reshape(&[t, ft, c, ho, fs, wo, fs])?;
    // [t, ft, c, h', fy, w', fx] → [t, c, ft, fy, fx, h', w'].
    let folded = b.permute(&folded, &[0, 2, 1, 4, 6, 3, 5])?;
    let grouped = folded.reshape(&[t, out, group, ho * wo])?;
    let mut sum = b.slice(&grouped, 2, 0, 1)?;
    for g in 1..group {
        sum = b.binary(&sum, &b.slice(&grouped, 2, g, 1)?, BinaryOp::Add)?;
    }
    let mean = b.affine(&sum, 1.0 / group as f32, 0.0)?;
    Ok(mean.reshape(&[t, out, ho, wo])?)
}

/// `DupUp3D(in, out, ft, fs)` of frames `x` `[n, in, H, W]`: each channel repeated `out·ft·fs²/in` times, then
/// unfolded (the inverse of [`avg_down`]'s fold) into `[n·ft, out, H·fs, W·fs]`. A clip's first frame gives only
/// its last `ft`-th (`first`: ComfyUI's `first_chunk` drops the first `ft − 1` frames), as does every image.
pub(crate) fn dup_up<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    out: usize,
    (ft, fs): (usize, usize),
    first: bool,
    time: &Time<'_, B>,
) -> Result<Tensor<B>> {
    let [n, c, h, w] = dims(x, "DupUp3D")?;
    let factor = ft * fs * fs;
    if c == 0 || !(out * factor).is_multiple_of(c) {
        return Err(Error::Invalid(format!(
            "DupUp3D of {c} → {out} channels by ({ft}, {fs}, {fs})"
        )));
    }
    let repeats = out * factor / c;
    let x5 = x.reshape(&[n, c, 1, h * w])?;
    let copies: Vec<&Tensor<B>> = std::iter::repeat_n(&x5, repeats).collect();
    let repeated = b.concat(&copies, 2)?.reshape(&[n, out, ft, fs, fs, h, w])?;
    // [n, out, ft, fy, fx, h, w] → [n, ft, out, h, fy, w, fx].
    let unfolded = b.permute(&repeated, &[0, 2, 1, 5, 3, 6, 4])?;
    let (ho, wo) = (h * fs, w * fs);
    let frame = out * ho * wo;
    match time {
        Time::Alone if ft > 1 => {
            let last = b.slice(&unfolded.reshape(&[n, ft, frame])?, 1, ft - 1, 1)?;
            Ok(last.reshape(&[n, out, ho, wo])?)
        }
        Time::Stream(_) if first && ft > 1 => {
            let all = unfolded.reshape(&[n * ft, out, ho, wo])?;
            Ok(b.slice(&all, 0, ft - 1, n * ft - (ft - 1))?)
        }
        _ => Ok(unfolded.reshape(&[n * ft, out, ho, wo])?),
    }
}
