//! [`RateLimitLayer`], its builder, the [`RateLimit`] service and its future.

use std::cell::RefCell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, ready};

use ::tower::BoxError;
use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Body as HttpBody;
use pin_project_lite::pin_project;
use smallvec::SmallVec;

use super::body::ResponseBody;
use super::key::{self, Client, Extracted, Head, KeyFrom, Keys, PathParams, Problem, Source};
use super::response;
use crate::http::{RATELIMIT, RATELIMIT_POLICY, TrustedProxies};
use crate::limiter::Limiter;
use crate::limiter::call::{CallFuture, Keys as CallKeys, Permit};
use crate::limiter::in_flight::InFlight;
use crate::limiter::spec::{CallSpec, GroupSpec};
use crate::model::decision::Decision;
use crate::model::error::LimitError;
use crate::model::key::Part;
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;
use crate::model::rejection::Rejection;
use crate::refusal;

/// What a layer does with a request it cannot find a key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer it without calling the service (the default): `400` with
    /// `{"error":"rate_limit_key_missing","message":...}` when the request
    /// lacks the key (`rate_limit_key_invalid` when it is not UTF-8), `500`
    /// with `rate_limit_misconfigured` (and an error log) when the server
    /// does; see [`KeyFrom`] for which is which.
    #[default]
    Reject,
    /// Let it through, not limited by this layer (e.g. an optional API key
    /// whose absence another layer handles).
    Allow,
}

/// A layer's configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LayerError {
    /// A limit of a key cannot be built or read.
    #[error("rate limit `{group}`: {source}")]
    Limit {
        /// The key's (group's) name.
        group: String,
        /// Why.
        source: LimitError,
    },
    /// A header name that is not one.
    #[error("rate limit `{group}`: `{header}` is not a valid header name")]
    Header {
        /// The key's (group's) name.
        group: String,
        /// The name given.
        header: String,
    },
    /// Two keys of one layer with one name would share a counter.
    #[error("rate limit `{0}` is given twice in one layer: give each key its own name")]
    DuplicateGroup(String),
    /// The layer cannot decide its calls (e.g. it has no key, or a cost
    /// over a limit's capacity, or an invalid tier).
    #[error(transparent)]
    Spec(LimitError),
    /// A tier given where there is no tiered key to add it to.
    #[error("rate limit tier `{tier}`: {message}")]
    Tier {
        /// The tier's name.
        tier: String,
        /// What is wrong.
        message: String,
    },
}

/// A tiered key's tier resolver: the request's tier, borrowed from it (a
/// header, an extension's field) or `'static` (a plan's name).
#[derive(Clone)]
struct TierFn(Arc<TierOf>);

/// What a tier resolver is.
type TierOf = dyn Fn(&Parts) -> Option<&str> + Send + Sync;

impl fmt::Debug for TierFn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tier(..)")
    }
}

/// A limit of [`RateLimitLayerBuilder::key`]: a [`Limit`] (or a `Result` of one, such as
/// `Limit::in_flight(4)`) or its text
/// (`"100/1m"`, the grammar of `#[rate_limit(limits = [...])]`).
pub trait IntoLimit: sealed::Sealed {
    /// The limit, or why not.
    ///
    /// # Errors
    /// The [`LimitError`] of a limit that cannot be built or read.
    fn into_limit(self) -> Result<Limit, LimitError>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for crate::model::limit::Limit {}
    impl Sealed for &str {}
    impl Sealed for String {}
    impl Sealed for Result<crate::model::limit::Limit, crate::model::error::LimitError> {}
}

impl IntoLimit for Limit {
    fn into_limit(self) -> Result<Limit, LimitError> {
        Ok(self)
    }
}

/// A limit still to check (`Limit::in_flight(4)`): its error is `build`'s.
impl IntoLimit for Result<Limit, LimitError> {
    fn into_limit(self) -> Result<Limit, LimitError> {
        self
    }
}

impl IntoLimit for &str {
    fn into_limit(self) -> Result<Limit, LimitError> {
        self.parse()
    }
}

impl IntoLimit for String {
    fn into_limit(self) -> Result<Limit, LimitError> {
        self.parse()
    }
}

