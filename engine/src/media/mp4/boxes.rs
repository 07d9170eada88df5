//! Writing ISO boxes: a header (32-bit size, or 64-bit when the body needs it) and a body.

/// A box of `kind` around `body`.
pub(crate) fn plain(kind: &[u8; 4], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 16);
    match u32::try_from(body.len() + 8) {
        Ok(size) => {
            out.extend_from_slice(&size.to_be_bytes());
            out.extend_from_slice(kind);
        }
        Err(_) => {
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(kind);
            out.extend_from_slice(&(body.len() as u64 + 16).to_be_bytes());
        }
    }
    out.extend_from_slice(body);
    out
}

/// A full box (version and flags before the body).
pub(crate) fn full(kind: &[u8; 4], version: u8, flags: u32, body: &[u8]) -> Vec<u8> {
    let mut inner = Vec::with_capacity(body.len() + 4);
    inner.push(version);
    inner.extend_from_slice(&flags.to_be_bytes()[1..]);
    inner.extend_from_slice(body);
    plain(kind, &inner)
}

/// A box whose body is the concatenation of `children`.
pub(crate) fn container(kind: &[u8; 4], children: &[Vec<u8>]) -> Vec<u8> {
    plain(kind, &children.concat())
}
