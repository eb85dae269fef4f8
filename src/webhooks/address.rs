//! Where a merchant's endpoint may point: an http(s) URL whose host is, and resolves only to,
//! public addresses. Otherwise idempay would be a proxy into its own network (server-side request
//! forgery): a loopback admin port, a database, the cloud metadata service at 169.254.169.254.
//!
//! The URL is checked when the endpoint is registered, and again on every delivery, since a name
//! may resolve elsewhere by then: the delivery client resolves names through [`PublicOnly`],
//! which drops every non-public address, and follows no redirect. `IDEMPAY_WEBHOOK_ALLOW_PRIVATE`
//! lifts the rule, for development (`idempay dev` sets it) and tests.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Whether an address is one anyone on the internet could reach: not loopback, private (RFC 1918,
/// fc00::/7), link-local (169.254/16, fe80::/10), shared (CGNAT, 100.64/10), unspecified,
/// multicast, broadcast, documentation or otherwise reserved. An IPv4-mapped or NAT64-embedded
/// IPv6 address is judged by its IPv4 address.
pub fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => is_public_v4(v4),
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public_v4(v4);
            }
            let segments = v6.segments();
            // 64:ff9b::/96 embeds an IPv4 address for NAT64.
            if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
                let [a, b] = segments[6].to_be_bytes();
                let [c, d] = segments[7].to_be_bytes();
                return is_public_v4(Ipv4Addr::new(a, b, c, d));
            }
            // Global unicast is 2000::/3; within it, documentation (2001:db8::/32) and the
            // 2001::/23 block of special-purpose addresses are not reachable hosts.
            (segments[0] & 0xe000) == 0x2000
                && !(segments[0] == 0x2001 && segments[1] == 0x0db8)
                && !(segments[0] == 0x2001 && segments[1] < 0x0200)
        }
    }
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
        // 198.18/15 benchmarking, 240/4 reserved.
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 192 && b == 0 && c == 0)
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
            let public: Vec<SocketAddr> =
                resolved.filter(|address| is_public(address.ip())).collect();
            if public.is_empty() {
                return Err(format!("{host} resolves to no public address").into());
            }
            Ok(Box::new(public.into_iter()) as Addrs)
        })
    }
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
        for private in ["http://127.0.0.1/", "http://[::1]:80/", "http://10.0.0.1/"] {
            assert!(
                matches!(parse(private, false), Err(Refused::NotPublic { .. })),
                "{private}"
            );
            assert!(parse(private, true).is_ok(), "{private}");
        }
    }
}
