//! Glue for the code `#[rate_limit]` generates: paths it can name and the
//! conversions it needs. No decision is made here; the expansion calls the
//! public API ([`Limiter::call`], [`CallSpec`], [`Permit`]).

use std::fmt::Display;
use std::sync::Arc;

pub use crate::limiter::Limiter;
pub use crate::limiter::call::{CallFuture, CallSpec, Counting, GroupSpec, Permit};
pub use crate::model::error::Error;
pub use crate::model::limit::{Algorithm, Limit};
pub use crate::model::policy::FailurePolicy;
pub use crate::model::rejection::Rejection;
pub use core;

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

/// [`FailurePolicy::local`] for a `static` (the macro has checked `share`).
pub const fn local(share: u64) -> FailurePolicy {
    match FailurePolicy::local(share) {
        Some(policy) => policy,
        None => panic!("`local(N)` needs N >= 1"),
    }
}

/// [`Limiter::call`] on the limiter the function names, or a rejection
/// (logged) when there is none, e.g. no global limiter installed.
pub fn call<'l>(
    spec: &'l CallSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[&dyn Display],
) -> CallFuture<'l> {
    match limiter {
        Ok(limiter) => limiter.call(spec, identities),
        Err(error) => {
            tracing::error!(limit = spec.name(), %error, "rate limited function called without a limiter");
            CallFuture::ready(Err(Rejection::unavailable(spec.name().to_owned(), error)))
        }
    }
}
