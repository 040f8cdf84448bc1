use super::*;
use crate::limiter::spec::GroupSpec;

/// A group with a concurrency limit (one slot of two taken: 1 left) and
/// a rate limit (99 of 100 left).
fn jobs() -> CallSpec {
    CallSpec::owned(
        "jobs",
        vec![GroupSpec::owned(
            "jobs",
            vec![
                Limit::in_flight(2).unwrap(),
                Limit::per_minute(100).unwrap(),
            ],
        )],
    )
}

#[test]
fn the_binding_limit_is_a_rate_limit_even_when_an_in_flight_slot_has_fewer_left() {
    let limiter = Limiter::builder().memory().build().unwrap();
    let spec = jobs();
    let permit = limiter.call(&spec, &[&"tenant"]).now().unwrap().unwrap();
    let (name, decision, limit) = permit.binding().unwrap();
    assert_eq!(name, "jobs");
    assert_eq!(limit, Limit::per_minute(100).unwrap());
    assert_eq!(decision.remaining(), 99);
    let (group, decision, limit) = permit.binding_group().unwrap();
    assert_eq!((group, decision.remaining()), (0, 99));
    assert_eq!(limit, Limit::per_minute(100).unwrap());
}

#[cfg(feature = "tower")]
#[test]
fn the_layer_describes_the_rate_limit_of_a_group_with_an_in_flight_limit() {
    use crate::tower::{KeyFrom, RateLimitLayer};
    use ::tower::ServiceExt;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
    let layer = RateLimitLayer::builder("jobs")
        .key(
            "jobs",
            [
                Limit::in_flight(2).unwrap(),
                Limit::per_minute(100).unwrap(),
            ],
            KeyFrom::header("x-tenant"),
        )
        .limiter(limiter)
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .route_layer(layer);
    let request = http::Request::get("/")
        .header("x-tenant", "t1")
        .body(axum::body::Body::empty())
        .unwrap();
    let Poll::Ready(response) = pin!(app.oneshot(request))
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    else {
        panic!("an in-memory request suspended");
    };
    let response = response.unwrap();
    assert_eq!(response.status(), http::StatusCode::OK);
    let headers = response.headers();
    assert_eq!(headers["ratelimit-policy"], "\"jobs\";q=100;w=60");
    // One unit of a 100-per-minute GCRA comes back within a second.
    assert_eq!(headers["ratelimit"], "\"jobs\";r=99;t=1");
}
