//! The ES256 (P-256) keys that sign the cloud runtime's tokens, kept in `<data_dir>/keys/`.
//!
//! Layout: one PKCS#8 DER private key per file, `es256-<generation>.der`, mode 0600, in a directory of mode
//! 0700. The highest generation is the *current* key (it signs); the one below it is the *previous* key (it still
//! verifies and is still published in the JWKS, so tokens minted before a rotation stay valid until they expire).
//! Rotation writes generation + 1 and deletes everything older than the new previous key; loading ignores older
//! files. A key is written to a dot-file, synced, then renamed to its name, so a crash never leaves half a key.
//! Creation and rotation assume one writer at a time (the server's first start, or `kiln keys rotate`).
//!
//! A key's `kid` is its RFC 7638 JWK thumbprint (SHA-256 of `{"crv":"P-256","kty":"EC","x":…,"y":…}`,
//! base64url): derived from the public key, so nothing else is stored and anyone holding the JWK can recompute it.
//!
//! Key files or a key directory that other users may access are refused (like ssh does), with the `chmod` that
//! fixes it; unreadable or corrupt files are errors that name the file.
//!
//! Noticing a rotation done by another process: [`SigningKeys::reload_if_changed`] lists the directory and
//! re-reads the keys when the list of key files changed. Minting, verifying and the JWKS call it at most once per
//! [`CHECK_INTERVAL`], and verification at once for a token whose `kid` is unknown (one directory listing; the
//! files are parsed only when the listing changed). So a server signs with a rotated key, and stops accepting a
//! retired one, within [`CHECK_INTERVAL`] of its next request. A re-read that fails is logged once per change of
//! the directory and the keys in memory stay in use.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{DecodingKey, EncodingKey};
use kiln_spec::types::{JwkKey, JwkSet};
use p256::SecretKey;
use p256::elliptic_curve::Generate as _;
use p256::elliptic_curve::point::AffineCoordinates as _;
use p256::pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _};
use sha2::{Digest as _, Sha256};

/// The directory under the data directory that holds the keys.
pub(crate) const KEYS_DIR: &str = "keys";

/// How often minting and the JWKS look for a rotation done by another process (`kiln keys rotate`).
pub(crate) const CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// At most one re-read a second for tokens naming an unknown `kid`: anyone can send such a token, and each
/// re-read lists the key directory.
const UNKNOWN_KID_INTERVAL: Duration = Duration::from_secs(1);

/// Key file names: `es256-<generation>.der`.
const PREFIX: &str = "es256-";
/// See [`PREFIX`].
const SUFFIX: &str = ".der";

/// Why the keys could not be loaded, created or rotated.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    /// A file or directory could not be read, written, created or removed.
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Other users may access a key file or the key directory.
    #[error("{} is accessible by other users (mode {mode:03o}); run `chmod {wanted:o} {}`", path.display(), path.display())]
    Mode {
        /// The file or directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// The mode it should have.
        wanted: u32,
    },
    /// A key file is not a P-256 private key in PKCS#8 DER.
    #[error("{} is not a P-256 private key in PKCS#8 DER: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// The key directory holds no key (every key file was removed while the server ran).
    #[error("{} holds no signing key (es256-<n>.der)", dir.display())]
    NoKey {
        /// The key directory.
        dir: PathBuf,
    },
    /// The system's random number generator failed.
    #[error("cannot generate a signing key: the system's random number generator failed: {0}")]
    Random(String),
}

/// One key pair, ready to sign and verify.
pub(crate) struct KeyPair {
    /// The key id (RFC 7638 thumbprint), as in token headers.
    pub(crate) kid: String,
    /// The private key, for signing.
    pub(crate) encoding: EncodingKey,
    /// The public key, for verifying.
    pub(crate) decoding: DecodingKey,
    /// The public key as published.
    jwk: JwkKey,
}

