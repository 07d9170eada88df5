//! Safetensors files and the threaded reader that fills host buffers from them (memory-manager.md §4.1).
//!
//! [`SafetensorsFile::open`] reads the header into an index (name → dtype, shape, file offset, length) and
//! checks every offset against the file's size, so a truncated or garbage file is an error naming the file
//! before any byte is read. Loads then bypass any mapping: eight process-wide reader threads take 2 MiB
//! positional reads (`pread`) from a bounded queue of 256 and write them straight into claimed ranges of a
//! [`HostBuffer`] ([`WriteRange`]), so no bytes are copied twice. With `mark_cold` (the default) each chunk
//! is dropped from the page cache once read, so a load does not cost its size twice in RAM.
//!
//! The invariant: a read's destination is a [`WriteRange`], released before the read is counted as done, so
//! when a load returns every byte it wrote can be copied to a device.

#![allow(unsafe_code)]

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::host::{HostBuffer, WriteRange};

/// Reader threads, process-wide (`io.reader_threads`).
pub const READER_THREADS: usize = 8;
/// Bytes per positional read (`io.chunk`).
pub const READ_CHUNK: usize = 2 << 20;
/// Reads queued before a submitter blocks (`io.queue`).
pub const READ_QUEUE: usize = 256;

/// An open file that the reader threads read by position; cheap to clone.
#[derive(Clone)]
pub struct FileSource {
    file: Arc<File>,
    path: Arc<Path>,
}

impl std::fmt::Debug for FileSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileSource({})", self.path.display())
    }
}

impl FileSource {
    /// Opens `path` for reading.
    pub fn open(path: impl AsRef<Path>) -> Result<FileSource> {
        let path = path.as_ref();
        let file =
            File::open(path).map_err(|source| Error::Io { path: path.to_path_buf(), source })?;
        Ok(FileSource { file: Arc::new(file), path: path.into() })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file's size in bytes, now.
    pub fn size(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(|e| self.io(e))?.len())
    }

    /// Fills `out` with the bytes at `offset`, read on the calling thread (what a device that maps the file
    /// in place reads: see [`super::DeviceMemory::map_file`]).
    pub fn read_at(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt as _;
        self.file.read_exact_at(out, offset).map_err(|e| self.io(e))
    }

    /// A read-only memory map of the whole file, `None` where the system gives none (an empty file, a file
    /// system that cannot map). Reading through it reads the page cache's pages themselves, without a copy.
    pub fn map(&self) -> Option<memmap2::Mmap> {
        // SAFETY: the map is only read, and lives while the file is mapped as device memory. Like safetensors'
        // own mapped loading (which ComfyUI uses), Kiln relies on a model file not being changed in place while
        // it is loaded: bytes rewritten in place (`cp` or `curl -o` over the file) would change under a kernel
        // reading them, and a truncation makes the next read of a lost page raise SIGBUS, which ends the
        // process. Replacing the file (a rename, `rm` then a new file) leaves the mapped one intact.
        let map = unsafe { memmap2::Mmap::map(&*self.file) }.ok()?;
        // Weights are read front to back, once a pass. Said so, the kernel reads ahead on a fault as it does for
        // a sequential read, and ignores a mapping's accessed bits in reclaim, as for pages no process maps.
        // Without it, when the models outgrew RAM (Qwen-Image's 28.7 GB on a 24 GiB host), the encoder's mapped
        // pages stayed resident into the sampler and the first prompt's steps took up to 4× the preads' time
        // (bench/results/2026-12-05-cpu-real-mapped.md). Advice the system refuses changes nothing read.
        let _ = map.advise(memmap2::Advice::Sequential);
        Some(map)
    }

    /// Reads `len` bytes at `offset` on the calling thread (small reads: force-cast tiny weights).
    pub fn read_vec(&self, offset: u64, len: u64) -> Result<Vec<u8>> {
        let len = usize::try_from(len).map_err(|_| Error::Host(format!("a {len}-byte read")))?;
        let mut out = vec![0u8; len];
        self.read_at(offset, &mut out)?;
        Ok(out)
    }

