//! Support for the code `#[rate_limit]` generates. Not a public API.

use std::fmt::Display;
use std::sync::Arc;

use smallvec::SmallVec;

pub use crate::limit::{Algorithm, Limit};
pub use crate::limiter::{Admission, Limiter};
pub use crate::policy::FailurePolicy;
pub use crate::rejection::Rejection;
pub use crate::error::Error;
pub use core;

use crate::backend::Request;

/// What one annotated function asks for, built at compile time.
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

/// Anything the `limiter = ...` argument may name.
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
pub const fn limit(threshold: u64, period_us: u64, algorithm: Algorithm, burst: u64, slots: u64) -> Limit {
    Limit::__const(threshold, period_us, algorithm, burst, slots)
}

/// Decides the call described by `spec` for `identity`.
pub async fn check(
    spec: &'static Spec,
    limiter: Result<&Limiter, Error>,
    identity: &dyn Display,
) -> Result<Admission, Rejection> {
    let limiter = match limiter {
        Ok(limiter) => limiter,
        Err(error) => {
            tracing::error!(limit = spec.name, %error, "rate limited function called without a limiter");
            return Err(Rejection::unavailable(spec.name, error));
        }
    };
    let key = limiter.key(spec.name, identity);
    let requests: SmallVec<[Request<'_>; 4]> =
        spec.limits.iter().map(|limit| Request::new(&key, limit, spec.cost)).collect();
    limiter.check(spec.name, &requests, spec.policy).await
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

/// An admitted call: can give back what it took (count-failures mode) or
/// reset the identity (reset-on-success).
#[derive(Debug)]
pub struct Permit<'l> {
    limiter: &'l Limiter,
    spec: &'static MultiSpec,
    keys: SmallVec<[crate::key::Key; 2]>,
    admission: Admission,
}

impl Permit<'_> {
    fn requests(&self) -> SmallVec<[Request<'_>; 4]> {
        self.spec
            .groups
            .iter()
            .zip(&self.keys)
            .flat_map(|(group, key)| group.limits.iter().map(move |limit| Request::new(key, limit, group.cost)))
            .collect()
    }

    /// How the call was admitted.
    pub fn admission(&self) -> &Admission {
        &self.admission
    }

    /// Gives back what this call took. Failures are logged, not returned:
    /// the call already ran.
    pub async fn refund(self) {
        let requests = self.requests();
        if let Err(error) = self.limiter.refund_admission(&requests, &self.admission).await {
            tracing::warn!(limit = self.spec.name, %error, "rate limit refund failed");
        }
    }

    /// Forgets the state of this call's identities (consecutive-failure
    /// counting: a success starts the count again).
    pub async fn reset(self) {
        let requests = self.requests();
        if let Err(error) = self.limiter.reset_everywhere(&requests).await {
            tracing::warn!(limit = self.spec.name, %error, "rate limit reset failed");
        }
    }
}

/// Decides a call with several keys: `identities[i]` is the identity of
/// `spec.groups[i]`.
pub async fn check_groups<'l>(
    spec: &'static MultiSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[&dyn Display],
) -> Result<Permit<'l>, Rejection> {
    let limiter = match limiter {
        Ok(limiter) => limiter,
        Err(error) => {
            tracing::error!(limit = spec.name, %error, "rate limited function called without a limiter");
            return Err(Rejection::unavailable(spec.name, error));
        }
    };
    let keys: SmallVec<[crate::key::Key; 2]> =
        spec.groups.iter().zip(identities).map(|(group, id)| limiter.key(group.name, *id)).collect();
    let mut names: SmallVec<[&'static str; 4]> = SmallVec::new();
    let mut requests: SmallVec<[Request<'_>; 4]> = SmallVec::new();
    for (group, key) in spec.groups.iter().zip(&keys) {
        for limit in group.limits {
            names.push(group.name);
            requests.push(Request::new(key, limit, group.cost));
        }
    }
    let admission = limiter.check_named(spec.name, &names, &requests, spec.policy).await?;
    drop(requests);
    Ok(Permit { limiter, spec, keys, admission })
}
