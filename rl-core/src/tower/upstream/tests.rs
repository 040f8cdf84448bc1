//! The client layer's default wait: over a spec whose calls cannot wait,
//! requests are decided at once instead of refused for waiting.

use std::sync::Arc;
use std::time::Duration;

use tower::{Layer, Service, ServiceExt};

use super::{UpstreamError, UpstreamLayer};
use crate::testing::{NowOrNever, logged};
use crate::upstream::Draw;
use crate::{CallSpec, GroupSpec, Limit, Limiter, upstream::Counts};

/// A spec of one group: 100 a second and at most `in_flight` at once
/// (`None`: no in-flight limit).
fn spec(in_flight: Option<u64>) -> CallSpec {
    let mut limits = vec![Limit::per_second(100).unwrap()];
    limits.extend(in_flight.map(|max| Limit::in_flight(max).unwrap()));
    CallSpec::owned("partner", vec![GroupSpec::owned("partner_calls", limits)])
}

fn layer(spec: CallSpec) -> UpstreamLayer<impl Fn(&http::Request<()>) -> Draw + Clone> {
    let limiter = Arc::new(Limiter::builder().memory().build().unwrap());
    UpstreamLayer::new(limiter, spec, [Counts::Requests], |_: &http::Request<()>| {
        Draw::new(["partner-a"])
    })
}

/// Sends one request through `layer` to an upstream answering 200, in
/// memory (decided at once): the upstream's status, or the refusal.
fn send<F>(layer: &UpstreamLayer<F>) -> Result<u16, String>
where
    F: Fn(&http::Request<()>) -> Draw + Send + Sync + 'static,
{
    let upstream = tower::service_fn(|_: http::Request<()>| async {
        Ok::<_, std::convert::Infallible>(http::Response::new(()))
    });
    let mut client = layer.layer(upstream);
    let sent = async move {
        let client = client.ready().await.expect("ready");
        client.call(http::Request::new(())).await
    };
    match sent.now_or_never().expect("decided at once") {
        Ok(response) => Ok(response.status().as_u16()),
        Err(UpstreamError::Refused(rejection)) => Err(rejection.to_string()),
        Err(UpstreamError::Service(never)) => match never {},
    }
}

#[test]
fn a_spec_that_can_wait_waits_a_minute_by_default() {
    let layer = layer(spec(None));
    assert!(format!("{layer:?}").contains("wait: 60s"), "{layer:?}");
    assert_eq!(send(&layer), Ok(200));
}

#[test]
fn a_spec_with_an_in_flight_limit_is_decided_at_once_by_default() {
    let layer = layer(spec(Some(2)));
    assert!(format!("{layer:?}").contains("wait: 0ns"), "{layer:?}");
    // Before the default followed the spec, each of these was refused as
    // "cannot wait".
    for _ in 0..3 {
        assert_eq!(send(&layer), Ok(200));
    }
}

#[test]
fn a_wait_set_over_a_spec_that_cannot_wait_is_logged_once_with_its_reason() {
    let ((waiting, answers), log) = logged(|| {
        let waiting = layer(spec(Some(2))).wait(Duration::from_secs(5));
        let answers: Vec<_> = (0..2).map(|_| send(&waiting)).collect();
        // A wait over a spec that can wait says nothing.
        let _ = layer(spec(None)).wait(Duration::from_secs(5));
        (waiting, answers)
    });
    // Once at configuration (each refused call then logs its own error).
    let warned: Vec<_> = log.lines().filter(|l| l.contains("WARN")).collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("UpstreamLayer::wait"), "{log}");
    assert!(warned[0].contains("has an in-flight limit"), "{log}");
    assert!(format!("{waiting:?}").contains("wait: 5s"), "{waiting:?}");
    // As documented: every request of it is refused for waiting.
    for answer in answers {
        let refusal = answer.expect_err("a call that cannot wait is refused");
        assert!(refusal.contains("unavailable"), "{refusal}");
    }
}
