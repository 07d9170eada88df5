//! A clip's edges: `[1, C, T, H, W]` in, its frames `[T, C, H, W]` through the network, and the chunks
//! a clip goes through (its first frame alone, then a few at a time).

use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};

/// The frames `[T, C, H, W]` of a clip `[1, C, T, H, W]` of `channels` channels, cast to the compute dtype.
pub(crate) fn clip_frames<B: Backend>(
    b: &B,
    x: &Tensor<B>,
    channels: usize,
    what: &str,
) -> Result<Tensor<B>> {
    let &[1, c, t, h, w] = x.shape() else {
        return Err(Error::Invalid(format!(
            "a {what} must be one clip [1, C, T, H, W], got {:?}",
            x.shape()
        )));
    };
    if c != channels || t == 0 {
        return Err(Error::Invalid(format!(
            "a {what} {:?} for a VAE of {channels} channels (and at least one frame)",
            x.shape()
        )));
    }
    let x = b.permute(&b.cast(x, b.compute_dtype())?, &[0, 2, 1, 3, 4])?;
    Ok(x.reshape(&[t, c, h, w])?)
}

/// `(start, len)` of each chunk of `total` frames: the first alone, then `per` at a time.
pub(crate) fn chunks(total: usize, per: usize) -> Vec<(usize, usize)> {
    let mut out = vec![(0, total.min(1))];
    let mut start = 1;
    while start < total {
        let len = per.min(total - start);
        out.push((start, len));
        start += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chunks;

    #[test]
    fn chunks_start_with_one_frame() {
        assert_eq!(chunks(9, 8), [(0, 1), (1, 8)]);
        assert_eq!(chunks(13, 8), [(0, 1), (1, 8), (9, 4)]);
        assert_eq!(chunks(3, 1), [(0, 1), (1, 1), (2, 1)]);
        assert_eq!(chunks(1, 4), [(0, 1)]);
    }
}
