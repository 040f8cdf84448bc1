//! [`RateLimitLayer`]: a route limit's configuration and how it decides a
//! request, shared by the tower service (`service.rs`) and actix-web's
//! middleware (`crate::actix`).

use std::cell::RefCell;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Response};
use smallvec::SmallVec;

use super::answer::{GrpcReply, Hooks, Refusal};
use super::head::{Line, RequestHead};
use super::key::{self, Client, Extracted, KeyFrom, Keys, Problem, Source};
use crate::http::TrustedProxies;
#[cfg(feature = "tower")]
use crate::http::{
    RATELIMIT, RATELIMIT_POLICY, X_RATELIMIT_LIMIT, X_RATELIMIT_REMAINING, X_RATELIMIT_RESET,
};
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

mod builder;
mod exempt;
mod fields;

pub use builder::RateLimitLayerBuilder;
pub(crate) use exempt::Exempt;
use fields::{kept_fields, tiered_fields};

/// What a layer does with a request it cannot find a key in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer it without calling the service (the default): `400` with
    /// `{"error":"rate_limit_key_missing","message":...}` when the request
    /// lacks the key (`rate_limit_key_invalid` when it is not UTF-8), `500`
    /// with `rate_limit_misconfigured` (and an error log) when the server
    /// does; see [`KeyFrom`] for which is which. A response hook
    /// ([`on_refusal`](RateLimitLayerBuilder::on_refusal)) answers these
    /// too.
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
    /// An exempted path that cannot be one (not starting with `/`).
    #[error("exempted path `{0}`: a path starts with `/`")]
    Path(String),
}

/// A tiered key's tier resolver: the request's tier, borrowed from it (a
/// header, an extension's field) or `'static` (a plan's name).
#[derive(Clone)]
pub(crate) struct TierFn(pub(crate) Arc<TierOf>);

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
/// tonic servers, any `tower` HTTP service; actix-web apps, resources and
/// scopes through `ratewall::actix::RateLimitMiddleware`, feature `actix`)
/// with [`Limiter::call`].
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
/// | exempted ([`exempt_methods`](RateLimitLayerBuilder::exempt_methods), [`exempt_path_prefix`](RateLimitLayerBuilder::exempt_path_prefix), [`exempt_path`](RateLimitLayerBuilder::exempt_path), [`exempt_if`](RateLimitLayerBuilder::exempt_if)) | the service's response, untouched: no store call, no fields |
/// | admitted | the service's response, with `RateLimit-Policy` and `RateLimit` for the binding limit unless [`headers(false)`](RateLimitLayerBuilder::headers), and `X-RateLimit-*` with [`legacy_headers(true)`](RateLimitLayerBuilder::legacy_headers) (a response that has them keeps its own) |
/// | over a limit | `429`, `Retry-After`, `RateLimit-Policy`, `RateLimit`, `{"error":"rate_limited","retry_after_ms":N}` (as [`Rejection`]'s `IntoResponse`), unless a hook answers ([`on_refusal`](RateLimitLayerBuilder::on_refusal)) |
/// | the limiter cannot decide and fails closed, or no limiter is installed | `503`, `{"error":"rate_limiter_unavailable"}` |
/// | no key | see [`MissingKey`] |
/// | gRPC (`content-type: application/grpc*`) refused | HTTP `200`, `grpc-status: 8` (`RESOURCE_EXHAUSTED`; `14` `UNAVAILABLE` when it cannot decide), `grpc-message`, `grpc-retry-pushback-ms`: tonic clients get `Status::resource_exhausted`; unless a hook answers ([`on_grpc_refusal`](RateLimitLayerBuilder::on_grpc_refusal)) |
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
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("spec", &self.shared.spec)
            .field("keys", &self.shared.keys)
            .field("headers", &self.shared.headers)
            .field("legacy_headers", &self.shared.legacy)
            .field("missing", &self.shared.missing)
            .field("exempt", &self.shared.exempt)
            .field("hooks", &self.shared.hooks)
            .finish_non_exhaustive()
    }
}