    /// Reads `dst.len()` bytes at `offset` into `dst` on the reader threads, in 2 MiB chunks; fails if any
    /// chunk fails. With `mark_cold`, each chunk is dropped from the page cache after it is read.
    pub fn read_into(&self, offset: u64, dst: WriteRange, mark_cold: bool) -> Result<()> {
        let total = dst.len() as u64;
        read_batch(vec![(self.clone(), offset, dst)], total, mark_cold, &mut |_, _| {})
    }

    /// Drops the file's cached pages (`posix_fadvise(DONTNEED)` on the whole file), so the next read comes
    /// from the disk: a benchmark measures a cold load after this and a warm one after a first read.
    pub fn drop_page_cache(&self) -> Result<()> {
        // Dirty pages are not dropped; write them back first (a benchmark may have just written the file).
        self.file.sync_data().map_err(|e| self.io(e))?;
        advise_dontneed(&self.file, 0, 0).map_err(|e| self.io(e))
    }

    fn io(&self, source: io::Error) -> Error {
        Error::Io { path: self.path.to_path_buf(), source }
    }
}

/// Drops `path`'s cached pages from the page cache (see [`FileSource::drop_page_cache`]).
pub fn drop_page_cache(path: impl AsRef<Path>) -> Result<()> {
    FileSource::open(path)?.drop_page_cache()
}

#[cfg(any(target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn advise_dontneed(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::{Advice, fadvise};
    Ok(fadvise(file, offset, std::num::NonZeroU64::new(len), Advice::DontNeed)?)
}

#[cfg(not(any(target_os = "linux", target_os = "android", target_os = "freebsd")))]
fn advise_dontneed(_file: &File, _offset: u64, _len: u64) -> io::Result<()> {
    // No page-cache advice on this platform; cold reads are not possible, warm reads still are.
    Ok(())
}

/// How a load reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// Drop each chunk from the page cache once read (`io.mark_cold`, on by default).
    pub mark_cold: bool,
}

impl Default for LoadOptions {
    fn default() -> LoadOptions {
        LoadOptions { mark_cold: true }
    }
}

/// What a load did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadStats {
    /// Bytes read.
    pub bytes: u64,
    /// Wall-clock seconds the load took.
    pub seconds: f64,
}

impl LoadStats {
    /// Throughput in GB/s (10⁹ bytes per second).
    pub fn gb_per_s(&self) -> f64 {
        if self.seconds > 0.0 { self.bytes as f64 / 1e9 / self.seconds } else { 0.0 }
    }
}

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element type.
    pub dtype: DType,
    /// Shape.
    pub shape: Vec<usize>,
    /// Offset of its first byte in the file.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// An open safetensors file and its header's index.
#[derive(Debug)]
pub struct SafetensorsFile {
    source: FileSource,
    tensors: BTreeMap<String, TensorInfo>,
    /// Tensors whose dtype Kiln does not compute with: name → dtype name and where its bytes are.
    unsupported: BTreeMap<String, (String, u64, u64)>,
    metadata: BTreeMap<String, String>,
    data_start: u64,
    data_len: u64,
}

