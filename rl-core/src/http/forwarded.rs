//! The client behind trusted proxies: the headers a proxy tells it in
//! ([`ProxyHeader`]), read right to left under the trust rule of
//! [`TrustedProxies`](super::TrustedProxies).
//!
//! Every value is hostile until a trusted proxy is shown to have written
//! it: a hop is believed only when the hop to its right (or the peer, for
//! the right-most) is a trusted proxy, and a hop that is not an address
//! (unparsable, `unknown`, an obfuscated `_name`, a `Forwarded` element
//! without `for`) ends the walk: what lies left of it was written by a node
//! nobody vouches for, so the client is then the peer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use smallvec::SmallVec;

use super::TrustedProxies;

/// A header in which proxies tell the address of the client they serve.
/// [`TrustedProxies::with_headers`](super::TrustedProxies::with_headers)
/// says which ones a deployment's proxies set, in order of precedence:
/// only the first of them present in a request is read (never a mix).
/// Name only headers your proxies set or overwrite: a header a proxy
/// passes through unchanged is the client's to write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProxyHeader {
    /// `X-Forwarded-For: client, proxy1, proxy2`: a comma-separated list of
    /// addresses, each proxy appending the address it was called from
    /// (the default, alone).
    XForwardedFor,
    /// RFC 7239 `Forwarded: for=192.0.2.60;proto=https, for="[2001:db8::17]:4711"`:
    /// elements separated by commas, the `for` parameter of each (quoted or
    /// not; an IPv6 address in brackets; a port, also obfuscated, allowed).
    Forwarded,
    /// `X-Real-IP: 192.0.2.60`: one address, what nginx's
    /// `proxy_set_header X-Real-IP $remote_addr` sets.
    XRealIp,
}

impl ProxyHeader {
    /// The header's name, lowercase.
    pub const fn name(self) -> &'static str {
        match self {
            Self::XForwardedFor => "x-forwarded-for",
            Self::Forwarded => "forwarded",
            Self::XRealIp => "x-real-ip",
        }
    }
}

