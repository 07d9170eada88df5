//! Client ID metadata documents (CIMD, `draft-ietf-oauth-client-id-metadata-document`): when an authorization
//! request's `client_id` is an `https` URL, the client is described by the JSON document served at that URL, and
//! the authorization server fetches it instead of looking up a registration (§5.10 of the OAuth reference).
//!
//! Fetching a URL an anonymous caller chose is a server-side request forgery risk, so [`ClientMetadataDocuments::get`]
//! goes through four gates, each refusing before the next one runs:
//! 1. the URL's shape and the operator's host lists (`target`), with no network access;
//! 2. one DNS lookup whose every answer must be a public address (`resolver`, `address`);
//! 3. one GET to a checked address, with no redirects, only 200, JSON only, a capped body and a total timeout
//!    (`fetch`);
//! 4. the document's own rules: it names itself, has a name and redirect URIs, and is a public client
//!    (`document`).
//!
//! Invariant: the cache holds only documents that passed all four gates, for at most the lifetime their
//! response allowed within [`CimdPolicy::min_ttl`]..=[`CimdPolicy::max_ttl`]; errors are never cached, so a
//! fixed document is picked up on the next request.
//!
//! Errors carry a user-facing message (the host and the reason, never the document or an address) and, for
//! the log, an internal source; [`ClientMetadataDocuments::get`] logs each failure once, with host, status and
//! reason.

mod address;
mod document;
mod fetch;
mod resolver;
mod target;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub(crate) use document::{ClientMetadataDocument, DocumentProblem};
pub(crate) use target::UrlProblem;

use fetch::Tls;
use resolver::{Resolver, system_resolver};

/// A boxed error, the internal cause kept for the log.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The most documents fetched at once (each may take the whole timeout).
const MAX_FETCHES: usize = 16;

/// The most documents kept at once; past it, the one closest to expiry makes room.
const MAX_CACHED_DOCUMENTS: usize = 1024;

/// What the fetcher accepts: the transport limits, the cache bounds and the operator's host lists.
#[derive(Debug, Clone)]
pub(crate) struct CimdPolicy {
    /// Test mode: `http://` (and `https://`) to `127.0.0.1`, `localhost` or `[::1]` (any port) passes the scheme
    /// and address checks. Only for a server whose own issuer is loopback; never in production.
    pub(crate) allow_loopback_http: bool,
    /// The limit for the whole fetch: lookup, connect, TLS, response and body.
    pub(crate) timeout: Duration,
    /// The largest document body read; a longer one is refused.
    pub(crate) max_bytes: usize,
    /// The shortest time a valid document is cached (also for `no-store` or no `max-age`).
    pub(crate) min_ttl: Duration,
    /// The longest time a valid document is cached, whatever `max-age` says.
    pub(crate) max_ttl: Duration,
    /// Hosts whose documents are refused; an entry matches the host and its subdomains.
    pub(crate) blocked_hosts: Vec<String>,
    /// When set, only these hosts (and their subdomains) may serve documents.
    pub(crate) allowed_hosts: Option<Vec<String>>,
}

impl Default for CimdPolicy {
    /// Production values: https only, 5 s, 5 KiB, cached 5 min to 24 h, no host lists.
    fn default() -> Self {
        Self {
            allow_loopback_http: false,
            timeout: Duration::from_secs(5),
            max_bytes: 5 * 1024,
            min_ttl: Duration::from_secs(5 * 60),
            max_ttl: Duration::from_secs(24 * 60 * 60),
            blocked_hosts: Vec::new(),
            allowed_hosts: None,
        }
    }
}

