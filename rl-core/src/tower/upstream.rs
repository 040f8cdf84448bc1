//! Limits on what we send out: a [`tower::Layer`] for *client* services
//! (an HTTP client, a gRPC channel) calling an upstream that limits us, its
//! budget shared by every instance through the limiter's store.
//!
//! Each outgoing request draws on the budget first ([`Draw`]: an identity
//! and a cost per group of the spec), waiting for room rather than failing
//! (queue, don't stampede); the upstream's answer is then heard
//! ([`Limiter::hold`]): its `Retry-After` pauses the budget for every
//! instance, and so does a count it says is spent, until that count
//! resets; its remaining counts bound it, and a `429` or `503` that pauses
//! nothing pauses it for [`UpstreamLayer::pause_on_refusal`] (a pause is
//! believed up to [`UpstreamLayer::max_pause`]). A request the upstream
//! refused (`429`) took nothing upstream: in a spec whose groups settle
//! their cost ([`crate::GroupSpec::settled`]), its estimate is given back
//! (in every group, requests too, when the budget finds its limit,
//! [`UpstreamLayer::auto`]: its count is where it reads the upstream's,
//! which never counted the refused call), before the pause is written. Otherwise the estimate stays taken, unless
//! [`UpstreamLayer::settle_with`] reads the real cost from the response
//! (costs known only from a response body, such as a language model's
//! token usage, are settled by the reqwest middleware, feature `reqwest`,
//! which watches the body, or with the call API: [`crate::Permit::settle_cost`]).
//!
//! A request of this instance already waiting for a slot it reserved, when
//! the upstream's pause is heard, reserves again if its slot falls inside
//! the pause, and goes after it. One waiting in another instance keeps its
//! slot (that instance has not heard the pause); if the upstream refuses it
//! too, its answer pauses the budget again there.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::limiter::Limiter;
use crate::limiter::auto::Auto;
use crate::limiter::outbound::{Draw, Outbound};
use crate::limiter::spec::CallSpec;
use crate::limiter::upstream::Counts;
use crate::model::rejection::Rejection;

/// Why an outgoing request did not get an answer from the upstream.
#[derive(Debug)]
pub enum UpstreamError<E> {
    /// The budget refused it (no room within the wait, or the limiter could
    /// not decide under a closed failure policy): never sent.
    Refused(Rejection),
    /// The client service failed.
    Service(E),
}

impl<E: fmt::Display> fmt::Display for UpstreamError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpstreamError::Refused(rejection) => {
                write!(f, "not sent: the upstream's budget refused it: {rejection}")
            }
            UpstreamError::Service(error) => write!(f, "the upstream call failed: {error}"),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for UpstreamError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            UpstreamError::Refused(rejection) => Some(rejection),
            UpstreamError::Service(error) => Some(error),
        }
    }
}

/// The real cost of a request, read from its response (per group; `None`
/// keeps the estimate).
type SettleFn<RB> = dyn Fn(&http::Response<RB>) -> Option<u64> + Send + Sync;

struct Shared<F, RB> {
    outbound: Outbound,
    draw: F,
    settle: Option<Box<SettleFn<RB>>>,
}

/// A layer for client services calling an upstream that limits us: each
/// request draws on the shared budget first ([`Draw`]), waiting for room;
/// the upstream's answer is heard ([`Limiter::hold`]): its `Retry-After`
/// pauses the budget for every instance (believed up to
/// [`UpstreamLayer::max_pause`]; a `429`/`503` that pauses nothing pauses it for
/// [`UpstreamLayer::pause_on_refusal`]), its remaining counts bound it, and
/// a `429`'s estimate is given back in a spec whose groups settle their
/// cost. A request of this instance waiting for a slot it reserved inside
/// a pause the upstream then said reserves again, after the pause.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ratewall::tower::UpstreamLayer;
/// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, upstream::{Counts, Draw}};
/// use tower::{Layer, Service, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = Arc::new(Limiter::builder().memory().build()?);
/// let spec = CallSpec::owned("partner", vec![GroupSpec::owned("partner_rpm", vec![Limit::per_second(2)?])]);
/// // A client service (here: an upstream answering 429 with Retry-After).
/// let upstream = service_fn(|_request: http::Request<String>| async {
///     let response = http::Response::builder().status(429).header("retry-after", "1").body(String::new())?;
///     Ok::<_, http::Error>(response)
/// });
/// let layer = UpstreamLayer::new(limiter.clone(), spec, [Counts::Requests], |_: &http::Request<String>| {
///     Draw::new(["partner-a"])
/// })
/// .wait(Duration::ZERO);
/// let mut client = layer.layer(upstream);
/// let answered = client.ready().await?.call(http::Request::new(String::new())).await?;
/// assert_eq!(answered.status(), 429);
/// // Every instance sharing the budget now waits out the upstream's second.
/// let refused = client.ready().await?.call(http::Request::new(String::new())).await;
/// assert!(refused.is_err());
/// # Ok(())
/// # }
/// ```
pub struct UpstreamLayer<F, RB = ()> {
    shared: Arc<Shared<F, RB>>,
}

impl<F, RB> Clone for UpstreamLayer<F, RB> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<F, RB> fmt::Debug for UpstreamLayer<F, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamLayer")
            .field("call", &self.shared.outbound.spec.name())
            .field("counts", &self.shared.outbound.counts)
            .field("wait", &self.shared.outbound.wait)
            .finish_non_exhaustive()
    }
}

