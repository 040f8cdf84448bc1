//! The route-level layer against `tower_governor` on the same axum app,
//! measured side by side in one run: one `Router` with one route, the layer
//! added with `route_layer`, each request sent in process with
//! `ServiceExt::oneshot` (everything completes without suspending, so a
//! request is polled once), keyed by the peer IP of `ConnectInfo`.
//!
//! `cargo bench -p ratewall --features tower,axum --bench tower` (feature `axum`:
//! the layer reads the client address from axum's `ConnectInfo`)
//!
//! - `allowed`: 1 024 client IPs in turn, every request admitted (GCRA on
//!   both sides); `rl_layer` adds the `RateLimit` fields to each response
//!   (its default), `rl_layer_no_headers` does not (as `tower_governor`'s
//!   default); `tower_governor_headers` adds its `x-ratelimit-limit` and
//!   `x-ratelimit-remaining` (`use_headers()`), the counterpart of
//!   `rl_layer`; `bare` is the app without a limit.
//! - `refused`: one client over its limit, every request answered `429`.
//! - `proxied`: the same 1 024 clients behind a reverse proxy: every
//!   request comes from the proxy's address (`10.0.0.1`) with the client in
//!   `X-Forwarded-For`. Both sides proxy-aware and with headers, like with
//!   like: `rl_layer_trusted_proxies` trusts `10.0.0.0/8`
//!   (`trusted_proxies`), `tower_governor_smart_headers` takes the client
//!   from the headers with `SmartIpKeyExtractor` (it trusts any sender).
//!
//! Requests per second are the reciprocal of the time per request (one
//! thread); the ratio of `rl_layer*` to `tower_governor` is what the README
//! reports.

use std::future::Future;
use std::hint::black_box;
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
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewall::http::TrustedProxies;
use ratewall::tower::{KeyFrom, RateLimitLayer};
use ratewall::{Limit, Limiter};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::{KeyExtractor, PeerIpKeyExtractor, SmartIpKeyExtractor};

/// Client IPs of the `allowed` group.
const CLIENTS: u32 = 1024;

/// Polls a future that completes without suspending.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-process request suspended"),
    }
}

fn app() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn request(peer: SocketAddr) -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).unwrap();
    request.extensions_mut().insert(ConnectInfo(peer));
    request
}

/// The proxy every `proxied` request comes from.
const PROXY: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)), 443);

/// `client`'s request as the proxy forwards it.
fn forwarded(client: SocketAddr) -> Request<Body> {
    let mut request = Request::get("/")
        .header("x-forwarded-for", client.ip().to_string())
        .body(Body::empty())
        .unwrap();
    request.extensions_mut().insert(ConnectInfo(PROXY));
    request
}

fn peer(i: u32) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0xC000_0200 + i)), 40_000)
}

fn rl(limit: Limit, headers: bool) -> Router {
    rl_layer(limit, headers, None)
}

/// `rl` with headers behind the proxy: the client is the right-most
/// `X-Forwarded-For` entry a trusted proxy added.
fn rl_trusted_proxies(limit: Limit) -> Router {
    rl_layer(limit, true, Some("10.0.0.0/8".parse().unwrap()))
}

fn rl_layer(limit: Limit, headers: bool, proxies: Option<TrustedProxies>) -> Router {
    let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
    let mut layer = RateLimitLayer::builder("bench")
        .key("bench", [limit], KeyFrom::client_ip())
        .limiter(limiter)
        .headers(headers);
    if let Some(proxies) = proxies {
        layer = layer.trusted_proxies(proxies);
    }
    app().route_layer(layer.build().unwrap())
}

fn governor(per_nanos: u64, burst: u32) -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(per_nanos)
        .burst_size(burst)
        .finish()
        .unwrap();
    app().route_layer(GovernorLayer::new(Arc::new(config)))
}

/// `tower_governor` with its `x-ratelimit-*` headers on admitted responses
/// (`use_headers`), the counterpart of `rl_layer` with its `RateLimit`
/// fields, keyed by the peer address.
fn governor_headers(per_nanos: u64, burst: u32) -> Router {
    governor_headers_by(PeerIpKeyExtractor, per_nanos, burst)
}

/// `governor_headers` taking the client from the forwarding headers.
fn governor_smart_headers(per_nanos: u64, burst: u32) -> Router {
    governor_headers_by(SmartIpKeyExtractor, per_nanos, burst)
}

fn governor_headers_by<K>(key: K, per_nanos: u64, burst: u32) -> Router
where
    K: KeyExtractor + Send + Sync + 'static,
    K::Key: Send + Sync + 'static,
{
    let config = GovernorConfigBuilder::default()
        .key_extractor(key)
        .use_headers()
        .per_nanosecond(per_nanos)
        .burst_size(burst)
        .finish()
        .unwrap();
    app().route_layer(GovernorLayer::new(Arc::new(config)))
}

/// Sends requests from `clients` peers in turn (each made by `make`),
/// checking each status once.
fn bench(
    c: &mut Criterion,
    group: &str,
    apps: &[(&str, Router)],
    clients: u32,
    status: StatusCode,
    make: fn(SocketAddr) -> Request<Body>,
) {
    let mut group = c.benchmark_group(group);
    group.throughput(Throughput::Elements(1));
    let peers: Vec<SocketAddr> = (0..clients).map(peer).collect();
    for (name, app) in apps {
        for &peer in &peers {
            let response = now(app.clone().oneshot(make(peer))).unwrap();
            let expected = if *name == "bare" {
                StatusCode::OK
            } else {
                status
            };
            assert_eq!(response.status(), expected, "{name}");
        }
        let mut i = 0;
        group.bench_function(*name, |b| {
            b.iter(|| {
                i = (i + 1) % peers.len();
                black_box(now(app.clone().oneshot(make(peers[i]))).unwrap())
            })
        });
    }
    group.finish();
}

fn tower(c: &mut Criterion) {
    // Admitted: far below the limits.
    let ample = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    let allowed = [
        ("bare", app()),
        ("rl_layer", rl(ample, true)),
        ("rl_layer_no_headers", rl(ample, false)),
        ("tower_governor", governor(1, u32::MAX)),
        ("tower_governor_headers", governor_headers(1, u32::MAX)),
    ];
    bench(c, "allowed", &allowed, CLIENTS, StatusCode::OK, request);
    let proxied = [
        ("rl_layer_trusted_proxies", rl_trusted_proxies(ample)),
        (
            "tower_governor_smart_headers",
            governor_smart_headers(1, u32::MAX),
        ),
    ];
    bench(c, "proxied", &proxied, CLIENTS, StatusCode::OK, forwarded);
    // Refused: one request per hour, spent by the check of the first request.
    let hourly = Limit::per_hour(1).unwrap();
    let refused = [
        ("rl_layer", rl(hourly, true)),
        ("tower_governor", governor(3_600_000_000_000, 1)),
    ];
    let warm = |apps: &[(&str, Router)]| {
        for (_, app) in apps {
            let _ = now(app.clone().oneshot(request(peer(0))));
        }
    };
    warm(&refused);
    bench(
        c,
        "refused",
        &refused,
        1,
        StatusCode::TOO_MANY_REQUESTS,
        request,
    );
}

criterion_group!(benches, tower);
criterion_main!(benches);
