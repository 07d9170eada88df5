//! The checks a `client_id` URL passes before Kiln fetches anything: its shape (§5.10 of the OAuth reference)
//! and the operator's host allow and block lists.
//!
//! Invariant: a [`Target`] exists only for a URL that is `https` (or loopback `http` in test mode), has a path
//! other than `/`, has no dot segment, fragment, user-info or query, is written exactly as the URL parser would
//! write it (so every reader sees the same host), and whose host the operator's lists let through.

use std::net::IpAddr;

use url::{Host, Url};

use super::address::is_special_use;
use super::{CimdError, CimdPolicy};

/// Why a `client_id` is not a URL Kiln fetches a client metadata document from; shown to the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum UrlProblem {
    /// The text does not parse as an absolute URL with a host.
    #[error("it is not an absolute URL with a host")]
    NotAUrl,
    /// The scheme is not `https` (or `http` to a loopback host in test mode).
    #[error("it must use https")]
    NotHttps,
    /// The path is empty or `/`.
    #[error("it must have a path after the host")]
    NoPath,
    /// A path segment is `.` or `..` (also percent-encoded).
    #[error("its path must not contain `.` or `..` segments")]
    DotSegment,
    /// There is a `#fragment`.
    #[error("it must not have a fragment")]
    Fragment,
    /// There is `user@` or `user:password@` before the host.
    #[error("it must not contain a user name or password")]
    UserInfo,
    /// There is a `?query`.
    #[error("it must not have a query string")]
    Query,
    /// The text differs from the URL parser's serialisation (upper-case host, default port, backslashes,
    /// unencoded characters, ...).
    #[error("it is not written in canonical form")]
    NotCanonical,
}

/// The host part of a checked URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum TargetHost {
    /// A DNS name, lower-case, as the URL has it.
    Name(String),
    /// An IP address literal.
    Ip(IpAddr),
}

/// A `client_id` URL that passed every check that needs no network.
#[derive(Debug, Clone)]
pub(super) struct Target {
    /// The parsed URL; its serialisation equals the `client_id`.
    pub(super) url: Url,
    /// The host to resolve (or the literal address).
    pub(super) host: TargetHost,
    /// The port to connect to.
    pub(super) port: u16,
    /// Test mode, loopback host: only loopback addresses are acceptable, and nothing else is.
    pub(super) loopback_test: bool,
}

impl Target {
    /// The host as the URL writes it (IPv6 in brackets), for messages and the `Host` header.
    pub(super) fn host_str(&self) -> &str {
        self.url.host_str().unwrap_or_default()
    }

    /// Whether the document is fetched over TLS.
    pub(super) fn is_https(&self) -> bool {
        self.url.scheme() == "https"
    }
}

/// Checks `client_id` against the URL rules and the operator's host lists, without any network access.
pub(super) fn check(client_id: &str, policy: &CimdPolicy) -> Result<Target, CimdError> {
    let invalid = |problem| CimdError::InvalidUrl { problem };
    let url = Url::parse(client_id).map_err(|_| invalid(UrlProblem::NotAUrl))?;
    let host = match url.host() {
        Some(Host::Domain(name)) => TargetHost::Name(name.to_owned()),
        Some(Host::Ipv4(v4)) => TargetHost::Ip(IpAddr::V4(v4)),
        Some(Host::Ipv6(v6)) => TargetHost::Ip(IpAddr::V6(v6)),
        None => return Err(invalid(UrlProblem::NotAUrl)),
    };
    let loopback_test = policy.allow_loopback_http && is_loopback_host(&host);
    match url.scheme() {
        "https" => {}
        "http" if loopback_test => {}
        _ => return Err(invalid(UrlProblem::NotHttps)),
    }
    let Some((authority, path)) = raw_authority_and_path(client_id) else {
        return Err(invalid(UrlProblem::NotAUrl));
    };
    if authority.contains('@') || !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(UrlProblem::UserInfo));
    }
    if url.fragment().is_some() {
        return Err(invalid(UrlProblem::Fragment));
    }
    if url.query().is_some() {
        return Err(invalid(UrlProblem::Query));
    }
    if path.split(['/', '\\']).any(is_dot_segment) {
        return Err(invalid(UrlProblem::DotSegment));
    }
    if path.is_empty() || path == "/" {
        return Err(invalid(UrlProblem::NoPath));
    }
    let Some(port) = url.port_or_known_default() else { return Err(invalid(UrlProblem::NotAUrl)) };
    let target = Target { url, host, port, loopback_test };
    check_host_lists(&target, policy)?;
    if !loopback_test && names_special_use(&target.host) {
        return Err(CimdError::SpecialUseAddress {
            host: target.host_str().to_owned(),
            address: None,
        });
    }
    // Last, so that the more specific reasons above win.
    if target.url.as_str() != client_id {
        return Err(invalid(UrlProblem::NotCanonical));
    }
    Ok(target)
}