impl<F, RB> UpstreamLayer<F, RB> {
    /// Outgoing requests drawing on `spec`'s groups in `limiter`, each
    /// group counting what `counts` says (to read the upstream's headers;
    /// one per group), each request's [`Draw`] read by `draw`. Waits up to
    /// 60 s for room by default, or not at all when `spec`'s calls cannot
    /// wait (a group with an in-flight limit, limits that mix the reserving
    /// algorithms with the window ones, or selective counting: see
    /// [`UpstreamLayer::wait`]); a `429`/`503` without `Retry-After`
    /// pauses the budget for 1 s; a pause is believed up to 5 minutes.
    pub fn new(
        limiter: Arc<Limiter>,
        spec: CallSpec,
        counts: impl IntoIterator<Item = Counts>,
        draw: F,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                outbound: Outbound::new(limiter, spec, counts),
                draw,
                settle: None,
            }),
        }
    }

    fn with(self, change: impl FnOnce(&mut Shared<F, RB>)) -> Self {
        let mut shared = Arc::try_unwrap(self.shared)
            .unwrap_or_else(|_| unreachable!("a layer is configured before it is cloned"));
        change(&mut shared);
        Self {
            shared: Arc::new(shared),
        }
    }

    /// How long a request may wait for room (zero: refused at once).
    ///
    /// Calls of some specs cannot wait: a slot of an in-flight limit frees
    /// when a running call ends, which no reserved time can promise, and
    /// neither selective counting nor a mix of reserving and window
    /// algorithms can queue. Over such a spec a non-zero wait refuses every
    /// request as unavailable; it is logged here, once, with the reason
    /// (a `warn` event), and the default is zero.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|s| s.outbound.set_wait(wait, "UpstreamLayer::wait"))
    }

    /// How long a `429` or `503` that pauses nothing (no `Retry-After`, no
    /// spent count with a reset) pauses the budget.
    pub fn pause_on_refusal(self, pause: Duration) -> Self {
        self.with(|s| s.outbound.pause_on_refusal = pause)
    }

    /// The longest pause an upstream's `Retry-After` or reset is believed
    /// for (a remote server's word; default 5 minutes).
    pub fn max_pause(self, max: Duration) -> Self {
        self.with(|s| s.outbound.max_pause = max)
    }

    /// Finds the upstream's limit ([`Auto`]): the spec's stated limits are
    /// where the budget starts; every answer is heard
    /// ([`Limiter::learn`]): a limit the upstream says is taken, a `429` or
    /// `503` lowers the shared scale to what the budget's own count says,
    /// what an answer says is left above zero finds the limit (and is not
    /// also written into the budget), accepted calls climb toward the limit
    /// found. A request the budget refuses reads the shared scale when it
    /// is due ([`Limiter::refresh_learned`]), and so does one waiting on a
    /// budget of windows, between its tries (at most once per
    /// [`Auto::every`]): a request that waited through a pause another
    /// instance heard goes on with the limit learned from that refusal.
    pub fn auto(self, auto: Auto) -> Self {
        self.with(|s| s.outbound.auto = Some(auto))
    }

    /// Reads the real cost of a request from its response (every settled
    /// group's; `None` keeps the estimate), e.g. from a usage header.
    pub fn settle_with(
        self,
        settle: impl Fn(&http::Response<RB>) -> Option<u64> + Send + Sync + 'static,
    ) -> Self {
        self.with(|s| s.settle = Some(Box::new(settle)))
    }
}

impl<S, F, RB> tower::Layer<S> for UpstreamLayer<F, RB> {
    type Service = Upstream<S, F, RB>;

    fn layer(&self, inner: S) -> Self::Service {
        Upstream {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The client service [`UpstreamLayer`] makes.
pub struct Upstream<S, F, RB = ()> {
    inner: S,
    shared: Arc<Shared<F, RB>>,
}

impl<S: Clone, F, RB> Clone for Upstream<S, F, RB> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S, F, RB> fmt::Debug for Upstream<S, F, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Upstream")
            .field("call", &self.shared.outbound.spec.name())
            .finish_non_exhaustive()
    }
}

/// The future of an [`Upstream`] call.
pub type UpstreamFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, UpstreamError<E>>> + Send>>;

impl<S, F, B, RB> tower::Service<http::Request<B>> for Upstream<S, F, RB>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    F: Fn(&http::Request<B>) -> Draw + Send + Sync + 'static,
    B: Send + 'static,
    RB: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = UpstreamError<S::Error>;
    type Future = UpstreamFuture<http::Response<RB>, S::Error>;

    /// Always ready: the client service is made ready once the budget has
    /// admitted a request (a request waiting for room holds no capacity of
    /// the client's, e.g. a `Buffer`'s slot).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let draw = (self.shared.draw)(&request);
        let shared = self.shared.clone();
        let mut inner = self.inner.clone();
        Box::pin(async move {
            let outbound = &shared.outbound;
            let permit = outbound.draw(&draw).await.map_err(UpstreamError::Refused)?;
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(UpstreamError::Service)?;
            let response = inner.call(request).await.map_err(UpstreamError::Service)?;
            let headers = response
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_bytes()));
            let heard = outbound
                .hear(permit, &draw, response.status().as_u16(), headers)
                .await;
            let actual = match &shared.settle {
                Some(settle) if heard.reads_cost() => settle(&response),
                _ => None,
            };
            heard.settle(outbound, &draw, actual).await;
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests;
