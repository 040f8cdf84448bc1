//! Support for the code `#[rate_limit]` generates. Not a public API.
//!
//! The entry points build every key synchronously from the identities, so
//! the returned futures hold no reference to the caller's arguments and are
//! `Send` whenever the handler's are.

use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use smallvec::SmallVec;

pub use crate::error::Error;
pub use crate::limit::{Algorithm, Limit};
pub use crate::limiter::{Admission, Limiter};
pub use crate::policy::FailurePolicy;
pub use crate::rejection::Rejection;
pub use core;

use crate::backend::Request;
use crate::key::Key;

/// What one annotated function with a single key asks for, built at compile time.
#[derive(Debug)]
pub struct Spec {
    /// The limit's name: metrics label and key scope.
    pub name: &'static str,
    /// The limits decided together on every call.
    pub limits: &'static [Limit],
    /// Units each call takes.
    pub cost: u64,
    /// Overrides the limiter's failure policy.
    pub policy: Option<FailurePolicy>,
}

/// One key and the limits decided on it, for a function with several keys.
#[derive(Debug)]
pub struct Group {
    /// The group's name: key scope, and policy name in HTTP headers.
    pub name: &'static str,
    /// The limits decided on this group's key.
    pub limits: &'static [Limit],
    /// Units each call takes from these limits.
    pub cost: u64,
    /// When a call is not counted (count-failures mode), forget this
    /// group's identity instead of refunding the call.
    pub reset_on_success: bool,
}

/// A function with one or more keys, each with one or more limits, decided
/// together and all-or-nothing.
#[derive(Debug)]
pub struct MultiSpec {
    /// The function's name, for metrics.
    pub name: &'static str,
    /// The groups, in the order of the identities passed to [`check_groups`].
    pub groups: &'static [Group],
    /// Overrides the limiter's failure policy.
    pub policy: Option<FailurePolicy>,
}

/// Anything the `limiter = ...` argument may name.
#[diagnostic::on_unimplemented(
    message = "`limiter = ...` must be a `Limiter`, `&Limiter`, `Arc<Limiter>` or `Box<Limiter>`, not `{Self}`"
)]
pub trait AsLimiter {
    /// The limiter.
    fn as_limiter(&self) -> &Limiter;
}

impl AsLimiter for Limiter {
    fn as_limiter(&self) -> &Limiter {
        self
    }
}

impl<T: AsLimiter + ?Sized> AsLimiter for &T {
    fn as_limiter(&self) -> &Limiter {
        (**self).as_limiter()
    }
}

impl<T: AsLimiter + ?Sized> AsLimiter for Arc<T> {
    fn as_limiter(&self) -> &Limiter {
        (**self).as_limiter()
    }
}

impl<T: AsLimiter + ?Sized> AsLimiter for Box<T> {
    fn as_limiter(&self) -> &Limiter {
        (**self).as_limiter()
    }
}

/// The global limiter, for generated code.
pub fn global() -> Result<&'static Limiter, Error> {
    Limiter::global()
}

/// A limit from literal parts the macro has validated; fails const evaluation otherwise.
pub const fn limit(
    threshold: u64,
    period_us: u64,
    algorithm: Algorithm,
    burst: u64,
    slots: u64,
) -> Limit {
    Limit::__const(threshold, period_us, algorithm, burst, slots)
}

/// A group's limits: compiled in, or set at runtime by name.
#[derive(Debug, Clone)]
enum Limits {
    Static(&'static [Limit]),
    Runtime(Arc<[Limit]>),
}

impl Limits {
    fn resolve(limiter: &Limiter, name: &str, compiled: &'static [Limit]) -> Self {
        limiter
            .limits(name)
            .map_or(Limits::Static(compiled), Limits::Runtime)
    }
}

impl std::ops::Deref for Limits {
    type Target = [Limit];
    fn deref(&self) -> &[Limit] {
        match self {
            Limits::Static(limits) => limits,
            Limits::Runtime(limits) => limits,
        }
    }
}

/// One key with its limits, resolved for one call.
#[derive(Debug)]
struct Resolved {
    name: &'static str,
    key: Key,
    limits: Limits,
    cost: u64,
    reset_on_success: bool,
}

/// An admitted call. In count-failures mode it gives back what it took
/// ([`Permit::refund`]) or resets the identity ([`Permit::reset`]).
#[derive(Debug)]
pub struct Permit<'l> {
    limiter: &'l Limiter,
    name: &'static str,
    groups: SmallVec<[Resolved; 2]>,
    admission: Admission,
}

