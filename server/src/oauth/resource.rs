//! Resource indicators (RFC 8707): the one resource Kiln issues tokens for is its MCP endpoint,
//! `<issuer>/mcp`. A requested resource names it when it is the same URL up to the case of scheme and host and
//! one trailing slash; tokens always carry the canonical spelling.

/// Whether `requested` names `canonical` (an absolute URI without a fragment that differs from it at most in
/// the case of its scheme and host and one trailing slash).
pub(crate) fn names(canonical: &str, requested: &str) -> bool {
    if requested.contains('#') {
        return false;
    }
    let trimmed = requested.strip_suffix('/').unwrap_or(requested);
    let (Some((scheme, rest)), Some((want_scheme, want_rest))) =
        (trimmed.split_once("://"), canonical.split_once("://"))
    else {
        return false;
    };
    let split = |rest: &str| -> (String, String) {
        let at = rest.find('/').unwrap_or(rest.len());
        (rest[..at].to_ascii_lowercase(), rest[at..].to_owned())
    };
    scheme.eq_ignore_ascii_case(want_scheme) && split(rest) == split(want_rest)
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn the_mcp_resource_is_named_tolerantly_and_nothing_else() {
        let canonical = "https://kiln.example.com/mcp";
        for same in [
            "https://kiln.example.com/mcp",
            "https://kiln.example.com/mcp/",
            "HTTPS://Kiln.Example.com/mcp",
        ] {
            assert!(names(canonical, same), "{same}");
        }
        for other in [
            "https://kiln.example.com/",
            "https://kiln.example.com",
            "https://kiln.example.com/MCP",
            "https://kiln.example.com/mcp/other",
            "https://evil.example/mcp",
            "https://kiln.example.com/mcp#x",
            "https://kiln.example.com/mcp//",
            "mcp",
            "",
        ] {
            assert!(!names(canonical, other), "{other}");
        }
    }
}
