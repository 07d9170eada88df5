//! The object store (`--store file://…|s3://…`): where inputs, outputs and temp files live when several machines
//! serve one set of workspaces (the API nodes and workers of a cluster), or when they should outlive the machine.
//!
//! The file roots stay the working copy: nodes read and write local files as they always do. Around them
//! ([`WorkspaceFiles`], one per workspace):
//! - an upload is named against the store (ComfyUI's `name (1).ext` rules, there), put there and written locally;
//! - before an API node validates a prompt and before a worker runs one, each file the prompt names is brought
//!   into its local root when the store has it and the local copy is missing or not the store's current one;
//! - a save node claims its file's name in the store (a conditional create, so no two workers write one name)
//!   and publishes the file once written (the engine's `SharedFiles`);
//! - `/view` reads from the store, a range read for a range request, and the input folder's listing
//!   (`/object_info`, `/internal/files/input`) brings its top level in first.
//!
//! Keys are `<workspace>/<input|output|temp>/<subfolder>/<name>`. Model files stay on each machine's disk.
//!
//! Invariant: every call blocks on the runtime's handle; callers are blocking threads (the worker thread,
//! `spawn_blocking`), never async tasks.

mod files;
mod http;

use std::collections::HashMap;
use std::path::{Path as LocalPath, PathBuf};
use std::sync::{Arc, Mutex};

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::{Path, PathPart};
use object_store::{ObjectStore, ObjectStoreExt as _, PutMode, PutOptions, PutPayload};

use kiln_engine::nodes::FileKind;

pub(crate) use files::{StoredRead, WorkspaceFiles, logged};

/// Why the store could not be opened or used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StoreError {
    /// `--store` is not a URL Kiln reads.
    #[error("--store {0}")]
    Url(String),
    /// The store refused or failed a request.
    #[error("the object store {store}: {source}")]
    Request {
        /// The store, as `--store` named it (without credentials).
        store: String,
        /// What failed.
        source: object_store::Error,
    },
    /// A local file could not be read or written.
    #[error(transparent)]
    Local(#[from] std::io::Error),
}

impl From<StoreError> for std::io::Error {
    fn from(e: StoreError) -> std::io::Error {
        match e {
            StoreError::Local(e) => e,
            other => std::io::Error::other(other.to_string()),
        }
    }
}

/// An opened object store.
pub(crate) struct Store {
    objects: Arc<dyn ObjectStore>,
    /// `--store` as given, for messages.
    shown: String,
    runtime: tokio::runtime::Handle,
    /// The store's version (e-tag) of each local copy this process brought in or wrote itself: a copy whose
    /// object has another version is brought in again.
    copies: Mutex<HashMap<PathBuf, String>>,
    /// Locks of local paths, by hash ([`Store::lock`]).
    locks: [Mutex<()>; 64],
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("store", &self.shown).finish_non_exhaustive()
    }
}

