//! Glue for the code `#[rate_limit]` generates: paths it can name and the
//! conversions it needs. No decision is made here; the expansion calls the
//! public API ([`Limiter::call`], [`CallSpec`], [`Permit`]).

use std::fmt::Display;
use std::sync::Arc;

pub use crate::limiter::Limiter;
pub use crate::limiter::call::{CallFuture, CallSpec, Counting, GroupSpec, Permit};
pub use crate::limiter::tier::Tier;
pub use crate::model::error::Error;
pub use crate::model::key::Part;
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
#[inline]
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
#[inline]
pub fn call<'l>(
    spec: &'l CallSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[Part<'_>],
) -> CallFuture<'l> {
    match limiter {
        Ok(limiter) => limiter.call_parts(spec, identities),
        Err(error) => {
            tracing::error!(limit = spec.name(), %error, "rate limited function called without a limiter");
            CallFuture::ready(Err(Rejection::unavailable(spec.name().to_owned(), error)))
        }
    }
}

/// [`Limiter::call_tiered`] on the limiter the function names, each tiered
/// group decided by its tier in `tiers` (a `tier = ..` value in the forms
/// keys take: a string as is, anything else through its `Display`).
#[inline]
pub fn call_tiered<'l>(
    spec: &'l CallSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[Part<'_>],
    tiers: &[Part<'_>],
) -> CallFuture<'l> {
    match limiter {
        Ok(limiter) => limiter.call_parts_tiered(spec, identities, tiers),
        Err(_) => call(spec, limiter, identities),
    }
}

/// A key expression's value, for [`PartFast`] / [`PartDisplay`] to turn
/// into a [`Part`]: `(&&Probe(&key)).__rl_part()` picks an integer or
/// string form when the key's type has one (method resolution tries the
/// `&&Probe` receiver first), else its `Display`.
pub struct Probe<'a, T>(pub &'a T);

/// Keys with a fast form: integers and strings.
pub trait PartFast<'a> {
    /// The key's part.
    fn __rl_part(&self) -> Part<'a>;
}

/// Every other key: through its `Display` (a key that is not `Display` is
/// reported at the key, as "doesn't implement `Display`").
pub trait PartDisplay<'a, T> {
    /// The key's part.
    fn __rl_part(&self) -> Part<'a>
    where
        T: Display;
}

impl<'a, T> PartDisplay<'a, T> for Probe<'a, T> {
    fn __rl_part(&self) -> Part<'a>
    where
        T: Display,
    {
        Part::Display(self.0)
    }
}

macro_rules! fast {
    ($variant:ident as $wide:ty: $($int:ty),*) => {$(
        impl<'a> PartFast<'a> for &Probe<'a, $int> {
            fn __rl_part(&self) -> Part<'a> {
                Part::$variant(*self.0 as $wide)
            }
        }
    )*};
}

fast!(Unsigned as u64: u8, u16, u32, u64, usize);
fast!(Signed as i64: i8, i16, i32, i64, isize);

impl<'a> PartFast<'a> for &Probe<'a, String> {
    fn __rl_part(&self) -> Part<'a> {
        Part::Text(self.0)
    }
}

impl<'a, 'b: 'a> PartFast<'a> for &Probe<'a, &'b str> {
    fn __rl_part(&self) -> Part<'a> {
        Part::Text(self.0)
    }
}
