//! ComfyUI's `gaussian_kernel` and the convolution its blur and sharpen filters run with it (`ImageBlur`,
//! `ImageSharpen`, `LatentOperationSharpen`): each plane mirrored at its borders (torch's `reflect` padding),
//! convolved with the square kernel; ComfyUI's zero padding around that is cropped off again, so only the
//! mirrored plane is read.

/// ComfyUI's `gaussian_kernel(size, sigma)`, `size × size` row by row, in f32: the offsets span -1..=1 whatever
/// the size (torch's `linspace`, computed from both ends), `exp(-d² / (2σ²))` of the distance `d` from the
/// middle, normalised to sum 1.
pub fn kernel(size: usize, sigma: f64) -> Vec<f32> {
    let step = 2.0f32 / (size - 1) as f32;
    let at = |i: usize| {
        if i < size / 2 { -1.0 + step * i as f32 } else { 1.0 - step * (size - 1 - i) as f32 }
    };
    let denominator = (2.0 * sigma * sigma) as f32;
    let mut kernel = Vec::with_capacity(size * size);
    for i in 0..size {
        for j in 0..size {
            let (x, y) = (at(i), at(j));
            let d = (x * x + y * y).sqrt();
            kernel.push((-(d * d) / denominator).exp());
        }
    }
    let sum = kernel.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
    kernel.iter_mut().for_each(|v| *v /= sum);
    kernel
}

/// The sharpening kernel of ComfyUI's `ImageSharpen` and `LatentOperationSharpen`: [`kernel`] times
/// `-10 · alpha`, its middle tap raised so the taps sum to 1 (an unsharp mask).
pub fn sharpen_kernel(size: usize, sigma: f64, alpha: f64) -> Vec<f32> {
    let scale = -(alpha * 10.0) as f32;
    let mut kernel: Vec<f32> = kernel(size, sigma).iter().map(|v| v * scale).collect();
    let sum = kernel.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
    let middle = size * size / 2;
    kernel[middle] = kernel[middle] - sum + 1.0;
    kernel
}

/// The index of `i` in a row of `len` mirrored at its ends without repeating the end value (torch's `reflect`
/// padding: `-1` reads `1`). `i` lies at most `len - 1` outside `0..len`, as torch requires of the padding and
/// the callers check.
pub fn reflect(i: isize, len: usize) -> usize {
    let last = len as isize - 1;
    let i = if i < 0 {
        -i
    } else if i > last {
        2 * last - i
    } else {
        i
    };
    i as usize
}

/// `plane` (`h × w`, row by row) convolved with the `(2·radius + 1)²` taps `kernel` over the plane mirrored at
/// its borders, into `out` (`h × w`). Each output sums its taps row by row, left to right, as a plain
/// convolution does. The plane must be larger than `radius` on both sides.
pub fn convolve_plane(
    plane: &[f32],
    (h, w): (usize, usize),
    kernel: &[f32],
    radius: usize,
    out: &mut [f32],
) {
    let size = 2 * radius + 1;
    let (pw, ph) = (w + 2 * radius, h + 2 * radius);
    let mut padded = vec![0.0f32; pw * ph];
    for (py, line) in padded.chunks_exact_mut(pw).enumerate() {
        let y = reflect(py as isize - radius as isize, h);
        for (px, v) in line.iter_mut().enumerate() {
            *v = plane[y * w + reflect(px as isize - radius as isize, w)];
        }
    }
    for (y, row) in out.chunks_exact_mut(w).enumerate().take(h) {
        row.fill(0.0);
        for (ky, weights) in kernel.chunks_exact(size).enumerate() {
            let line = &padded[(y + ky) * pw..(y + ky + 1) * pw];
            for (kx, &weight) in weights.iter().enumerate() {
                for (acc, &v) in row.iter_mut().zip(&line[kx..kx + w]) {
                    *acc += weight * v;
                }
            }
        }
    }
}
