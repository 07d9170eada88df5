//! Building a [`Client`]: a request timeout suited to long-running servers, and the credentials a cloud
//! runtime (or a local one started with `--api-key-file`) asks for.

use std::time::Duration;

use reqwest::header::{AUTHORIZATION, HeaderMap, HeaderName, HeaderValue, InvalidHeaderValue};

use crate::Client;

/// How long a request may take by default: long enough for a slow server, short enough to notice a dead one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// What the client authenticates with, on every request and on the event websocket.
#[derive(Clone, Default)]
pub enum Credentials {
    /// Nothing (a local server).
    #[default]
    None,
    /// An API key (`kiln key add`, or `POST /api/auth/api-keys`), sent as `X-API-Key`.
    ApiKey(String),
    /// A bearer token (a JWT from `POST /api/auth/token`, or an OAuth access token), sent as
    /// `Authorization: Bearer`.
    Bearer(String),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret itself.
        f.write_str(match self {
            Credentials::None => "Credentials::None",
            Credentials::ApiKey(_) => "Credentials::ApiKey(..)",
            Credentials::Bearer(_) => "Credentials::Bearer(..)",
        })
    }
}

impl Credentials {
    /// The header that carries them, marked sensitive (left out of logs), if any.
    pub(crate) fn header(&self) -> Result<Option<(HeaderName, HeaderValue)>, InvalidHeaderValue> {
        let (name, value) = match self {
            Credentials::None => return Ok(None),
            Credentials::ApiKey(key) => (HeaderName::from_static("x-api-key"), key.clone()),
            Credentials::Bearer(token) => (AUTHORIZATION, format!("Bearer {token}")),
        };
        let mut value = HeaderValue::from_str(&value)?;
        value.set_sensitive(true);
        Ok(Some((name, value)))
    }
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The credentials hold characters a header cannot carry.
    #[error("the credentials cannot be sent in a header (control characters or non-ASCII)")]
    Credentials(#[source] InvalidHeaderValue),
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client")]
    Http(#[source] reqwest::Error),
}

impl Client {
    /// A client for the server at `baseurl` (e.g. `http://127.0.0.1:8188`) whose requests may take up to
    /// `timeout` (connecting may take up to 10 seconds of it).
    pub fn with_timeout(baseurl: &str, timeout: Duration) -> Result<Client, reqwest::Error> {
        Client::build(baseurl, Credentials::None, HeaderMap::new(), timeout)
    }

    /// [`Client::with_timeout`] for a server that asks for credentials: every request and the event
    /// websocket ([`Client::events`], [`Client::run_prompt`]) carry them.
    pub fn with_credentials(
        baseurl: &str,
        credentials: Credentials,
        timeout: Duration,
    ) -> Result<Client, ConnectError> {
        let mut headers = HeaderMap::new();
        if let Some((name, value)) = credentials.header().map_err(ConnectError::Credentials)? {
            headers.insert(name, value);
        }
        Client::build(baseurl, credentials, headers, timeout).map_err(ConnectError::Http)
    }

    fn build(
        baseurl: &str,
        credentials: Credentials,
        headers: HeaderMap,
        timeout: Duration,
    ) -> Result<Client, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .default_headers(headers)
            .build()?;
        Ok(Client::new_with_client(baseurl.trim_end_matches('/'), http, credentials))
    }
}
