//! Budgets for calls out through [reqwest](https://docs.rs/reqwest): a
//! [`reqwest_middleware`] middleware, [`UpstreamMiddleware`], with the
//! tower client layer's semantics ([`crate::tower::UpstreamLayer`], one
//! road for both), for a client calling an upstream that limits us, its
//! budget shared by every instance through the limiter's store.
//!
//! Each request draws on the budget first ([`Draw`]: read from the request
//! by the middleware's closure, or set on the request as an extension),
//! waiting for room rather than failing; a request the budget refuses is
//! never sent, and fails with
//! [`reqwest_middleware::Error::Middleware`] carrying the [`Rejection`]
//! ([`refusal`] finds it). The upstream's answer is then heard
//! ([`Limiter::hold`]): its `Retry-After` pauses the budget for every
//! instance, and so does a count it says is spent until that count resets;
//! its remaining counts bound it; a `429` or `503` without a pause pauses it
//! for [`UpstreamMiddleware::pause_on_refusal`] (a pause is believed up to
//! [`UpstreamMiddleware::max_pause`]). A `429` took nothing upstream: in a
//! spec whose groups settle their cost ([`crate::GroupSpec::settled`]), its
//! estimate is given back; in every group, requests too, when the budget
//! finds its limit ([`UpstreamMiddleware::auto`]: its count is where it
//! reads the upstream's, which never counted the refused call).
//!
//! The real cost is read from the response by
//! [`UpstreamMiddleware::settle_with`]'s closure ([`Cost`]): from its
//! headers at once, or from its body as the caller reads it ([`Cost::body`]
//! for a JSON answer, [`Cost::lines`] for the usage event at the end of a
//! streamed one, [`Cost::watch`] for any other reading). The response's
//! body is then wrapped: the call is settled when the body ends, before the
//! caller sees its end; a body that fails or is dropped before its end
//! keeps the estimate (as a dropped call does). What the upstream said is
//! shared after the settlement (an estimate given back cannot reopen room
//! the upstream does not have), and a budget that finds its limit
//! ([`UpstreamMiddleware::auto`]) hears the answer last.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ratewall::reqwest::{Cost, UpstreamMiddleware};
//! use ratewall::upstream::{Counts, Draw};
//! use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let limiter = Arc::new(Limiter::builder().memory().build()?); // or ratewall-redis, shared
//! // The upstream's limits: requests and tokens a minute, the tokens settled.
//! let budget = CallSpec::owned("openai", vec![
//!     GroupSpec::owned("openai_rpm", vec![Limit::per_minute(500)?]),
//!     GroupSpec::owned("openai_tpm", vec![Limit::per_minute(200_000)?]).settled(),
//! ]);
//! let middleware = UpstreamMiddleware::new(limiter, budget, [Counts::Requests, Counts::Tokens], |_: &reqwest::Request| {
//!     Draw::new(["gpt-4o"; 2]).costs([1, 4_000]) // the estimate: max_tokens and the prompt
//! })
//! // Streamed answers end with a usage event (`stream_options.include_usage`).
//! .settle_with(|_: &reqwest::Response| Cost::lines(|line: &[u8]| {
//!     let event = std::str::from_utf8(line).ok()?.strip_prefix("data: ")?;
//!     let at = event.find("\"total_tokens\":")? + "\"total_tokens\":".len();
//!     event[at..].split(|c: char| !c.is_ascii_digit()).next()?.parse().ok()
//! }));
//! let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new()).with(middleware).build();
//! let answer = client
//!     .post("http://127.0.0.1:8080/v1/chat/completions")
//!     .body(r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[]}"#)
//!     .send()
//!     .await?;
//! let _text = answer.text().await?; // read to its end: the call is settled at its real tokens
//! # Ok(())
//! # }
//! ```

mod body;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::limiter::Limiter;
use crate::limiter::auto::Auto;
use crate::limiter::outbound::{Draw, Outbound};
use crate::limiter::spec::CallSpec;
use crate::limiter::upstream::Counts;
use crate::model::rejection::Rejection;

pub use body::{Cost, Watch};

use body::{Kind, Watched, Watching};

type DrawFn = dyn Fn(&reqwest::Request) -> Draw + Send + Sync;
type CostFn = dyn Fn(&reqwest::Response) -> Cost + Send + Sync;

