//! Function-level rate limiting: one attribute on an async fn, one limiter
//! configured at startup, decisions made in memory or in Redis.
//!
//! ```
//! use rl_core::{rate_limit, Limiter, Rejection};
//!
//! #[rate_limit(period = 30, threshold = 2, key = user_id)]
//! async fn say_hi(user_id: u64) -> Result<String, Rejection> {
//!     Ok(format!("hi {user_id}"))
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! Limiter::builder().memory().prefix("demo").install()?; // once, at startup
//! say_hi(7).await?;
//! say_hi(7).await?;
//! let refused = say_hi(7).await.unwrap_err(); // third call within 30 s: body not run
//! // GCRA (the default) spaces 2 per 30 s as one every 15 s after the burst.
//! assert_eq!(refused.decision().unwrap().retry_after_secs(), 15);
//! assert!(say_hi(8).await.is_ok()); // another user has their own quota
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//! - [`macro@rate_limit`] (feature `macros`, on by default): the attribute.
//!   Arguments: `period`, `threshold`, `limits`, `key`, `algorithm`,
//!   `cost`, `burst`, `slots`, `name`, `also(...)`, `count`, `count_if`,
//!   `reset_on_success`, `on_reject`, `headers`, `limiter`, `on_error`,
//!   `crate`; see its docs.
//! - [`Limiter`]: a backend, a key prefix and a [`FailurePolicy`]; one is
//!   installed globally with [`LimiterBuilder::install`].
//! - A deny cache in front of remote backends: a key the backend just
//!   refused is refused in process until its `retry_after`, so a flood on
//!   a blocked identity never reaches Redis ([`Limiter::set_deny_cache`]).
//! - [`MemoryBackend`]: the embedded default, sharded, bounded memory.
//!   `rl-redis` provides the Redis and Redis Cluster backend.
//! - Six [`Algorithm`]s with one contract; being limited is a [`Decision`],
//!   not an error, and a refused call becomes a [`Rejection`].
//! - `LimitsFile` (feature `config`): limits, failure policies and shadow
//!   mode per name from a TOML file, applied to a running limiter.
//! - `rl_core::http` (feature `axum`): a [`Rejection`] as a `429` with
//!   `Retry-After` and the IETF `RateLimit` fields, the client's IP behind
//!   trusted proxies, keyed by network (IPv6 by `/64` by default).
//! - `rl_core::tower` (feature `tower`): a `tower::Layer` limiting routes, routers
//!   and gRPC servers by client IP or network, header, path parameter,
//!   request extension or function, several keys all-or-nothing; gRPC
//!   requests are refused with `RESOURCE_EXHAUSTED`.
//! - `From<Rejection> for tonic::Status` (feature `tonic`) and
//!   `actix_web::ResponseError for Rejection` (feature `actix`).
//!
//! # Which algorithm
//! | algorithm | memory per identity | worst case in any window of length `P` | pick it for |
//! |---|---|---|---|
//! | `gcra` (default) | one timestamp | `burst + T − 1` (a full burst, then the steady rate); `T` with `burst = 1` | almost everything: O(1), smooth, exact `retry_after` |
//! | `fixed_window` | one counter | `2T` across a window boundary | cheap coarse quotas ("10 per day") |
//! | `sliding_log` | one entry per admitted unit (`T ≤ 10 000`) | exactly `T` | small `T` that must never be exceeded (SMS, login) |
//! | `sliding_window` | `slots` counters | just under `2T` if a quota lands in the last µs of one slot; close to `T` for spread traffic | large `T` needing near-exact windows |
//! | `token_bucket` | tokens + timestamp | `burst + T − 1` | bursty clients with an average rate |
//! | `leaky_bucket` | level + timestamp | `burst + T − 1` | the same decisions as the token bucket, seen from the level |
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
// axum integration: 429 responses, client IPs, headers.
#[cfg(feature = "axum")]
pub mod http;
// Route-level limits: a tower layer.
#[cfg(feature = "tower")]
pub mod tower;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

#[cfg(feature = "config")]
pub use config::{ConfigError, LimitsEntry, LimitsFile};
pub use layer::Source;
pub use layer::breaker::BreakerConfig;
pub use limiter::Limiter;
pub use limiter::builder::LimiterBuilder;
pub use limiter::call::{Admission, CallFuture, CallSpec, Counting, GroupSpec, Permit};
pub use limiter::lists::{ListEntry, ListKind};
pub use limiter::registry::Settings;
pub use model::clock::{Clock, ManualClock, SystemClock};
pub use model::decision::{Decision, Decisions, Figures};
pub use model::error::{BackendError, Error, LimitError};
pub use model::key::Key;
pub use model::limit::{Algorithm, Limit, parse_duration};
pub use model::mask::Masked;
pub use model::policy::FailurePolicy;
pub use model::rejection::{Rejection, RejectionReason};
pub use store::backend::{Backend, BoxFuture, LeaseReturn, Leased, Request, SharedLists};
pub use store::memory::MemoryBackend;

#[cfg(feature = "macros")]
pub use rl_macros::rate_limit;
