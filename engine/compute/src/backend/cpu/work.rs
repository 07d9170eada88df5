//! What the CPU backend's products computed and read, counted process-wide, and the CPU's f32 FMA peak: a
//! benchmark sets the seconds of a model call against the arithmetic and the weight bytes it needed (the
//! roofline). Counting is two relaxed atomic adds per product; nothing reads the counters but benchmarks.

#![allow(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rayon::prelude::*;

static FLOPS: AtomicU64 = AtomicU64::new(0);
static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);

/// Floating-point operations and weight bytes of the products run so far (linear, matmul, attention and
/// convolution; a multiply-add counts two operations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Work {
    /// Floating-point operations.
    pub flops: u64,
    /// Stored bytes of the weights the products read (each read counted: a weight used twice counts twice).
    pub weight_bytes: u64,
}

impl std::ops::Sub for Work {
    type Output = Work;

    fn sub(self, earlier: Work) -> Work {
        Work {
            flops: self.flops.wrapping_sub(earlier.flops),
            weight_bytes: self.weight_bytes.wrapping_sub(earlier.weight_bytes),
        }
    }
}

/// The work counted so far in this process.
pub fn work() -> Work {
    Work {
        flops: FLOPS.load(Ordering::Relaxed),
        weight_bytes: WEIGHT_BYTES.load(Ordering::Relaxed),
    }
}

/// Counts a product's operations and the weight bytes it read.
pub(crate) fn count(flops: usize, weight_bytes: u64) {
    FLOPS.fetch_add(flops as u64, Ordering::Relaxed);
    WEIGHT_BYTES.fetch_add(weight_bytes, Ordering::Relaxed);
}

/// Independent FMA chains per thread: enough to cover the FMA latency on both pipes of a core.
const CHAINS: usize = 12;
/// Iterations between clock reads.
const BATCH: usize = 1 << 16;

/// The f32 multiply-add rate of every thread of the rayon pool together, in operations per second, measured
/// for about `duration` with AVX-512 FMAs on registers (the most an f32 product can reach here); `None`
/// without AVX-512.
pub fn peak_f32_flops(duration: Duration) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        let start = Instant::now();
        let per_thread: Vec<u64> = rayon::broadcast(|_| {
            let mut batches = 0u64;
            let mut sink = 0.0f32;
            while start.elapsed() < duration {
                // SAFETY: the CPU has AVX512F (checked above), the only feature `fma_batch` needs.
                sink += unsafe { fma_batch() };
                batches += 1;
            }
            std::hint::black_box(sink);
            batches
        });
        let seconds = start.elapsed().as_secs_f64();
        let flops_per_batch = (BATCH * CHAINS * 16 * 2) as f64;
        return Some(
            per_thread.par_iter().map(|&b| b as f64).sum::<f64>() * flops_per_batch / seconds,
        );
    }
    let _ = duration;
    None
}

/// [`BATCH`] rounds of [`CHAINS`] dependent 16-lane FMAs; returns a lane so the work is not optimised away.
///
/// # Safety
/// The CPU has AVX512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_batch() -> f32 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_set1_ps(1.0); CHAINS];
    let (a, b) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    for _ in 0..BATCH {
        for r in &mut acc {
            *r = _mm512_fmadd_ps(*r, a, b);
        }
    }
    let sum = acc.iter().fold(_mm512_setzero_ps(), |s, &r| _mm512_add_ps(s, r));
    _mm512_reduce_add_ps(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_subtracts_and_the_peak_is_a_rate() {
        let before = work();
        count(10, 4);
        let done = work() - before;
        assert!(done.flops >= 10 && done.weight_bytes >= 4, "{done:?}");
        if let Some(peak) = peak_f32_flops(Duration::from_millis(20)) {
            assert!(peak > 1e9, "an AVX-512 core does more than a GFLOP/s: {peak}");
        }
    }
}