/// Limits the requests of the services it wraps (axum routers and routes,
/// tonic servers, any `tower` HTTP service) with [`Limiter::call`].
///
/// A layer is one [`CallSpec`]: a name, and one group per key, each with
/// its limits, decided together, all-or-nothing, in one round trip. Groups
/// are limits by name, shared with `#[rate_limit]`: a group named
/// `"api_ip"` keyed by the client IP counts in the same keys as
/// `also(name = "api_ip", key = ip)`, and [`Settings::set_limits`](crate::settings::Settings::set_limits)`("api_ip", ..)`,
/// a limits file or an admin override changes it for the next request.
///
/// | request | answer |
/// |---|---|
/// | admitted | the service's response, with `RateLimit-Policy` and `RateLimit` for the binding limit unless [`headers(false)`](RateLimitLayerBuilder::headers) (a response that has them keeps its own) |
/// | over a limit | `429`, `Retry-After`, `RateLimit-Policy`, `RateLimit`, `{"error":"rate_limited","retry_after_ms":N}` (as [`Rejection`]'s `IntoResponse`) |
/// | the limiter cannot decide and fails closed, or no limiter is installed | `503`, `{"error":"rate_limiter_unavailable"}` |
/// | no key | see [`MissingKey`] |
/// | gRPC (`content-type: application/grpc*`) refused | HTTP `200`, `grpc-status: 8` (`RESOURCE_EXHAUSTED`; `14` `UNAVAILABLE` when it cannot decide), `grpc-message`, `grpc-retry-pushback-ms`: tonic clients get `Status::resource_exhausted` |
///
/// In memory, a request is decided before the service is called, with no
/// allocation beyond the limiter's own; on a remote store (Redis) the
/// decision is one boxed future per request, beside its round trip.
///
/// ```
/// use axum::{Router, routing::get};
/// use ratewall::tower::{KeyFrom, RateLimitLayer};
/// use ratewall::{Limiter, http::IpPrefix};
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = std::sync::Arc::new(Limiter::builder().memory().build()?);
/// // Per client /64 and per /48 (IPv4: per address), and per API key: all-or-nothing.
/// let api = RateLimitLayer::builder("api")
///     .key("api_ip", ["100/1m"], KeyFrom::client_ip())
///     .key("api_site", ["1000/1m"], KeyFrom::client_network(IpPrefix::V6_48))
///     .key("api_key", ["600/1m", "10000/1d"], KeyFrom::header("x-api-key"))
///     .limiter(limiter.clone()) // default: the global limiter
///     .build()?;
/// let users = RateLimitLayer::new("user_reads", ["10/1s"], KeyFrom::path_param("id"))?;
/// let app: Router = Router::new()
///     .route("/users/{id}", get(|| async { "user" }))
///     .route_layer(users) // after routing: path parameters are known
///     .layer(api);
/// // axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
/// # let _ = app;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("spec", &self.shared.spec)
            .field("keys", &self.shared.keys)
            .field("headers", &self.shared.headers)
            .field("missing", &self.shared.missing)
            .finish_non_exhaustive()
    }
}

/// What every service of one layer shares.
struct Shared {
    spec: CallSpec,
    /// Key `i` is group `i`'s identity.
    keys: SmallVec<[KeyFrom; 2]>,
    /// Key `i`'s tier resolver, for a tiered group.
    tiers: SmallVec<[Option<TierFn>; 2]>,
    /// Whether a key is tiered.
    tiered: bool,
    /// `None`: the global limiter, looked up per request.
    limiter: Option<Arc<Limiter>>,
    headers: bool,
    missing: MissingKey,
    trusted: Option<TrustedProxies>,
    /// Whether a key reads path parameters.
    params: bool,
    /// Whether a key reads the whole request head.
    parts: bool,
    /// A process-unique id: what this layer's `RateLimit-Policy` values are
    /// kept under ([`policy_field`]).
    id: u64,
}

static NEXT_LAYER: AtomicU64 = AtomicU64::new(1);

impl RateLimitLayer {
    /// A layer of one key: requests are limited by `limits` per key from
    /// `key`, under the name `name` (the call's and the group's).
    ///
    /// # Errors
    /// As [`RateLimitLayerBuilder::build`] of one key: [`LayerError::Limit`],
    /// [`LayerError::Header`] or [`LayerError::Spec`].
    pub fn new<L: IntoLimit>(
        name: &str,
        limits: impl IntoIterator<Item = L>,
        key: KeyFrom,
    ) -> Result<Self, LayerError> {
        Self::builder(name).key(name, limits, key).build()
    }

