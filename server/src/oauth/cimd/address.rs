//! Which IP addresses a client metadata document may be fetched from: public unicast only.
//!
//! Invariant: [`is_special_use`] answers `true` for every address that is not plainly public (RFC 6890's
//! special-purpose registries and everything that embeds such an address), so a caller that refuses those can
//! never be steered at loopback, the private networks, link-local metadata services or multicast.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether `ip` is special-use: loopback, private, link-local, CGNAT, multicast, unspecified, broadcast,
/// documentation, benchmarking, reserved, an IPv6 range outside global unicast, or an IPv4-mapped, NAT64 or 6to4
/// address wrapping one of those. IPv4-compatible addresses (`::a.b.c.d`, deprecated) count as special whatever
/// they wrap.
pub(super) fn is_special_use(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_special_v4(v4),
        IpAddr::V6(v6) => is_special_v6(v6),
    }
}

/// IPv4 ranges that are not public unicast (RFC 6890 and its updates).
const SPECIAL_V4: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8), // "this network", includes the unspecified address
    (Ipv4Addr::new(10, 0, 0, 0), 8), // private
    (Ipv4Addr::new(100, 64, 0, 0), 10), // shared address space (CGNAT)
    (Ipv4Addr::new(127, 0, 0, 0), 8), // loopback
    (Ipv4Addr::new(169, 254, 0, 0), 16), // link-local, cloud metadata services (169.254.169.254)
    (Ipv4Addr::new(172, 16, 0, 0), 12), // private
    (Ipv4Addr::new(192, 0, 0, 0), 24), // IETF protocol assignments
    (Ipv4Addr::new(192, 0, 2, 0), 24), // documentation (TEST-NET-1)
    (Ipv4Addr::new(192, 88, 99, 0), 24), // 6to4 relay anycast (deprecated)
    (Ipv4Addr::new(192, 168, 0, 0), 16), // private
    (Ipv4Addr::new(198, 18, 0, 0), 15), // benchmarking
    (Ipv4Addr::new(198, 51, 100, 0), 24), // documentation (TEST-NET-2)
    (Ipv4Addr::new(203, 0, 113, 0), 24), // documentation (TEST-NET-3)
    (Ipv4Addr::new(224, 0, 0, 0), 4), // multicast
    (Ipv4Addr::new(240, 0, 0, 0), 4), // reserved, includes the limited broadcast 255.255.255.255
];

/// IPv6 ranges inside global unicast (2000::/3) that are still not public.
const SPECIAL_V6_IN_GLOBAL: &[(Ipv6Addr, u8)] = &[
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23), // IETF protocol assignments (Teredo, benchmarking, ORCHID)
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32), // documentation
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20), // documentation (RFC 9637)
];

/// Whether an IPv4 address lies in one of [`SPECIAL_V4`].
fn is_special_v4(ip: Ipv4Addr) -> bool {
    let bits = u32::from(ip);
    SPECIAL_V4.iter().any(|&(net, len)| prefix_matches_v4(bits, u32::from(net), len))
}

/// Whether an IPv6 address is special: anything outside 2000::/3 (loopback, unspecified, unique-local fc00::/7,
/// link-local fe80::/10, site-local, multicast ff00::/8, discard-only, local NAT64), the reserved parts of
/// 2000::/3, and the IPv4-embedding forms whose IPv4 address is special.
fn is_special_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_special_v4(v4);
    }
    let bits = u128::from(ip);
    // NAT64 well-known prefix 64:ff9b::/96 (RFC 6052): the last 32 bits are the IPv4 destination.
    if prefix_matches_v6(bits, u128::from(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0)), 96) {
        return is_special_v4(Ipv4Addr::from(bits as u32));
    }
    // 6to4 2002::/16 (RFC 3056): bits 16..48 are the IPv4 address of the relay-reached host.
    if prefix_matches_v6(bits, u128::from(Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0)), 16) {
        return is_special_v4(Ipv4Addr::from((bits >> 80) as u32));
    }
    let global_unicast =
        prefix_matches_v6(bits, u128::from(Ipv6Addr::new(0x2000, 0, 0, 0, 0, 0, 0, 0)), 3);
    !global_unicast
        || SPECIAL_V6_IN_GLOBAL
            .iter()
            .any(|&(net, len)| prefix_matches_v6(bits, u128::from(net), len))
}

/// Whether the first `len` bits of `ip` and `net` agree.
fn prefix_matches_v4(ip: u32, net: u32, len: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    ip & mask == net & mask
}

/// Whether the first `len` bits of `ip` and `net` agree.
fn prefix_matches_v6(ip: u128, net: u128, len: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(len)).unwrap_or(0);
    ip & mask == net & mask
}

#[cfg(test)]
mod tests {
    use super::is_special_use;

    /// Asserts the predicate's answer for each address in `addresses`.
    fn check(addresses: &[&str], special: bool) {
        for text in addresses {
            let ip = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(is_special_use(ip), special, "{text}");
        }
    }

    #[test]
    fn special_use_ipv4_ranges_are_refused() {
        check(
            &[
                "0.0.0.0",
                "0.1.2.3",
                "10.0.0.1",
                "10.255.255.255",
                "100.64.0.1",
                "100.127.255.254",
                "127.0.0.1",
                "127.1.2.3",
                "169.254.169.254",
                "169.254.0.1",
                "172.16.0.1",
                "172.31.255.255",
                "192.0.0.8",
                "192.0.2.10",
                "192.88.99.1",
                "192.168.1.1",
                "198.18.0.1",
                "198.19.255.255",
                "198.51.100.7",
                "203.0.113.9",
                "224.0.0.1",
                "239.255.255.250",
                "240.0.0.1",
                "255.255.255.255",
            ],
            true,
        );
    }

    #[test]
    fn public_ipv4_addresses_are_allowed() {
        check(
            &[
                "93.184.216.34",
                "8.8.8.8",
                "1.1.1.1",
                "100.63.255.255",
                "100.128.0.0",
                "172.15.255.255",
                "172.32.0.0",
                "198.17.255.255",
                "198.20.0.0",
                "223.255.255.255",
            ],
            false,
        );
    }

    #[test]
    fn special_use_ipv6_ranges_are_refused() {
        check(
            &[
                "::",
                "::1",
                "fc00::1",
                "fd12:3456::1",
                "fe80::1",
                "fec0::1",
                "ff02::1",
                "ff0e::1",
                "100::1",
                "64:ff9b:1::1",
                "2001::1",
                "2001:2::1",
                "2001:db8::1",
                "3fff::1",
                // IPv4-mapped, IPv4-compatible, NAT64 and 6to4 forms of special IPv4 addresses.
                "::ffff:127.0.0.1",
                "::ffff:10.0.0.1",
                "::ffff:169.254.169.254",
                "::ffff:0.0.0.0",
                "::127.0.0.1",
                "::93.184.216.34",
                "64:ff9b::127.0.0.1",
                "64:ff9b::a9fe:a9fe",
                "2002:7f00:1::1",
                "2002:c0a8:101::1",
            ],
            true,
        );
    }

    #[test]
    fn public_ipv6_addresses_are_allowed() {
        check(
            &[
                "2606:2800:220:1:248:1893:25c8:1946",
                "2a00:1450:4001:80b::200e",
                "::ffff:93.184.216.34",
                "64:ff9b::93.184.216.34",
                "2002:5db8:d822::1",
            ],
            false,
        );
    }
}
