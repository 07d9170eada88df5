//! Redirect URIs: which ones a client may register (RFC 7591 §2 with OAuth 2.1 and RFC 8252), and whether the
//! `redirect_uri` of an authorization request is one of them.
//!
//! Matching compares raw strings, never normalised URLs (oauth.md §7 row 7): the only freedom is the port of a
//! loopback redirect (RFC 8252 §7.3), because native clients listen on whatever port is free.

/// Why a redirect URI cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("redirect URI `{uri}` {reason}")]
pub(crate) struct RedirectError {
    /// The URI as given (shortened when long).
    uri: String,
    /// What is wrong with it.
    reason: &'static str,
}

/// The longest redirect URI Kiln accepts.
const MAX_LEN: usize = 2000;

/// Schemes that run code or read local files in a browser: never a redirect target.
const DANGEROUS_SCHEMES: [&str; 5] = ["javascript", "data", "file", "vbscript", "blob"];

/// Checks that `uri` may be registered: absolute, no fragment, and `https`, loopback `http`, or a private-use
/// scheme of a native app (`cursor://…`, `com.example.app:/cb`).
pub(crate) fn check_registrable(uri: &str) -> Result<(), RedirectError> {
    let refuse = |reason| Err(RedirectError { uri: uri.chars().take(100).collect(), reason });
    if uri.is_empty() || uri.len() > MAX_LEN {
        return refuse("must have 1 to 2000 characters");
    }
    if uri.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return refuse("contains whitespace or control characters");
    }
    if uri.contains('\\') {
        // Browsers read `\` as `/`, other parsers do not: the two would disagree on the host.
        return refuse("contains a backslash");
    }
    if uri.contains('#') {
        return refuse("has a fragment");
    }
    let Some((scheme, rest)) = uri.split_once(':') else {
        return refuse("is not an absolute URI");
    };
    let valid_scheme = scheme.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && scheme.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid_scheme {
        return refuse("is not an absolute URI");
    }
    let scheme = scheme.to_ascii_lowercase();
    if DANGEROUS_SCHEMES.contains(&scheme.as_str()) {
        return refuse("uses a scheme that is never a redirect target");
    }
    match scheme.as_str() {
        "https" if !rest.starts_with("//") || rest[2..].starts_with('/') => {
            refuse("is not a valid https URL with a host and no user-info")
        }
        "https" => match url::Url::parse(uri) {
            Ok(url)
                if url.host_str().is_some_and(|h| !h.is_empty()) && url.username().is_empty() =>
            {
                Ok(())
            }
            _ => refuse("is not a valid https URL with a host and no user-info"),
        },
        "http" => match loopback(uri) {
            Some(_) => Ok(()),
            None => {
                refuse("uses http on a host that is not loopback (127.0.0.1, [::1], localhost)")
            }
        },
        _ if rest.is_empty() => refuse("has nothing after its scheme"),
        _ => Ok(()),
    }
}

/// A loopback `http` URI split around its port: (`http://host`, rest after the port). `None` when the URI is
/// not `http` on `127.0.0.1`, `[::1]` or `localhost`.
fn loopback(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix("http://")?;
    let host_len = if rest.starts_with('[') {
        rest.find(']')? + 1
    } else {
        rest.find([':', '/', '?', '@', '#']).unwrap_or(rest.len())
    };
    let host = &rest[..host_len];
    if !matches!(host, "127.0.0.1" | "[::1]" | "localhost") {
        return None;
    }
    let after_host = &rest[host_len..];
    let after_port = match after_host.strip_prefix(':') {
        Some(port) => {
            let digits = port.find(|c: char| !c.is_ascii_digit()).unwrap_or(port.len());
            if digits == 0 || digits > 5 {
                return None;
            }
            &port[digits..]
        }
        None => after_host,
    };
    if after_port.starts_with('@') {
        return None;
    }
    Some((&uri[.."http://".len() + host_len], after_port))
}

/// Whether `requested` is one of `registered`: the same string, or for loopback `http` URIs the same host
/// spelling, path and query on any port (`localhost` never matches `127.0.0.1`).
pub(crate) fn is_registered(registered: &[String], requested: &str) -> bool {
    registered.iter().any(|uri| {
        if uri == requested {
            return true;
        }
        match (loopback(uri), loopback(requested)) {
            (Some((host, rest)), Some((asked_host, asked_rest))) => {
                host == asked_host && normal_root(rest) == normal_root(asked_rest)
            }
            _ => false,
        }
    })
}