    /// Starts a layer whose calls are named `name`: the `limit` label of
    /// its metrics and the name [`Settings::set_policy`](crate::settings::Settings::set_policy) and
    /// [`Settings::set_shadow`](crate::settings::Settings::set_shadow) take for the whole call (each key's limits go
    /// by the key's own name).
    pub fn builder(name: &str) -> RateLimitLayerBuilder {
        RateLimitLayerBuilder::new(name)
    }

    /// The call this layer makes for each request.
    pub fn spec(&self) -> &CallSpec {
        &self.shared.spec
    }
}

impl<S> ::tower::Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of a [`RateLimitLayer`].
#[derive(Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: fmt::Debug> fmt::Debug for RateLimit<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("call", &self.shared.spec.name())
            .finish_non_exhaustive()
    }
}

/// `RateLimit-Policy` and `RateLimit` for an admitted response.
type Fields = (HeaderValue, HeaderValue);

/// What an admitted request's response waits with besides the service's
/// future: the fields to add and the in-flight slots to give back. Boxed,
/// and absent when there is neither, so the response future (moved
/// several times through a router) stays as small as the service's.
struct Extras {
    fields: Option<Fields>,
    in_flight: Option<InFlight>,
}

impl Extras {
    #[inline]
    fn boxed(fields: Option<Fields>, in_flight: Option<InFlight>) -> Option<Box<Self>> {
        if fields.is_none() && in_flight.is_none() {
            return None;
        }
        Some(Box::new(Self { fields, in_flight }))
    }

    /// Gives back the slots of an admitted request whose response is
    /// ready, and adds the fields to the response unless it has its own.
    fn finish<T>(self, response: &mut Response<T>) {
        let Self { fields, in_flight } = self;
        drop(in_flight);
        if let Some((policy, current)) = fields {
            let headers = response.headers_mut();
            if let http::header::Entry::Vacant(vacant) = headers.entry(RATELIMIT) {
                vacant.insert(current);
                headers.insert(RATELIMIT_POLICY, policy);
            }
        }
    }
}

/// A request's fate.
enum Verdict {
    /// Admitted, with the fields to add to its response and the in-flight
    /// slots it holds until its response is ready, if any.
    Admit(Option<Box<Extras>>),
    /// Answered without the service (boxed: a verdict moves through the
    /// deciding calls, and an admission is the common case).
    Answer(Box<Response<Bytes>>),
}

impl Verdict {
    fn answer(response: Response<Bytes>) -> Self {
        Self::Answer(Box::new(response))
    }
}

/// The deciding half of a request on a remote store.
type Deciding = Pin<Box<dyn Future<Output = (Verdict, Parts)> + Send>>;

impl Shared {
    /// Extracts the keys of a request with this head (and path parameters)
    /// and decides its call with `limiter`, or `None` when the call cannot
    /// be decided at once (a remote store).
    fn decide_now(
        &self,
        limiter: &Limiter,
        head: Head<'_>,
        params: &PathParams,
    ) -> Option<Verdict> {
        // One untiered key (the common case): no vectors.
        if let (false, [from], [group]) = (self.tiered, &*self.keys, self.spec.groups()) {
            // The client's address (the commonest key), made here: only the
            // address moves, not a key that could have been text.
            if let Source::ClientIp(prefix) = &from.source {
                let Some(ip) = key::client_address(head, self.trusted.as_ref()) else {
                    return Some(self.no_client(group.name(), head.headers));
                };
                let key = key::client_ip(*prefix, head, ip);
                return self.decide_one(limiter, group, key.part(), head.headers);
            }
            let key = match self.key(from, group.name(), head, params, &mut Client::default()) {
                Ok(key) => key,
                Err(problem) => return Some(self.no_key(&problem, head.headers)),
            };
            return self.decide_one(limiter, group, key.part(), head.headers);
        }
        let mut keys = Keys::new();
        if let Err(problem) = self.keys(head, params, &mut keys) {
            return Some(self.no_key(&problem, head.headers));
        }
        let decided = self.call(limiter, head, &keys).now()?;
        Some(self.verdict(decided, head.headers))
    }

