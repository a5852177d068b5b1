//! The client's address behind a reverse proxy (`http.trusted_proxies`).
//!
//! Only a connection whose TCP peer is a trusted proxy has its forwarding
//! header read (`http.forwarded_header`: `X-Forwarded-For`, or RFC 7239
//! `Forwarded`); anyone else could write any address there. The header's
//! hops are walked from the right (the hop the trusted peer itself added)
//! and trusted hops skipped: the first untrusted hop is the client. What is
//! left of it was written by the client and is never believed. A hop that
//! is not an address (`unknown`, an obfuscated name, garbage) ends the walk
//! at the last trusted hop: those clients then share that proxy's budget
//! rather than choose their own.
//!
//! Only one header is read: a proxy maintains one of them, and a client
//! could send the other through it untouched.

use actix_web::http::header::{HeaderMap, HeaderName};
use actix_web::HttpRequest;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An address block, `10.0.0.0/8` or `::1/128`; a bare address is a block
/// of one. Parsed by hand: a mask and a compare, not worth a crate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let net: IpAddr = addr.trim().parse().map_err(|_| format!("{s:?} is not an address or CIDR block"))?;
        let max = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to {max}"))?,
        };
        Ok(Cidr { net, prefix })
    }
}

impl Cidr {
    pub fn contains(&self, ip: IpAddr) -> bool {
        // A v4 client on a dual-stack socket shows as ::ffff:a.b.c.d.
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let bits = |n: u32| if self.prefix == 0 { 0 } else { u128::MAX << (n - u32::from(self.prefix)) };
        match (self.net, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = bits(32) as u32;
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = bits(128);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }
}

/// Which header a trusted proxy writes the client's address into.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub enum ForwardedHeader {
    /// `X-Forwarded-For: client, proxy1, …` (nginx, Caddy, HAProxy).
    #[default]
    #[serde(rename = "x-forwarded-for")]
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=client, for=proxy1`.
    #[serde(rename = "forwarded")]
    Forwarded,
}

/// `http.trusted_proxies` and the header they write.
#[derive(Clone, Debug, Default)]
pub struct TrustedProxies {
    cidrs: Vec<Cidr>,
    header: ForwardedHeader,
}

impl TrustedProxies {
    pub fn new(cidrs: Vec<Cidr>, header: ForwardedHeader) -> Self {
        TrustedProxies { cidrs, header }
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.cidrs.iter().any(|c| c.contains(ip))
    }

    /// The client's address, for a request from TCP peer `peer`.
    pub fn client(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        if !self.trusts(peer) {
            return peer;
        }
        let (name, parse): (HeaderName, fn(&str) -> Option<IpAddr>) = match self.header {
            ForwardedHeader::XForwardedFor => (HeaderName::from_static("x-forwarded-for"), node),
            ForwardedHeader::Forwarded => (HeaderName::from_static("forwarded"), forwarded_for),
        };
        // Several header lines are one list, in order (RFC 9110 §5.3).
        let hops: Vec<&str> = headers.get_all(name).flat_map(|v| v.to_str().unwrap_or("\u{0}").split(',')).collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            match parse(hop) {
                Some(ip) if self.trusts(ip) => client = ip,
                Some(ip) => return ip,
                None => return client,
            }
        }
        client
    }
}

/// The address of an `X-Forwarded-For` hop or a `Forwarded` node:
/// `192.0.2.1`, `192.0.2.1:443`, `2001:db8::1`, `[2001:db8::1]:443`.
fn node(hop: &str) -> Option<IpAddr> {
    let hop = hop.trim().trim_matches('"');
    if let Some(rest) = hop.strip_prefix('[') {
        return rest.split_once(']').and_then(|(v6, _)| v6.parse::<Ipv6Addr>().ok()).map(IpAddr::V6);
    }
    if let Ok(ip) = hop.parse::<IpAddr>() {
        return Some(ip);
    }
    let (v4, port) = hop.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    v4.parse::<Ipv4Addr>().ok().map(IpAddr::V4)
}

/// The `for=` node of one `Forwarded` element (`for=…;proto=https`).
fn forwarded_for(element: &str) -> Option<IpAddr> {
    element.split(';').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        k.trim().eq_ignore_ascii_case("for").then(|| node(v)).flatten()
    })
}

/// The client address of `req`: its TCP peer, or what a trusted proxy
/// says (the app's [`TrustedProxies`], if it has them).
pub fn client_ip(req: &HttpRequest) -> Option<IpAddr> {
    let peer = req.peer_addr()?.ip();
    Some(match req.app_data::<TrustedProxies>() {
        Some(proxies) => proxies.client(peer, req.headers()),
        None => peer,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::HeaderValue;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn proxies(cidrs: &[&str], header: ForwardedHeader) -> TrustedProxies {
        TrustedProxies::new(cidrs.iter().map(|c| c.parse().unwrap()).collect(), header)
    }

    fn headers(lines: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in lines {
            h.append(HeaderName::from_static(name), HeaderValue::from_static(value));
        }
        h
    }

    #[test]
    fn cidr_blocks_hold_their_addresses_and_no_others() {
        let c: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(c.contains(ip("10.1.255.3")) && !c.contains(ip("10.2.0.1")));
        assert!(c.contains(ip("::ffff:10.1.0.9")), "a v4-mapped address is the v4 one");
        let one: Cidr = "127.0.0.1".parse().unwrap();
        assert!(one.contains(ip("127.0.0.1")) && !one.contains(ip("127.0.0.2")));
        let v6: Cidr = "fd00::/8".parse().unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")) && !v6.contains(ip("10.1.0.1")));
        assert!("0.0.0.0/0".parse::<Cidr>().unwrap().contains(ip("203.0.113.9")));
        for bad in ["10.0.0.0/33", "::/129", "10.0.0/8", "nginx", "10.0.0.0/x", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_header_of_an_untrusted_peer_is_ignored() {
        let p = proxies(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let h = headers(&[("x-forwarded-for", "198.51.100.7")]);
        assert_eq!(p.client(ip("203.0.113.5"), &h), ip("203.0.113.5"));
        assert_eq!(TrustedProxies::default().client(ip("10.0.0.1"), &h), ip("10.0.0.1"), "no proxies: none trusted");
    }

    #[test]
    fn the_rightmost_untrusted_hop_is_the_client_whatever_the_client_wrote_before_it() {
        let p = proxies(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        // The client wrote 1.1.1.1 itself; the outer proxy 10.0.0.2 appended
        // the client's real address, the inner one appended 10.0.0.2.
        let h = headers(&[("x-forwarded-for", "1.1.1.1, 198.51.100.7"), ("x-forwarded-for", "10.0.0.2")]);
        assert_eq!(p.client(ip("10.0.0.1"), &h), ip("198.51.100.7"));
        let ported = headers(&[("x-forwarded-for", "[2001:db8::7]:5000, 198.51.100.8:443")]);
        assert_eq!(p.client(ip("10.0.0.1"), &ported), ip("198.51.100.8"));
    }

    #[test]
    fn a_hop_that_is_not_an_address_ends_the_walk_at_the_last_trusted_hop() {
        let p = proxies(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        let h = headers(&[("x-forwarded-for", "198.51.100.7, unknown, 10.0.0.2")]);
        assert_eq!(p.client(ip("10.0.0.1"), &h), ip("10.0.0.2"));
        assert_eq!(p.client(ip("10.0.0.1"), &HeaderMap::new()), ip("10.0.0.1"), "no header: the proxy itself");
        let all_trusted = headers(&[("x-forwarded-for", "10.9.9.9, 10.0.0.2")]);
        assert_eq!(p.client(ip("10.0.0.1"), &all_trusted), ip("10.9.9.9"));
    }

    #[test]
    fn rfc_7239_forwarded_is_read_only_when_configured() {
        let p = proxies(&["10.0.0.0/8"], ForwardedHeader::Forwarded);
        let h = headers(&[
            ("forwarded", r#"for=192.0.2.60;proto=http, For="[2001:db8:cafe::17]:4711""#),
            ("x-forwarded-for", "198.51.100.9"),
        ]);
        assert_eq!(p.client(ip("10.0.0.1"), &h), ip("2001:db8:cafe::17"));
        let xff = proxies(&["10.0.0.0/8"], ForwardedHeader::XForwardedFor);
        assert_eq!(xff.client(ip("10.0.0.1"), &h), ip("198.51.100.9"), "the other header is the client's word");
        let obfuscated = headers(&[("forwarded", "for=_hidden, for=10.0.0.3")]);
        assert_eq!(p.client(ip("10.0.0.1"), &obfuscated), ip("10.0.0.3"));
    }
}
