//! Glue for the code `#[rate_limit]` generates: paths it can name and the
//! conversions it needs. No decision is made here; the expansion calls the
//! public API ([`Limiter::call`], [`CallSpec`], [`Permit`]).

pub use crate::limiter::Limiter;
pub use crate::limiter::call::{Admitted, CallFuture, Keys, Permit};
pub use crate::limiter::spec::Tier;
pub use crate::limiter::spec::{CallSpec, Counting, GroupSpec};
pub use crate::model::error::Error;
pub use crate::model::key::Part;
pub use crate::model::limit::{Algorithm, Limit};
pub use crate::model::policy::FailurePolicy;
pub use crate::model::rejection::Rejection;
pub use core;

mod keys;
mod limiter;
pub use keys::{PartDisplay, PartFast, Probe};
pub use limiter::AsLimiter;

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
        Ok(limiter) => limiter.call_with(spec, Keys::parts(identities)),
        Err(error) => {
            tracing::error!(limit = spec.name(), %error, "rate limited function called without a limiter");
            CallFuture::ready(Err(Rejection::unavailable(spec.name().to_owned(), error)))
        }
    }
}

/// [`Limiter::call_with`] with each group's own cost (`cost = <expr>`)
/// and, for tiered groups, their tiers, on the limiter the function names.
#[inline]
pub fn call_costed<'l>(
    spec: &'l CallSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[Part<'_>],
    tiers: &[Part<'_>],
    costs: &[u64],
) -> CallFuture<'l> {
    match limiter {
        Ok(limiter) => {
            let keys = Keys::parts(identities).costs(costs);
            let keys = if tiers.is_empty() {
                keys
            } else {
                keys.tier_parts(tiers)
            };
            limiter.call_with(spec, keys)
        }
        Err(_) => call(spec, limiter, identities),
    }
}

/// A cost the function computes (`cost = <expr>`, `settle = |out| ..`):
/// any unsigned integer.
#[diagnostic::on_unimplemented(
    message = "a cost is an unsigned integer (`u8` to `u128`, `usize`), not `{Self}`",
    label = "not an unsigned integer",
    note = "convert it where the cost is computed, e.g. `cost = weight.ceil() as u64` or `u64::try_from(n)?`"
)]
pub trait Cost {
    /// The cost in units (`u64::MAX` past it: refused as above every
    /// capacity, never wrapped).
    fn units(self) -> u64;
}

macro_rules! unsigned_costs {
    ($($t:ty),*) => {$(
        impl Cost for $t {
            #[inline]
            fn units(self) -> u64 {
                u64::try_from(self).unwrap_or(u64::MAX)
            }
        }
    )*};
}
unsigned_costs!(u8, u16, u32, u64, u128, usize);

/// `cost` as units, for generated code.
#[inline]
pub fn cost(cost: impl Cost) -> u64 {
    cost.units()
}

/// What a function that keeps no permit matches on: the admission or
/// refusal when it is decided already (the memory store), else the future
/// to await for it (`Admitted`).
pub type AdmitNow<'l> = Result<Result<(), Rejection>, Admitted<'l>>;

/// [`call`]'s admission or refusal, the permit dropped at once (see
/// `CallFuture::admitted`), for a function that keeps no permit.
#[inline]
pub fn admitted(call: CallFuture<'_>) -> AdmitNow<'_> {
    call.admitted().decided()
}

/// [`call`] for its admission only, as [`admitted`]; a call the direct
/// lane admitted makes no permit and awaits nothing.
#[inline(always)]
pub fn admit<'l>(
    spec: &'l CallSpec,
    limiter: Result<&'l Limiter, Error>,
    identities: &[Part<'_>],
) -> AdmitNow<'l> {
    match limiter {
        Ok(limiter) => limiter.admit(spec, Keys::parts(identities)),
        Err(_) => call(spec, limiter, identities).admitted().decided(),
    }
}

/// [`Limiter::call_with`] with tiers on the limiter the function names, each tiered
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
        Ok(limiter) => limiter.call_with(spec, Keys::parts(identities).tier_parts(tiers)),
        Err(_) => call(spec, limiter, identities),
    }
}
