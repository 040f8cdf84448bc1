//! An axum handler limited by `#[rate_limit]`: two requests a minute per
//! client IP, with the IETF `RateLimit` fields on admitted responses and a
//! `429` with `Retry-After` on refused ones.
//!
//! `cargo run -p ratewall --features axum --example axum_handler`
//!
//! The example sends four requests straight to the router (no socket) and
//! prints each answer. A server gives `ClientIp` the peer's address when the
//! router is served with connect info:
//! `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`;
//! here each request carries that address itself.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::Response;
use axum::routing::get;
use http::Request;
use ratewall::http::ClientIp;
use ratewall::{Limiter, Rejection, rate_limit};
use tower::ServiceExt;

/// Two a minute per client; `headers` adds `RateLimit-Policy` and
/// `RateLimit` to the response, and a `Rejection` answers `429`.
#[rate_limit(name = "hello", key = ip, limits = ["2/1m"], headers)]
async fn hello(ip: ClientIp) -> Result<Response, Rejection> {
    Ok(Response::new(Body::from(format!("hello {ip}\n"))))
}

/// A request from `peer`, as a server with connect info would pass it on.
fn request_from(peer: [u8; 4]) -> Request<Body> {
    let mut request = Request::get("/hello").body(Body::empty()).unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((peer, 40_000))));
    request
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    Limiter::builder().memory().install()?;
    let app = Router::new().route("/hello", get(hello));

    let mut statuses = Vec::new();
    for peer in [
        [192, 0, 2, 1],
        [192, 0, 2, 1],
        [192, 0, 2, 1],
        [192, 0, 2, 2],
    ] {
        let response = app.clone().oneshot(request_from(peer)).await?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .map_or("-", |v| v.to_str().unwrap_or("?"))
                .to_owned()
        };
        println!(
            "{peer:?}: {} ratelimit: {} retry-after: {}",
            response.status(),
            header("ratelimit"),
            header("retry-after"),
        );
        if response.status() == 429 {
            // GCRA gives one request back every 30 s after the burst of two.
            assert_eq!(header("retry-after"), "30");
        }
        statuses.push(response.status().as_u16());
    }
    // The third request of 192.0.2.1 is refused; 192.0.2.2 has its own quota.
    assert_eq!(statuses, [200, 200, 429, 200]);
    Ok(())
}
