//! Limits on what we send out: a [`tower::Layer`] for *client* services
//! (an HTTP client, a gRPC channel) calling an upstream that limits us, its
//! budget shared by every instance through the limiter's store.
//!
//! Each outgoing request draws on the budget first ([`Draw`]: an identity
//! and a cost per group of the spec), waiting for room rather than failing
//! (queue, don't stampede); the upstream's answer is then heard
//! ([`Limiter::hold`]): its `Retry-After` pauses the budget for every
//! instance, its remaining counts bound it, and a `429` or `503` without a
//! `Retry-After` pauses it for [`UpstreamLayer::pause_on_refusal`] (a pause
//! is believed up to [`UpstreamLayer::max_pause`]). A request the upstream
//! refused (`429`) took nothing upstream: in a spec whose groups settle
//! their cost ([`crate::GroupSpec::settled`]), its estimate is given back,
//! before the pause is written. Otherwise the estimate stays taken, unless
//! [`UpstreamLayer::settle_with`] reads the real cost from the response
//! (costs known only from a response body, such as a language model's
//! token usage, are settled with the call API: [`crate::Permit::settle_cost`]).
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

use smallvec::SmallVec;

use crate::limiter::Limiter;
use crate::limiter::auto::Auto;
use crate::limiter::call::Keys;
use crate::limiter::spec::CallSpec;
use crate::limiter::upstream::{Counts, Hold};
use crate::limiter::wait::stated_cannot_wait;
use crate::model::rejection::Rejection;

/// What one outgoing request draws on: an identity per group of the
/// layer's spec (in order) and its cost in each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draw {
    identities: SmallVec<[String; 2]>,
    costs: SmallVec<[u64; 2]>,
}

impl Draw {
    /// Draws on each group with its identity, at each group's own cost.
    pub fn new<I: Into<String>>(identities: impl IntoIterator<Item = I>) -> Self {
        Self {
            identities: identities.into_iter().map(Into::into).collect(),
            costs: SmallVec::new(),
        }
    }

    /// This request's cost in each group (an estimate, where the real
    /// cost is settled later), one per group.
    pub fn costs(mut self, costs: impl IntoIterator<Item = u64>) -> Self {
        self.costs = costs.into_iter().collect();
        self
    }
}

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
    limiter: Arc<Limiter>,
    spec: CallSpec,
    counts: Vec<Counts>,
    draw: F,
    wait: Duration,
    pause_on_refusal: Duration,
    max_pause: Duration,
    settle: Option<Box<SettleFn<RB>>>,
    auto: Option<Auto>,
}