    /// Decides the call of a request (with these headers) on its one key,
    /// untiered: on the direct lane when the call takes it (no permit to
    /// make; the verdict is made where the admission is), else with a
    /// permit.
    #[inline(always)]
    fn decide_one(
        &self,
        limiter: &Limiter,
        group: &GroupSpec,
        part: Part<'_>,
        headers: &HeaderMap,
    ) -> Option<Verdict> {
        let admitted = |decision: &Decision, limit: &Limit| {
            if !self.headers {
                return Verdict::Admit(None);
            }
            let fields = kept_fields(self.id, 0, group.name(), decision, limit);
            Verdict::Admit(Extras::boxed(fields, None))
        };
        // The verdict is made where the permit is (not moved out first).
        limiter.now_with(&self.spec, CallKeys::parts(&[part]), admitted, |decided| {
            self.verdict(decided, headers)
        })
    }

    /// The call of a request with this head and these keys (and its tiers).
    fn call<'l>(&'l self, limiter: &'l Limiter, head: Head<'_>, keys: &Keys<'_>) -> CallFuture<'l> {
        // Typed identities: text as is, no `core::fmt` per request.
        let parts: SmallVec<[Part<'_>; 2]> = keys.iter().map(Extracted::part).collect();
        if !self.tiered {
            return limiter.call_with(&self.spec, CallKeys::parts(&parts));
        }
        // A request without a tier gives "": its group's default tier.
        let tiers: SmallVec<[Part<'_>; 2]> = self
            .tiers
            .iter()
            .flatten()
            .map(|tier| Part::Text(head.parts.and_then(|parts| (tier.0)(parts)).unwrap_or("")))
            .collect();
        limiter.call_with(&self.spec, CallKeys::parts(&parts).tier_parts(&tiers))
    }

    /// [`Shared::decide_now`] for a remote store: the request head is moved
    /// in and given back with the verdict.
    async fn decide(self: Arc<Self>, mut parts: Parts) -> (Verdict, Parts) {
        let limiter = match self.limiter() {
            Ok(limiter) => limiter,
            Err(rejection) => {
                let grpc = response::is_grpc(&parts.headers);
                return (Verdict::answer(response::refused(rejection, grpc)), parts);
            }
        };
        let params: PathParams = if self.params {
            key::path_params(&mut parts)
        } else {
            None
        };
        let head = Head::of_parts(&parts);
        let call = {
            let mut keys = Keys::new();
            match self.keys(head, &params, &mut keys) {
                Ok(()) => Ok(self.call(limiter, head, &keys)),
                Err(problem) => Err(self.no_key(&problem, &parts.headers)),
            }
        };
        let verdict = match call {
            Ok(call) => self.verdict(call.await, &parts.headers),
            Err(verdict) => verdict,
        };
        (verdict, parts)
    }

    /// The limiter, or the rejection of a call without one.
    #[inline]
    fn limiter(&self) -> Result<&Limiter, Rejection> {
        match &self.limiter {
            Some(limiter) => Ok(limiter),
            None => match Limiter::global() {
                Ok(limiter) => Ok(limiter),
                Err(error) => Err(self.no_limiter(error)),
            },
        }
    }

    /// The rejection (logged) of a request when no limiter is installed.
    #[cold]
    #[inline(never)]
    fn no_limiter(&self, error: crate::model::error::Error) -> Rejection {
        tracing::error!(limit = self.spec.name(), %error, "rate limit layer without a limiter");
        Rejection::unavailable(self.spec.name().to_owned(), error)
    }

    /// Adds the request's keys to `keys` (filled in place: no copy of the
    /// keys on the way out), or says why it has none.
    fn keys<'p>(
        &self,
        head: Head<'p>,
        params: &'p PathParams,
        keys: &mut Keys<'p>,
    ) -> Result<(), Problem> {
        let mut client = Client::default();
        for (from, group) in self.keys.iter().zip(self.spec.groups()) {
            keys.push(self.key(from, group.name(), head, params, &mut client)?);
        }
        Ok(())
    }

    /// One key of a request (group `group`), or why it has none (logged
    /// when the server is at fault).
    #[inline]
    fn key<'p>(
        &self,
        from: &KeyFrom,
        group: &str,
        head: Head<'p>,
        params: &'p PathParams,
        client: &mut Client,
    ) -> Result<Extracted<'p>, Problem> {
        let key = key::extract(from, group, head, params, client, self.trusted.as_ref());
        if let Err(problem) = &key {
            misconfigured(group, problem);
        }
        key
    }

    /// The verdict on a request (with these headers) whose client address
    /// the server did not give (logged: the server is at fault).
    #[cold]
    #[inline(never)]
    fn no_client(&self, group: &str, headers: &HeaderMap) -> Verdict {
        let problem = key::no_client_address();
        misconfigured(group, &problem);
        self.no_key(&problem, headers)
    }

    /// The verdict on a request (with these headers) without a key.
    fn no_key(&self, problem: &Problem, headers: &HeaderMap) -> Verdict {
        match self.missing {
            MissingKey::Allow => Verdict::Admit(None),
            MissingKey::Reject => {
                Verdict::answer(response::no_key(problem, response::is_grpc(headers)))
            }
        }
    }

    /// What a decided call (of a request with these headers) becomes.
    #[inline]
    fn verdict(&self, mut decided: Result<Permit<'_>, Rejection>, headers: &HeaderMap) -> Verdict {
        // The permit is read where it is (it is large: not moved out).
        match decided {
            Ok(ref mut permit) => {
                let fields = if self.headers {
                    self.fields(permit)
                } else {
                    None
                };
                Verdict::Admit(Extras::boxed(fields, permit.in_flight.take()))
            }
            Err(rejection) => self.refused(rejection, headers),
        }
    }

    /// The answer to a refused request (with these headers).
    #[inline(never)]
    fn refused(&self, rejection: Rejection, headers: &HeaderMap) -> Verdict {
        Verdict::answer(response::refused(rejection, response::is_grpc(headers)))
    }

    /// The `RateLimit` fields of an admitted call's binding limit: the
    /// policy as kept for its limit and the current value from its kept
    /// prefix ([`kept_fields`]); a call decided by tiers (named by its
    /// tier) formats both.
    fn fields(&self, permit: &Permit<'_>) -> Option<Fields> {
        let Some((group, decision, limit)) = permit.binding_group() else {
            return tiered_fields(permit);
        };
        let name = self.spec.groups().get(group)?.name();
        kept_fields(self.id, group, name, &decision, &limit)
    }
}

