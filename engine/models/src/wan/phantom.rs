//! Phantom's subject frames (`WanPhantomSubjectToVideo`'s `time_dim_concat`, read by ComfyUI's
//! `WanModel._forward`): the reference images' latents follow the video's along time, the model runs over both
//! (its RoPE counting their frames after the video's), and its output is cut back to the video's frames.

use kiln_compute::{Backend, Tensor};

use crate::error::{Error, Result};

/// `x` `[B, C, T, H, W]` with `frames` `[B' , C, K, H, W]` after its frames: `[B, C, T + K, H, W]`, sample s
/// reading `frames`' row s mod B' (ComfyUI's `repeat_to_batch_size`), in `x`'s dtype.
pub fn join_frames<B: Backend>(b: &B, x: &Tensor<B>, frames: &Tensor<B>) -> Result<Tensor<B>> {
    let (xs, fs) = (x.shape(), frames.shape());
    let fits = xs.len() == 5 && fs.len() == 5 && fs[0] > 0 && fs[1] == xs[1] && fs[3..] == xs[3..];
    if !fits {
        return Err(Error::Invalid(format!(
            "Phantom's subject frames (WanPhantomSubjectToVideo) {fs:?} do not fit the model's input {xs:?}: they \
             follow its frames, so their channels and size must be the latent's (a text-to-video Wan 2.1 model \
             of 16 channels, the frames made at the latent's width and height)"
        )));
    }
    let frames = b.cast(frames, x.dtype())?;
    let mut samples = Vec::with_capacity(xs[0]);
    for s in 0..xs[0] {
        let row = b.slice(&frames, 0, s % fs[0], 1)?;
        samples.push(b.concat(&[&b.slice(x, 0, s, 1)?, &row], 2)?);
    }
    Ok(b.concat(&samples.iter().collect::<Vec<_>>(), 0)?)
}