fn requests(groups: &[Resolved]) -> SmallVec<[Request<'_>; 4]> {
    let mut requests = SmallVec::new();
    for group in groups {
        for limit in group.limits.iter() {
            requests.push(Request::new(&group.key, limit, group.cost));
        }
    }
    requests
}

impl Permit<'_> {
    /// How the call was admitted.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Gives back what this call took. Failures are logged, not returned:
    /// the call already ran.
    pub async fn refund(self) {
        let requests = requests(&self.groups);
        if let Err(error) = self
            .limiter
            .refund_admission(&requests, &self.admission)
            .await
        {
            tracing::warn!(limit = self.name, %error, "rate limit refund failed");
        }
    }

    /// Forgets the state of this call's identities (consecutive-failure
    /// counting: a success starts the count again).
    pub async fn reset(self) {
        let requests = requests(&self.groups);
        if let Err(error) = self.limiter.reset_everywhere(&requests).await {
            tracing::warn!(limit = self.name, %error, "rate limit reset failed");
        }
    }

    /// Count-failures mode, after the body ran: a counted call keeps what it
    /// took; otherwise each group refunds it, or forgets its identity when
    /// the group resets on success.
    pub async fn settle(self, counted: bool) {
        if counted {
            return;
        }
        let mut offset = 0;
        for group in &self.groups {
            let requests = requests(std::slice::from_ref(group));
            let range = offset..offset + requests.len();
            offset = range.end;
            let result = if group.reset_on_success {
                self.limiter.reset_everywhere(&requests).await
            } else {
                self.limiter
                    .refund_admission(&requests, &sub_admission(&self.admission, range))
                    .await
            };
            if let Err(error) = result {
                tracing::warn!(limit = group.name, %error, "rate limit refund or reset failed");
            }
        }
    }

    /// The allowed decision with the fewest units left, with its group's
    /// name and limit (what `RateLimit` headers on a success describe).
    pub fn binding(&self) -> Option<(&'static str, crate::Decision, Limit)> {
        let decisions = self.admission.decisions()?;
        let binding = decisions.binding();
        let index = decisions.iter().position(|d| d == binding)?;
        self.groups
            .iter()
            .flat_map(|g| g.limits.iter().map(move |limit| (g.name, *limit)))
            .nth(index)
            .map(|(name, limit)| (name, *binding, limit))
    }

    /// Adds `RateLimit-Policy` and `RateLimit` to a successful response.
    #[cfg(feature = "axum")]
    pub fn add_headers<R: WithHeaders>(&self, response: &mut R) {
        if let (Some((name, decision, limit)), Some(headers)) =
            (self.binding(), response.headers_mut())
        {
            crate::http::insert_rate_limit_headers(headers, name, &decision, &limit);
        }
    }
}

/// Responses that can carry rate-limit headers (the `headers` option).
#[cfg(feature = "axum")]
#[diagnostic::on_unimplemented(
    message = "`headers` needs the function to return an `http::Response` or a `Result` of one, not `{Self}`"
)]
pub trait WithHeaders {
    /// The headers to add to, if this is a successful response.
    fn headers_mut(&mut self) -> Option<&mut ::http::HeaderMap>;
}

#[cfg(feature = "axum")]
impl<B> WithHeaders for ::http::Response<B> {
    fn headers_mut(&mut self) -> Option<&mut ::http::HeaderMap> {
        Some(::http::Response::headers_mut(self))
    }
}

#[cfg(feature = "axum")]
impl<T: WithHeaders, E> WithHeaders for Result<T, E> {
    fn headers_mut(&mut self) -> Option<&mut ::http::HeaderMap> {
        self.as_mut().ok().and_then(WithHeaders::headers_mut)
    }
}

/// The part of an admission that covers `range` of its requests.
fn sub_admission(admission: &Admission, range: std::ops::Range<usize>) -> Admission {
    let slice =
        |d: &crate::Decisions| crate::Decisions::new(d.as_slice()[range.clone()].iter().copied());
    match admission {
        Admission::Backend(d) => Admission::Backend(slice(d)),
        Admission::Local { decisions, share } => Admission::Local {
            decisions: slice(decisions),
            share: *share,
        },
        Admission::Shadowed(d) => Admission::Shadowed(slice(d)),
        Admission::FailedOpen => Admission::FailedOpen,
    }
}

