//! Compiled kernels kept on disk between processes, so a restarted server (or each process of a benchmark run)
//! does not compile every kernel file with NVRTC again (seconds of CPU at a process's first use of each file).
//!
//! An entry is the PTX of one kernel file for one architecture, named by the file, the architecture and a hash
//! of what produced it (the program's text, NVRTC's options and NVRTC's version): a changed kernel, option or
//! NVRTC is another name, never a stale hit. Entries are written whole (a temporary file of the writer's own,
//! then a rename) and end with a marker; one without it is compiled again, and so is one the driver does not
//! load (`kernels.rs` drops it). A cache that cannot be read or written costs only the compile (logged at debug
//! level).
//!
//! Where: the `KILN_CUDA_KERNEL_CACHE` environment variable's folder (set but empty: nowhere), else the folder
//! [`set_kernel_cache`] names (the server's `DATA_DIR/cuda-kernels`), else nowhere.

#![allow(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

static FOLDER: Mutex<Option<PathBuf>> = Mutex::new(None);

/// The last line of every entry: a file without it was cut short.
const END: &str = "// kiln kernel cache: end of entry\n";

/// Keeps compiled kernels under `dir` from now on in this process (`None`: not kept), unless
/// `KILN_CUDA_KERNEL_CACHE` says otherwise.
pub fn set_kernel_cache(dir: Option<PathBuf>) {
    *FOLDER.lock().unwrap_or_else(|p| p.into_inner()) = dir;
}

/// The folder compiled kernels are kept in, if any.
fn folder() -> Option<PathBuf> {
    match std::env::var_os("KILN_CUDA_KERNEL_CACHE") {
        Some(dir) if dir.is_empty() => None,
        Some(dir) => Some(PathBuf::from(dir)),
        None => FOLDER.lock().unwrap_or_else(|p| p.into_inner()).clone(),
    }
}

/// NVRTC's version, as `major.minor` (part of each entry's hash).
fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid places for the two ints NVRTC writes; the library is loaded (a compile needs it).
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        "unknown".to_owned()
    }
}

/// One kernel file's PTX for one architecture, on disk.
pub(super) struct Entry {
    path: PathBuf,
}

impl Entry {
    /// The entry of `program` (the file `name`, compiled with `options` for `arch`), where a cache folder is set.
    pub(super) fn of(
        name: &str,
        arch: (i32, i32),
        program: &str,
        options: &[String],
    ) -> Option<Entry> {
        let dir = folder()?;
        Some(Entry::in_folder(&dir, name, arch, program, options, &nvrtc_version()))
    }

    fn in_folder(
        dir: &Path,
        name: &str,
        arch: (i32, i32),
        program: &str,
        options: &[String],
        nvrtc: &str,
    ) -> Entry {
        let mut hash = Sha256::new();
        for part in [nvrtc, &options.join(" "), program] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
        let hex: String = hash.finalize()[..8].iter().map(|b| format!("{b:02x}")).collect();
        let stem = name.trim_end_matches(".cu");
        Entry { path: dir.join(format!("{stem}-compute_{}{}-{hex}.ptx", arch.0, arch.1)) }
    }

    /// The PTX kept, if there is a whole one.
    pub(super) fn read(&self) -> Option<String> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        text.strip_suffix(END).map(str::to_owned)
    }

    /// Keeps `ptx` (a failure is logged, not returned: the kernel is compiled again next time).
    pub(super) fn write(&self, ptx: &str) {
        // A name no other writer uses, even one of the same process id (another container on the same folder).
        static WRITES: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let tmp = self.path.with_extension(format!(
            "ptx.{}-{nanos}-{}.tmp",
            std::process::id(),
            WRITES.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&tmp, format!("{ptx}{END}"))?;
            std::fs::rename(&tmp, &self.path)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(error = %e, path = %self.path.display(), "the compiled kernel was not kept");
        }
    }

    /// Drops the entry (one the driver did not load).
    pub(super) fn remove(&self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::debug!(error = %e, path = %self.path.display(), "a kept kernel was not removed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Entry;

    const PTX: &str = "//\n.version 9.0\n.target sm_90\n.address_size 64\n";

    #[test]
    fn an_entry_is_named_by_what_produced_it_and_read_back_whole() {
        let dir = std::env::temp_dir().join(format!("kiln-kernel-cache-{}", std::process::id()));
        let options = vec!["--gpu-architecture=compute_90".to_owned()];
        let entry = |program: &str, nvrtc: &str| {
            Entry::in_folder(&dir, "norm.cu", (9, 0), program, &options, nvrtc)
        };
        let e = entry("kernel a", "13.0");
        assert_eq!(e.read(), None, "nothing kept yet");
        e.write(PTX);
        assert_eq!(e.read().as_deref(), Some(PTX));
        assert_eq!(
            entry("kernel a", "13.0").read().as_deref(),
            Some(PTX),
            "the same inputs: the same entry"
        );
        assert_eq!(entry("kernel b", "13.0").read(), None, "another program");
        assert_eq!(entry("kernel a", "13.1").read(), None, "another NVRTC");
        let other_arch = Entry::in_folder(&dir, "norm.cu", (8, 6), "kernel a", &options, "13.0");
        assert_eq!(other_arch.read(), None, "another architecture");
        // A file cut short (without its end marker) is compiled again.
        let whole = std::fs::read_to_string(&e.path).expect("the entry");
        std::fs::write(&e.path, &whole[..whole.len() - 10]).expect("truncate");
        assert_eq!(e.read(), None);
        e.write(PTX);
        e.remove();
        assert_eq!(e.read(), None, "removed");
        let left: Vec<_> = std::fs::read_dir(&dir).expect("the folder").collect();
        assert!(left.is_empty(), "no temporary file is left behind: {left:?}");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