impl KeyPair {
    /// Derives the signing and verifying forms and the JWK of `secret`, read from or written to `path`.
    fn new(secret: &SecretKey, path: &Path) -> Result<Self, KeyError> {
        let corrupt = |reason: String| KeyError::Corrupt { path: path.to_path_buf(), reason };
        let der = secret.to_pkcs8_der().map_err(|e| corrupt(e.to_string()))?;
        let public = secret.public_key();
        let x = URL_SAFE_NO_PAD.encode(public.as_affine().x());
        let y = URL_SAFE_NO_PAD.encode(public.as_affine().y());
        let decoding =
            DecodingKey::from_ec_components(&x, &y).map_err(|e| corrupt(e.to_string()))?;
        // RFC 7638 §3.2: the required members, in lexicographic order, no whitespace.
        let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
        let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()));
        let jwk = JwkKey {
            kty: "EC".into(),
            crv: "P-256".into(),
            x,
            y,
            kid: kid.clone(),
            use_: Some("sig".into()),
            alg: Some("ES256".into()),
        };
        Ok(Self { kid, encoding: EncodingKey::from_ec_der(der.as_bytes()), decoding, jwk })
    }
}

/// The live keys: the current one and, after a rotation, the previous one.
struct KeySet {
    /// Signs; verifies.
    current: Arc<KeyPair>,
    /// Verifies.
    previous: Option<Arc<KeyPair>>,
}

/// What the last look at the directory found, and when.
struct Seen {
    /// When the directory was last listed.
    at: Instant,
    /// The key generations it held.
    generations: Vec<u64>,
}

/// The signing keys of one data directory, shared by the server (put it in an `Arc`).
pub(crate) struct SigningKeys {
    /// `<data_dir>/keys`.
    dir: PathBuf,
    /// The keys in use.
    set: RwLock<Arc<KeySet>>,
    /// The last listing; its lock also serialises reloads.
    seen: Mutex<Seen>,
    /// When a token with an unknown `kid` last made the keys be re-read.
    unknown_kid_reload: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.set();
        f.debug_struct("SigningKeys")
            .field("dir", &self.dir)
            .field("current", &set.current.kid)
            .field("previous", &set.previous.as_ref().map(|key| &key.kid))
            .finish()
    }
}

impl SigningKeys {
    /// Reads the keys of `data_dir`, creating the directory and a first key when there is none.
    pub(crate) fn load_or_create(data_dir: &Path) -> Result<Self, KeyError> {
        let dir = key_dir(data_dir)?;
        let mut generations = list(&dir)?;
        if generations.is_empty() {
            write_key(&dir, 1)?;
            generations.push(1);
        }
        let set = read_set(&dir, &generations)?;
        Ok(Self {
            dir,
            set: RwLock::new(Arc::new(set)),
            seen: Mutex::new(Seen { at: Instant::now(), generations }),
            unknown_kid_reload: Mutex::new(None),
        })
    }

    /// Writes a new current key for `data_dir`; the current one becomes the previous one and any older key is
    /// deleted. Returns the new key's `kid`. Running servers notice it (see the module documentation).
    pub(crate) fn rotate(data_dir: &Path) -> Result<String, KeyError> {
        let dir = key_dir(data_dir)?;
        let generations = list(&dir)?;
        let next = generations.last().map_or(1, |last| last + 1);
        let key = write_key(&dir, next)?;
        for old in generations.iter().filter(|generation| *generation + 1 < next) {
            let path = key_path(&dir, *old);
            fs::remove_file(&path).map_err(io_error("delete", &path))?;
        }
        sync_dir(&dir)?;
        Ok(key.kid)
    }

    /// The key that signs, after looking for a rotation if the last look is [`CHECK_INTERVAL`] old.
    pub(crate) fn current(&self) -> Arc<KeyPair> {
        self.check_if_due();
        Arc::clone(&self.set().current)
    }