/// The lines of a request's header fields by name, in the order received
/// (`http`'s `HeaderMap`, actix-web's).
pub(crate) trait HeaderLines {
    /// The lines of header `name` (lowercase).
    fn lines(&self, name: &'static str) -> SmallVec<[&[u8]; 2]>;
}

impl HeaderLines for http::HeaderMap {
    #[inline]
    fn lines(&self, name: &'static str) -> SmallVec<[&[u8]; 2]> {
        self.get_all(name).iter().map(|v| v.as_bytes()).collect()
    }
}

/// The client of a request from trusted proxy `peer` (canonical): the
/// right-most hop of the first of `trusted`'s headers present that is not
/// itself a trusted proxy; the peer when no header is present, every hop
/// is trusted, or the walk meets a hop that is not an address.
pub(crate) fn client_behind(
    peer: IpAddr,
    headers: &impl HeaderLines,
    trusted: &TrustedProxies,
) -> IpAddr {
    for &header in trusted.headers() {
        let lines = headers.lines(header.name());
        if lines.is_empty() {
            continue;
        }
        return walk(header, &lines, trusted).unwrap_or(peer);
    }
    peer
}

/// What one hop of a chain is.
enum Hop {
    /// An address: believed if its writer is trusted.
    Address(IpAddr),
    /// Anything else: the walk ends.
    Opaque,
}

/// The right-most untrusted hop of `lines` of `header`, right to left over
/// the lines and the hops of each; `None` to fall back to the peer.
fn walk(header: ProxyHeader, lines: &[&[u8]], trusted: &TrustedProxies) -> Option<IpAddr> {
    // Whether a hop ends the walk with an answer (`Some(Some(ip))`: the
    // client; `Some(None)`: the peer) or the walk goes on leftwards.
    let judge = |hop: Hop| match hop {
        Hop::Address(ip) if trusted.contains(ip) => None,
        Hop::Address(ip) => Some(Some(ip.to_canonical())),
        Hop::Opaque => Some(None),
    };
    for line in lines.iter().rev() {
        // Split as bytes: a byte that is not text in what a client wrote
        // leaves the hops appended right of it readable.
        match header {
            ProxyHeader::XForwardedFor => {
                for hop in line.rsplit(|&b| b == b',') {
                    if let Some(found) = judge(address(hop)) {
                        return found;
                    }
                }
            }
            ProxyHeader::XRealIp => {
                if let Some(found) = judge(address(line)) {
                    return found;
                }
            }
            ProxyHeader::Forwarded => {
                for element in split_unquoted_rev(line, b',') {
                    if let Some(found) = judge(forwarded_for(element)) {
                        return found;
                    }
                }
            }
        }
    }
    // Every hop was a trusted proxy.
    None
}

/// A bare address (`X-Forwarded-For`, `X-Real-IP`), spaces around it.
fn address(text: &[u8]) -> Hop {
    match std::str::from_utf8(text).map(|text| text.trim().parse::<IpAddr>()) {
        Ok(Ok(ip)) => Hop::Address(ip),
        _ => Hop::Opaque,
    }
}

/// Splits `text` at every `delimiter` outside a quoted string, scanning
/// from the right, and gives the parts right to left: the quotes of what
/// the last proxies appended pair up whatever a client wrote further left
/// (an unterminated quote there swallows only the client's own part).
/// Escapes are not followed: a `\"` ends up in an opaque value, and no
/// address has one.
fn split_unquoted_rev(text: &[u8], delimiter: u8) -> SmallVec<[&[u8]; 4]> {
    let mut parts = SmallVec::new();
    let (mut end, mut quoted) = (text.len(), false);
    for (at, &byte) in text.iter().enumerate().rev() {
        if byte == b'"' {
            quoted = !quoted;
        } else if !quoted && byte == delimiter {
            parts.push(&text[at + 1..end]);
            end = at;
        }
    }
    parts.push(&text[..end]);
    parts
}

/// The `for` node of one `Forwarded` element: an address, or opaque when
/// it has none, several, or one that is not an address.
fn forwarded_for(element: &[u8]) -> Hop {
    let mut found = None;
    for pair in split_unquoted_rev(element, b';') {
        let Some(at) = pair.iter().position(|&b| b == b'=') else {
            if pair.trim_ascii().is_empty() {
                continue;
            }
            return Hop::Opaque;
        };
        let (name, value) = (&pair[..at], &pair[at + 1..]);
        if !name.trim_ascii().eq_ignore_ascii_case(b"for") {
            continue;
        }
        if found.is_some() {
            // Two `for`s in one element: malformed.
            return Hop::Opaque;
        }
        found = Some(value.trim_ascii());
    }
    let value = found.and_then(|value| std::str::from_utf8(value).ok());
    match value.and_then(unquote) {
        Some(node) => node_address(node),
        None => Hop::Opaque,
    }
}

/// A parameter's value: a token as is, or a quoted string's contents (an
/// escape inside has no place in an address: `None`).
fn unquote(value: &str) -> Option<&str> {
    match value.strip_prefix('"') {
        Some(rest) => {
            let inner = rest.strip_suffix('"')?;
            (!inner.contains(['"', '\\'])).then_some(inner)
        }
        None => Some(value),
    }
}

/// A `Forwarded` node (RFC 7239 section 6): `192.0.2.43`, `192.0.2.43:47011`,
/// `[2001:db8::17]`, `[2001:db8::17]:4711` (a bare IPv6 address too);
/// `unknown` and obfuscated identifiers (`_hidden`) are not addresses.
fn node_address(node: &str) -> Hop {
    if let Some(rest) = node.strip_prefix('[') {
        let Some((ip, after)) = rest.split_once(']') else {
            return Hop::Opaque;
        };
        return match (ip.parse::<Ipv6Addr>(), port(after)) {
            (Ok(ip), true) => Hop::Address(IpAddr::V6(ip)),
            _ => Hop::Opaque,
        };
    }
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Hop::Address(ip);
    }
    match node.rsplit_once(':') {
        Some((ip, number)) => match (ip.parse::<Ipv4Addr>(), port_number(number)) {
            (Ok(ip), true) => Hop::Address(IpAddr::V4(ip)),
            _ => Hop::Opaque,
        },
        None => Hop::Opaque,
    }
}

/// Whether what follows a bracketed address is nothing or `:port`.
fn port(after: &str) -> bool {
    after.is_empty() || after.strip_prefix(':').is_some_and(port_number)
}