impl Store {
    /// Opens `--store`: `file:///absolute/path` (a folder, perhaps a shared file system), or
    /// `s3://bucket[/prefix][?key=value&…]` with the S3 settings of the `object_store` crate as query keys
    /// (`endpoint`, `region`, `allow_http`, …) and credentials from the usual `AWS_*` variables; then lists its
    /// root once, so that a store Kiln cannot reach stops the start with a message naming it.
    pub(crate) async fn open(url: &str) -> Result<Arc<Store>, StoreError> {
        // Messages show the URL without its query: it may carry a secret key.
        let unqueried = url.split('?').next().unwrap_or_default();
        let parsed =
            url::Url::parse(url).map_err(|e| StoreError::Url(format!("{unqueried:?}: {e}")))?;
        let shown = format!(
            "{}://{}{}",
            parsed.scheme(),
            parsed.host_str().unwrap_or_default(),
            parsed.path()
        );
        let objects: Arc<dyn ObjectStore> = match parsed.scheme() {
            "file" => {
                let folder = parsed.to_file_path().map_err(|()| {
                    StoreError::Url(format!("{unqueried:?}: not an absolute path"))
                })?;
                std::fs::create_dir_all(&folder)?;
                Arc::new(
                    LocalFileSystem::new_with_prefix(&folder)
                        .map_err(|source| StoreError::Request { store: shown.clone(), source })?,
                )
            }
            "s3" => {
                let bucket = parsed.host_str().filter(|b| !b.is_empty()).ok_or_else(|| {
                    StoreError::Url(format!("{shown}: the URL names no bucket (s3://bucket)"))
                })?;
                // A few quick retries: a request waits on the store (an upload, a `/view`), so an unreachable
                // one fails in seconds rather than after object_store's three minutes.
                let retry = object_store::RetryConfig {
                    max_retries: 4,
                    retry_timeout: std::time::Duration::from_secs(15),
                    ..object_store::RetryConfig::default()
                };
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_allow_http(false)
                    .with_retry(retry)
                    .with_http_connector(http::HyperConnector);
                for (key, value) in parsed.query_pairs() {
                    let key: AmazonS3ConfigKey = key.parse().map_err(|_| {
                        StoreError::Url(format!(
                            "{shown}: unknown S3 setting `{key}` (use the object_store crate's names: \
                             endpoint, region, allow_http, …)"
                        ))
                    })?;
                    builder = builder.with_config(key, value);
                }
                let store = builder
                    .build()
                    .map_err(|source| StoreError::Request { store: shown.clone(), source })?;
                let prefix = parsed.path().trim_matches('/');
                if prefix.is_empty() {
                    Arc::new(store)
                } else {
                    Arc::new(object_store::prefix::PrefixStore::new(store, prefix))
                }
            }
            other => {
                return Err(StoreError::Url(format!(
                    "{shown}: Kiln reads file:// and s3:// stores, not {other}://"
                )));
            }
        };
        let store = Store {
            objects,
            shown,
            runtime: tokio::runtime::Handle::current(),
            copies: Mutex::new(HashMap::new()),
            locks: std::array::from_fn(|_| Mutex::new(())),
        };
        timed(store.objects.list_with_delimiter(None)).await.map_err(|e| store.failed(e))?;
        Ok(Arc::new(store))
    }

    /// The store as `--store` named it.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    fn failed(&self, source: object_store::Error) -> StoreError {
        StoreError::Request { store: self.shown.clone(), source }
    }

    /// Runs one request to the store, body included, within [`REQUEST_TIMEOUT`].
    fn request<T>(
        &self,
        work: impl Future<Output = object_store::Result<T>>,
    ) -> object_store::Result<T> {
        self.runtime.block_on(timed(work))
    }

    fn copies(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, String>> {
        self.copies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock of one local path: a copy is fetched, written and recorded by one thread at a time.
    fn lock(&self, local: &LocalPath) -> std::sync::MutexGuard<'_, ()> {
        use std::hash::{Hash as _, Hasher as _};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        local.hash(&mut hasher);
        let stripe = &self.locks[hasher.finish() as usize % self.locks.len()];
        stripe.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that the local copy at `local` is the object's `version`.
    fn record(&self, local: &LocalPath, version: String) {
        self.copies().insert(local.to_path_buf(), version);
    }

    /// The object's metadata, or `None` when there is no such object or it is an empty placeholder (a save
    /// node's claimed name whose file is not written yet, or never was).
    fn head(&self, key: &Path) -> Result<Option<object_store::ObjectMeta>, StoreError> {
        match self.request(self.objects.head(key)) {
            Ok(meta) if meta.size == 0 => Ok(None),
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.failed(e)),
        }
    }

    /// The object's size, or `None` (see [`Store::head`]).
    fn size(&self, key: &Path) -> Result<Option<u64>, StoreError> {
        Ok(self.head(key)?.map(|meta| meta.size))
    }

    /// Bytes `range` of the object (nothing for an empty range).
    fn read(&self, key: &Path, range: std::ops::Range<u64>) -> Result<Vec<u8>, StoreError> {
        if range.is_empty() {
            return Ok(Vec::new());
        }
        let bytes = self.request(self.objects.get_range(key, range)).map_err(|e| self.failed(e))?;
        Ok(bytes.to_vec())
    }

    /// Brings object `key` into `local` unless the local copy is the store's current version: whether the
    /// store has the object.
    fn bring(&self, key: &Path, local: &LocalPath) -> Result<bool, StoreError> {
        self.bring_version(key, None, local)
    }

    /// [`Store::bring`], the object's current version known already when a listing gave it.
    fn bring_version(
        &self,
        key: &Path,
        listed: Option<String>,
        local: &LocalPath,
    ) -> Result<bool, StoreError> {
        let _one_at_a_time = self.lock(local);
        let version = match listed {
            Some(version) => version,
            None => match self.head(key)? {
                Some(meta) => version_of(meta.e_tag, meta.size, meta.last_modified),
                None => return Ok(false),
            },
        };
        if local.is_file() && self.copies().get(local) == Some(&version) {
            return Ok(true);
        }
        let fetched = self.request(async {
            let got = self.objects.get(key).await?;
            let meta = got.meta.clone();
            Ok((meta, got.bytes().await?))
        });
        let (meta, bytes) = match fetched {
            Ok((_, bytes)) if bytes.is_empty() => return Ok(false),
            Ok(fetched) => fetched,
            Err(object_store::Error::NotFound { .. }) => return Ok(false),
            Err(e) => return Err(self.failed(e)),
        };
        write_replacing(local, &bytes)?;
        // The version of the bytes fetched (the object may have changed since the head).
        self.record(local, version_of(meta.e_tag, meta.size, meta.last_modified));
        Ok(true)
    }

    /// Puts `bytes` under `key`; with `create`, only if no object has that key. The new object's version
    /// (`Some("")` when the store gives none), or `None` when `create` found the key taken.
    fn put(&self, key: &Path, bytes: Vec<u8>, create: bool) -> Result<Option<String>, StoreError> {
        let mode = if create { PutMode::Create } else { PutMode::Overwrite };
        let options = PutOptions { mode, ..PutOptions::default() };
        match self.request(self.objects.put_opts(key, PutPayload::from(bytes), options)) {
            Ok(put) => Ok(Some(put.e_tag.unwrap_or_default())),
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) if create => Ok(None),
            Err(e) => Err(self.failed(e)),
        }
    }

    fn delete(&self, key: &Path) {
        if let Err(e) = self.request(self.objects.delete(key)) {
            tracing::warn!(store = %self.shown, key = %key, error = %e, "cannot delete a claimed name");
        }
    }

    /// The objects directly under `folder`, their names decoded.
    fn list(&self, folder: &Path) -> Result<Vec<Listed>, StoreError> {
        let listed = self
            .request(self.objects.list_with_delimiter(Some(folder)))
            .map_err(|e| self.failed(e))?;
        Ok(listed
            .objects
            .into_iter()
            .filter_map(|meta| {
                let name = decoded(meta.location.filename()?);
                Some(Listed { name, key: meta.location, version: meta.e_tag })
            })
            .collect())
    }
}