fn unavailable(name: &'static str, error: Error) -> Rejection {
    tracing::error!(limit = name, %error, "rate limited function called without a limiter");
    Rejection::unavailable(name, error)
}

async fn decide<'l>(
    limiter: &'l Limiter,
    name: &'static str,
    policy: Option<FailurePolicy>,
    groups: SmallVec<[Resolved; 2]>,
) -> Result<Permit<'l>, Rejection> {
    let mut names: SmallVec<[&'static str; 4]> = SmallVec::new();
    for group in &groups {
        names.extend(std::iter::repeat_n(group.name, group.limits.len()));
    }
    let admission = {
        let requests = requests(&groups);
        limiter.check_named(name, &names, &requests, policy).await?
    };
    Ok(Permit {
        limiter,
        name,
        groups,
        admission,
    })
}

/// The future of the plain expansion: already decided for the in-memory
/// store (no state, no allocation), boxed for a remote one (one allocation
/// next to a network round trip).
#[must_use = "futures do nothing unless awaited"]
pub enum CheckFuture<'l> {
    /// Decided synchronously.
    Ready(Option<Result<(), Rejection>>),
    /// Waiting for a remote backend.
    Remote(std::pin::Pin<Box<dyn Future<Output = Result<(), Rejection>> + Send + 'l>>),
}

impl std::fmt::Debug for CheckFuture<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CheckFuture::Ready(result) => f.debug_tuple("Ready").field(result).finish(),
            CheckFuture::Remote(_) => f.write_str("Remote(..)"),
        }
    }
}

impl Future for CheckFuture<'_> {
    type Output = Result<(), Rejection>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            CheckFuture::Ready(result) => {
                std::task::Poll::Ready(result.take().expect("CheckFuture polled after completion"))
            }
            CheckFuture::Remote(future) => future.as_mut().poll(cx),
        }
    }
}

/// Decides the call described by `spec` for `identity` (the plain
/// `#[rate_limit]` expansion: nothing to settle afterwards, so no [`Permit`]).
pub fn check<'l>(
    spec: &'static Spec,
    limiter: Result<&'l Limiter, Error>,
    identity: &dyn Display,
) -> CheckFuture<'l> {
    let limiter = match limiter {
        Ok(limiter) => limiter,
        Err(error) => return CheckFuture::Ready(Some(Err(unavailable(spec.name, error)))),
    };
    let key = limiter.key(spec.name, identity);
    let limits = Limits::resolve(limiter, spec.name, spec.limits);
    {
        let mut requests: SmallVec<[Request<'_>; 2]> = SmallVec::new();
        for limit in limits.iter() {
            requests.push(Request::new(&key, limit, spec.cost));
        }
        if let Some(done) = limiter.check_in_memory(spec.name, &[], &requests, spec.policy) {
            return CheckFuture::Ready(Some(done.map(drop)));
        }
    }
    CheckFuture::Remote(Box::pin(async move {
        let mut requests: SmallVec<[Request<'_>; 2]> = SmallVec::new();
        for limit in limits.iter() {
            requests.push(Request::new(&key, limit, spec.cost));
        }
        limiter
            .check_named(spec.name, &[], &requests, spec.policy)
            .await
            .map(drop)
    }))
}

/// Decides a call with several keys: `identities[i]` is the identity of
/// `spec.groups[i]`.
pub fn check_groups<'l>(
    spec: &'static MultiSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[&dyn Display],
) -> impl Future<Output = Result<Permit<'l>, Rejection>> + Send + 'l {
    let prepared = limiter.map(|limiter| {
        let groups: SmallVec<[Resolved; 2]> = spec
            .groups
            .iter()
            .zip(identities)
            .map(|(group, identity)| Resolved {
                name: group.name,
                key: limiter.key(group.name, *identity),
                limits: Limits::resolve(limiter, group.name, group.limits),
                cost: group.cost,
                reset_on_success: group.reset_on_success,
            })
            .collect();
        (limiter, groups)
    });
    async move {
        let (limiter, groups) = prepared.map_err(|error| unavailable(spec.name, error))?;
        decide(limiter, spec.name, spec.policy, groups).await
    }
}
