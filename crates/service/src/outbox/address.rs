//! Where a merchant's endpoint may point: an http(s) URL whose host is, and resolves only to,
//! public addresses. Otherwise idempay would be a proxy into its own network (server-side request
//! forgery): a loopback admin port, a database, the cloud metadata service at 169.254.169.254.
//!
//! The URL is checked when the endpoint is registered, and again on every delivery, since a name
//! may resolve elsewhere by then: the delivery client resolves names through [`PublicOnly`],
//! which drops every non-public address, follows no redirect, and ignores proxy variables (a
//! proxy would resolve the name itself). `IDEMPAY_WEBHOOK_ALLOW_PRIVATE` lifts the rule, for
//! development (`idempay dev` sets it) and tests.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Whether an address is one anyone on the internet could reach: not loopback, private (RFC 1918,
/// fc00::/7), link-local (169.254/16, fe80::/10), shared (CGNAT, 100.64/10), unspecified,
/// multicast, broadcast, documentation or otherwise reserved, and no IPv6 form that wraps an
/// IPv4 address a host here could reach by it (see `is_public_v6`).
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => is_public_v6(v6),
    }
}

/// An IPv6 prefix: its first `len` bits.
struct Prefix(u128, u8);

impl Prefix {
    fn contains(&self, ip: Ipv6Addr) -> bool {
        let mask = u128::MAX << (128 - u32::from(self.1));
        u128::from(ip) & mask == self.0 & mask
    }
}

/// NAT64's well-known prefix (RFC 6052), the IPv4 address in the last 32 bits.
const NAT64: Prefix = Prefix(0x0064_ff9b_0000_0000_0000_0000_0000_0000, 96);

/// The prefixes refused inside global unicast (2000::/3), from the IANA IPv6 Special-Purpose
/// Address Registry and the deprecated blocks. Those that wrap an IPv4 address are refused
/// whole, whatever it is, rather than judged by it: the address the packets finally reach is
/// chosen by a relay or a translator, which may be on this network (a 6to4 or Teredo relay
/// decapsulates to 127.0.0.1 or 169.254.169.254 as readily as to a public address), and no
/// receiver needs them (6to4's anycast relays are deprecated, RFC 7526; Teredo is a client's
/// last resort, never a server's address).
const REFUSED_GLOBAL: [Prefix; 5] = [
    // IETF protocol assignments (RFC 2928): Teredo (2001::/32, the client's IPv4 is the last 32
    // bits with every bit flipped, its server's bits 32-64), benchmarking, ORCHID, AMT, AS112.
    Prefix(0x2001_0000_0000_0000_0000_0000_0000_0000, 23),
    // Documentation (RFC 3849).
    Prefix(0x2001_0db8_0000_0000_0000_0000_0000_0000, 32),
    // 6to4 (RFC 3056): bits 16-48 are the IPv4 address of the site's router, to which the
    // packets are tunnelled: 2002:7f00:1:: wraps 127.0.0.1.
    Prefix(0x2002_0000_0000_0000_0000_0000_0000_0000, 16),
    // The former 6bone (RFC 3701), returned to IANA.
    Prefix(0x3ffe_0000_0000_0000_0000_0000_0000_0000, 16),
    // Documentation (RFC 9637).
    Prefix(0x3fff_0000_0000_0000_0000_0000_0000_0000, 20),
];

/// IPv6: global unicast (2000::/3) outside [`REFUSED_GLOBAL`]. Everything outside 2000::/3 is
/// refused, among it each other form that wraps an IPv4 address: IPv4-compatible (::/96,
/// deprecated by RFC 4291), IPv4-translated (::ffff:0:0:0/96, RFC 2765), NAT64's local-use prefix
/// (64:ff9b:1::/48, RFC 8215, where the IPv4 address sits where the network's own prefix length
/// puts it), and loopback, unspecified, discard-only (100::/64), SRv6 SIDs (5f00::/16), unique
/// local (fc00::/7), link-local (fe80::/10), site-local (fec0::/10) and multicast.
///
/// Two forms are judged by the IPv4 address they carry instead: IPv4-mapped (::ffff:0:0/96), the
/// IPv4 address itself as a dual-stack socket writes it, and NAT64's well-known prefix
/// (64:ff9b::/96), which a DNS64 resolver gives an IPv6-only host for every IPv4-only name, so
/// that refusing it would refuse every such receiver there; RFC 6052 forbids it to carry a
/// non-public IPv4 address, and it is refused if it does.
fn is_public_v6(ip: Ipv6Addr) -> bool {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return is_public_v4(v4);
    }
    if NAT64.contains(ip) {
        let [.., a, b, c, d] = ip.octets();
        return is_public_v4(Ipv4Addr::new(a, b, c, d));
    }
    let global_unicast = Prefix(0x2000_0000_0000_0000_0000_0000_0000_0000, 3);
    global_unicast.contains(ip) && !REFUSED_GLOBAL.iter().any(|prefix| prefix.contains(ip))
}

