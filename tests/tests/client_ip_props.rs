//! The client's IP behind trusted proxies, over arbitrary header values
//! (`X-Forwarded-For`, `Forwarded`, `X-Real-IP`, several lines, any bytes
//! a header value may hold): nothing panics, an untrusted peer is always
//! the client, the answer is the peer or an untrusted address, and the hop
//! a trusted proxy appended is the client whatever the client wrote left
//! of it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use ratewall::http::{ClientIp, ProxyHeader, TrustedProxies};

/// The proxies: 10.0.0.0/8 and fd00::/8.
fn trusted(order: &[ProxyHeader]) -> TrustedProxies {
    "10.0.0.0/8, fd00::/8"
        .parse::<TrustedProxies>()
        .unwrap()
        .with_headers(order.iter().copied())
}

fn any_header() -> impl Strategy<Value = ProxyHeader> {
    prop_oneof![
        Just(ProxyHeader::XForwardedFor),
        Just(ProxyHeader::Forwarded),
        Just(ProxyHeader::XRealIp),
    ]
}

/// An order of precedence: up to three headers, repeats allowed.
fn any_order() -> impl Strategy<Value = Vec<ProxyHeader>> {
    proptest::collection::vec(any_header(), 0..4)
}

/// A header value's bytes: what hyper accepts (tab, printable ASCII,
/// 0x80..=0xFF), raw or built from the grammar's pieces.
fn any_value() -> impl Strategy<Value = Vec<u8>> {
    let raw = proptest::collection::vec(
        prop_oneof![Just(b'\t'), 0x20u8..=0x7e, 0x80u8..=0xff],
        0..48,
    );
    let piece = prop_oneof![
        Just("for=".to_owned()),
        Just("For=".to_owned()),
        Just("\"".to_owned()),
        Just(",".to_owned()),
        Just(";".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just(":".to_owned()),
        Just(" ".to_owned()),
        Just("\\".to_owned()),
        Just("_hidden".to_owned()),
        Just("unknown".to_owned()),
        Just("proto=https".to_owned()),
        any_ip().prop_map(|ip| ip.to_string()),
        (0u32..70_000).prop_map(|port| port.to_string()),
    ];
    let pieces = proptest::collection::vec(piece, 0..12).prop_map(|p| p.concat().into_bytes());
    prop_oneof![raw, pieces]
}

fn any_ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(v))),
        any::<u128>().prop_map(|v| IpAddr::V6(Ipv6Addr::from(v))),
        // Proxies' addresses, often.
        any::<u32>().prop_map(|v| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (v & 0x00ff_ffff)))),
    ]
}

/// An address no proxy has: a client's.
fn untrusted_ip() -> impl Strategy<Value = IpAddr> {
    any_ip().prop_filter("a client, not a proxy", |ip| !trusted(&[]).contains(*ip))
}

fn headers(lines: &[(ProxyHeader, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (header, value) in lines {
        let value = HeaderValue::from_bytes(value).expect("a valid header value");
        map.append(HeaderName::from_static(header.name()), value);
    }
    map
}

fn lines() -> impl Strategy<Value = Vec<(ProxyHeader, Vec<u8>)>> {
    proptest::collection::vec((any_header(), any_value()), 0..5)
}

/// The hop a proxy appends for client `ip`, in `header`'s form.
fn appended(header: ProxyHeader, ip: IpAddr, port: u16, quoted: bool) -> String {
    match (header, ip) {
        (ProxyHeader::Forwarded, IpAddr::V6(v6)) => format!("for=\"[{v6}]:{port}\""),
        (ProxyHeader::Forwarded, IpAddr::V4(v4)) if quoted => format!("for=\"{v4}:{port}\""),
        (ProxyHeader::Forwarded, IpAddr::V4(v4)) => format!("for={v4};proto=https"),
        _ => ip.to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn an_untrusted_peer_is_the_client_whatever_the_headers_say(
        peer in untrusted_ip(),
        order in any_order(),
        lines in lines(),
    ) {
        let client = ClientIp::resolve(peer, &headers(&lines), Some(&trusted(&order)));
        prop_assert_eq!(client.ip(), peer.to_canonical());
    }

    #[test]
    fn behind_a_proxy_the_client_is_the_peer_or_an_untrusted_address(
        peer in any_ip().prop_map(|ip| match ip {
            IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | (u32::from(v4) & 0xffff))),
            v6 => v6,
        }),
        order in any_order(),
        lines in lines(),
    ) {
        let trusted = trusted(&order);
        let client = ClientIp::resolve(peer, &headers(&lines), Some(&trusted)).ip();
        prop_assert!(
            client == peer.to_canonical() || !trusted.contains(client),
            "{client} is a proxy, not the peer {peer}"
        );
    }

    #[test]
    fn the_hop_a_trusted_proxy_appended_is_the_client_whatever_the_client_wrote(
        header in prop_oneof![Just(ProxyHeader::XForwardedFor), Just(ProxyHeader::Forwarded)],
        others in proptest::collection::vec(any_header(), 0..3),
        written in any_value(),
        client in untrusted_ip(),
        port in any::<u16>(),
        quoted in any::<bool>(),
        same_line in any::<bool>(),
        // Proxies between, each appending the one before it.
        hops in proptest::collection::vec(0u32..0x00ff_ffff, 0..3),
    ) {
        let mut order = vec![header];
        order.extend(others);
        let mut chain = vec![appended(header, client, port, quoted)];
        for hop in hops {
            let proxy = IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | hop));
            chain.push(appended(header, proxy, port, quoted));
        }
        let appended = chain.join(", ");
        let lines = if same_line {
            let mut line = written;
            line.extend_from_slice(b", ");
            line.extend_from_slice(appended.as_bytes());
            vec![(header, line)]
        } else {
            vec![(header, written), (header, appended.into_bytes())]
        };
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let resolved = ClientIp::resolve(peer, &headers(&lines), Some(&trusted(&order)));
        prop_assert_eq!(resolved.ip(), client.to_canonical());
    }

    #[test]
    fn x_real_ip_set_by_a_trusted_proxy_is_the_client(
        client in untrusted_ip(),
        before in proptest::collection::vec(any_value(), 0..2),
    ) {
        // A proxy that sets X-Real-IP replaces what the client sent; one
        // that appends a line puts its own last.
        let mut lines: Vec<_> = before.into_iter().map(|v| (ProxyHeader::XRealIp, v)).collect();
        lines.push((ProxyHeader::XRealIp, format!(" {client} ").into_bytes()));
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let resolved = ClientIp::resolve(peer, &headers(&lines), Some(&trusted(&[ProxyHeader::XRealIp])));
        prop_assert_eq!(resolved.ip(), client.to_canonical());
    }
}

#[test]
fn a_client_cannot_pick_its_address_through_a_header_its_proxy_does_not_set() {
    // The proxy sets X-Real-IP; the client sends Forwarded and
    // X-Forwarded-For of its own: only X-Real-IP is read.
    let mut map = HeaderMap::new();
    map.insert("forwarded", HeaderValue::from_static("for=1.1.1.1"));
    map.insert("x-forwarded-for", HeaderValue::from_static("2.2.2.2"));
    map.insert("x-real-ip", HeaderValue::from_static("198.51.100.9"));
    let proxy: IpAddr = "10.0.0.1".parse().unwrap();
    let client = ClientIp::resolve(proxy, &map, Some(&trusted(&[ProxyHeader::XRealIp])));
    assert_eq!(client.ip(), "198.51.100.9".parse::<IpAddr>().unwrap());
}