/// Why a client metadata document could not be used. `Display` is safe to show the user on the error page: it
/// names the host and the reason, never the document, an address or an internal error (those go to the log).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CimdError {
    /// The `client_id` is not a URL documents are fetched from.
    #[error("the client_id is not a valid client metadata document URL: {problem}")]
    InvalidUrl {
        /// The rule it breaks.
        problem: UrlProblem,
    },
    /// The operator's block list names the host, or the allow list does not.
    #[error("this server does not accept client metadata documents from `{host}`")]
    HostNotAllowed {
        /// The URL's host.
        host: String,
    },
    /// The host name does not resolve.
    #[error("the client's host `{host}` could not be resolved")]
    Resolve {
        /// The URL's host.
        host: String,
        /// The resolver's error, if it gave one.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The host is, or resolves to, a loopback, private, link-local or other special-use address.
    #[error(
        "the client's host `{host}` is not a public address; client metadata documents are fetched only from public hosts"
    )]
    SpecialUseAddress {
        /// The URL's host.
        host: String,
        /// The refused address, when the host was resolved (for the log only).
        address: Option<IpAddr>,
    },
    /// The connection, TLS handshake or transfer failed.
    #[error("the client metadata document could not be fetched from `{host}`")]
    Fetch {
        /// The URL's host.
        host: String,
        /// What failed.
        #[source]
        source: Option<BoxError>,
    },
    /// The whole fetch took longer than the policy allows.
    #[error("`{host}` did not serve the client metadata document within {timeout:?}")]
    Timeout {
        /// The URL's host.
        host: String,
        /// The limit.
        timeout: Duration,
    },
    /// The host answered with a redirect, which is never followed.
    #[error(
        "`{host}` answered the client metadata document request with a redirect (HTTP {status}); it must serve the document itself"
    )]
    Redirect {
        /// The URL's host.
        host: String,
        /// The 3xx status.
        status: u16,
    },
    /// The host answered with a status other than 200.
    #[error("`{host}` answered the client metadata document request with HTTP {status}")]
    Status {
        /// The URL's host.
        host: String,
        /// The status.
        status: u16,
    },
    /// The response's `Content-Type` is missing or not JSON.
    #[error("`{host}` did not serve the client metadata document as JSON")]
    NotJson {
        /// The URL's host.
        host: String,
    },
    /// The body is longer than the policy allows.
    #[error("the client metadata document at `{host}` is larger than {max_bytes} bytes")]
    TooLarge {
        /// The URL's host.
        host: String,
        /// The limit.
        max_bytes: usize,
    },
    /// Too many documents are being fetched at once (anyone can make Kiln fetch one: the fetches are bounded).
    #[error("too many client metadata documents are being fetched; try again in a moment")]
    Busy,
    /// The body is not an acceptable document.
    #[error("the client metadata document at `{host}` is not valid: {problem}")]
    InvalidDocument {
        /// The URL's host.
        host: String,
        /// The rule it breaks.
        problem: DocumentProblem,
    },
}

impl CimdError {
    /// The host the error is about, when the URL had one.
    pub(crate) fn host(&self) -> Option<&str> {
        match self {
            Self::InvalidUrl { .. } | Self::Busy => None,
            Self::HostNotAllowed { host }
            | Self::Resolve { host, .. }
            | Self::SpecialUseAddress { host, .. }
            | Self::Fetch { host, .. }
            | Self::Timeout { host, .. }
            | Self::Redirect { host, .. }
            | Self::Status { host, .. }
            | Self::NotJson { host }
            | Self::TooLarge { host, .. }
            | Self::InvalidDocument { host, .. } => Some(host),
        }
    }

    /// The HTTP status the host answered, when it answered with a wrong one.
    pub(crate) fn status(&self) -> Option<u16> {
        match self {
            Self::Redirect { status, .. } | Self::Status { status, .. } => Some(*status),
            Self::InvalidUrl { .. }
            | Self::Busy
            | Self::HostNotAllowed { .. }
            | Self::Resolve { .. }
            | Self::SpecialUseAddress { .. }
            | Self::Fetch { .. }
            | Self::Timeout { .. }
            | Self::NotJson { .. }
            | Self::TooLarge { .. }
            | Self::InvalidDocument { .. } => None,
        }
    }

    /// The internal detail for the log: the refused address or the chain of causes; empty when there is none.
    fn detail(&self) -> String {
        if let Self::SpecialUseAddress { address: Some(address), .. } = self {
            return format!("refused address {address}");
        }
        let mut detail = Vec::new();
        let mut source = std::error::Error::source(self);
        while let Some(error) = source {
            detail.push(error.to_string());
            source = error.source();
        }
        detail.join(": ")
    }
}

/// A clock, injectable so tests can move past cache lifetimes.
type Clock = Arc<dyn Fn() -> Instant + Send + Sync>;

/// A cached document and when it stops being served.
struct CachedDocument {
    /// The validated document.
    document: Arc<ClientMetadataDocument>,
    /// When the entry expires.
    expires_at: Instant,
}

/// The client metadata document fetcher and its cache, shared by the authorization and token endpoints.
pub(crate) struct ClientMetadataDocuments {
    /// The limits and host lists.
    policy: CimdPolicy,
    /// Host name lookups.
    resolver: Resolver,
    /// The time, for cache expiry.
    clock: Clock,
    /// The TLS configuration, built on first use.
    tls: Tls,
    /// Valid documents by URL.
    cache: Mutex<HashMap<String, CachedDocument>>,
    /// Bounds the fetches in flight.
    fetches: tokio::sync::Semaphore,
}

