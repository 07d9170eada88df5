//! The encoder's strided causal convolutions (its downsamples), as ComfyUI's `conv_carry_causal_3d` computes them
//! with a `CarriedConv3d` of stride `(1, 2, 2)` or 2. Every other convolution of the network is the HunyuanVideo 1.5
//! VAE's stride-1 [`causal_conv`](crate::hunyuan_vae::causal::causal_conv), on the same [`Time`] and stream.
//!
//! The padding is that of every carried convolution: one replicated row and column on each side, and in front of
//! a chunk the last two padded input frames of the chunk before (its carry), or a clip's first frame twice. The
//! stride then applies to those padded frames as they stand in each chunk: output k of a chunk reads padded frames
//! s·k, s·k + 1 and s·k + 2. So a stride-2 convolution after a clip's one-frame first chunk reads frames
//! (x₀, x₀, x₁), (x₁, x₂, x₃), …, not the (x₀, x₁, x₂), (x₂, x₃, x₄), … of the whole clip at once: the carry keeps
//! ComfyUI's numbers, whichever they are, as long as the chunks are ComfyUI's.

use kiln_compute::backend::{Conv2dParams, ConvTerm};
use kiln_compute::memory::Layer;
use kiln_compute::{Backend, Tensor, Weight};

use crate::error::{Error, Result};
use crate::hunyuan_vae::causal::{
    Time, collapsed, dims5, last_frames, pad_space, repeat_first, taps_dtype,
};

/// The causal 3-D convolution of `layer`'s weights `i` (`[O, I, 3, 3, 3]`) and `i + 1` (bias) on frames `x`
/// `[n, I, H, W]` in `time`, stride 2 in space and, with `temporal`, in time; `key` names its carry in a stream.
/// A chunk of n frames gives ⌊(n − 1)/2⌋ + 1 frames with `temporal`, else n; every image one.
pub(crate) fn strided_conv<B: Backend>(
    b: &B,
    layer: &Layer<'_>,
    i: usize,
    x: &Tensor<B>,
    temporal: bool,
    time: &mut Time<'_, B>,
    key: &str,
) -> Result<Tensor<B>> {
    let (w, bias) = (layer.weight(i), layer.weight(i + 1));
    let kt = dims5(&w)?[2];
    let xp = pad_space(b, x)?;
    let n = xp.dim(0)?;
    let params = Conv2dParams { stride: 2, padding: [0; 4] };
    match time {
        Time::Stream(stream) if !stream.fresh(key) || n > 1 => {
            let history = match stream.history.remove(key) {
                Some(h) => h,
                None => repeat_first(b, &xp, kt - 1)?,
            };
            let step = if temporal { 2 } else { 1 };
            let y = strided(b, &w, &bias, &xp, &history, step, params)?;
            stream.history.insert(key.to_owned(), last_frames(b, &history, &xp, kt - 1)?);
            Ok(y)
        }
        // A frame with nothing before it reads itself through every tap, whatever the stride.
        Time::Stream(stream) => {
            let y = b.conv2d(&xp, &collapsed(b, &w)?.view(), Some(&bias), params)?;
            stream.history.insert(key.to_owned(), repeat_first(b, &xp, kt - 1)?);
            Ok(y)
        }
        Time::Alone => Ok(b.conv2d(&xp, &collapsed(b, &w)?.view(), Some(&bias), params)?),
    }
}

