//! A streaming safetensors writer for random weights: the header is computed from the tensor list first, then
//! the values are generated and written a few MiB at a time, so an 11.5 GiB file never sits in memory.
//!
//! Invariant: a tensor's bytes depend only on the seed, its stream id (its family and name, never its position
//! in the file or the thread that drew it) and its dtype — so the same seed gives the same file, and a
//! checkpoint's parts equal the standalone files.

use std::borrow::Cow;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use kiln_compute::DType;
use kiln_compute::dtype::narrow;
use rayon::prelude::*;

use super::layout::{Init, Spec};
use crate::error::{Error, Result};

/// Elements drawn from one PRNG stream; streams are generated in parallel.
const BLOCK: usize = 1 << 16;
/// Bytes generated and written per batch.
const BATCH_BYTES: usize = 8 << 20;

/// One tensor to write: its key in the file, its layout entry, its dtype and its PRNG stream id.
pub(crate) struct Entry<'s> {
    pub(crate) key: String,
    pub(crate) spec: Cow<'s, Spec>,
    pub(crate) dtype: DType,
    pub(crate) stream: u64,
    /// A quantized weight `(scale, offset)`: its values become `v / scale + offset` before they are rounded to
    /// `dtype` (the offset moves NVFP4's random code bytes into 0..=255).
    pub(crate) quantized: Option<(f32, f32)>,
}

impl Entry<'_> {
    fn bytes(&self) -> u64 {
        self.spec.shape.iter().product::<usize>() as u64 * self.dtype.size() as u64
    }
}

/// The PRNG stream id of tensor `name` of `family` (FNV-1a).
pub(crate) fn stream_id(family: &str, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in family.as_bytes().iter().chain(&[0]).chain(name.as_bytes()) {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A file ready to write: its tensors in file order, its header and its size.
pub(crate) struct Plan<'s> {
    path: PathBuf,
    entries: Vec<Entry<'s>>,
    header: String,
    total: u64,
}

impl<'s> Plan<'s> {
    /// Orders `entries` as safetensors does (larger elements first, then by name) and lays out the header.
    pub(crate) fn new(
        path: &Path,
        mut entries: Vec<Entry<'s>>,
        metadata: &[(String, String)],
    ) -> Plan<'s> {
        entries.sort_by(|a, b| b.dtype.size().cmp(&a.dtype.size()).then_with(|| a.key.cmp(&b.key)));
        let header = header_json(&entries, metadata);
        let data: u64 = entries.iter().map(Entry::bytes).sum();
        let total = 8 + header.len() as u64 + data;
        Plan { path: path.to_path_buf(), entries, header, total }
    }

    /// The file's size in bytes.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }

    /// Writes the file (through `<path>.part`, renamed when complete), reporting `progress(bytes written, file
    /// size)`.
    pub(crate) fn write(&self, seed: u64, progress: &mut dyn FnMut(u64, u64)) -> Result<()> {
        let part = part_path(&self.path);
        let result = write_all(&part, &self.header, &self.entries, seed, self.total, progress)
            .and_then(|()| std::fs::rename(&part, &self.path).map_err(|e| io_error(&self.path, e)));
        if result.is_err() {
            // Best effort: the error being returned is the one that matters.
            let _ = std::fs::remove_file(&part);
        }
        result
    }
}