/// The raw authority (between `://` and the path) and the raw path (up to `?` or `#`) of `client_id`, before
/// any normalisation by the URL parser; `None` without `://`.
fn raw_authority_and_path(client_id: &str) -> Option<(&str, &str)> {
    let (_, rest) = client_id.split_once("://")?;
    let authority_end = rest.find(['/', '\\', '?', '#']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(authority_end);
    let path_end = rest.find(['?', '#']).unwrap_or(rest.len());
    Some((authority, &rest[..path_end]))
}

/// Whether a raw path segment means "this" or "parent" directory, also when percent-encoded.
fn is_dot_segment(segment: &str) -> bool {
    let decoded = segment.to_ascii_lowercase().replace("%2e", ".");
    decoded == "." || decoded == ".."
}

/// Whether the host is one the test mode lets through over `http`: `localhost`, 127.0.0.0/8 or `::1`.
fn is_loopback_host(host: &TargetHost) -> bool {
    match host {
        TargetHost::Name(name) => name == "localhost",
        TargetHost::Ip(ip) => ip.is_loopback(),
    }
}

/// Whether the host names a special-use address without any lookup: an IP literal that is special-use, or
/// `localhost` and its subdomains (RFC 6761, always loopback).
fn names_special_use(host: &TargetHost) -> bool {
    match host {
        TargetHost::Name(name) => {
            let name = name.trim_end_matches('.');
            name == "localhost" || name.ends_with(".localhost")
        }
        TargetHost::Ip(ip) => is_special_use(*ip),
    }
}

/// Refuses a host on the operator's block list, or missing from the allow list when there is one. An entry
/// matches the host itself and its subdomains; a trailing dot and letter case do not matter.
fn check_host_lists(target: &Target, policy: &CimdPolicy) -> Result<(), CimdError> {
    let host = target.host_str();
    let refused = || CimdError::HostNotAllowed { host: host.to_owned() };
    if policy.blocked_hosts.iter().any(|entry| host_matches(host, entry)) {
        return Err(refused());
    }
    match &policy.allowed_hosts {
        Some(allowed) if !allowed.iter().any(|entry| host_matches(host, entry)) => Err(refused()),
        _ => Ok(()),
    }
}

/// Whether `host` (lower-case, as the URL parser writes it) is `entry` or a subdomain of it; a trailing dot on
/// either (the fully qualified spelling) does not matter.
fn host_matches(host: &str, entry: &str) -> bool {
    let host = host.trim_end_matches('.');
    let entry = entry.trim().trim_end_matches('.').to_ascii_lowercase();
    if entry.is_empty() {
        return false;
    }
    host == entry || host.strip_suffix(entry.as_str()).is_some_and(|prefix| prefix.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use super::{CimdError, CimdPolicy, UrlProblem, check};

    /// The production policy with the given host lists.
    fn policy(blocked: &[&str], allowed: Option<&[&str]>) -> CimdPolicy {
        CimdPolicy {
            blocked_hosts: blocked.iter().map(|h| (*h).to_owned()).collect(),
            allowed_hosts: allowed.map(|a| a.iter().map(|h| (*h).to_owned()).collect()),
            ..CimdPolicy::default()
        }
    }

    /// Asserts that each URL is refused for `problem` under the production policy.
    fn refused(urls: &[&str], problem: UrlProblem) {
        for url in urls {
            match check(url, &CimdPolicy::default()) {
                Err(CimdError::InvalidUrl { problem: got }) => assert_eq!(got, problem, "{url}"),
                other => panic!("{url}: expected {problem:?}, got {other:?}"),
            }
        }
    }

    #[test]
    fn well_formed_https_urls_pass() {
        for url in [
            "https://claude.ai/oauth/claude-code-client-metadata",
            "https://example.com:8443/client.json",
            "https://example.com/a/b/",
            "https://93.184.216.34/client",
        ] {
            let target =
                check(url, &CimdPolicy::default()).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(target.url.as_str(), url);
            assert!(!target.loopback_test);
        }
    }

    #[test]
    fn urls_without_a_path_are_refused() {
        refused(
            &["https://example.com", "https://example.com/", "https://example.com:8443/"],
            UrlProblem::NoPath,
        );
    }

    #[test]
    fn dot_segments_are_refused_even_encoded() {
        refused(
            &[
                "https://example.com/a/../b",
                "https://example.com/a/./b",
                "https://example.com/..",
                "https://example.com/a/%2e%2E/b",
                "https://example.com/a/.%2e",
                "https://example.com/a\\..\\b",
            ],
            UrlProblem::DotSegment,
        );
    }

    #[test]
    fn fragments_user_info_and_queries_are_refused() {
        refused(
            &["https://example.com/client#x", "https://example.com/client#"],
            UrlProblem::Fragment,
        );
        refused(
            &[
                "https://user@example.com/client",
                "https://user:secret@example.com/client",
                "https://@example.com/client",
            ],
            UrlProblem::UserInfo,
        );
        refused(
            &["https://example.com/client?x=1", "https://example.com/client?"],
            UrlProblem::Query,
        );
    }

    #[test]
    fn other_schemes_are_refused() {
        refused(
            &["http://example.com/client", "ftp://example.com/client", "HTTP://example.com/client"],
            UrlProblem::NotHttps,
        );
        refused(&["not a url", "/client", "https:client"], UrlProblem::NotAUrl);
    }

    #[test]
    fn non_canonical_spellings_are_refused() {
        refused(
            &[
                "https://EXAMPLE.com/client",
                "https://example.com:443/client",
                "https://example.com/a b",
                "https://example.com\\client",
                "HTTPS://example.com/client",
            ],
            UrlProblem::NotCanonical,
        );
    }

    #[test]
    fn loopback_http_needs_test_mode() {
        let test_mode = CimdPolicy { allow_loopback_http: true, ..CimdPolicy::default() };
        for url in [
            "http://127.0.0.1:8080/client",
            "http://localhost:8080/client",
            "http://[::1]:8080/client",
        ] {
            refused(&[url], UrlProblem::NotHttps);
            let target = check(url, &test_mode).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(target.loopback_test, "{url}");
        }
        // Test mode opens loopback hosts only.
        assert!(matches!(
            check("http://10.0.0.1/client", &test_mode),
            Err(CimdError::InvalidUrl { problem: UrlProblem::NotHttps })
        ));
        assert!(matches!(
            check("http://example.com/client", &test_mode),
            Err(CimdError::InvalidUrl { problem: UrlProblem::NotHttps })
        ));
    }

    #[test]
    fn special_use_literals_and_localhost_are_refused_without_lookup() {
        for url in [
            "https://127.0.0.1/client",
            "https://10.0.0.1/client",
            "https://169.254.169.254/latest",
            "https://[::1]/client",
            "https://[::ffff:127.0.0.1]/client",
            "https://localhost/client",
            "https://app.localhost/client",
            "https://localhost./client",
        ] {
            assert!(
                matches!(
                    check(url, &CimdPolicy::default()),
                    Err(CimdError::SpecialUseAddress { .. })
                ),
                "{url}"
            );
        }
    }

    #[test]
    fn host_lists_match_the_host_and_its_subdomains() {
        let blocking = policy(&["Evil.Example."], None);
        for url in ["https://evil.example/c", "https://a.evil.example/c", "https://evil.example./c"]
        {
            assert!(
                matches!(check(url, &blocking), Err(CimdError::HostNotAllowed { .. })),
                "{url}"
            );
        }
        assert!(check("https://notevil.example/c", &blocking).is_ok());

        let allowing = policy(&["bad.claude.ai"], Some(&["claude.ai"]));
        assert!(check("https://claude.ai/oauth/c", &allowing).is_ok());
        assert!(check("https://x.claude.ai/oauth/c", &allowing).is_ok());
        for url in ["https://bad.claude.ai/c", "https://example.com/c", "https://fakeclaude.ai/c"] {
            assert!(
                matches!(check(url, &allowing), Err(CimdError::HostNotAllowed { .. })),
                "{url}"
            );
        }
    }
}