impl SafetensorsFile {
    /// Opens `path` and indexes its header; a file too short for its header or its tensors, or a header that
    /// is not a safetensors header, is an [`Error::File`] naming the file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let source = FileSource::open(path)?;
        let file_err = |msg: String| Error::File { path: source.path().to_path_buf(), msg };
        let file_len = source.size()?;
        let mut n = [0u8; 8];
        if file_len < 8 {
            return Err(file_err(format!("{file_len} bytes: too short for a safetensors header")));
        }
        source.file.read_exact_at(&mut n, 0).map_err(|e| source.io(e))?;
        let header_len = u64::from_le_bytes(n);
        if header_len > file_len - 8 {
            return Err(file_err(format!(
                "the header claims {header_len} bytes but the file has {} after its length (truncated?)",
                file_len - 8
            )));
        }
        // SAFETY: the map is private to this function and only its header bytes are read (by
        // `read_metadata`) before it is dropped; like every safetensors reader we rely on the file not being
        // truncated while we read it (a concurrent truncation would fault, not corrupt memory we own).
        let map = unsafe { memmap2::Mmap::map(&*source.file) }.map_err(|e| source.io(e))?;
        let (header_len, meta) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| {
            file_err(match e {
                safetensors::SafeTensorError::MetadataIncompleteBuffer => format!(
                    "its {file_len} bytes do not match the tensor data the header describes (truncated?)"
                ),
                e => format!("not a safetensors file: {e}"),
            })
        })?;
        drop(map);
        let data_start = 8 + header_len as u64;
        let mut tensors = BTreeMap::new();
        let mut unsupported = BTreeMap::new();
        for (name, info) in meta.tensors() {
            let (start, end) = info.data_offsets;
            let (offset, len) = (data_start + start as u64, (end - start) as u64);
            if offset + len > file_len {
                return Err(file_err(format!(
                    "tensor {name} ends at byte {}, past the end of the file",
                    offset + len
                )));
            }
            match DType::from_safetensors(info.dtype) {
                Some(dtype) => {
                    tensors
                        .insert(name, TensorInfo { dtype, shape: info.shape.clone(), offset, len });
                }
                None => {
                    unsupported.insert(name, (info.dtype.to_string(), offset, len));
                }
            }
        }
        let metadata =
            meta.metadata().iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(SafetensorsFile {
            source,
            tensors,
            unsupported,
            metadata,
            data_start,
            data_len: meta.data_len() as u64,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.source.path()
    }

    /// The open file, for positional reads (the staging ring and the pin-on-the-way path read from it).
    pub fn source(&self) -> &FileSource {
        &self.source
    }

    /// The tensor named `name`; an error names the file and says whether the tensor is missing or has a
    /// dtype Kiln does not compute with.
    pub fn tensor(&self, name: &str) -> Result<&TensorInfo> {
        if let Some(info) = self.tensors.get(name) {
            return Ok(info);
        }
        let msg = match self.unsupported.get(name) {
            Some((dtype, ..)) => {
                format!("tensor {name} has dtype {dtype}, which Kiln does not support")
            }
            None => format!("no tensor named {name}"),
        };
        Err(Error::File { path: self.path().to_path_buf(), msg })
    }

    /// The tensors with a supported dtype, by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&str, &TensorInfo)> {
        self.tensors.iter().map(|(n, t)| (n.as_str(), t))
    }

    /// The tensors whose dtype Kiln does not support: name and dtype name.
    pub fn unsupported(&self) -> impl Iterator<Item = (&str, &str)> {
        self.unsupported.iter().map(|(n, (d, ..))| (n.as_str(), d.as_str()))
    }

    /// The stored bytes of a tensor Kiln does not compute with (a `U8` marker such as ComfyUI's
    /// `<layer>.comfy_quant` JSON), or `None` when there is no such tensor.
    pub fn unsupported_bytes(&self, name: &str) -> Option<Result<Vec<u8>>> {
        let (_, offset, len) = self.unsupported.get(name)?;
        Some(self.source.read_vec(*offset, *len))
    }

    /// Where tensor `name`'s bytes lie, `(offset, length)`, whatever its dtype (a quantized weight's scale table
    /// may be stored as a type Kiln does not compute with, such as MXFP8's `F8_E8M0`).
    pub fn raw_range(&self, name: &str) -> Result<(u64, u64)> {
        match (self.tensors.get(name), self.unsupported.get(name)) {
            (Some(info), _) => Ok((info.offset, info.len)),
            (None, Some((_, offset, len))) => Ok((*offset, *len)),
            (None, None) => Err(Error::File {
                path: self.path().to_path_buf(),
                msg: format!("no tensor named {name}"),
            }),
        }
    }

    /// The stored bytes of tensor `name`, whatever its dtype (a marker, a scale).
    pub fn raw_bytes(&self, name: &str) -> Result<Vec<u8>> {
        let (offset, len) = self.raw_range(name)?;
        self.source.read_vec(offset, len)
    }

    /// Every tensor's name, whatever its dtype.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().chain(self.unsupported.keys()).map(String::as_str)
    }

    /// The header's `__metadata__` strings.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Offset of the data section (8 + header length).
    pub fn data_start(&self) -> u64 {
        self.data_start
    }

    /// Bytes of tensor data in the file.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Reads each `(tensor name, buffer offset)` of `plan` into `buf` at that offset, on the reader threads.
    ///
    /// Every name is looked up and every destination claimed before the first read (an unknown name, an
    /// unsupported dtype, a destination beyond the buffer's in-use length or two overlapping destinations
    /// are errors). Reads go in file order, tensors adjacent in the file and in the buffer as one run.
    /// `progress(done, total)` is called on the calling thread with growing byte counts, last with
    /// `(total, total)` on success.
    pub fn load(
        &self,
        buf: &Arc<HostBuffer>,
        plan: &[(&str, usize)],
        options: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<LoadStats> {
        let started = Instant::now();
        let mut items = Vec::with_capacity(plan.len());
        for &(name, dst) in plan {
            // MXFP8's scale tables may be stored as F8_E8M0, which Kiln reads as bytes; other dtypes it does not
            // compute with are refused.
            let (offset, len) = match self.unsupported.get(name) {
                Some((dtype, offset, len)) if dtype == "F8_E8M0" => (*offset, *len),
                _ => {
                    let info = self.tensor(name)?;
                    (info.offset, info.len)
                }
            };
            let len = usize::try_from(len)
                .map_err(|_| Error::Host(format!("tensor {name} is too large")))?;
            items.push((offset, dst, len));
        }
        items.sort_unstable();
        // Coalesce runs contiguous both in the file and in the buffer.
        let mut runs: Vec<(u64, usize, usize)> = Vec::with_capacity(items.len());
        for (offset, dst, len) in items {
            match runs.last_mut() {
                Some(run) if run.0 + run.2 as u64 == offset && run.1 + run.2 == dst => run.2 += len,
                _ => runs.push((offset, dst, len)),
            }
        }
        let mut jobs = Vec::with_capacity(runs.len());
        let mut total = 0u64;
        for (offset, dst, len) in runs {
            jobs.push((self.source.clone(), offset, buf.claim(dst, len)?));
            total += len as u64;
        }
        read_batch(jobs, total, options.mark_cold, progress)?;
        Ok(LoadStats { bytes: total, seconds: started.elapsed().as_secs_f64() })
    }
}

