//! Function-level rate limiting: one attribute on an async fn, one limiter
//! configured at startup, decisions made in memory or in Redis.
//!
//! `cargo add ratewall` (features below), and for Redis `cargo add ratewall-redis`.
//! The quick start (`cargo run --example quickstart` in the repository):
//!
//! ```
//! use ratewall::{Limiter, Rejection, rate_limit};
//!
//! #[rate_limit(period = 30, threshold = 2, key = user_id)]
//! async fn say_hi(user_id: u64) -> Result<String, Rejection> {
//!     Ok(format!("hi {user_id}"))
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     Limiter::builder().memory().prefix("demo").install()?; // once, at startup
//!     println!("{}", say_hi(7).await?);
//!     println!("{}", say_hi(7).await?);
//!     let refused = say_hi(7).await.unwrap_err(); // third call within 30 s: body not run
//!     // GCRA (the default) spaces 2 per 30 s as one every 15 s after the burst.
//!     let retry_after = refused.decision().unwrap().retry_after_secs();
//!     println!("refused by {}, retry after {retry_after} s", refused.name());
//!     assert_eq!(retry_after, 15);
//!     assert!(say_hi(8).await.is_ok()); // another user has their own quota
//!     Ok(())
//! }
//! ```
//!
//! # Features
//! - [`macro@rate_limit`] (feature `macros`, on by default): the attribute.
//!   Arguments: `period`, `threshold`, `limits`, `key`, `algorithm`,
//!   `cost`, `burst`, `slots`, `lease`, `max_in_flight`, `in_flight_ttl`,
//!   `name`, `also(...)`, `tier` + `tiers(...)`, `count`, `count_if`,
//!   `reset_on_success`, `on_reject`, `headers`, `limiter`, `on_error`,
//!   `wait`, `crate`; see its docs.
//! - Tiers: limits chosen per call by the caller's tier (`free`, `pro`),
//!   each tier on its own state and live-configurable as `<name>@<tier>`
//!   ([`GroupSpec::tiered`], [`Keys::tiers`](crate::Keys::tiers), [`Tier`]).
//! - Waiting instead of failing ([`Keys::wait`](crate::Keys::wait), `wait = "2s"`):
//!   on GCRA and the buckets a waiting call reserves the earliest slot every
//!   limit allows, atomically, and sleeps until it (callers queue and leave
//!   at the limit's rate; a dropped waiter gives its slot back); on the
//!   window algorithms it retries after each `retry_after` until its
//!   deadline.
//! - [`Limiter`]: a backend, a key prefix and a [`FailurePolicy`]; one is
//!   installed globally with [`LimiterBuilder::install`].
//! - A deny cache in front of remote backends: a key the backend just
//!   refused is refused in process until its `retry_after`, so a flood on
//!   a blocked identity never reaches Redis ([`Settings::set_deny_cache`]).
//! - Quota leasing for hot identities on a remote backend
//!   ([`Limit::with_lease`], `lease = N`): a process reserves units of a
//!   busy identity's limit in the backend and decides its calls in process
//!   from them, never admitting more than the limit; cold identities are
//!   decided by the backend as before. [`Limiter::shutdown`] gives unused
//!   units back.
//! - [`MemoryBackend`]: the embedded default, sharded, bounded memory.
//!   `ratewall-redis` provides the Redis and Redis Cluster backend.
//! - Six [`Algorithm`]s with one contract; being limited is a [`Decision`],
//!   not an error, and a refused call becomes a [`Rejection`].
//! - `LimitsFile` (feature `config`): limits, failure policies and shadow
//!   mode per name from a TOML file, applied to a running limiter.
//! - `ratewall::http` (feature `axum`, or `tower`): a [`Rejection`] as a
//!   `429` with `Retry-After` and the IETF `RateLimit` fields, the client's
//!   IP behind trusted proxies, keyed by network (IPv6 by `/64` by
//!   default); with `axum`, axum's `IntoResponse` for [`Rejection`] and the
//!   `ClientIp` extractor.
//! - `ratewall::tower` (feature `tower`, without axum): a `tower::Layer`
//!   limiting routes, routers and gRPC servers (axum, tonic, hyper: any
//!   tower service over `http` requests) by client IP or network, header,
//!   request extension or function, and with feature `axum` too by path
//!   parameter, several keys all-or-nothing; gRPC requests are refused with
//!   `RESOURCE_EXHAUSTED`.
//! - `From<Rejection> for tonic::Status` (feature `tonic`) and
//!   `actix_web::ResponseError for Rejection` (feature `actix`).
//! - Concurrency limits ([`Limit::in_flight`], `max_in_flight = N`): at most
//!   `N` calls of a key running at once across instances, leased slots held
//!   by the [`Permit`] ([`InFlight`]) and decided with the rate limits.
//!
//! # Quota leasing
//! One hot identity (a big tenant, a global "10 000 SMS per minute") costs
//! one backend round trip per call. With a lease size
//! ([`Limit::with_lease`], `lease = N` in the macro or the limits file), a
//! limiter on a remote backend watches each identity's rate: a cold
//! identity (under about 80 units a second with the default TTL) takes no
//! lease and is decided by the backend as before; a hot one reserves units
//! in the backend in one atomic call ([`Backend::acquire_lease`]) and
//! decides its next calls in process from them, all-or-nothing over every
//! limit of the call. A lease is sized to a tenth of the lease TTL
//! ([`LimiterBuilder::lease_ttl`], default 1 s) at the identity's observed
//! rate, at most `N`, and never more than half of what the backend has
//! left, so the last units of a limit are shared rather than stranded; the
//! next lease is taken ahead when one is half spent.
//!
//! - **Never above the limit.** A leased unit is taken in the backend when
//!   it is leased, so the backend never admits it twice, and it is used
//!   only while the algorithm would still allow it (see below).
//! - **The cost: stranded units.** Units leased to one process cannot serve
//!   another. With `n` processes (or limiter instances), up to
//!   **`(n − 1) × N`** units can sit unused in the other instances' leases
//!   while one instance is refused; they go back when those leases end
//!   (the TTL), their identity goes idle (a fifth of the TTL), its limits
//!   change, or on [`Limiter::shutdown`].
//! - **A process that dies** gives nothing back itself: with GCRA and the
//!   buckets its units are back within the lease TTL (a lease never spans
//!   more than the TTL's worth of refill); with the window algorithms they
//!   count as used until their window (or slot) ends, at most `N` per dead
//!   process: the backend cannot tell which of a dead holder's units were
//!   used, and freeing them early could admit more than the limit.
//! - **Algorithms.** `gcra`, `token_bucket` and `leaky_bucket` lease: unit
//!   `k` of a lease is scheduled `k` emission intervals after the one
//!   before it and expires at its theoretical arrival time, so a unit is
//!   never used after the state would have refilled it. `fixed_window`
//!   leases units of the current window, used only within it;
//!   `sliding_window` units of the current slot, used only within that
//!   slot, so they count exactly where the backend counted them.
//!   `sliding_log` cannot lease ([`Limit::with_lease`] refuses it): it
//!   records each admitted unit's own timestamp, and a unit reserved at
//!   `t` but used at `t' > t` would leave the log early, letting more than
//!   `T` through in `[t', t' + P)`. Concurrency limits
//!   ([`Limit::in_flight`]) do not take quota leases either: their slots
//!   (leased for a TTL, renewed while a call runs) are held, not spent.
//! - **Where it applies.** Remote backends only (the [`MemoryBackend`] is
//!   already in process), calls whose every limit has a lease size, with a
//!   Tokio runtime (a background task gives leases back). Shadowed names,
//!   idempotent calls and raw `acquire_all` calls do not lease.
//! - **Visibility.** `ratewall_decisions_total{source="lease"}` counts the calls
//!   decided from leases; the gauge `ratewall_leased_units{limit}` the units
//!   held unused ([`Limiter::leased_units`]); `ratewall_lease_takes_total`,
//!   `ratewall_lease_units_total{event="taken"|"returned"}` and
//!   `ratewall_lease_returns_total{result}` the traffic. `ratewall inspect`
//!   lists the lease records Redis keeps for an identity's limit.
//!
//! # Which algorithm
//! | algorithm | memory per identity | worst case in any window of length `P` | pick it for |
//! |---|---|---|---|
//! | `gcra` (default) | one timestamp | `burst + T − 1` (a full burst, then the steady rate); `T` with `burst = 1` | almost everything: O(1), smooth, exact `retry_after` |
//! | `fixed_window` | one counter | `2T` across a window boundary | cheap coarse quotas ("10 per day") |
//! | `sliding_log` | one entry per admitted unit (`T ≤ 10 000`) | exactly `T` | small `T` that must never be exceeded (SMS, login) |
//! | `sliding_window` | `slots` counters | just under `2T` if a quota lands in the last µs of one slot; close to `T` for spread traffic | large `T` needing near-exact windows |
//! | `token_bucket` | tokens + timestamp | `burst + T − 1` | bursty clients with an average rate |
//! | `leaky_bucket` | level + timestamp | `burst + T − 1` (a whole burst passes at once) | the same decisions as the token bucket, seen from the level; with waiting calls and `burst = 1`, a smoother |
//!
//! A window of length `P` is `[t, t + P)`. A client calling as fast as it
//! is allowed gets exactly `T` per `P` from every algorithm but
//! `sliding_window`, which gives `max(T·N/(N+1), T − 1)` with `N` slots.
//! The repository's `docs/accuracy.md` measures all of this with a
//! deterministic simulation, and how often each algorithm decides unlike an
//! exact sliding log under load.
//!
//! The default is GCRA because it needs one value per identity, never
//! over-admits on average, gives an exact `retry_after`, and bursts only up to
//! the configured `burst`. Choose `sliding_log` when "never more than `T` in
//! any `P`" is a hard requirement.
//!
//! # Time
//! All state is integer microseconds (exact in Redis' Lua doubles). GCRA's
//! emission interval `P / T` is rounded up to a whole microsecond, so it never
//! admits faster than configured.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// The limit model: limits, keys, decisions, errors, time.
mod model;
// The six algorithms, as pure functions over typed state.
mod algorithm;
// Where decisions are made: memory, or a remote `Backend`.
mod store;
// What wraps a decision: observe, validate, shadow, failure policy, deny
// cache, breaker, publishing.
mod layer;
// The façade: `Limiter`, its builder, the call API, runtime overrides.
mod limiter;
// Limits from a TOML file.
#[cfg(feature = "config")]
mod config;
// How a rejection is said over HTTP and gRPC, for every integration.
#[cfg_attr(
    not(feature = "tower"),
    allow(
        dead_code,
        reason = "each integration says a rejection in its own subset of these forms; the tower layer uses all"
    )
)]
mod refusal;
// HTTP: 429 responses, client IPs, headers (and axum's side of them).
#[cfg(any(feature = "axum", feature = "tower"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "axum", feature = "tower"))))]
pub mod http;
// Route-level limits: a tower layer.
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;

