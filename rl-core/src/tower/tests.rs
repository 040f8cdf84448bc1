//! The layer as a service, in process: a route behind a layer with one
//! client-IP key (the layer decides such a request on its own short path,
//! so these read the same rules as [`super::key`]'s extraction does).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
#[cfg(feature = "axum")]
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::{Request, StatusCode};
use tower::ServiceExt;

use super::{KeyFrom, MissingKey, RateLimitLayer};
use crate::Limiter;
use crate::http::{IpPrefix, TrustedProxies};
use crate::testing::NowOrNever;

/// A route limited to one request per hour per client IP.
fn app(missing: MissingKey) -> Router {
    let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
    let layer = RateLimitLayer::builder("per_ip")
        .key("per_ip", ["1/1h"], KeyFrom::client_ip())
        .limiter(limiter)
        .on_missing_key(missing)
        .build()
        .unwrap();
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route_layer(layer)
}

/// A request from socket peer `peer` (none: the server gave no address),
/// as axum's `ConnectInfo` gives it (a `PeerAddr` without feature `axum`).
fn request(peer: Option<&str>) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    if let Some(peer) = peer {
        let ip: IpAddr = peer.parse().unwrap();
        #[cfg(feature = "axum")]
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::new(ip, 40_000)));
        #[cfg(not(feature = "axum"))]
        request
            .extensions_mut()
            .insert(crate::http::PeerAddr(SocketAddr::new(ip, 40_000)));
    }
    request
}

/// The statuses `app` answers `requests` with, in order (in memory: each
/// at once).
fn statuses(app: &Router, requests: impl IntoIterator<Item = Request<Body>>) -> Vec<StatusCode> {
    let answer = |request: Request<Body>| {
        let response = app.clone().oneshot(request).now_or_never();
        response.expect("answered at once").unwrap().status()
    };
    requests.into_iter().map(answer).collect()
}

const OK: StatusCode = StatusCode::OK;
const LIMITED: StatusCode = StatusCode::TOO_MANY_REQUESTS;

#[test]
fn each_ipv4_client_has_its_own_limit() {
    let app = app(MissingKey::Reject);
    let answered = statuses(
        &app,
        [
            request(Some("192.0.2.1")),
            request(Some("192.0.2.2")),
            request(Some("192.0.2.1")),
            // The IPv4-mapped form of an address is the same client.
            request(Some("::ffff:192.0.2.2")),
        ],
    );
    assert_eq!(answered, [OK, OK, LIMITED, LIMITED]);
}

#[test]
fn an_ipv6_client_is_keyed_by_the_request_prefix_else_by_its_64() {
    let app = app(MissingKey::Reject);
    let wide = |peer| {
        let mut request = request(Some(peer));
        request.extensions_mut().insert(IpPrefix::V6_48);
        request
    };
    let answered = statuses(
        &app,
        [
            // Under /48, two /64s of one /48 are one client.
            wide("2001:db8:1:2::1"),
            wide("2001:db8:1:3::1"),
            // Under the default /64, another /64 of that /48 is its own
            // client, and an address of a spent /64 is not.
            request(Some("2001:db8:1:4::1")),
            request(Some("2001:db8:1:4::99")),
        ],
    );
    assert_eq!(answered, [OK, LIMITED, OK, LIMITED]);
}

#[test]
fn behind_a_proxy_the_request_trusts_the_client_is_its_forwarded_address() {
    let app = app(MissingKey::Reject);
    let proxied = |client: &'static str| {
        let mut request = request(Some("10.0.0.1"));
        request
            .extensions_mut()
            .insert("10.0.0.0/8".parse::<TrustedProxies>().unwrap());
        request
            .headers_mut()
            .insert("x-forwarded-for", http::HeaderValue::from_static(client));
        request
    };
    let answered = statuses(
        &app,
        [
            proxied("198.51.100.7"),
            // The same client without the proxy: already counted.
            request(Some("198.51.100.7")),
            // Another client through the same proxy: its own limit.
            proxied("198.51.100.8"),
            // The proxy itself, untrusted by a request that says nothing: a
            // client.
            request(Some("10.0.0.1")),
        ],
    );
    assert_eq!(answered, [OK, LIMITED, OK, OK]);
}

#[test]
fn without_a_peer_address_the_request_gets_500_unless_the_layer_lets_it_through() {
    let strict = statuses(&app(MissingKey::Reject), [request(None)]);
    assert_eq!(strict, [StatusCode::INTERNAL_SERVER_ERROR]);
    let lenient = statuses(&app(MissingKey::Allow), [request(None), request(None)]);
    assert_eq!(lenient, [OK, OK]);
}
