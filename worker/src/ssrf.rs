//! Which addresses the worker may fetch from: the SSRF guard's test.
//!
//! An address is public when it is globally reachable: outside every block
//! of the IANA IPv4 and IPv6 Special-Purpose Address Registries that is not
//! marked globally reachable. IPv6 forms that carry an IPv4 address
//! (IPv4-mapped, the NAT64 well-known prefix, 6to4) are judged by the IPv4
//! address they carry; every other IPv6 address outside global unicast
//! (2000::/3) is refused, which covers IPv4-compatible, site-local, unique
//! local, link-local and multicast addresses and whatever is assigned
//! there later.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Whether an address is on the public internet.
#[must_use]
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

fn is_public_v4(v4: Ipv4Addr) -> bool {
    let [a, b, c, _] = v4.octets();
    !(a == 0 // "this network", 0.0.0.0/8
        || a == 10
        || a == 127
        || (a == 100 && (64..128).contains(&b)) // shared address space
        || (a == 169 && b == 254) // link-local
        || (a == 172 && (16..32).contains(&b))
        || (a == 192 && b == 0 && c == 0) // IETF protocol assignments
        || (a == 192 && b == 0 && c == 2) // documentation
        || (a == 192 && b == 31 && c == 196) // AS112-v4
        || (a == 192 && b == 52 && c == 193) // AMT
        || (a == 192 && b == 88 && c == 99) // 6to4 relay anycast
        || (a == 192 && b == 168)
        || (a == 192 && b == 175 && c == 48) // direct delegation AS112
        || (a == 198 && (b == 18 || b == 19)) // benchmarking
        || (a == 198 && b == 51 && c == 100) // documentation
        || (a == 203 && b == 0 && c == 113) // documentation
        || a >= 224) // multicast, reserved, broadcast
}

fn is_public_v6(v6: Ipv6Addr) -> bool {
    let s = v6.segments();
    let embedded = |high: u16, low: u16| {
        let [h1, h2] = high.to_be_bytes();
        let [l1, l2] = low.to_be_bytes();
        Ipv4Addr::new(h1, h2, l1, l2)
    };
    // IPv4-mapped, ::ffff:0:0/96.
    if let Some(v4) = v6.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    // NAT64 well-known prefix, 64:ff9b::/96.
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return is_public_v4(embedded(s[6], s[7]));
    }
    // Outside global unicast: unspecified, loopback, IPv4-compatible,
    // IPv4-translated, discard-only, local-use NAT64, SRv6 SIDs, unique
    // local, site-local, link-local, multicast.
    if s[0] & 0xe000 != 0x2000 {
        return false;
    }
    // 6to4, 2002::/16: the IPv4 address it routes to.
    if s[0] == 0x2002 {
        return is_public_v4(embedded(s[1], s[2]));
    }
    match s[0] {
        // IETF protocol assignments (Teredo, ORCHID, ...), 2001::/23, and
        // documentation, 2001:db8::/32.
        0x2001 => s[1] >= 0x0200 && s[1] != 0x0db8,
        // Documentation, 3fff::/20.
        0x3fff => s[1] >= 0x1000,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn special_purpose_addresses_are_not_public() {
        for special in [
            "0.1.2.3",
            "10.1.2.3",
            "100.64.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "192.0.0.8",
            "192.0.2.1",
            "192.31.196.1",
            "192.52.193.1",
            "192.88.99.1",
            "192.168.1.1",
            "192.175.48.1",
            "198.18.0.1",
            "198.51.100.1",
            "203.0.113.1",
            "224.0.0.1",
            "240.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "::7f00:1",
            "::a9fe:a9fe",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:0:a9fe:a9fe",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b::7f00:1",
            "64:ff9b:1::1",
            "100::1",
            "2001::1",
            "2001:2::1",
            "2001:db8::1",
            "2002:a9fe:a9fe::1",
            "2002:7f00:1::1",
            "3fff::1",
            "5f00::1",
            "fc00::1",
            "fd00::1",
            "fe80::1",
            "fec0::1",
            "ff02::1",
        ] {
            assert!(!is_public(special.parse().unwrap()), "{special}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "192.0.1.1",
            "2606:4700::1111",
            "2a00:1450:4001::1",
            "::ffff:1.1.1.1",
            "64:ff9b::808:808",
            "2002:808:808::1",
        ] {
            assert!(is_public(public.parse().unwrap()), "{public}");
        }
    }

    proptest! {
        /// Every IPv6 form that carries an IPv4 address is judged as that
        /// address; the IPv4-compatible form is never public.
        #[test]
        fn ipv6_forms_of_an_ipv4_address_agree_with_it(bits in any::<u32>()) {
            let v4 = Ipv4Addr::from(bits);
            let [a, b, c, d] = v4.octets();
            let high = u16::from_be_bytes([a, b]);
            let low = u16::from_be_bytes([c, d]);
            let public = is_public(IpAddr::V4(v4));
            prop_assert_eq!(is_public(IpAddr::V6(v4.to_ipv6_mapped())), public);
            prop_assert_eq!(is_public(IpAddr::V6(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, high, low))), public);
            prop_assert_eq!(is_public(IpAddr::V6(Ipv6Addr::new(0x2002, high, low, 0, 0, 0, 0, 1))), public);
            prop_assert!(!is_public(IpAddr::V6(v4.to_ipv6_compatible())));
        }
    }
}