/// A chunk `xp` (padded in space) after `history` (its `kt − 1` padded frames before), `step` frames apart in
/// time: output k sums tap j over frame `step·k + j` of history and chunk together, each tap's frames read where
/// they lie, runs of consecutive frames as one term.
fn strided<B: Backend>(
    b: &B,
    w: &Weight<'_>,
    bias: &Weight<'_>,
    xp: &Tensor<B>,
    history: &Tensor<B>,
    step: usize,
    params: Conv2dParams,
) -> Result<Tensor<B>> {
    let [o, i, kt, kh, kw] = dims5(w)?;
    let k = kt - 1;
    if history.dim(0)? != k {
        return Err(Error::Invalid(format!(
            "{} frames of history for a kernel of {kt}",
            history.dim(0)?
        )));
    }
    let n = xp.dim(0)?;
    let outputs = (n - 1) / step + 1;
    let taps = b.causal_taps(w, 0, taps_dtype(w))?;
    let kernels: Vec<Weight<'_>> = (0..kt)
        .map(|j| Ok(taps.view().rows(j, 1)?.reshape(&[o, i, kh, kw])?))
        .collect::<Result<_>>()?;
    let mut terms: Vec<ConvTerm<'_, B>> = Vec::new();
    for (j, kernel) in kernels.iter().enumerate() {
        let first = terms.len();
        for at in 0..outputs {
            let frame = step * at + j;
            let (x, from) = if frame < k { (history, frame) } else { (xp, frame - k) };
            // The next frame of the same input into the next output extends this tap's last term.
            if let Some(last) = terms[first..].last_mut()
                && std::ptr::eq(last.x, x)
                && last.from + last.n == from
                && last.at + last.n == at
            {
                last.n += 1;
                continue;
            }
            terms.push(ConvTerm { x, from, n: 1, w: kernel, at });
        }
    }
    Ok(b.conv2d_sum(&terms, Some(bias), params, outputs)?)
}

#[cfg(test)]
mod tests {
    use kiln_compute::backend::cpu::Cpu;
    use kiln_compute::backend::{BinaryOp, Conv2dParams};
    use kiln_compute::{Backend, DType, OwnedWeight, Tensor};

    use super::strided;

    /// Values of a tensor of `n` elements, varied enough that a frame read twice or not at all shows.
    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|v| (v as f32 * 0.37 + seed).sin()).collect()
    }

    #[test]
    fn output_k_reads_frames_step_k_to_step_k_plus_2_of_history_and_chunk() {
        let b = Cpu::new(1 << 24);
        let (o, i, side) = (2, 3, 5);
        let shape = [o, i, 3, 3, 3];
        let w_values = values(shape.iter().product(), 0.1);
        let w = OwnedWeight::from_f32(b.memory(), DType::F32, &shape, &w_values).expect("weight");
        let bias =
            OwnedWeight::from_f32(b.memory(), DType::F32, &[o], &[0.25, -0.5]).expect("bias");
        // Tap j of `w` as a 2-D kernel [O, I, 3, 3].
        let tap = |j: usize| {
            let taps: Vec<f32> = (0..o * i)
                .flat_map(|oi| w_values[(oi * 3 + j) * 9..(oi * 3 + j + 1) * 9].to_vec())
                .collect();
            OwnedWeight::from_f32(b.memory(), DType::F32, &[o, i, 3, 3], &taps).expect("a tap")
        };
        let frame = i * side * side;
        let history =
            b.from_f32(&[2, i, side, side], &values(2 * frame, 2.0), DType::F32).expect("history");
        let params = Conv2dParams { stride: 2, padding: [0; 4] };
        for n in 1..=5 {
            let xp =
                b.from_f32(&[n, i, side, side], &values(n * frame, 3.0), DType::F32).expect("x");
            let padded = b.concat(&[&history, &xp], 0).expect("history and chunk");
            for step in [1, 2] {
                let got = strided(&b, &w.view(), &bias.view(), &xp, &history, step, params)
                    .expect("strided");
                let outputs = (n - 1) / step + 1;
                assert_eq!(got.shape(), [outputs, o, 2, 2], "n {n} step {step}");
                let mut want: Vec<Tensor<Cpu>> = Vec::new();
                for k in 0..outputs {
                    let mut sum: Option<Tensor<Cpu>> = None;
                    for j in 0..3 {
                        let input = b.slice(&padded, 0, step * k + j, 1).expect("a frame");
                        let bias = (j == 0).then(|| bias.view());
                        let y =
                            b.conv2d(&input, &tap(j).view(), bias.as_ref(), params).expect("conv");
                        sum = Some(match sum {
                            Some(s) => b.binary(&s, &y, BinaryOp::Add).expect("add"),
                            None => y,
                        });
                    }
                    want.push(sum.expect("three taps"));
                }
                let want = b.concat(&want.iter().collect::<Vec<_>>(), 0).expect("outputs");
                let (got, want) = (b.to_f32(&got).expect("read"), b.to_f32(&want).expect("read"));
                for (g, w) in got.iter().zip(&want) {
                    assert!((g - w).abs() < 1e-5, "n {n} step {step}: {g} vs {w}");
                }
            }
        }
    }
}