/// An empty path is the root path: `http://127.0.0.1:33418` and `http://127.0.0.1/` name the same resource.
fn normal_root(rest: &str) -> &str {
    if rest.is_empty() { "/" } else { rest }
}

/// Whether every URI is loopback `http` (the consent page warns: any program on the machine can receive the
/// code).
pub(crate) fn all_loopback(uris: &[String]) -> bool {
    uris.iter().all(|uri| loopback(uri).is_some())
}

/// The host a redirect URI sends the browser to, for the consent page (`cursor://x/…` shows `cursor://x`).
pub(crate) fn display_host(uri: &str) -> String {
    match url::Url::parse(uri) {
        Ok(url) => match url.host_str() {
            Some(host) if matches!(url.scheme(), "http" | "https") => match url.port() {
                Some(port) => format!("{host}:{port}"),
                None => host.to_owned(),
            },
            Some(host) => format!("{}://{host}", url.scheme()),
            None => format!("{}:", url.scheme()),
        },
        Err(_) => uri.chars().take(60).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(uris: &[&str]) -> Vec<String> {
        uris.iter().map(|u| (*u).to_owned()).collect()
    }

    #[test]
    fn registrable_uris_are_https_loopback_http_and_app_schemes() {
        for good in [
            "https://client.example.com/cb",
            "http://127.0.0.1:33418/",
            "http://127.0.0.1/",
            "http://localhost/callback",
            "http://[::1]:8080/cb",
            "cursor://anysphere.cursor-mcp/oauth/callback",
            "com.example.app:/cb",
            "vscode://vscode.github-authentication/did-authenticate",
        ] {
            assert_eq!(check_registrable(good), Ok(()), "{good}");
        }
        for bad in [
            "javascript:alert(1)",
            "JavaScript:alert(1)",
            "data:text/html,hi",
            "file:///etc/passwd",
            "vbscript:x",
            "http://evil.example/cb",
            "http://127.0.0.1.evil.example/cb",
            "http://localhost@evil.example/cb",
            "http://localhost:80\\@evil.example/cb",
            "https://good@evil.example/cb",
            "https://client.example.com/cb#frag",
            "/relative/cb",
            "cb",
            "https:///nohost",
            "https://client.example.com/c b",
            "",
        ] {
            assert!(check_registrable(bad).is_err(), "{bad} must be refused");
        }
    }

    #[test]
    fn redirects_match_exactly_except_loopback_ports() {
        let uris = registered(&["http://127.0.0.1:1234/cb", "https://app.example.com/cb"]);
        assert!(is_registered(&uris, "http://127.0.0.1:1234/cb"));
        assert!(is_registered(&uris, "http://127.0.0.1:5555/cb"), "any loopback port (RFC 8252)");
        assert!(is_registered(&uris, "http://127.0.0.1/cb"));
        for bad in [
            "http://127.0.0.1:5555/other",
            "http://localhost:5555/cb",
            "http://evil.com:1234/cb",
            "http://127.0.0.1:5555/cb?x=1",
            "http://127.0.0.1:5555/cb/",
            "https://app.example.com/cb/extra",
            "https://app.example.com/cb?x=1",
            "https://APP.example.com/cb",
            "https://app.example.com/%63b",
            "https://app.example.com/cb#f",
            "https://app.example.com@evil.example/cb",
            "https://evil.example/cb",
        ] {
            assert!(!is_registered(&uris, bad), "{bad} must not match");
        }
    }

    #[test]
    fn vs_code_port_fallback_matches_its_port_less_registration() {
        let uris = registered(&[
            "http://127.0.0.1/",
            "http://127.0.0.1:33418/",
            "https://vscode.dev/redirect",
        ]);
        assert!(is_registered(&uris, "http://127.0.0.1:59656/"));
        assert!(is_registered(&uris, "http://127.0.0.1:59656"));
        assert!(!is_registered(&uris, "http://localhost:59656/"));
    }

    #[test]
    fn hosts_are_shown_for_consent() {
        assert_eq!(display_host("https://app.example.com/cb"), "app.example.com");
        assert_eq!(display_host("http://127.0.0.1:5555/cb"), "127.0.0.1:5555");
        assert_eq!(
            display_host("cursor://anysphere.cursor-mcp/oauth"),
            "cursor://anysphere.cursor-mcp"
        );
        assert!(all_loopback(&registered(&["http://127.0.0.1/", "http://localhost:1/x"])));
        assert!(!all_loopback(&registered(&["http://127.0.0.1/", "https://a.example/"])));
    }
}
