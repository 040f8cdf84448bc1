//! What the `limiter = ...` argument of `#[rate_limit]` may name.

use std::sync::Arc;

use crate::limiter::Limiter;

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