    /// The key named `kid` (current or previous), after looking for a rotation if the last look is
    /// [`CHECK_INTERVAL`] old; an unknown `kid` looks at once.
    pub(crate) fn find(&self, kid: &str) -> Option<Arc<KeyPair>> {
        self.check_if_due();
        self.lookup(kid).or_else(|| {
            let mut last = self.unknown_kid_reload.lock().unwrap_or_else(PoisonError::into_inner);
            if last.is_none_or(|at| at.elapsed() >= UNKNOWN_KID_INTERVAL) {
                *last = Some(Instant::now());
                drop(last);
                self.reload_if_changed();
            }
            self.lookup(kid)
        })
    }

    /// The public keys, current first, then previous (for `/.well-known/jwks.json`).
    pub(crate) fn jwks(&self) -> JwkSet {
        self.check_if_due();
        let set = self.set();
        let keys =
            std::iter::once(&set.current).chain(&set.previous).map(|key| key.jwk.clone()).collect();
        JwkSet { keys }
    }

    /// Lists the key directory and re-reads the keys if its key files changed since the last look; true when
    /// it did. A failure is logged once per change of the directory and the keys in memory stay in use.
    pub(crate) fn reload_if_changed(&self) -> bool {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.at = Instant::now();
        let generations = match list(&self.dir) {
            Ok(generations) => generations,
            Err(error) => {
                tracing::warn!("signing keys not reloaded: {error}");
                return false;
            }
        };
        if generations == seen.generations {
            return false;
        }
        let result = read_set(&self.dir, &generations);
        seen.generations = generations;
        match result {
            Ok(set) => {
                tracing::info!("signing keys reloaded: {} signs", set.current.kid);
                *self.set.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
                true
            }
            Err(error) => {
                tracing::warn!("signing keys not reloaded, the previous ones stay in use: {error}");
                false
            }
        }
    }

    /// Reloads if the last look at the directory is [`CHECK_INTERVAL`] old.
    fn check_if_due(&self) {
        let due =
            self.seen.lock().unwrap_or_else(PoisonError::into_inner).at.elapsed() >= CHECK_INTERVAL;
        if due {
            self.reload_if_changed();
        }
    }

    /// The key named `kid` among the keys in memory.
    fn lookup(&self, kid: &str) -> Option<Arc<KeyPair>> {
        let set = self.set();
        std::iter::once(&set.current).chain(&set.previous).find(|key| key.kid == kid).cloned()
    }

    /// The keys in memory.
    fn set(&self) -> Arc<KeySet> {
        Arc::clone(&self.set.read().unwrap_or_else(PoisonError::into_inner))
    }
}

/// `kiln keys rotate`: rotates the keys of `data_dir` and logs what it did.
pub(crate) fn run_rotate(data_dir: &Path) -> Result<(), KeyError> {
    let kid = SigningKeys::rotate(data_dir)?;
    tracing::info!(
        "new signing key {kid} in {}; the previous key still verifies; a running server signs with the new key \
         within {} s",
        data_dir.join(KEYS_DIR).display(),
        CHECK_INTERVAL.as_secs()
    );
    Ok(())
}

/// Creates `<data_dir>/keys` (mode 0700) if needed and checks that other users cannot access it.
fn key_dir(data_dir: &Path) -> Result<PathBuf, KeyError> {
    fs::create_dir_all(data_dir).map_err(io_error("create", data_dir))?;
    let dir = data_dir.join(KEYS_DIR);
    let mut builder = fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    match builder.create(&dir) {
        Err(error) if error.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_error("create", &dir)(error));
        }
        _ => {}
    }
    let metadata = fs::metadata(&dir).map_err(io_error("read", &dir))?;
    check_private(&metadata, &dir, 0o700)?;
    Ok(dir)
}

