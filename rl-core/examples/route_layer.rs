//! Route-level limits without touching the handlers: a `RateLimitLayer` on
//! one route of an axum router, keyed by client IP, while another route
//! stays unlimited.
//!
//! `cargo run -p ratewall --features tower,axum --example route_layer` (feature
//! `axum`: the layer reads the client address from axum's `ConnectInfo`)
//!
//! The example sends requests straight to the router (no socket) and prints
//! each answer. Served for real, the router needs connect info for the
//! client IP: `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`;
//! here each request carries the peer address itself.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use http::Request;
use ratewall::Limiter;
use ratewall::tower::{KeyFrom, RateLimitLayer};
use tower::ServiceExt;

/// A `GET path` from 198.51.100.7, as a server with connect info would pass it on.
fn request(path: &str) -> Request<Body> {
    let mut request = Request::get(path).body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([198, 51, 100, 7], 40_000))));
    request
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let limiter = Arc::new(Limiter::builder().memory().build()?);
    // Three searches a minute per client IP (IPv6 clients by /64).
    let search_limit = RateLimitLayer::builder("search")
        .key("search_ip", ["3/1m"], KeyFrom::client_ip())
        .limiter(limiter)
        .build()?;
    let app = Router::new()
        .route("/search", get(|| async { "results\n" }))
        .route_layer(search_limit)
        .route("/health", get(|| async { "ok\n" }));

    let mut statuses = Vec::new();
    for path in ["/search", "/search", "/search", "/search", "/health"] {
        let response = app.clone().oneshot(request(path)).await?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map_or("-", |v| v.to_str().unwrap_or("?"))
                .to_owned()
        };
        println!(
            "GET {path}: {} ratelimit: {} retry-after: {}",
            response.status(),
            header("ratelimit"),
            header("retry-after"),
        );
        if response.status() == 429 {
            // GCRA gives one search back every 20 s after the burst of three.
            assert_eq!(header("retry-after"), "20");
        }
        statuses.push(response.status().as_u16());
    }
    // The fourth search within the minute is refused; /health has no limit.
    assert_eq!(statuses, [200, 200, 200, 429, 200]);
    Ok(())
}