/// Logs a request without a key when the server is at fault.
#[cold]
fn misconfigured(group: &str, problem: &Problem) {
    if problem.server {
        tracing::error!(limit = group, problem = %problem.message, "rate limit layer misconfigured");
    }
}

/// Decides `request` on the memory store when a key reads path parameters
/// or the whole head (the request is split for them), and calls `inner` if
/// admitted; gives the request back when it cannot be decided at once.
// The request goes back by value: boxing it would cost an allocation on the
// path that decides remotely.
#[allow(clippy::result_large_err)]
fn decide_parts<S, B, ResBody>(
    shared: &Shared,
    inner: &mut S,
    limiter: &Limiter,
    request: Request<B>,
) -> Result<ResponseFuture<S, B>, Request<B>>
where
    S: ::tower::Service<Request<B>, Response = Response<ResBody>>,
{
    let (mut parts, body) = request.into_parts();
    let params: PathParams = if shared.params {
        key::path_params(&mut parts)
    } else {
        None
    };
    match shared.decide_now(limiter, Head::of_parts(&parts), &params) {
        Some(Verdict::Admit(extras)) => {
            let future = inner.call(Request::from_parts(parts, body));
            Ok(ResponseFuture::admitted(future, extras))
        }
        Some(Verdict::Answer(response)) => Ok(ResponseFuture::answered(*response)),
        None => Err(Request::from_parts(parts, body)),
    }
}

impl<S> RateLimit<S> {
    /// Decides `request` on a remote store: the decision is a boxed future
    /// (started when first polled), then the service is called.
    fn decide_remote<B, ResBody>(&mut self, request: Request<B>) -> ResponseFuture<S, B>
    where
        S: ::tower::Service<Request<B>, Response = Response<ResBody>> + Clone,
        B: Send + 'static,
    {
        let (parts, body) = request.into_parts();
        // The service that was polled ready serves this request.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            state: State::Deciding {
                decision: Box::pin(self.shared.clone().decide(parts)),
                inner: Some(inner),
                body: Some(body),
            },
        }
    }
}

