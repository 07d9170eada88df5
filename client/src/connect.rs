//! Building a [`Client`] with a request timeout suited to long-running servers.

use std::time::Duration;

use crate::Client;

/// How long a request may take by default: long enough for a slow server, short enough to notice a dead one.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

impl Client {
    /// A client for the server at `baseurl` (e.g. `http://127.0.0.1:8188`) whose requests may take up to
    /// `timeout` (connecting may take up to 10 seconds of it).
    pub fn with_timeout(baseurl: &str, timeout: Duration) -> Result<Client, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .timeout(timeout)
            .build()?;
        Ok(Client::new_with_client(baseurl.trim_end_matches('/'), http))
    }
}