/// A port: a number up to 65535, or an obfuscated one (`_abc`).
fn port_number(text: &str) -> bool {
    match text.strip_prefix('_') {
        Some(obfuscated) => {
            !obfuscated.is_empty()
                && obfuscated
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        }
        None => {
            !text.is_empty()
                && text.bytes().all(|b| b.is_ascii_digit())
                && text.parse::<u16>().is_ok()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn behind(
        peer: &str,
        trusted: &str,
        order: &[ProxyHeader],
        headers: &[(&str, &str)],
    ) -> String {
        let mut map = http::HeaderMap::new();
        for (name, value) in headers {
            map.append(
                http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                http::HeaderValue::from_str(value).unwrap(),
            );
        }
        let trusted = trusted
            .parse::<TrustedProxies>()
            .unwrap()
            .with_headers(order.iter().copied());
        client_behind(peer.parse().unwrap(), &map, &trusted).to_string()
    }

    const FWD: &[ProxyHeader] = &[ProxyHeader::Forwarded];

    #[test]
    fn forwarded_nodes_in_every_form_rfc_7239_gives() {
        for (value, client) in [
            ("for=192.0.2.60;proto=http;by=203.0.113.43", "192.0.2.60"),
            ("For=\"192.0.2.43:47011\"", "192.0.2.43"),
            ("for=\"[2001:db8:cafe::17]:4711\"", "2001:db8:cafe::17"),
            ("for=\"[2001:db8:cafe::17]\"", "2001:db8:cafe::17"),
            ("for=\"[2001:db8::1]:_port\"", "2001:db8::1"),
            ("for=192.0.2.43, for=198.51.100.17", "198.51.100.17"),
            ("for=198.51.100.17, for=10.0.0.5", "198.51.100.17"),
            (" proto=https ; for = 198.51.100.17 ", "198.51.100.17"),
            ("for=\"::ffff:198.51.100.17\"", "198.51.100.17"),
        ] {
            assert_eq!(
                behind("10.0.0.1", "10.0.0.0/8", FWD, &[("forwarded", value)]),
                client,
                "{value}"
            );
        }
    }

    #[test]
    fn an_opaque_forwarded_node_ends_the_walk_at_the_peer() {
        for value in [
            "for=unknown",
            "for=_hidden",
            "for=198.51.100.17, for=_hidden",
            "for=198.51.100.17, for=unknown",
            "for=198.51.100.17, proto=https",
            "for=198.51.100.17;for=198.51.100.18",
            "for=\"198.51.100.17",
            "for=\"[2001:db8::1\"",
            "for=\"[2001:db8::1]:99999\"",
            "for=\"192.0.2.1:\"",
            "for=\"1.2.3.4\\\"\"",
            "garbage",
            "",
        ] {
            assert_eq!(
                behind("10.0.0.1", "10.0.0.0/8", FWD, &[("forwarded", value)]),
                "10.0.0.1",
                "{value}"
            );
        }
    }

    #[test]
    fn several_forwarded_lines_are_one_list_and_quotes_keep_their_commas() {
        let lines = [
            ("forwarded", "for=203.0.113.9"),
            ("forwarded", "for=\"_a,b\";by=x, for=198.51.100.3"),
        ];
        assert_eq!(
            behind("10.0.0.1", "10.0.0.0/8", FWD, &lines),
            "198.51.100.3"
        );
        // A client's unterminated quote cannot swallow what the proxies appended.
        let quoted = [(
            "forwarded",
            "for=\"x, for=10.0.0.3, for=198.51.100.4, for=10.0.0.2",
        )];
        assert_eq!(
            behind("10.0.0.1", "10.0.0.0/8", FWD, &quoted),
            "198.51.100.4"
        );
        let through = [
            ("forwarded", "for=203.0.113.9"),
            ("forwarded", "for=10.0.0.7"),
        ];
        assert_eq!(
            behind("10.0.0.1", "10.0.0.0/8", FWD, &through),
            "203.0.113.9"
        );
    }

    #[test]
    fn only_the_first_configured_header_present_is_read() {
        use ProxyHeader::*;
        let all = [
            ("forwarded", "for=198.51.100.1"),
            ("x-forwarded-for", "198.51.100.2"),
            ("x-real-ip", "198.51.100.3"),
        ];
        let order = |o: &[ProxyHeader]| behind("10.0.0.1", "10.0.0.0/8", o, &all);
        assert_eq!(order(&[Forwarded, XForwardedFor, XRealIp]), "198.51.100.1");
        assert_eq!(order(&[XRealIp, Forwarded]), "198.51.100.3");
        assert_eq!(order(&[XForwardedFor]), "198.51.100.2");
        assert_eq!(order(&[]), "10.0.0.1");
        // The default: X-Forwarded-For alone.
        let trusted: TrustedProxies = "10.0.0.0/8".parse().unwrap();
        assert_eq!(trusted.headers(), [XForwardedFor]);
        // A header absent: the next one.
        let real = [("x-real-ip", " 198.51.100.3 ")];
        assert_eq!(
            behind("10.0.0.1", "10.0.0.0/8", &[Forwarded, XRealIp], &real),
            "198.51.100.3"
        );
    }

    #[test]
    fn x_real_ip_is_one_address_believed_from_a_trusted_peer_only() {
        let real = |peer: &str, value: &str| {
            behind(
                peer,
                "10.0.0.0/8",
                &[ProxyHeader::XRealIp],
                &[("x-real-ip", value)],
            )
        };
        assert_eq!(real("10.0.0.1", "198.51.100.3"), "198.51.100.3");
        assert_eq!(real("10.0.0.1", "2001:db8::3"), "2001:db8::3");
        assert_eq!(real("10.0.0.1", "198.51.100.3, 198.51.100.4"), "10.0.0.1");
        assert_eq!(real("10.0.0.1", "198.51.100.3:80"), "10.0.0.1");
        assert_eq!(real("10.0.0.1", "10.0.0.9"), "10.0.0.1");
    }
}
