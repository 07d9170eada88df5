//! The CUDA backend's op profile, for finding where a step's time goes on a real device: with
//! `KILN_CUDA_PROFILE=1` every kernel launch and every GEMM waits for the compute stream before and after it, and
//! its time is added to its name's total (with the GEMMs' operations, so their rate shows). Waiting costs a few
//! microseconds an op and serialises the CPU with the GPU, so profiled runs are slower than plain ones; without
//! the variable nothing is recorded and nothing waits. A process's first launch of each kernel file includes
//! compiling it with NVRTC, and a GEMM's first of its kind the cuBLASLt heuristic: a second, warm run's profile is
//! the steady state.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::CudaStream;

use super::memory::drv;
use crate::error::Result;

/// One op's totals in a profile.
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    /// The kernel's name, or `gemm <op> <dtype>` for a GEMM.
    pub name: String,
    /// How many times it ran.
    pub calls: u64,
    /// Its seconds in all, from before its launch to the end of its work on the device.
    pub seconds: f64,
    /// Its floating-point operations in all, where they are known (GEMMs and the tensor-core attention kernel),
    /// else 0.
    pub flops: f64,
}

fn table() -> Option<&'static Mutex<HashMap<String, OpTime>>> {
    static TABLE: OnceLock<Option<Mutex<HashMap<String, OpTime>>>> = OnceLock::new();
    TABLE
        .get_or_init(|| {
            let on = std::env::var("KILN_CUDA_PROFILE").is_ok_and(|v| !v.is_empty() && v != "0");
            on.then(|| Mutex::new(HashMap::new()))
        })
        .as_ref()
}

/// Whether `KILN_CUDA_PROFILE` turned the profile on for this process.
pub fn enabled() -> bool {
    table().is_some()
}

/// Runs `queue` (which queues work on `stream`) and, when profiling, adds the time it and its work on the device
/// take to `name`'s totals with `flops` operations. Returns what `queue` returns.
pub(crate) fn timed<T>(
    stream: &CudaStream,
    name: impl FnOnce() -> String,
    flops: f64,
    queue: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(table) = table() else { return queue() };
    stream.synchronize().map_err(|e| drv("cuStreamSynchronize", e))?;
    let start = Instant::now();
    let queued = queue()?;
    stream.synchronize().map_err(|e| drv("cuStreamSynchronize", e))?;
    let seconds = start.elapsed().as_secs_f64();
    let name = name();
    let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
    let entry =
        table.entry(name.clone()).or_insert(OpTime { name, calls: 0, seconds: 0.0, flops: 0.0 });
    entry.calls += 1;
    entry.seconds += seconds;
    entry.flops += flops;
    Ok(queued)
}

/// The totals since the last call (the most time first), emptying the profile; empty when it is off.
pub fn take() -> Vec<OpTime> {
    let Some(table) = table() else { return Vec::new() };
    let mut ops: Vec<OpTime> =
        table.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, op)| op).collect();
    ops.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    ops
}