fn is_public_v4(ip: Ipv4Addr) -> bool {
    let [a, b, c, _] = ip.octets();
    !(ip.is_unspecified()
        || ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_broadcast()
        || ip.is_documentation()
        || ip.is_multicast()
        // 0/8 "this network", 100.64/10 shared (CGNAT), 192.0.0/24 protocol assignments,
        // 192.88.99/24 6to4's relay anycast (deprecated, RFC 7526), 198.18/15 benchmarking,
        // 240/4 reserved.
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
        || (a == 192 && b == 88 && c == 99)
        || (a == 198 && (18..20).contains(&b))
        || a >= 240)
}

/// Why an endpoint URL is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("the url must be an absolute http or https URL with a host: {0}")]
    Malformed(String),
    #[error("the url's host {host} is {address}, not a public address")]
    NotPublic { host: String, address: IpAddr },
    #[error("the url's host {0} does not resolve")]
    Unresolved(String),
}

/// Checks the shape of an endpoint URL, with no lookup: absolute, http or https, with a host, no
/// user or password (they would be sent to whoever answers), and, if its host is an address, a
/// public one (unless `allow_private`).
pub fn parse(raw: &str, allow_private: bool) -> Result<Url, Refused> {
    let url = Url::parse(raw).map_err(|error| Refused::Malformed(error.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refused::Malformed(format!(
            "the scheme is {}",
            url.scheme()
        )));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Refused::Malformed(
            "it carries a user name or password".to_owned(),
        ));
    }
    let literal = match url.host() {
        None => return Err(Refused::Malformed("it has no host".to_owned())),
        Some(url::Host::Domain(_)) => None,
        Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
        Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
    };
    match literal {
        Some(address) if !allow_private && !is_public(address) => Err(Refused::NotPublic {
            host: url.host_str().unwrap_or_default().to_owned(),
            address,
        }),
        _ => Ok(url),
    }
}

/// [`parse`], then, for a name, a lookup: every address it resolves to must be public (unless
/// `allow_private`).
pub async fn check(raw: &str, allow_private: bool) -> Result<Url, Refused> {
    let url = parse(raw, allow_private)?;
    if allow_private {
        return Ok(url);
    }
    if let Some(url::Host::Domain(host)) = url.host() {
        let port = url.port_or_known_default().unwrap_or(443);
        let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|_| Refused::Unresolved(host.to_owned()))?
            .collect();
        if addresses.is_empty() {
            return Err(Refused::Unresolved(host.to_owned()));
        }
        if let Some(private) = addresses.iter().find(|address| !is_public(address.ip())) {
            return Err(Refused::NotPublic {
                host: host.to_owned(),
                address: private.ip(),
            });
        }
    }
    Ok(url)
}

/// The delivery client's resolver: the system's, with every non-public address dropped, so a
/// name that now resolves to a private address cannot be reached (the connection fails as if the
/// name did not resolve, and the attempt is recorded as failed).
#[derive(Debug, Default)]
pub struct PublicOnly;

impl Resolve for PublicOnly {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved = tokio::net::lookup_host((host.as_str(), 0)).await?;
            let public = only_public(&host, resolved)?;
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
}

