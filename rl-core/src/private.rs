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
