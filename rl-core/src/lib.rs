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
//! # Where to go next
//! - [`macro@rate_limit`] (feature `macros`, on by default): the attribute
//!   and the table of its arguments.
//! - [`guide`]: the user guide, one page per subject (the attribute, the
//!   call API, algorithms, route limits, Redis, waiting, tiers, lists,
//!   penalty boxes, concurrency limits, leasing, token budgets, calls out to limited
//!   upstreams, operations, metrics, architecture, migrating from other
//!   limiters); every example in it is compiled and run by `cargo test`.
//! - [`Limiter`]: built with [`Limiter::builder`], installed globally once
//!   (what `#[rate_limit]` uses) or passed explicitly; [`Limiter::call`]
//!   decides a [`CallSpec`] without the macro.
//! - [`Decision`] and [`Rejection`]: being limited is a value (with an exact
//!   `retry_after`), not an error; [`Error`] is for a backend that failed or
//!   a call that can never succeed.
//!
//! # Features
//! | feature | what it adds |
//! |---|---|
//! | `macros` (default) | `#[rate_limit]` |
//! | `axum` | `http`: a [`Rejection`] as a `429` with `Retry-After` and the IETF `RateLimit` fields, the client's IP behind trusted proxies as an extractor |
//! | `tower` | `tower`: a layer limiting routes, routers and gRPC servers (response hooks, exemptions, legacy headers, clients behind `X-Forwarded-For`, `Forwarded` or `X-Real-IP`), and a client layer for calls out to a limited upstream |
//! | `reqwest` | `reqwest`: a `reqwest-middleware` middleware for calls out to a limited upstream, settled from the response (a streamed body's last usage event too) |
//! | `config` | `config`: limits, failure policies, shadow mode and lists per name from a TOML file (and `serde`) |
//! | `serde` | `Serialize` and `Deserialize` for [`Limit`] (`"10/1m"`, or a table with its algorithm and settings) and [`Algorithm`], and `config`'s limits file from any serde format (YAML, JSON, config-rs, figment) |
//! | `tonic` | `From<Rejection> for tonic::Status` |
//! | `actix` | `actix`: the route layer as actix-web middleware (the `tower` module's configuration, without the tower crate), and `actix_web::ResponseError for Rejection` |
//!
//! The Redis, Redis Cluster and Sentinel backend is the `ratewall-redis`
//! crate.
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
// How a rejection is said over HTTP and gRPC, for every integration.
#[cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(
        dead_code,
        reason = "each integration says a rejection in its own subset of these forms; the tower layer uses all"
    )
)]
mod refusal;
// HTTP: 429 responses, client IPs, headers (and axum's side of them).
#[cfg(any(feature = "axum", feature = "tower", feature = "actix"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "axum", feature = "tower", feature = "actix")))
)]
pub mod http;
// Route-level limits: a tower layer (its configuration is actix-web's
// middleware's too).
#[cfg(any(feature = "tower", feature = "actix"))]
#[cfg_attr(docsrs, doc(cfg(any(feature = "tower", feature = "actix"))))]
pub mod tower;
// Route-level limits in actix-web: a middleware.
#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
// Budgets for calls out through reqwest: a reqwest-middleware middleware.
#[cfg(feature = "reqwest")]
#[cfg_attr(docsrs, doc(cfg(feature = "reqwest")))]
pub mod reqwest;

// The user guide: Markdown pages under `docs/guide/`, doctested.
pub mod guide;

#[doc(hidden)]
#[path = "private/mod.rs"]
pub mod __private;

// What the unit tests share (a metrics recorder).
#[cfg(test)]
mod testing;

// The crate root: what a newcomer uses first. Everything else public is
// reached through a module named by use, below; each name has one public
// path (`__private` is the macro's hidden glue). A test
// (`tests/architecture.rs`) holds the root to at most 20 items.
pub use limiter::Limiter;
pub use limiter::call::{Keys, Permit};
pub use limiter::spec::{CallSpec, GroupSpec};
pub use model::decision::Decision;
pub use model::error::Error;
pub use model::key::Key;
pub use model::limit::{Algorithm, Limit};
pub use model::policy::FailurePolicy;
pub use model::rejection::{Rejection, RejectionReason};

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
pub use ratewall_macros::rate_limit;

pub mod builder {
    //! Building a [`Limiter`](crate::Limiter): its [`LimiterBuilder`]
    //! (from [`Limiter::builder`](crate::Limiter::builder)) and the settings
    //! of the circuit breaker in front of a remote backend
    //! ([`BreakerConfig`]). Reach for it to name the builder's type, e.g.
    //! in a function that configures one, or to tune the breaker.
    pub use crate::layer::breaker::BreakerConfig;
    pub use crate::limiter::builder::LimiterBuilder;
}

pub mod settings {
    //! Changing a running limiter: [`Settings`], the handle
    //! [`Limiter::settings`](crate::Limiter::settings) returns (limits,
    //! failure policies, shadow mode, lists and the deny cache per limit
    //! name, at run time), and [`NameSettings`], what is set for one name.
    //! Reach for it to change limits without a restart.
    pub use crate::limiter::settings::Settings;
    pub use crate::model::settings::NameSettings;
}

