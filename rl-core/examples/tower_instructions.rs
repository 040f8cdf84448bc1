//! Instructions per request of the route-level layer and of
//! `tower_governor`, counted by callgrind (exact, unlike timings on a busy
//! machine): the axum app of `benches/tower.rs`, 2 048 warm-up requests
//! over 1 024 client IPs, then N measured ones.
//!
//! ```text
//! cargo build --release -p ratewall --features tower --example tower_instructions
//! for v in bare rl rl_no_headers tower_governor tower_governor_headers; do
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
use ratewall::tower::{KeyFrom, RateLimitLayer};
use ratewall::{Limit, Limiter};
use tower::ServiceExt;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;

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
            "usage: tower_instructions bare|rl|rl_no_headers|tower_governor|tower_governor_headers N"
        );
        std::process::exit(2);
    };
    let app = Router::new().route("/", get(|| async { "ok" }));
    let ample = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    let rl = |headers| {
        let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
        RateLimitLayer::builder("bench")
            .key("bench", [ample], KeyFrom::client_ip())
            .limiter(limiter)
            .headers(headers)
            .build()
            .unwrap()
    };
    let app = match variant.as_str() {
        "bare" => app,
        "rl" => app.route_layer(rl(true)),
        "rl_no_headers" => app.route_layer(rl(false)),
        "tower_governor" => {
            let config = GovernorConfigBuilder::default()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .unwrap();
            app.route_layer(GovernorLayer::new(Arc::new(config)))
        }
        "tower_governor_headers" => {
            let config = GovernorConfigBuilder::default()
                .use_headers()
                .per_nanosecond(1)
                .burst_size(u32::MAX)
                .finish()
                .unwrap();
            app.route_layer(GovernorLayer::new(Arc::new(config)))
        }
        other => {
            eprintln!("unknown variant `{other}`");
            std::process::exit(2);
        }
    };
    warm(&app, 2048);
    measured(&app, n);
}

#[inline(never)]
fn warm(app: &Router, n: u32) {
    requests(app, n)
}

#[inline(never)]
fn measured(app: &Router, n: u32) {
    requests(app, n)
}

fn requests(app: &Router, n: u32) {
    for i in 0..n {
        let peer = SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0xC000_0200 + i % 1024)), 40_000);
        let mut request = Request::get("/").body(Body::empty()).unwrap();
        request.extensions_mut().insert(ConnectInfo(peer));
        let response = now(app.clone().oneshot(request)).unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
}