/// The public addresses among those `host` resolved to; an error if there are none.
fn only_public(
    host: &str,
    resolved: impl Iterator<Item = SocketAddr>,
) -> Result<Vec<SocketAddr>, Box<dyn std::error::Error + Send + Sync>> {
    let public: Vec<SocketAddr> = resolved.filter(|address| is_public(address.ip())).collect();
    if public.is_empty() {
        return Err(format!("{host} resolves to no public address").into());
    }
    Ok(public)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn public(raw: &str) -> bool {
        is_public(raw.parse().unwrap())
    }

    #[test]
    fn only_global_addresses_are_public() {
        for private in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "198.18.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd12::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
            "ff02::1",
        ] {
            assert!(!public(private), "{private}");
        }
        for global in [
            "93.184.216.34",
            "8.8.8.8",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert!(public(global), "{global}");
        }
    }

    /// Each address is refused; a failure names the form.
    fn all_refused(form: &str, addresses: &[&str]) {
        for address in addresses {
            assert!(!public(address), "{form}: {address} was taken as public");
        }
    }

    #[test]
    fn six_to_four_is_refused_whatever_ipv4_address_it_wraps() {
        all_refused(
            "6to4",
            &[
                "2002:7f00:1::",         // 127.0.0.1
                "2002:a9fe:a9fe::1",     // 169.254.169.254
                "2002:a00:1:1::1",       // 10.0.0.1
                "2002:c0a8:101::",       // 192.168.1.1
                "2002:808:808::1",       // 8.8.8.8: the whole prefix, relays being deprecated
                "2002:ffff:ffff:ffff::", // the prefix's end
            ],
        );
        assert!(public("2003::1"), "the next /16 is ordinary global unicast");
    }

    #[test]
    fn teredo_is_refused_whatever_ipv4_address_it_wraps() {
        // Server 65.54.227.120; the client's address is the last 32 bits, every bit flipped.
        all_refused(
            "Teredo",
            &[
                "2001:0:4136:e378:8000:63bf:80ff:fffe", // client 127.0.0.1
                "2001:0:4136:e378:8000:63bf:5601:5601", // client 169.254.169.254
                "2001:0:4136:e378:8000:63bf:f5ff:fffe", // client 10.0.0.1
                "2001:0:4136:e378:8000:63bf:f7f7:f7f7", // client 8.8.8.8: the whole prefix
                "2001:0:7f00:1::",                      // server 127.0.0.1
            ],
        );
    }

    #[test]
    fn nat64_is_judged_by_its_ipv4_address_and_its_local_use_prefix_refused() {
        all_refused(
            "NAT64 well-known",
            &[
                "64:ff9b::7f00:1",
                "64:ff9b::a9fe:a9fe",
                "64:ff9b::a00:1",
                "64:ff9b::c0a8:101",
                "64:ff9b::6440:1",    // 100.64.0.1, shared
                "64:ff9b::c058:6301", // 192.88.99.1, 6to4's relay anycast
            ],
        );
        assert!(public("64:ff9b::808:808"), "what DNS64 gives for 8.8.8.8");
        all_refused(
            "NAT64 local-use",
            &[
                "64:ff9b:1::7f00:1",
                "64:ff9b:1:7f00:1::",
                "64:ff9b:1::808:808",
                "64:ff9b:1:ffff:ffff:ffff:ffff:ffff",
            ],
        );
    }

    #[test]
    fn ipv4_mapped_is_judged_by_its_ipv4_address_and_compatible_and_translated_are_refused() {
        all_refused(
            "IPv4-mapped",
            &[
                "::ffff:127.0.0.1",
                "::ffff:169.254.169.254",
                "::ffff:10.0.0.1",
            ],
        );
        assert!(public("::ffff:8.8.8.8"));
        all_refused(
            "IPv4-compatible (deprecated)",
            &[
                "::127.0.0.1",
                "::169.254.169.254",
                "::10.0.0.1",
                "::8.8.8.8",
            ],
        );
        all_refused(
            "IPv4-translated",
            &[
                "::ffff:0:127.0.0.1",
                "::ffff:0:a9fe:a9fe",
                "::ffff:0:8.8.8.8",
            ],
        );
    }

    #[test]
    fn the_other_special_purpose_blocks_are_refused() {
        all_refused(
            "special-purpose",
            &[
                "100::1",          // discard-only
                "2001:2::1",       // benchmarking, in the IETF protocol assignments
                "2001:20::1",      // ORCHIDv2
                "2001:db8:1::1",   // documentation
                "3fff::1",         // documentation (RFC 9637)
                "3fff:fff:ffff::", // its end
                "3ffe::1",         // the former 6bone
                "5f00::1",         // SRv6 SIDs
                "fec0::1",         // site-local (deprecated)
                "ff0e::1",         // global multicast
                "192.88.99.1",     // 6to4's relay anycast, as IPv4
            ],
        );
        assert!(public("3fff:1000::1"), "past the documentation /20");
        assert!(public("2620:0:2d0:200::7"));
    }

    #[test]
    fn the_resolver_keeps_only_public_addresses() {
        let at = |ip: &str| SocketAddr::new(ip.parse().unwrap(), 443);
        let wrapped = [
            at("2002:7f00:1::"),
            at("64:ff9b::a9fe:a9fe"),
            at("127.0.0.1"),
        ];
        let refused = only_public("hooks.example", wrapped.into_iter()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "hooks.example resolves to no public address"
        );
        let mixed = [
            at("2002:7f00:1::"),
            at("93.184.216.34"),
            at("::ffff:10.0.0.1"),
        ];
        assert_eq!(
            only_public("hooks.example", mixed.into_iter()).unwrap(),
            vec![at("93.184.216.34")]
        );
    }

    #[test]
    fn a_url_needs_http_a_host_and_no_credentials() {
        assert!(parse("https://example.com/hooks", false).is_ok());
        assert!(parse("http://93.184.216.34:8080/", false).is_ok());
        for bad in [
            "ftp://example.com/",
            "example.com/hooks",
            "https://user:pw@example.com/",
            "http://",
            "mailto:someone@example.com",
            "",
        ] {
            assert!(
                matches!(parse(bad, false), Err(Refused::Malformed(_))),
                "{bad}"
            );
        }
        for private in [
            "http://127.0.0.1/",
            "http://[::1]:80/",
            "http://10.0.0.1/",
            "http://[2002:7f00:1::]:18080/",
        ] {
            assert!(
                matches!(parse(private, false), Err(Refused::NotPublic { .. })),
                "{private}"
            );
            assert!(parse(private, true).is_ok(), "{private}");
        }
    }
}