impl ClientMetadataDocuments {
    /// A fetcher with the system resolver and clock.
    pub(crate) fn new(policy: CimdPolicy) -> Self {
        Self::with_parts(policy, system_resolver(), Arc::new(Instant::now))
    }

    /// A fetcher with the given resolver and clock.
    fn with_parts(policy: CimdPolicy, resolver: Resolver, clock: Clock) -> Self {
        Self {
            policy,
            resolver,
            clock,
            tls: Tls::default(),
            cache: Mutex::new(HashMap::new()),
            fetches: tokio::sync::Semaphore::new(MAX_FETCHES),
        }
    }

    /// Whether this client_id is a metadata-document URL rather than a registered id: it starts with `https://`
    /// or `http://` (any letter case). Kiln's registered ids never do, so every such id goes to [`Self::get`],
    /// whose error then says what is wrong with it (`http` outside test mode, say).
    pub(crate) fn is_document_url(&self, client_id: &str) -> bool {
        let starts_with = |prefix: &str| {
            client_id.get(..prefix.len()).is_some_and(|start| start.eq_ignore_ascii_case(prefix))
        };
        starts_with("https://") || starts_with("http://")
    }

    /// The validated document for `client_id`: from the cache while it is fresh, otherwise fetched (and cached
    /// on success). Every failure is logged with host, status and reason, and returned; none is cached.
    pub(crate) async fn get(
        &self,
        client_id: &str,
    ) -> Result<Arc<ClientMetadataDocument>, CimdError> {
        if let Some(document) = self.cached(client_id) {
            return Ok(document);
        }
        let Ok(_permit) = self.fetches.try_acquire() else {
            tracing::warn!(
                limit = MAX_FETCHES,
                "client metadata document refused: too many fetches at once"
            );
            return Err(CimdError::Busy);
        };
        match self.fetch_and_validate(client_id).await {
            Ok((document, ttl)) => {
                let document = Arc::new(document);
                self.store(client_id, Arc::clone(&document), ttl);
                Ok(document)
            }
            Err(error) => {
                tracing::warn!(
                    host = error.host().unwrap_or("-"),
                    status = error.status(),
                    reason = %error,
                    detail = %error.detail(),
                    "client metadata document refused"
                );
                Err(error)
            }
        }
    }

    /// The four gates of the module doc, under the policy's total timeout.
    async fn fetch_and_validate(
        &self,
        client_id: &str,
    ) -> Result<(ClientMetadataDocument, Duration), CimdError> {
        let target = target::check(client_id, &self.policy)?;
        let fetch = async {
            let addresses = resolver::checked_addresses(&target, &self.resolver).await?;
            fetch::fetch(&target, &addresses, &self.tls, &self.policy).await
        };
        let fetched = tokio::time::timeout(self.policy.timeout, fetch).await.map_err(|_| {
            CimdError::Timeout { host: target.host_str().to_owned(), timeout: self.policy.timeout }
        })??;
        let document = document::parse(client_id, &fetched.body).map_err(|problem| {
            CimdError::InvalidDocument { host: target.host_str().to_owned(), problem }
        })?;
        Ok((document, fetched.ttl))
    }

    /// The cached document for `client_id`, if it has not expired.
    fn cached(&self, client_id: &str) -> Option<Arc<ClientMetadataDocument>> {
        let now = (self.clock)();
        let cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache
            .get(client_id)
            .filter(|entry| entry.expires_at > now)
            .map(|entry| Arc::clone(&entry.document))
    }

    /// Caches `document` for `ttl`, dropping expired entries and, when full, the entry closest to expiry.
    fn store(&self, client_id: &str, document: Arc<ClientMetadataDocument>, ttl: Duration) {
        let now = (self.clock)();
        let mut cache = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        cache.retain(|_, entry| entry.expires_at > now);
        if cache.len() >= MAX_CACHED_DOCUMENTS && !cache.contains_key(client_id) {
            let soonest =
                cache.iter().min_by_key(|(_, entry)| entry.expires_at).map(|(url, _)| url.clone());
            if let Some(url) = soonest {
                cache.remove(&url);
            }
        }
        cache.insert(client_id.to_owned(), CachedDocument { document, expires_at: now + ttl });
    }

    /// How many documents the cache holds, expired or not (tests).
    #[cfg(test)]
    fn cached_count(&self) -> usize {
        self.cache.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}
