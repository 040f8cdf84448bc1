//! Unit tests of `crate::http`.

use super::*;

fn limited(retry_us: u64) -> Rejection {
    let decision = Decision::new(crate::model::decision::Figures {
        allowed: false,
        limit: 5,
        retry_after_us: retry_us,
        reset_after_us: 3_000_000_000,
        ..Default::default()
    });
    Rejection::limited("sms::send", decision, Limit::per_hour(5).unwrap())
}

#[cfg(feature = "axum")]
#[tokio::test]
async fn a_limited_rejection_is_a_429_with_retry_after_rounded_up_and_ietf_fields() {
    let response = limited(1_000_001).into_response();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let headers = response.headers().clone();
    assert_eq!(headers[RETRY_AFTER], "2");
    assert_eq!(headers["ratelimit-policy"], "\"sms::send\";q=5;w=3600");
    assert_eq!(headers["ratelimit"], "\"sms::send\";r=0;t=3000");
    assert_eq!(headers[CONTENT_TYPE], "application/json");
    let body = axum::body::to_bytes(response.into_body(), 1024)
        .await
        .unwrap();
    assert_eq!(
        &body[..],
        br#"{"error":"rate_limited","retry_after_ms":1001}"#
    );
}

#[cfg(feature = "axum")]
#[test]
fn retry_after_is_never_zero_on_a_429() {
    assert_eq!(limited(1).into_response().headers()[RETRY_AFTER], "1");
    assert_eq!(
        limited(std::time::Duration::from_secs(60).as_micros() as u64)
            .into_response()
            .headers()[RETRY_AFTER],
        "60"
    );
}

#[test]
fn without_axum_the_same_response_is_made() {
    let response: http::Response<String> = rejection_response(&limited(1_000_001));
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()[RETRY_AFTER], "2");
    assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"sms::send\";q=5;w=3600"
    );
    assert_eq!(
        response.body(),
        r#"{"error":"rate_limited","retry_after_ms":1001}"#
    );
}

#[test]
fn the_peer_is_read_from_connect_info_or_a_peer_addr() {
    let addr: SocketAddr = "198.51.100.7:4000".parse().unwrap();
    let mut extensions = Extensions::new();
    assert_eq!(peer(&extensions), None);
    extensions.insert(PeerAddr(addr));
    assert_eq!(peer(&extensions), Some(addr.ip()));
    #[cfg(feature = "axum")]
    {
        let via_axum: SocketAddr = "203.0.113.9:5000".parse().unwrap();
        extensions.insert(ConnectInfo(via_axum));
        assert_eq!(peer(&extensions), Some(via_axum.ip()));
    }
}

#[cfg(feature = "axum")]
#[test]
fn an_unavailable_rejection_is_a_503() {
    let rejection = Rejection::unavailable("x", crate::Error::NotInstalled);
    assert_eq!(
        rejection.into_response().status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

fn xff(value: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-for", value.parse().unwrap());
    headers
}

#[test]
fn ipv4_keys_render_as_the_address_display_for_every_octet_value() {
    for o in 0..=255u8 {
        for ip in [
            std::net::Ipv4Addr::new(o, 0, 9, 10),
            std::net::Ipv4Addr::new(1, o, 99, 100),
            std::net::Ipv4Addr::new(255, 10, o, 7),
            std::net::Ipv4Addr::new(8, 8, 8, o),
        ] {
            let key = IpPrefix::DEFAULT.key(ip.into());
            assert_eq!(key.to_string(), ip.to_string());
        }
    }
}

#[test]
fn ip_keys_render_like_the_addresses_display_and_stay_distinct() {
    for (ip, prefix, shown) in [
        ("0.0.0.0", IpPrefix::DEFAULT, "0.0.0.0"),
        ("255.255.255.255", IpPrefix::DEFAULT, "255.255.255.255"),
        ("192.0.2.77", IpPrefix::new(24, 64).unwrap(), "192.0.2.0/24"),
        ("::ffff:192.0.2.1", IpPrefix::DEFAULT, "192.0.2.1"),
        ("2001:db8::1", IpPrefix::FULL, "2001:db8::1"),
        (
            "2001:db8:ffff:ffff:1::",
            IpPrefix::V6_48,
            "2001:db8:ffff::/48",
        ),
        (
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
            IpPrefix::new(32, 127).unwrap(),
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe/127",
        ),
    ] {
        let ip: IpAddr = ip.parse().unwrap();
        let key = prefix.key(ip);
        assert_eq!(key.to_string(), shown);
        assert!(key.contains(ip));
    }
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    assert!(
        !IpPrefix::DEFAULT
            .key(ip("2001:db8:0:1::1"))
            .contains(ip("2001:db8:0:2::1"))
    );
    assert!(
        !IpPrefix::DEFAULT
            .key(ip("10.0.0.1"))
            .contains(ip("2001:db8::1"))
    );
}

#[test]
fn ip_prefixes_out_of_range_or_unreadable_are_refused() {
    assert_eq!(IpPrefix::new(0, 64), Err(IpPrefixError::V4(0)));
    assert_eq!(IpPrefix::new(33, 64), Err(IpPrefixError::V4(33)));
    assert_eq!(IpPrefix::new(32, 0), Err(IpPrefixError::V6(0)));
    assert_eq!("v6=/48".parse::<IpPrefix>(), Ok(IpPrefix::V6_48));
    assert!(matches!(
        "v5=1".parse::<IpPrefix>(),
        Err(IpPrefixError::Syntax(_))
    ));
    assert!(matches!(
        "v6".parse::<IpPrefix>(),
        Err(IpPrefixError::Syntax(_))
    ));
    assert_eq!("".parse::<IpPrefix>(), Ok(IpPrefix::DEFAULT));
}

#[test]
fn forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy() {
    let peer: IpAddr = "203.0.113.9".parse().unwrap();
    assert_eq!(ClientIp::resolve(peer, &xff("1.2.3.4"), None).ip(), peer);
    let trusted: TrustedProxies = "10.0.0.0/8".parse().unwrap();
    assert_eq!(
        ClientIp::resolve(peer, &xff("1.2.3.4"), Some(&trusted)).ip(),
        peer
    );
}

#[test]
fn the_rightmost_untrusted_hop_is_the_client_and_spoofed_hops_are_skipped() {
    let trusted: TrustedProxies = "10.0.0.0/8".parse().unwrap();
    let proxy: IpAddr = "10.0.0.2".parse().unwrap();
    let client = ClientIp::resolve(
        proxy,
        &xff("6.6.6.6, 198.51.100.7, 10.0.0.1"),
        Some(&trusted),
    );
    assert_eq!(client.ip(), "198.51.100.7".parse::<IpAddr>().unwrap());
    let garbage = ClientIp::resolve(proxy, &xff("nonsense"), Some(&trusted));
    assert_eq!(garbage.ip(), proxy);
}
