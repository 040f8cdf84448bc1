//! Instructions per request of the route-level layer and of
//! `tower_governor`, counted by callgrind (exact, unlike timings on a busy
//! machine): the axum app of `benches/tower.rs`, 2 048 warm-up requests
//! over 1 024 client IPs, then N measured ones. `rl_proxied` and
//! `tower_governor_smart` are the `proxied` pair: every request from the
//! proxy `10.0.0.1` with the client in `X-Forwarded-For`, both sides with
//! headers (ours trusting `10.0.0.0/8`, theirs `SmartIpKeyExtractor`).
//!
//! ```text
//! cargo build --release -p ratewall --features tower,axum --example tower_instructions
//! for v in bare rl rl_no_headers rl_proxied tower_governor tower_governor_headers tower_governor_smart; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='tower_instructions::measured' \
//!     target/release/examples/tower_instructions $v 4000 2>&1 | grep Collected
//! done   # divide by 4000
//! ```

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use ratewall::http::TrustedProxies;
use ratewall::tower::{KeyFrom, RateLimitLayer};
use ratewall::{Limit, Limiter};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor, SmartIpKeyExtractor};

/// Polls a future that completes without suspending.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-process request suspended"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(n)) = (args.next(), args.next().and_then(|n| n.parse().ok())) else {
        eprintln!(
            "usage: tower_instructions bare|rl|rl_no_headers|rl_proxied|tower_governor|tower_governor_headers|tower_governor_smart N"
        );
        std::process::exit(2);
    };
    let app = Router::new().route("/", get(|| async { "ok" }));
    let ample = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    let rl = |headers, proxies: Option<TrustedProxies>| {
        let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
        let mut layer = RateLimitLayer::builder("bench")
            .key("bench", [ample], KeyFrom::client_ip())
            .limiter(limiter)
            .headers(headers);
        if let Some(proxies) = proxies {
            layer = layer.trusted_proxies(proxies);
        }
        layer.build().unwrap()
    };
    let proxied = variant.ends_with("proxied") || variant.ends_with("smart");
    let app = match variant.as_str() {
        "bare" => app,
        "rl" => app.route_layer(rl(true, None)),
        "rl_no_headers" => app.route_layer(rl(false, None)),
        "rl_proxied" => app.route_layer(rl(true, Some("10.0.0.0/8".parse().unwrap()))),
        "tower_governor" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .unwrap();
            app.route_layer(GovernorLayer::new(Arc::new(config)))
        }
        "tower_governor_headers" => governor_headers(app, PeerIpKeyExtractor),
        "tower_governor_smart" => governor_headers(app, SmartIpKeyExtractor),
        other => {
            eprintln!("unknown variant `{other}`");
            std::process::exit(2);
        }
    };
    warm(&app, 2048, proxied);
    measured(&app, n, proxied);
}

/// `app` under `tower_governor` with its `x-ratelimit-*` headers, keyed by
/// `key`, every request admitted.
fn governor_headers<K>(app: Router, key: K) -> Router
where
    K: KeyExtractor + Send + Sync + 'static,
    K::Key: Send + Sync + 'static,
{
    let config = GovernorConfigBuilder::default()
        .key_extractor(key)
        .use_headers()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .finish()
        .unwrap();
    app.route_layer(GovernorLayer::new(Arc::new(config)))
}

#[inline(never)]
fn warm(app: &Router, n: u32, proxied: bool) {
    requests(app, n, proxied)
}

#[inline(never)]
fn measured(app: &Router, n: u32, proxied: bool) {
    requests(app, n, proxied)
}

/// `n` requests from 1 024 clients in turn, directly or (`proxied`)
/// through the proxy `10.0.0.1`.
fn requests(app: &Router, n: u32, proxied: bool) {
    let proxy = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 443);
    for i in 0..n {
        let client = Ipv4Addr::from(0xC000_0200 + i % 1024);
        let mut request = Request::get("/");
        if proxied {
            request = request.header("x-forwarded-for", client.to_string());
        }
        let mut request = request.body(Body::empty()).unwrap();
        let peer = if proxied {
            proxy
        } else {
            SocketAddr::new(IpAddr::V4(client), 40_000)
        };
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = now(app.clone().oneshot(request)).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}