/// A [`reqwest_middleware`] middleware drawing each request on a budget for
/// calls out (see [the module](self)): waits for room, sends, hears the
/// upstream's answer, settles the real cost (at the end of the body, when
/// the body tells it).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use ratewall::reqwest::{UpstreamMiddleware, refusal};
/// use ratewall::upstream::{Counts, Draw};
/// use ratewall::{CallSpec, GroupSpec, Limit, Limiter};
/// use reqwest_middleware::{ClientBuilder, Next, Result};
/// use std::{future::Future, pin::Pin};
///
/// /// The upstream, answered in process: `429` with `Retry-After: 1`.
/// fn upstream<'a>(_: reqwest::Request, _: &'a mut http::Extensions, _: Next<'a>)
///     -> Pin<Box<dyn Future<Output = Result<reqwest::Response>> + Send + 'a>> {
///     let refused = http::Response::builder().status(429).header("retry-after", "1").body("");
///     Box::pin(async move { Ok(refused.map_err(reqwest_middleware::Error::middleware)?.into()) })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
/// let limiter = Arc::new(Limiter::builder().memory().build()?);
/// let spec = CallSpec::owned("partner", vec![GroupSpec::owned("partner_rpm", vec![Limit::per_second(2)?])]);
/// let budget = UpstreamMiddleware::new(limiter, spec, [Counts::Requests], |_: &reqwest::Request| Draw::new(["partner-a"]))
///     .wait(Duration::ZERO);
/// let client = ClientBuilder::new(reqwest::Client::new()).with(budget).with(upstream).build();
/// let answered = client.get("http://partner.example/").send().await?;
/// assert_eq!(answered.status(), 429);
/// // Every instance sharing the budget now waits out the upstream's second: not sent.
/// let error = client.get("http://partner.example/").send().await.unwrap_err();
/// let refused = refusal(&error).expect("refused by the budget");
/// assert!(refused.retry_after().unwrap() > Duration::from_millis(500)); // most of it
/// # Ok(())
/// # }
/// ```
pub struct UpstreamMiddleware {
    outbound: Arc<Outbound>,
    draw: Box<DrawFn>,
    settle: Option<Box<CostFn>>,
}

impl fmt::Debug for UpstreamMiddleware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamMiddleware")
            .field("call", &self.outbound.spec.name())
            .field("counts", &self.outbound.counts)
            .field("wait", &self.outbound.wait)
            .finish_non_exhaustive()
    }
}

impl UpstreamMiddleware {
    /// Requests drawing on `spec`'s groups in `limiter`, each group
    /// counting what `counts` says (to read the upstream's headers; one per
    /// group), each request's [`Draw`] read by `draw`, unless the request
    /// carries one as an extension
    /// ([`reqwest_middleware::RequestBuilder::with_extension`]), which is
    /// drawn instead. Waits up to 60 s for room by default, or not at all
    /// when `spec`'s calls cannot wait (see [`UpstreamMiddleware::wait`]);
    /// a `429`/`503` that pauses nothing pauses the budget for 1 s; a
    /// pause is believed up to 5 minutes; the estimate stays unless
    /// [`UpstreamMiddleware::settle_with`] reads the real cost.
    pub fn new(
        limiter: Arc<Limiter>,
        spec: CallSpec,
        counts: impl IntoIterator<Item = Counts>,
        draw: impl Fn(&reqwest::Request) -> Draw + Send + Sync + 'static,
    ) -> Self {
        Self {
            outbound: Arc::new(Outbound::new(limiter, spec, counts)),
            draw: Box::new(draw),
            settle: None,
        }
    }

    fn with(mut self, change: impl FnOnce(&mut Outbound)) -> Self {
        // Shared only once requests are sent, by the middleware, which is
        // then no longer configured.
        let outbound = Arc::get_mut(&mut self.outbound)
            .unwrap_or_else(|| unreachable!("a middleware is configured before it is used"));
        change(outbound);
        self
    }

    /// How long a request may wait for room (zero: refused at once); a
    /// [`Draw::wait`] sets it per request.
    ///
    /// Calls of some specs cannot wait: a slot of an in-flight limit frees
    /// when a running call ends, which no reserved time can promise, and
    /// neither selective counting nor a mix of reserving and window
    /// algorithms can queue. Over such a spec a non-zero wait refuses every
    /// request as unavailable; it is logged here, once, with the reason
    /// (a `warn` event), and the default is zero.
    pub fn wait(self, wait: Duration) -> Self {
        self.with(|o| o.set_wait(wait, "UpstreamMiddleware::wait"))
    }