/// What every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) spec: CallSpec,
    /// Key `i` is group `i`'s identity.
    keys: SmallVec<[KeyFrom; 2]>,
    /// Key `i`'s tier resolver, for a tiered group.
    tiers: SmallVec<[Option<TierFn>; 2]>,
    /// Whether a key is tiered.
    tiered: bool,
    /// `None`: the global limiter, looked up per request.
    limiter: Option<Arc<Limiter>>,
    headers: bool,
    /// Whether responses get `X-RateLimit-*`.
    legacy: bool,
    missing: MissingKey,
    trusted: Option<TrustedProxies>,
    /// Whether a key reads path parameters.
    #[cfg_attr(
        not(feature = "tower"),
        allow(dead_code, reason = "actix-web's are read as needed")
    )]
    pub(crate) params: bool,
    /// Whether a key or a tier is a function of the request's head.
    #[cfg_attr(
        not(feature = "actix"),
        allow(dead_code, reason = "actix-web's heads are copied for them")
    )]
    pub(crate) fns: bool,
    /// Whether a request is split before it is decided (a key reads path
    /// parameters or the head, or a predicate exempts).
    #[cfg_attr(
        not(feature = "tower"),
        allow(dead_code, reason = "tower's requests only")
    )]
    pub(crate) split: bool,
    /// What is let through untouched; `None` when nothing is (one check).
    pub(crate) exempt: Option<Box<Exempt>>,
    /// What refused requests get.
    hooks: Hooks,
    /// A process-unique id: what this layer's `RateLimit-Policy` values are
    /// kept under ([`kept_fields`]).
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

/// `RateLimit-Policy` and `RateLimit` for an admitted response.
pub(crate) type Fields = (HeaderValue, HeaderValue);

/// `X-RateLimit-Limit`, `-Remaining` and `-Reset` for an admitted response
/// (boxed: off by default, it leaves the extras of the common case as
/// small as they were).
type Legacy = Box<[HeaderValue; 3]>;

/// What an admitted request's response waits with besides the service's
/// future: the fields to add and the in-flight slots to give back. Boxed,
/// and absent when there is neither, so the response future (moved
/// several times through a router) stays as small as the service's.
pub(crate) struct Extras {
    fields: Option<Fields>,
    in_flight: Option<InFlight>,
    /// Off by default: checked once, after the rest.
    legacy: Option<Legacy>,
}

impl Extras {
    #[inline(always)]
    fn boxed(fields: Option<Fields>, in_flight: Option<InFlight>) -> Option<Box<Self>> {
        if fields.is_none() && in_flight.is_none() {
            return None;
        }
        Some(Box::new(Self {
            fields,
            in_flight,
            legacy: None,
        }))
    }

    /// [`Extras::boxed`] with the legacy fields too.
    #[inline(never)]
    fn with_legacy(
        fields: Option<Fields>,
        legacy: Option<Legacy>,
        in_flight: Option<InFlight>,
    ) -> Option<Box<Self>> {
        let mut extras = Self::boxed(fields, in_flight);
        match (&mut extras, legacy) {
            (Some(extras), legacy) => extras.legacy = legacy,
            (None, Some(legacy)) => {
                return Some(Box::new(Self {
                    fields: None,
                    in_flight: None,
                    legacy: Some(legacy),
                }));
            }
            (None, None) => {}
        }
        extras
    }

    /// Gives back the slots of an admitted request whose response is
    /// ready, and hands out the fields to add to it.
    #[cfg(feature = "actix")]
    pub(crate) fn finish(self) -> (Option<Fields>, Option<Legacy>) {
        let Self {
            fields,
            in_flight,
            legacy,
        } = self;
        drop(in_flight);
        (fields, legacy)
    }

    /// Gives back the slots of an admitted request whose response is
    /// ready, and adds the fields to the response unless it has its own.
    #[cfg(feature = "tower")]
    #[inline]
    pub(crate) fn finish_into<T>(self, response: &mut Response<T>) {
        let Self {
            fields,
            in_flight,
            legacy,
        } = self;
        drop(in_flight);
        let headers = response.headers_mut();
        if let Some((policy, current)) = fields
            && let http::header::Entry::Vacant(vacant) = headers.entry(RATELIMIT)
        {
            vacant.insert(current);
            headers.insert(RATELIMIT_POLICY, policy);
        }
        if let Some(legacy) = legacy {
            insert_legacy(headers, *legacy);
        }
    }
}