// What the unit tests share (a metrics recorder).
#[cfg(test)]
mod testing;

#[cfg(feature = "config")]
#[cfg_attr(docsrs, doc(cfg(feature = "config")))]
pub use config::{ConfigError, LimitsEntry, LimitsFile};
pub use layer::Source;
pub use layer::breaker::BreakerConfig;
pub use limiter::Limiter;
pub use limiter::admission::Admission;
pub use limiter::auto::Auto;
pub use limiter::builder::LimiterBuilder;
pub use limiter::call::{Admitted, CallFuture, Keys, Permit};
pub use limiter::in_flight::InFlight;
pub use limiter::requests::Requests;
pub use limiter::settings::Settings;
pub use limiter::spec::{CallSpec, Counting, GroupSpec, MAX_GROUPS, Tier};
pub use limiter::upstream::{Counts, Hold};
pub use model::clock::{Clock, ManualClock, SystemClock};
pub use model::decision::{Decision, Decisions, Figures};
pub use model::error::{BackendError, Cause, Error, LimitError};
// The grammar's types that `LimitError` carries.
pub use model::key::{Key, Part};
pub use model::learned::{Adjust, Learned, SCALE_CEILING, SCALE_FLOOR, SCALE_ONE};
pub use model::limit::{Algorithm, Limit, parse_duration};
pub use model::lists::{ListEntry, ListKind};
pub use model::mask::Masked;
pub use model::policy::FailurePolicy;
pub use model::rejection::{Rejection, RejectionReason};
pub use model::reservation::Reservation;
pub use model::settings::NameSettings;
pub use ratewall_grammar::{LeaseProblem, Problem};
pub use store::backend::{Backend, BoxFuture, LeaseReturn, Leased, Request, SharedLists};
pub use store::memory::MemoryBackend;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use ratewall_macros::rate_limit;