pub mod lists {
    //! Allow and deny lists: an identity on an allow list bypasses a limit
    //! name, one on a deny list is refused at once. [`ListEntry`] is one
    //! entry, as
    //! [`Settings::list_entries`](crate::settings::Settings::list_entries)
    //! lists them, and [`ListKind`] says which list it is on. Reach for it
    //! to read the lists of a running limiter; entries are added through
    //! [`Limiter::settings`](crate::Limiter::settings).
    pub use crate::model::lists::{ListEntry, ListKind};
}

pub mod call {
    //! The call API's pieces beyond the four at the crate root
    //! ([`CallSpec`](crate::CallSpec), [`GroupSpec`](crate::GroupSpec),
    //! [`Keys`](crate::Keys), [`Permit`](crate::Permit)): the futures a call
    //! returns ([`CallFuture`], [`Admitted`]), what admitted calls count
    //! ([`Counting`]), tiers ([`Tier`]), the slots of a concurrency limit
    //! ([`InFlight`]), how a call got through ([`Admission`], [`Source`]),
    //! raw requests without a spec ([`Requests`], from
    //! [`Limiter::requests`](crate::Limiter::requests)) and the most groups
    //! one call may have ([`MAX_GROUPS`]). Reach for it when calling the
    //! limiter by hand rather than through `#[rate_limit]`, or when naming
    //! these types in your own signatures.
    pub use crate::layer::Source;
    pub use crate::limiter::admission::Admission;
    pub use crate::limiter::call::{Admitted, CallFuture};
    pub use crate::limiter::in_flight::InFlight;
    pub use crate::limiter::requests::Requests;
    pub use crate::limiter::spec::{Counting, MAX_GROUPS, Tier};
}

pub mod upstream {
    //! Budgets for calls out, to an upstream with limits of its own: what
    //! one request draws on ([`Draw`], for the client integrations:
    //! `ratewall::tower::UpstreamLayer` and
    //! `ratewall::reqwest::UpstreamMiddleware`); what
    //! the upstream said ([`Hold`], read from its headers for what each
    //! group [`Counts`]), given to
    //! [`Limiter::hold`](crate::Limiter::hold) so that every instance
    //! sharing the budget hears it; limits learned from the upstream
    //! ([`Auto`]) as a shared scale of the stated limits ([`Adjust`],
    //! [`Learned`], in parts per million: [`SCALE_ONE`], between
    //! [`SCALE_FLOOR`] and [`SCALE_CEILING`]). Reach for it in a client that
    //! calls a rate-limited API.
    pub use crate::limiter::auto::Auto;
    pub use crate::limiter::outbound::Draw;
    pub use crate::limiter::upstream::{Counts, Hold};
    pub use crate::model::learned::{Adjust, Learned, SCALE_CEILING, SCALE_FLOOR, SCALE_ONE};
}

pub mod backend {
    //! What a store implements and answers: the [`Backend`] trait (with
    //! [`BoxFuture`], [`Request`], [`Leased`], [`LeaseReturn`],
    //! [`SharedLists`], [`Reservation`], [`RefundNotices`]), the answers it gives ([`Figures`],
    //! made into a [`Decision`](crate::Decision), gathered per call in
    //! [`Decisions`]) and the in-memory store, [`MemoryBackend`]. Reach for it to give a limiter a backend
    //! explicitly, to read every decision of a call, or to implement a
    //! store of your own (`ratewall-redis` does).
    pub use crate::model::decision::{Decisions, Figures};
    pub use crate::model::reservation::Reservation;
    pub use crate::store::backend::{
        Backend, Block, BoxFuture, LeaseReturn, Leased, RefundNotices, Request, SharedLists,
    };
    pub use crate::store::memory::MemoryBackend;
}

pub mod clock {
    //! Time: the [`Clock`] trait the limiter reads, the [`SystemClock`] it
    //! uses by default, a [`ManualClock`] for deterministic tests, and
    //! [`parse_duration`] for durations written like `"500ms"` or `"1h"`.
    //! Reach for it in tests, or to read durations from configuration.
    pub use crate::model::clock::{Clock, ManualClock, SystemClock};
    pub use crate::model::limit::parse_duration;
}

pub mod error {
    //! What [`Error`](crate::Error) carries: a backend's failure
    //! ([`BackendError`], with its [`Cause`]) and an invalid limit
    //! ([`LimitError`], naming the [`Problem`], the [`LeaseProblem`] or the [`BlockProblem`]).
    //! Reach for it to match on why a call failed or a limit was refused.
    pub use crate::model::error::{BackendError, Cause, LimitError};
    pub use ratewall_grammar::{BlockProblem, LeaseProblem, Problem};
}

pub mod key {
    //! Identities beyond [`Key`](crate::Key): a [`Part`] (one identity as a
    //! call passes it: an integer, text, an IP address or anything
    //! `Display`) and [`Masked`], which displays an identity with all but
    //! its first two and last two characters replaced by `*`. Reach for it
    //! when passing identities by hand ([`Keys::parts`](crate::Keys::parts))
    //! or keeping them out of your own logs.
    pub use crate::model::key::Part;
    pub use crate::model::mask::Masked;
}

// Limits files: from TOML (feature `config`) or any serde format.
#[cfg(feature = "serde")]
#[cfg_attr(docsrs, doc(cfg(feature = "serde")))]
pub mod config;
