//! Resolving a document host once, and deciding which of its addresses may be connected to.
//!
//! Invariant: [`checked_addresses`] returns addresses only when every address the host resolved to is
//! acceptable (public, or loopback for a test-mode loopback host); the fetcher connects to those addresses and
//! never looks the name up again, so a DNS answer that changes between check and connect (rebinding) cannot
//! steer the request.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::CimdError;
use super::address::is_special_use;
use super::target::{Target, TargetHost};

/// Looks a host name up: the IP addresses it resolves to. Injectable so tests need no DNS.
pub(super) type Resolver =
    Arc<dyn Fn(String) -> BoxFuture<'static, std::io::Result<Vec<IpAddr>>> + Send + Sync>;

/// The system resolver (`getaddrinfo` on a blocking thread, through tokio).
pub(super) fn system_resolver() -> Resolver {
    Arc::new(|host: String| {
        Box::pin(async move {
            let addresses = tokio::net::lookup_host((host.as_str(), 0)).await?;
            Ok(addresses.map(|address| address.ip()).collect())
        })
    })
}

/// The addresses to connect to for `target`, each already checked; refused when the host does not resolve or
/// when any address it resolves to is not acceptable.
pub(super) async fn checked_addresses(
    target: &Target,
    resolver: &Resolver,
) -> Result<Vec<SocketAddr>, CimdError> {
    let host = target.host_str();
    let mut addresses = match &target.host {
        TargetHost::Ip(ip) => vec![*ip],
        TargetHost::Name(name) => (resolver)(name.clone())
            .await
            .map_err(|source| CimdError::Resolve { host: host.to_owned(), source: Some(source) })?,
    };
    addresses.dedup();
    if addresses.is_empty() {
        return Err(CimdError::Resolve { host: host.to_owned(), source: None });
    }
    if let Some(&refused) = addresses.iter().find(|&&ip| !acceptable(ip, target.loopback_test)) {
        return Err(CimdError::SpecialUseAddress { host: host.to_owned(), address: Some(refused) });
    }
    Ok(addresses.into_iter().map(|ip| SocketAddr::new(ip.to_canonical(), target.port)).collect())
}

/// Whether the fetcher may connect to `ip`: public addresses only, or loopback only for a test-mode loopback
/// host.
fn acceptable(ip: IpAddr, loopback_test: bool) -> bool {
    if loopback_test { ip.to_canonical().is_loopback() } else { !is_special_use(ip) }
}