/// Reads each `(file, offset, destination)` on the reader threads, reporting progress on this thread.
pub(crate) fn read_batch(
    jobs: Vec<(FileSource, u64, WriteRange)>,
    total: u64,
    mark_cold: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let pool = ReaderPool::global();
    let batch = Arc::new(Batch::default());
    let mut reported = 0u64;
    let mut report = |done: u64, progress: &mut dyn FnMut(u64, u64)| {
        if done > reported {
            reported = done;
            progress(done, total);
        }
    };
    for (source, offset, mut dst) in jobs {
        let mut at = offset;
        while !dst.is_empty() {
            let rest = dst.split_off(READ_CHUNK);
            let len = dst.len() as u64;
            batch.lock().pending += 1;
            pool.push(Task {
                source: source.clone(),
                offset: at,
                dst,
                mark_cold,
                batch: batch.clone(),
            });
            at += len;
            dst = rest;
            let done = batch.lock().done;
            report(done, progress);
        }
    }
    loop {
        let (done, pending) = {
            let state = batch.lock();
            (state.done, state.pending)
        };
        report(done, progress);
        if pending == 0 {
            break;
        }
        let state = batch.lock();
        if (state.done, state.pending) == (done, pending) {
            // Every chunk still pending notifies when it ends, so this wait cannot miss the last one.
            drop(batch.changed.wait(state).unwrap_or_else(|p| p.into_inner()));
        }
    }
    let mut state = batch.lock();
    match state.error.take() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// A 2 MiB read.
struct Task {
    source: FileSource,
    offset: u64,
    dst: WriteRange,
    mark_cold: bool,
    batch: Arc<Batch>,
}

/// The completion counter of one [`read_batch`] call.
#[derive(Default)]
struct Batch {
    state: Mutex<BatchState>,
    changed: Condvar,
}

#[derive(Default)]
struct BatchState {
    pending: usize,
    done: u64,
    error: Option<Error>,
}

impl Batch {
    fn lock(&self) -> MutexGuard<'_, BatchState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether an earlier chunk failed (later chunks of the batch are then skipped).
    fn failed(&self) -> bool {
        self.lock().error.is_some()
    }
}

impl Task {
    fn run(self) {
        let Task { source, offset, mut dst, mark_cold, batch } = self;
        let len = dst.len() as u64;
        // After a failure the batch fails anyway; its remaining chunks are skipped, not counted.
        let result = (!batch.failed()).then(|| read_exact_at(&source, offset, dst.as_mut_slice()));
        if mark_cold && matches!(result, Some(Ok(()))) {
            // Advice only: a failure leaves the pages cached, nothing worse.
            let _ = advise_dontneed(&source.file, offset, len);
        }
        // Release the destination before counting the chunk done, so a finished batch holds no claims.
        drop(dst);
        let mut state = batch.lock();
        match result {
            Some(Ok(())) => state.done += len,
            Some(Err(e)) => {
                state.error.get_or_insert(e);
            }
            None => {}
        }
        state.pending -= 1;
        batch.changed.notify_all();
    }
}

fn read_exact_at(source: &FileSource, offset: u64, out: &mut [u8]) -> Result<()> {
    let mut filled = 0;
    while filled < out.len() {
        let at = offset + filled as u64;
        match source.file.read_at(&mut out[filled..], at) {
            Ok(0) => {
                return Err(Error::File {
                    path: source.path().to_path_buf(),
                    msg: format!(
                        "the file ends at byte {at}, before {} (truncated while loading?)",
                        offset + out.len() as u64
                    ),
                });
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                let source_err = io::Error::new(e.kind(), format!("at byte {at}: {e}"));
                return Err(Error::Io { path: PathBuf::from(source.path()), source: source_err });
            }
        }
    }
    Ok(())
}

/// The process-wide reader threads and their bounded queue.
struct ReaderPool {
    queue: Mutex<VecDeque<Task>>,
    has_items: Condvar,
    has_space: Condvar,
    /// Whether any thread runs; without one, tasks run on the submitting thread.
    threaded: AtomicBool,
}

impl ReaderPool {
    fn global() -> &'static ReaderPool {
        static POOL: OnceLock<&'static ReaderPool> = OnceLock::new();
        POOL.get_or_init(|| {
            let pool: &'static ReaderPool = Box::leak(Box::new(ReaderPool {
                queue: Mutex::new(VecDeque::with_capacity(READ_QUEUE)),
                has_items: Condvar::new(),
                has_space: Condvar::new(),
                threaded: AtomicBool::new(false),
            }));
            for index in 0..READER_THREADS {
                match std::thread::Builder::new()
                    .name(format!("kiln-reader-{index}"))
                    .spawn(move || pool.worker())
                {
                    Ok(_) => pool.threaded.store(true, Ordering::Release),
                    Err(e) => {
                        tracing::warn!("the file reader runs with {index} threads: {e}");
                        break;
                    }
                }
            }
            pool
        })
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Task>> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `task`, blocking while the queue is full.
    fn push(&self, task: Task) {
        if !self.threaded.load(Ordering::Acquire) {
            task.run();
            return;
        }
        let mut queue = self.lock();
        while queue.len() >= READ_QUEUE {
            queue = self.has_space.wait(queue).unwrap_or_else(|p| p.into_inner());
        }
        queue.push_back(task);
        self.has_items.notify_one();
    }

    fn worker(&self) {
        loop {
            let task = {
                let mut queue = self.lock();
                loop {
                    match queue.pop_front() {
                        Some(task) => break task,
                        None => {
                            queue = self.has_items.wait(queue).unwrap_or_else(|p| p.into_inner())
                        }
                    }
                }
            };
            self.has_space.notify_one();
            task.run();
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::sync::atomic::AtomicU64;

    use super::*;
    use crate::memory::device::HostMemory;
    use crate::memory::host::HostBufferConfig;

    const MIB: usize = 1 << 20;

    /// A file under the temp dir, removed on drop.
    pub(crate) struct TempFile(pub(crate) PathBuf);

    impl TempFile {
        pub(crate) fn new(tag: &str) -> TempFile {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            TempFile(std::env::temp_dir().join(format!("kiln-{}-{n}-{tag}", std::process::id())))
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Deterministic pseudo-random bytes (xorshift64).
    pub(crate) fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    /// Writes a safetensors file with the safetensors crate: five supported tensors of four dtypes (one
    /// empty, two crossing a read chunk) and an I64 one.
    fn write_model(tag: &str) -> TempFile {
        use safetensors::Dtype;
        let specs: [(&str, Dtype, Vec<usize>); 6] = [
            ("a.weight", Dtype::F32, vec![3, 5]),
            ("b.weight", Dtype::BF16, vec![1000, 1100]),
            ("c.fp8", Dtype::F8_E4M3, vec![3_000_001]),
            ("d.half", Dtype::F16, vec![7]),
            ("e.empty", Dtype::F16, vec![0]),
            ("ids", Dtype::I64, vec![4]),
        ];
        let data: Vec<Vec<u8>> = specs
            .iter()
            .enumerate()
            .map(|(i, (_, dtype, shape))| {
                noise(shape.iter().product::<usize>() * dtype.bitsize() / 8, i as u64 + 1)
            })
            .collect();
        let views: Vec<(&str, safetensors::tensor::TensorView<'_>)> = specs
            .iter()
            .zip(&data)
            .map(|((name, dtype, shape), bytes)| {
                (
                    *name,
                    safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes)
                        .expect("view"),
                )
            })
            .collect();
        let file = TempFile::new(&format!("{tag}.safetensors"));
        let metadata = HashMap::from([("format".to_string(), "pt".to_string())]);
        safetensors::serialize_to_file(views, Some(metadata), &file.0).expect("serialize");
        file
    }

    fn buffer(len: usize) -> Arc<HostBuffer> {
        let buf = HostBuffer::new(len, HostBufferConfig { prewarm: 0, register_chunk: 1 << 30 });
        buf.grow(len).expect("grow");
        buf
    }

    fn read(buf: &HostBuffer, offset: usize, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        buf.read(offset, &mut out);
        out
    }

    #[test]
    fn the_index_names_dtypes_shapes_offsets_and_metadata() {
        let file = write_model("index");
        let st = SafetensorsFile::open(&file.0).expect("open");
        let names: Vec<&str> = st.tensors().map(|(n, _)| n).collect();
        assert_eq!(names, ["a.weight", "b.weight", "c.fp8", "d.half", "e.empty"]);
        let b = st.tensor("b.weight").expect("b");
        assert_eq!(
            (b.dtype, b.shape.as_slice(), b.len),
            (DType::BF16, &[1000, 1100][..], 2_200_000)
        );
        assert_eq!(st.tensor("c.fp8").expect("c").dtype, DType::F8E4M3);
        assert_eq!(st.metadata().get("format").map(String::as_str), Some("pt"));
        assert_eq!(st.unsupported().collect::<Vec<_>>(), [("ids", "I64")]);
        let bytes = std::fs::read(&file.0).expect("read");
        let total: u64 = st.tensors().map(|(_, t)| t.len).sum::<u64>() + 32;
        assert_eq!(st.data_len(), total);
        assert_eq!(st.data_start() + st.data_len(), bytes.len() as u64);

        let err = st.tensor("ids").expect_err("unsupported dtype");
        let msg = err.to_string();
        assert!(
            msg.contains("ids") && msg.contains("I64") && msg.contains(&*file.0.to_string_lossy()),
            "{msg}"
        );
        let err = st.tensor("nope").expect_err("missing");
        assert!(err.to_string().contains("no tensor named nope"), "{err}");
    }

    #[test]
    fn a_load_puts_the_files_bytes_at_the_callers_offsets_and_reports_progress() {
        let file = write_model("load");
        let st = SafetensorsFile::open(&file.0).expect("open");
        let bytes = std::fs::read(&file.0).expect("read");
        // Reverse name order, each tensor 4 KiB past the previous one's end: no two runs coalesce.
        let mut plan = Vec::new();
        let mut at = 0;
        for (name, info) in st.tensors().collect::<Vec<_>>().into_iter().rev() {
            plan.push((name, at));
            at += info.len as usize + 4096;
        }
        let buf = buffer(at);
        let mut calls = Vec::new();
        let stats = st
            .load(&buf, &plan, &LoadOptions::default(), &mut |done, total| {
                calls.push((done, total))
            })
            .expect("load");
        let total: u64 = st.tensors().map(|(_, t)| t.len).sum();
        assert_eq!(stats.bytes, total);
        for &(name, dst) in &plan {
            let info = st.tensor(name).expect("tensor");
            let want = &bytes[info.offset as usize..(info.offset + info.len) as usize];
            assert!(read(&buf, dst, info.len as usize) == want, "{name} differs from the file");
        }
        assert!(calls.windows(2).all(|w| w[0].0 < w[1].0), "progress grows: {calls:?}");
        assert!(calls.iter().all(|&(_, t)| t == total));
        assert_eq!(calls.last(), Some(&(total, total)));
        buf.claim(0, at).expect("a finished load holds no claims");
    }

    #[test]
    fn tensors_laid_out_as_in_the_file_load_as_one_run_and_warm_or_cold() {
        let file = write_model("runs");
        let st = SafetensorsFile::open(&file.0).expect("open");
        let bytes = std::fs::read(&file.0).expect("read");
        let data = &bytes[st.data_start() as usize..];
        let plan: Vec<(&str, usize)> =
            st.tensors().map(|(n, t)| (n, (t.offset - st.data_start()) as usize)).collect();
        for mark_cold in [true, false] {
            drop_page_cache(&file.0).expect("drop the page cache");
            let buf = buffer(data.len());
            let stats =
                st.load(&buf, &plan, &LoadOptions { mark_cold }, &mut |_, _| {}).expect("load");
            assert_eq!(stats.bytes, st.tensors().map(|(_, t)| t.len).sum::<u64>());
            for (name, info) in st.tensors() {
                let start = (info.offset - st.data_start()) as usize;
                let end = start + info.len as usize;
                assert!(
                    read(&buf, start, end - start) == data[start..end],
                    "{name} (mark_cold {mark_cold})"
                );
            }
        }
    }

    #[test]
    fn bad_plans_are_refused_before_any_read() {
        let file = write_model("plans");
        let st = SafetensorsFile::open(&file.0).expect("open");
        let a = st.tensor("a.weight").expect("a").len as usize;
        let buf = buffer(4 * MIB);
        let none = &mut |_: u64, _: u64| {};
        let overlapping =
            st.load(&buf, &[("a.weight", 0), ("d.half", a - 2)], &LoadOptions::default(), none);
        assert!(matches!(overlapping, Err(Error::Host(_))), "{overlapping:?}");
        let beyond = st.load(&buf, &[("b.weight", 3 * MIB)], &LoadOptions::default(), none);
        assert!(matches!(beyond, Err(Error::Host(_))), "{beyond:?}");
        let unsupported = st.load(&buf, &[("ids", 0)], &LoadOptions::default(), none);
        assert!(matches!(unsupported, Err(Error::File { .. })), "{unsupported:?}");
        buf.claim(0, 4 * MIB).expect("refused loads leave no claims");
    }

    fn open_err(bytes: &[u8], tag: &str) -> (TempFile, String) {
        let file = TempFile::new(tag);
        std::fs::write(&file.0, bytes).expect("write");
        let err = SafetensorsFile::open(&file.0).expect_err("a bad file");
        let Error::File { path, msg } = err else { panic!("not a file error: {err}") };
        assert_eq!(path, file.0, "the error names the file");
        (file, msg)
    }

    #[test]
    fn truncated_and_garbage_files_are_errors_naming_the_file() {
        let good = write_model("truncated");
        let bytes = std::fs::read(&good.0).expect("read");
        let (_f, msg) = open_err(&bytes[..bytes.len() - 10], "cut.safetensors");
        assert!(msg.contains("truncated"), "{msg}");
        let (_f, msg) = open_err(&bytes[..100], "cut-in-header.safetensors");
        assert!(msg.contains("truncated"), "{msg}");
        let (_f, msg) = open_err(&bytes[..3], "tiny.safetensors");
        assert!(msg.contains("too short"), "{msg}");
        let mut garbage = 24u64.to_le_bytes().to_vec();
        garbage.extend_from_slice(b"this is not a json head!");
        let (_f, msg) = open_err(&garbage, "garbage.safetensors");
        assert!(msg.contains("not a safetensors file"), "{msg}");
        let (_f, msg) = open_err(&noise(4096, 9), "noise.safetensors");
        assert!(!msg.is_empty());
    }

    #[test]
    fn a_file_cut_short_after_opening_fails_the_load() {
        let file = write_model("shrinks");
        let st = SafetensorsFile::open(&file.0).expect("open");
        let c = st.tensor("c.fp8").expect("c").clone();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&file.0)
            .expect("open for writing")
            .set_len(c.offset + 1000)
            .expect("cut");
        let buf = buffer(c.len as usize);
        let err = st
            .load(&buf, &[("c.fp8", 0)], &LoadOptions::default(), &mut |_, _| {})
            .expect_err("short read");
        assert!(err.to_string().contains("truncated while loading"), "{err}");
        buf.claim(0, c.len as usize).expect("a failed load holds no claims");
    }
}