/// Adds the legacy fields to a response unless it has its own.
#[cfg(feature = "tower")]
#[inline(never)]
fn insert_legacy(headers: &mut http::HeaderMap, legacy: [HeaderValue; 3]) {
    if let http::header::Entry::Vacant(vacant) = headers.entry(X_RATELIMIT_LIMIT) {
        let [limit, remaining, reset] = legacy;
        vacant.insert(limit);
        headers.insert(X_RATELIMIT_REMAINING, remaining);
        headers.insert(X_RATELIMIT_RESET, reset);
    }
}

/// The `X-RateLimit-*` values of `decision`.
#[inline(never)]
fn legacy_values(decision: &Decision) -> Option<Legacy> {
    Some(Box::new([
        HeaderValue::from(decision.limit()),
        HeaderValue::from(decision.remaining()),
        HeaderValue::from(decision.reset_after_secs()),
    ]))
}

/// A request's fate.
pub(crate) enum Verdict {
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

impl Shared {
    /// Extracts the keys of a request with this head and decides its call
    /// with `limiter`, or `None` when the call cannot be decided at once (a
    /// remote store).
    pub(crate) fn decide_now<'p>(
        &self,
        limiter: &Limiter,
        head: impl RequestHead<'p>,
    ) -> Option<Verdict> {
        // One untiered key (the common case): no vectors.
        if let (false, [from], [group]) = (self.tiered, &*self.keys, self.spec.groups()) {
            // The client's address (the commonest key), made here: only the
            // address moves, not a key that could have been text.
            if let Source::ClientIp(prefix) = &from.source {
                let Some(ip) = head.client_address(self.trusted.as_ref()) else {
                    return Some(self.no_client(group.name(), &head));
                };
                let key = key::client_ip(*prefix, head, ip);
                return self.decide_one(limiter, group, key.part(), &head);
            }
            let key = match self.key(from, group.name(), head, &mut Client::default()) {
                Ok(key) => key,
                Err(problem) => return Some(self.no_key(&problem, &head)),
            };
            return self.decide_one(limiter, group, key.part(), &head);
        }
        let mut keys = Keys::new();
        if let Err(problem) = self.keys(head, &mut keys) {
            return Some(self.no_key(&problem, &head));
        }
        let decided = self.call(limiter, head, &keys).now()?;
        Some(self.verdict(decided, &head))
    }

    /// Decides the call of a request (with this request line) on its one
    /// key, untiered: on the direct lane when the call takes it (no permit
    /// to make; the verdict is made where the admission is), else with a
    /// permit.
    #[inline(always)]
    fn decide_one(
        &self,
        limiter: &Limiter,
        group: &GroupSpec,
        part: Part<'_>,
        line: &impl Line,
    ) -> Option<Verdict> {
        let admitted = |decision: &Decision, limit: &Limit| {
            if self.legacy {
                return self.admitted_with_legacy(group, decision, limit);
            }
            if !self.headers {
                return Verdict::Admit(None);
            }
            let fields = kept_fields(self.id, 0, group.name(), decision, limit);
            Verdict::Admit(Extras::boxed(fields, None))
        };
        // The verdict is made where the permit is (not moved out first).
        limiter.now_with(&self.spec, CallKeys::parts(&[part]), admitted, |decided| {
            self.verdict(decided, line)
        })
    }

    /// An admission on the direct lane with the legacy fields.
    #[inline(never)]
    fn admitted_with_legacy(
        &self,
        group: &GroupSpec,
        decision: &Decision,
        limit: &Limit,
    ) -> Verdict {
        let fields = if self.headers {
            kept_fields(self.id, 0, group.name(), decision, limit)
        } else {
            None
        };
        Verdict::Admit(Extras::with_legacy(fields, legacy_values(decision), None))
    }