fn write_all(
    part: &Path,
    header: &str,
    entries: &[Entry<'_>],
    seed: u64,
    total: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<()> {
    let io = |e| io_error(part, e);
    let mut file = File::create(part).map_err(io)?;
    file.write_all(&(header.len() as u64).to_le_bytes()).map_err(io)?;
    file.write_all(header.as_bytes()).map_err(io)?;
    let mut done = 8 + header.len() as u64;
    progress(done, total);

    // Batch i + 1 is generated (on every thread) while batch i is written.
    let batches = batches(entries);
    let (mut current, mut next) = (Vec::new(), Vec::new());
    if let Some(first) = batches.first() {
        generate(entries, first, seed, &mut current);
    }
    for i in 0..batches.len() {
        let (written, ()) = rayon::join(
            || file.write_all(&current),
            || {
                if let Some(batch) = batches.get(i + 1) {
                    generate(entries, batch, seed, &mut next);
                }
            },
        );
        written.map_err(io)?;
        done += current.len() as u64;
        progress(done, total);
        std::mem::swap(&mut current, &mut next);
    }
    file.flush().map_err(io)?;
    Ok(())
}

/// Blocks `first..end` of entry `entry`: one batch of about [`BATCH_BYTES`].
struct Batch {
    entry: usize,
    first: usize,
    end: usize,
}

/// The entries' blocks in file order, in batches.
fn batches(entries: &[Entry<'_>]) -> Vec<Batch> {
    let mut out = Vec::new();
    for (entry, e) in entries.iter().enumerate() {
        let blocks = e.spec.shape.iter().product::<usize>().div_ceil(BLOCK);
        let per_batch = (BATCH_BYTES / (BLOCK * e.dtype.size())).max(1);
        for first in (0..blocks).step_by(per_batch) {
            out.push(Batch { entry, first, end: (first + per_batch).min(blocks) });
        }
    }
    out
}

/// The bytes of `batch` into `buf` (resized to them), its blocks drawn in parallel.
fn generate(entries: &[Entry<'_>], batch: &Batch, seed: u64, buf: &mut Vec<u8>) {
    let entry = &entries[batch.entry];
    let n: usize = entry.spec.shape.iter().product();
    let size = entry.dtype.size();
    buf.resize(((batch.end * BLOCK).min(n) - batch.first * BLOCK) * size, 0);
    buf.par_chunks_mut(BLOCK * size).enumerate().for_each(|(i, out)| {
        let block = batch.first + i;
        fill(entry, block, block_seed(seed, entry.stream, block as u64), out)
    });
}

/// Fills `out` (whole elements of the entry's dtype, block `block` of the tensor) from one PRNG stream.
fn fill(entry: &Entry<'_>, block: usize, stream_seed: u64, out: &mut [u8]) {
    let n = out.len() / entry.dtype.size();
    let values: Vec<f32> = match entry.spec.init {
        Init::Bytes(bytes) => {
            out.copy_from_slice(&bytes[block * BLOCK..block * BLOCK + n]);
            return;
        }
        Init::Ones => vec![1.0; n],
        Init::Zeros => vec![0.0; n],
        Init::Fill(value) => vec![value; n],
        Init::Uniform(bound) => {
            let mut rng = SplitMix64(stream_seed);
            (0..n).map(|_| rng.symmetric() * bound).collect()
        }
    };
    let values = match entry.quantized {
        Some((scale, offset)) => values.into_iter().map(|v| v / scale + offset).collect(),
        None => values,
    };
    out.copy_from_slice(&narrow(entry.dtype, &values));
}

fn block_seed(seed: u64, stream: u64, block: u64) -> u64 {
    let mut s = SplitMix64(seed ^ stream.rotate_left(29));
    s.next() ^ block.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The safetensors header: `__metadata__` then each tensor with its dtype, shape and data offsets, padded with
/// spaces to a multiple of 8 bytes (as safetensors writes it).
fn header_json(entries: &[Entry<'_>], metadata: &[(String, String)]) -> String {
    let mut json = "{\"__metadata__\":{\"format\":\"pt\"".to_owned();
    for (key, value) in metadata {
        json += &format!(",{}:{}", quote(key), quote(value));
    }
    json.push('}');
    let mut offset = 0u64;
    for entry in entries {
        let shape: Vec<String> = entry.spec.shape.iter().map(usize::to_string).collect();
        let end = offset + entry.bytes();
        json += &format!(
            ",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{offset},{end}]}}",
            quote(&entry.key),
            entry.dtype.name(),
            shape.join(",")
        );
        offset = end;
    }
    json.push('}');
    while !json.len().is_multiple_of(8) {
        json.push(' ');
    }
    json
}

/// A JSON string literal (keys and metadata are ASCII; quotes, backslashes and controls are escaped anyway).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn part_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".part");
    path.with_file_name(name)
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::Invalid(format!("writing {}: {e}", path.display()))
}

/// SplitMix64 (Steele, Lea, Flood 2014): fast, and every seed gives a full-period stream.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (−1, 1), symmetric about 0 (24 random bits).
    fn symmetric(&mut self) -> f32 {
        let u = ((self.next() >> 40) as f32 + 0.5) * (1.0 / (1u32 << 24) as f32);
        2.0 * u - 1.0
    }
}