/// A layer for client services calling an upstream that limits us: each
/// request draws on the shared budget first ([`Draw`]), waiting for room;
/// the upstream's answer is heard ([`Limiter::hold`]): its `Retry-After`
/// pauses the budget for every instance (believed up to
/// [`UpstreamLayer::max_pause`]; a `429`/`503` without one pauses it for
/// [`UpstreamLayer::pause_on_refusal`]), its remaining counts bound it, and
/// a `429`'s estimate is given back in a spec whose groups settle their
/// cost. A request of this instance waiting for a slot it reserved inside
/// a pause the upstream then said reserves again, after the pause.
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ratewall::tower::{Draw, UpstreamLayer};
/// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, upstream::Counts};
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
            .field("call", &self.shared.spec.name())
            .field("counts", &self.shared.counts)
            .field("wait", &self.shared.wait)
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
        // A wait the spec cannot take would refuse every request.
        let wait = match stated_cannot_wait(&spec) {
            Some(_) => Duration::ZERO,
            None => Duration::from_secs(60),
        };
        Self {
            shared: Arc::new(Shared {
                limiter,
                spec,
                counts: counts.into_iter().collect(),
                draw,
                wait,
                pause_on_refusal: Duration::from_secs(1),
                max_pause: Duration::from_secs(300),
                settle: None,
                auto: None,
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
        if !wait.is_zero()
            && let Some(why) = stated_cannot_wait(&self.shared.spec)
        {
            tracing::warn!(call = %self.shared.spec.name(), error = %why, "UpstreamLayer::wait over a spec that cannot wait");
        }
        self.with(|s| s.wait = wait)
    }

    /// How long a `429` or `503` without `Retry-After` pauses the budget.
    pub fn pause_on_refusal(self, pause: Duration) -> Self {
        self.with(|s| s.pause_on_refusal = pause)
    }

    /// The longest pause an upstream's `Retry-After` is believed for (a
    /// remote server's word; default 5 minutes).
    pub fn max_pause(self, max: Duration) -> Self {
        self.with(|s| s.max_pause = max)
    }

    /// Finds the upstream's limit ([`Auto`]): the spec's stated limits are
    /// where the budget starts; every answer is heard
    /// ([`Limiter::learn`]): a limit the upstream says is taken, a `429` or
    /// `503` lowers the shared scale, accepted calls raise it. A request the
    /// budget refuses reads the shared scale when it is due
    /// ([`Limiter::refresh_learned`]).
    pub fn auto(self, auto: Auto) -> Self {
        self.with(|s| s.auto = Some(auto))
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
            .field("call", &self.shared.spec.name())
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
            let identities: SmallVec<[&(dyn fmt::Display + Sync); 2]> = draw
                .identities
                .iter()
                .map(|i| i as &(dyn fmt::Display + Sync))
                .collect();
            let keys = || Keys::new(&identities);
            let permit = match shared
                .limiter
                .call_with(&shared.spec, keys().costs(&draw.costs).wait(shared.wait))
                .await
            {
                Ok(permit) => permit,
                Err(refused) => {
                    // Paused, perhaps by another instance: the scale it
                    // learned applies here before the pause ends (not
                    // asked of a store that could not decide).
                    if let Some(auto) = &shared.auto
                        && refused.retry_after().is_some()
                        && let Err(error) = shared.limiter.refresh_learned(&shared.spec, auto).await
                    {
                        tracing::warn!(call = shared.spec.name(), %error, "the upstream's learned limit could not be read");
                    }
                    return Err(UpstreamError::Refused(refused));
                }
            };
            std::future::poll_fn(|cx| inner.poll_ready(cx))
                .await
                .map_err(UpstreamError::Service)?;
            let response = inner.call(request).await.map_err(UpstreamError::Service)?;
            let mut hold = Hold::from_headers(
                response
                    .headers()
                    .iter()
                    .map(|(name, value)| (name.as_str(), value.as_bytes())),
                &shared.counts,
            );
            let status = response.status().as_u16();
            if matches!(status, 429 | 503) && !hold.pauses() {
                hold = hold.pause(shared.pause_on_refusal);
            }
            let actual = if status == 429 {
                // Refused upstream: it took nothing there.
                Some(0)
            } else {
                shared.settle.as_ref().and_then(|settle| settle(&response))
            };
            let hold = hold.capped(shared.max_pause);
            let share = || async {
                if let Err(error) = shared.limiter.hold(&shared.spec, keys(), &hold).await {
                    tracing::warn!(call = shared.spec.name(), %error, "the upstream's rate-limit word could not be shared");
                }
            };
            // A pause is shared first: every instance sees it one store
            // call after the refusal, not two, so fewer requests reach the
            // upstream while it refuses.
            let pauses = hold.pauses();
            if pauses {
                share().await;
            }
            let settled = match actual {
                Some(actual) if permit.settle.is_some() => {
                    permit.settle_cost(actual).await;
                    true
                }
                _ => {
                    drop(permit);
                    false
                }
            };
            // Shared after the settlement (again, after a pause: an estimate
            // given back cannot reopen it).
            if !pauses || settled {
                share().await;
            }
            if let Some(auto) = &shared.auto {
                let accepted = !matches!(status, 429 | 503);
                if let Err(error) = shared
                    .limiter
                    .learn(&shared.spec, auto, accepted, &hold)
                    .await
                {
                    tracing::warn!(call = shared.spec.name(), %error, "the upstream's limit could not be learned");
                }
            }
            Ok(response)
        })
    }
}

#[cfg(test)]
mod tests;