    /// The call of a request with this head and these keys (and its tiers).
    pub(crate) fn call<'l, 'p>(
        &'l self,
        limiter: &'l Limiter,
        head: impl RequestHead<'p>,
        keys: &Keys<'_>,
    ) -> CallFuture<'l> {
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
            .map(|tier| Part::Text(head.parts().and_then(|parts| (tier.0)(parts)).unwrap_or("")))
            .collect();
        limiter.call_with(&self.spec, CallKeys::parts(&parts).tier_parts(&tiers))
    }

    /// The limiter, or the rejection of a call without one.
    #[inline]
    pub(crate) fn limiter(&self) -> Result<&Limiter, Rejection> {
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
    pub(crate) fn keys<'p>(
        &self,
        head: impl RequestHead<'p>,
        keys: &mut Keys<'p>,
    ) -> Result<(), Problem> {
        let mut client = Client::default();
        for (from, group) in self.keys.iter().zip(self.spec.groups()) {
            keys.push(self.key(from, group.name(), head, &mut client)?);
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
        head: impl RequestHead<'p>,
        client: &mut Client,
    ) -> Result<Extracted<'p>, Problem> {
        let key = key::extract(from, group, head, client, self.trusted.as_ref());
        if let Err(problem) = &key {
            misconfigured(group, problem);
        }
        key
    }

    /// The verdict on a request whose client address the server did not
    /// give (logged: the server is at fault).
    #[cold]
    #[inline(never)]
    fn no_client(&self, group: &str, line: &dyn Line) -> Verdict {
        let problem = key::no_client_address();
        misconfigured(group, &problem);
        self.no_key(&problem, line)
    }

    /// The verdict on a request without a key.
    pub(crate) fn no_key(&self, problem: &Problem, line: &dyn Line) -> Verdict {
        match self.missing {
            MissingKey::Allow => Verdict::Admit(None),
            MissingKey::Reject => Verdict::answer(self.hooks.answer(&Refusal::keyless(
                problem,
                line,
                self.legacy,
            ))),
        }
    }

    /// What a decided call (of a request with this line) becomes.
    #[inline]
    pub(crate) fn verdict(
        &self,
        mut decided: Result<Permit<'_>, Rejection>,
        line: &impl Line,
    ) -> Verdict {
        // The permit is read where it is (it is large: not moved out).
        match decided {
            Ok(ref mut permit) if self.legacy => {
                let (fields, legacy) = self.fields(permit);
                Verdict::Admit(Extras::with_legacy(fields, legacy, permit.in_flight.take()))
            }
            Ok(ref mut permit) => {
                let fields = if self.headers {
                    self.fields(permit).0
                } else {
                    None
                };
                Verdict::Admit(Extras::boxed(fields, permit.in_flight.take()))
            }
            Err(rejection) => self.refused(&rejection, line),
        }
    }

    /// The answer to a refused request: the hook's, else the default.
    #[inline(never)]
    pub(crate) fn refused(&self, rejection: &Rejection, line: &dyn Line) -> Verdict {
        Verdict::answer(self.answer(rejection, line))
    }

    /// The response to a refused request.
    pub(crate) fn answer(&self, rejection: &Rejection, line: &dyn Line) -> Response<Bytes> {
        self.hooks
            .answer(&Refusal::rejected(rejection, line, self.legacy))
    }

    /// The `RateLimit` fields of an admitted call's binding limit (the
    /// policy as kept for its limit and the current value from its kept
    /// prefix, [`kept_fields`]; a call decided by tiers, named by its
    /// tier, formats both), and its `X-RateLimit-*` fields, as asked.
    fn fields(&self, permit: &Permit<'_>) -> (Option<Fields>, Option<Legacy>) {
        let legacy = |decision: &Decision| {
            if self.legacy {
                legacy_values(decision)
            } else {
                None
            }
        };
        let Some((group, decision, limit)) = permit.binding_group() else {
            let legacy = permit
                .binding()
                .and_then(|(_, decision, _)| legacy(&decision));
            let fields = if self.headers {
                tiered_fields(permit)
            } else {
                None
            };
            return (fields, legacy);
        };
        let fields = match self.spec.groups().get(group) {
            Some(spec) if self.headers => {
                kept_fields(self.id, group, spec.name(), &decision, &limit)
            }
            _ => None,
        };
        (fields, legacy(&decision))
    }
}

/// Logs a request without a key when the server is at fault.
#[cold]
fn misconfigured(group: &str, problem: &Problem) {
    if problem.server {
        tracing::error!(limit = group, problem = %problem.message, "rate limit layer misconfigured");
    }
}