impl<S, B, ResBody> ::tower::Service<Request<B>> for RateLimit<S>
where
    S: ::tower::Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResponseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let limiter = match self.shared.limiter() {
            Ok(limiter) => limiter,
            Err(rejection) => {
                let grpc = response::is_grpc(request.headers());
                return ResponseFuture::answered(response::refused(rejection, grpc));
            }
        };
        if limiter.is_remote() {
            return self.decide_remote(request);
        }
        if self.shared.parts {
            return match decide_parts(&self.shared, &mut self.inner, limiter, request) {
                Ok(future) => future,
                Err(request) => self.decide_remote(request),
            };
        }
        // In memory, from the borrowed request: decided before the service
        // is called, and the request is moved once, into the service.
        let verdict = self
            .shared
            .decide_now(limiter, Head::of_request(&request), &None);
        let extras = match verdict {
            Some(Verdict::Admit(extras)) => extras,
            Some(Verdict::Answer(response)) => return ResponseFuture::answered(*response),
            None => return self.decide_remote(request),
        };
        // Built in place (the service's future is large).
        ResponseFuture {
            state: State::Admitted {
                future: self.inner.call(request),
                extras,
            },
        }
    }
}

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<S, B>
    where
        S: ::tower::Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: ::tower::Service<Request<B>>,
    {
        // Answered without the service.
        Answered { response: Option<Response<Bytes>> },
        // Admitted: the service's response, the fields to add to it, and
        // the in-flight slots held until it is ready.
        Admitted { #[pin] future: S::Future, extras: Option<Box<Extras>> },
        // Being decided by a remote store.
        Deciding { decision: Deciding, inner: Option<S>, body: Option<B> },
    }
}

impl<S: ::tower::Service<Request<B>>, B> fmt::Debug for ResponseFuture<S, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Answered { .. } => "Answered",
            State::Admitted { .. } => "Admitted",
            State::Deciding { .. } => "Deciding",
        };
        f.debug_tuple("ResponseFuture").field(&state).finish()
    }
}

impl<S: ::tower::Service<Request<B>>, B> ResponseFuture<S, B> {
    fn answered(response: Response<Bytes>) -> Self {
        Self {
            state: State::Answered {
                response: Some(response),
            },
        }
    }

    fn admitted(future: S::Future, extras: Option<Box<Extras>>) -> Self {
        Self {
            state: State::Admitted { future, extras },
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: ::tower::Service<Request<B>, Response = Response<ResBody>>,
    ResBody: HttpBody<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Output = Result<Response<ResponseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Answered { response } => {
                    // Polled again after completion: an empty 500 rather than a panic.
                    let response = response.take().unwrap_or_else(|| {
                        let mut gone = Response::new(Bytes::new());
                        *gone.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                        gone
                    });
                    return Poll::Ready(Ok(response.map(ResponseBody::full)));
                }
                StateProj::Admitted { future, extras } => {
                    let output = ready!(future.poll(cx));
                    // The response is ready: its slots go back now (on an
                    // error too).
                    let extras = extras.take();
                    return Poll::Ready(output.map(|response| {
                        let mut response = response.map(ResponseBody::inner);
                        if let Some(extras) = extras {
                            (*extras).finish(&mut response);
                        }
                        response
                    }));
                }
                StateProj::Deciding {
                    decision,
                    inner,
                    body,
                } => {
                    let (verdict, parts) = ready!(decision.as_mut().poll(cx));
                    let next = match (verdict, inner.take(), body.take()) {
                        (Verdict::Admit(extras), Some(mut inner), Some(body)) => State::Admitted {
                            future: inner.call(Request::from_parts(parts, body)),
                            extras,
                        },
                        (Verdict::Answer(response), _, _) => State::Answered {
                            response: Some(*response),
                        },
                        // Polled again after completion.
                        _ => State::Answered { response: None },
                    };
                    state.set(next);
                }
            }
        }
    }
}

mod builder;
mod fields;

pub use builder::RateLimitLayerBuilder;
use fields::{kept_fields, tiered_fields};