    /// How long a `429` or `503` that pauses nothing (no `Retry-After`, no
    /// spent count with a reset) pauses the budget (default 1 s).
    pub fn pause_on_refusal(self, pause: Duration) -> Self {
        self.with(|o| o.pause_on_refusal = pause)
    }

    /// The longest pause an upstream's `Retry-After` or reset is believed
    /// for (a remote server's word; default 5 minutes).
    pub fn max_pause(self, max: Duration) -> Self {
        self.with(|o| o.max_pause = max)
    }

    /// Finds the upstream's limit ([`Auto`]): the spec's stated limits are
    /// where the budget starts; every answer is heard
    /// ([`Limiter::learn`]; what an answer says is left above zero finds
    /// the limit, and is not also written into the budget); a request the
    /// budget refuses reads the shared scale when it is due
    /// ([`Limiter::refresh_learned`]), and so does one waiting on a budget
    /// of windows, between its tries (at most once per [`Auto::every`]): a
    /// request that waited through a pause another instance heard goes on
    /// with the limit learned from that refusal.
    pub fn auto(self, auto: Auto) -> Self {
        self.with(|o| o.auto = Some(auto))
    }

    /// Reads the real cost of each request from its response ([`Cost`]:
    /// now, or from its body, watched as the caller reads it). Not asked
    /// after a `429`, whose cost is zero. Without it, the estimate stays.
    pub fn settle_with(
        mut self,
        settle: impl Fn(&reqwest::Response) -> Cost + Send + Sync + 'static,
    ) -> Self {
        self.settle = Some(Box::new(settle));
        self
    }
}

/// The budget's refusal carried by `error`, if the middleware refused the
/// request (it was never sent): no room within the wait, or a limiter that
/// could not decide under a closed failure policy.
pub fn refusal(error: &reqwest_middleware::Error) -> Option<&Rejection> {
    match error {
        reqwest_middleware::Error::Middleware(error) => error.downcast_ref::<Rejection>(),
        _ => None,
    }
}

#[async_trait::async_trait]
impl reqwest_middleware::Middleware for UpstreamMiddleware {
    async fn handle(
        &self,
        request: reqwest::Request,
        extensions: &mut http::Extensions,
        next: reqwest_middleware::Next<'_>,
    ) -> reqwest_middleware::Result<reqwest::Response> {
        let draw = match extensions.get::<Draw>() {
            Some(draw) => draw.clone(),
            None => (self.draw)(&request),
        };
        let outbound = &*self.outbound;
        let permit = outbound
            .draw(&draw)
            .await
            .map_err(reqwest_middleware::Error::middleware)?;
        let response = next.run(request, extensions).await?;
        let heard = {
            let headers = response
                .headers()
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_bytes()));
            outbound
                .hear(permit, &draw, response.status().as_u16(), headers)
                .await
        };
        let cost = match &self.settle {
            Some(settle) if heard.reads_cost() => settle(&response),
            _ => Cost::estimate(),
        };
        let actual = match cost.0 {
            Kind::Estimate => None,
            Kind::Now(cost) => Some(cost),
            Kind::Watch(watch) => {
                let watching = Watching {
                    outbound: self.outbound.clone(),
                    draw,
                    heard,
                    watch,
                };
                return Ok(watched(response, watching));
            }
        };
        heard.settle(outbound, &draw, actual).await;
        Ok(response)
    }
}

/// `response` with its body watched: settled when it ends.
fn watched(response: reqwest::Response, watching: Watching) -> reqwest::Response {
    use reqwest::ResponseBuilderExt;
    let url = response.url().clone();
    let (mut parts, body) = http::Response::<reqwest::Body>::from(response).into_parts();
    // reqwest keeps a response's URL in an extension its builder sets.
    if let Ok(with_url) = http::Response::builder().url(url).body(()) {
        parts.extensions.extend(with_url.into_parts().0.extensions);
    }
    let body = reqwest::Body::wrap(Watched::new(body, watching));
    reqwest::Response::from(http::Response::from_parts(parts, body))
}