/// The key generations in `dir`, oldest first.
fn list(dir: &Path) -> Result<Vec<u64>, KeyError> {
    let mut generations = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_error("list", dir))? {
        let entry = entry.map_err(io_error("list", dir))?;
        let name = entry.file_name();
        let number = name.to_str().and_then(|name| name.strip_prefix(PREFIX)?.strip_suffix(SUFFIX));
        if let Some(generation) = number.and_then(|number| number.parse::<u64>().ok()) {
            // Only the canonical spelling, so `es256-01.der` and `es256-1.der` are not both generation 1.
            if number == Some(generation.to_string().as_str()) {
                generations.push(generation);
            }
        }
    }
    generations.sort_unstable();
    Ok(generations)
}

/// Reads the two newest of `generations` (sorted, oldest first).
fn read_set(dir: &Path, generations: &[u64]) -> Result<KeySet, KeyError> {
    let Some((current, older)) = generations.split_last() else {
        return Err(KeyError::NoKey { dir: dir.to_path_buf() });
    };
    let previous =
        older.last().map(|generation| read_key(&key_path(dir, *generation))).transpose()?;
    Ok(KeySet {
        current: Arc::new(read_key(&key_path(dir, *current))?),
        previous: previous.map(Arc::new),
    })
}

/// Reads one key file.
fn read_key(path: &Path) -> Result<KeyPair, KeyError> {
    let mut file = File::open(path).map_err(io_error("open", path))?;
    let metadata = file.metadata().map_err(io_error("read", path))?;
    check_private(&metadata, path, 0o600)?;
    let mut der = Vec::new();
    file.read_to_end(&mut der).map_err(io_error("read", path))?;
    let secret = SecretKey::from_pkcs8_der(&der).map_err(|error| KeyError::Corrupt {
        path: path.to_path_buf(),
        reason: error.to_string(),
    })?;
    KeyPair::new(&secret, path)
}

/// Generates a key and writes it as generation `generation` (temporary file, sync, rename, sync the directory).
fn write_key(dir: &Path, generation: u64) -> Result<KeyPair, KeyError> {
    let secret = SecretKey::try_generate().map_err(|error| KeyError::Random(error.to_string()))?;
    let path = key_path(dir, generation);
    let key = KeyPair::new(&secret, &path)?;
    let der = secret
        .to_pkcs8_der()
        .map_err(|error| KeyError::Corrupt { path: path.clone(), reason: error.to_string() })?;
    let temp = dir.join(format!(".{PREFIX}{generation}{SUFFIX}.tmp"));
    match fs::remove_file(&temp) {
        Err(error) if error.kind() != io::ErrorKind::NotFound => {
            return Err(io_error("delete", &temp)(error));
        }
        _ => {}
    }
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&temp).map_err(io_error("create", &temp))?;
    file.write_all(der.as_bytes()).map_err(io_error("write", &temp))?;
    file.sync_all().map_err(io_error("sync", &temp))?;
    drop(file);
    fs::rename(&temp, &path).map_err(io_error("rename into place", &path))?;
    sync_dir(dir)?;
    Ok(key)
}

/// The file of generation `generation`.
fn key_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("{PREFIX}{generation}{SUFFIX}"))
}

/// Makes renames and deletions in `dir` durable.
fn sync_dir(dir: &Path) -> Result<(), KeyError> {
    #[cfg(unix)]
    File::open(dir).and_then(|dir| dir.sync_all()).map_err(io_error("sync", dir))?;
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

/// Refuses a file or directory that users other than its owner may access.
fn check_private(metadata: &fs::Metadata, path: &Path, wanted: u32) -> Result<(), KeyError> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = metadata.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Mode { path: path.to_path_buf(), mode, wanted });
        }
    }
    #[cfg(not(unix))]
    let _ = (metadata, path, wanted);
    Ok(())
}

/// Wraps an I/O error with what was being done to which path.
fn io_error(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> KeyError {
    let path = path.to_path_buf();
    move |source| KeyError::Io { action, path, source }
}