/// An object of a listing.
struct Listed {
    /// Its name in its folder.
    name: String,
    /// Its key.
    key: Path,
    /// Its version (e-tag), if the listing gives it (some stores list none: a head then asks).
    version: Option<String>,
}

/// How long one request to the store may take, its body included.
const REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// `work` within [`REQUEST_TIMEOUT`]: its result, or an error saying the store did not answer.
async fn timed<T>(work: impl Future<Output = object_store::Result<T>>) -> object_store::Result<T> {
    tokio::time::timeout(REQUEST_TIMEOUT, work).await.unwrap_or_else(|_| {
        Err(object_store::Error::Generic {
            store: "store",
            source: format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()).into(),
        })
    })
}

/// An object's version: its e-tag, or its size and modification time for stores without one.
fn version_of(e_tag: Option<String>, size: u64, modified: chrono::DateTime<chrono::Utc>) -> String {
    e_tag
        .unwrap_or_else(|| format!("{size}@{}", modified.timestamp_nanos_opt().unwrap_or_default()))
}

/// The key of `relative` (a `/`-separated path already checked to stay in its root) in `workspace`'s `kind`.
fn key(workspace: &str, kind: FileKind, relative: &str) -> Path {
    let parts = [workspace, kind.name()]
        .into_iter()
        .chain(relative.split('/').filter(|p| !p.is_empty() && *p != "."));
    Path::from_iter(parts.map(PathPart::from))
}

/// A key part as the name it encodes (`object_store` percent-encodes characters S3 keys should not hold).
fn decoded(part: &str) -> String {
    let mut out = Vec::with_capacity(part.len());
    let bytes = part.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(Some(hi)), Some(Some(lo))) =
                (bytes.get(i + 1).map(|b| hex(*b)), bytes.get(i + 2).map(|b| hex(*b)))
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Writes `bytes` to `path` as [`crate::files::write_atomically`] does, creating its folder first.
fn write_replacing(path: &LocalPath, bytes: &[u8]) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    crate::files::write_atomically(path, bytes)
}

#[cfg(test)]
mod tests;
