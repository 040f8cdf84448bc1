//! Redis and Redis Cluster backend for [`rl_core`]: every algorithm as one
//! atomic Lua script, decided in one round trip.
//!
//! ```no_run
//! use rl_core::{Limiter, Rejection, rate_limit};
//! use rl_redis::RedisBackend;
//!
//! #[rate_limit(period = 60, threshold = 1, key = phone, algorithm = sliding_log)]
//! async fn send_code(phone: &str) -> Result<(), Rejection> {
//!     Ok(())
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379/").await?;
//! Limiter::builder().backend(backend).prefix("app").install()?;
//! send_code("+33 6 12 34 56 78").await?;
//! let refused = send_code("+33 6 12 34 56 78").await.unwrap_err();
//! assert!(refused.retry_after().is_some());
//! # Ok(())
//! # }
//! ```
//!
//! # Features
//! - [`RedisBackend`] implements [`rl_core::Backend`] with the same decisions
//!   as [`rl_core::MemoryBackend`] (held to it by differential tests): fixed
//!   window, sliding log, sliding-window counter, token bucket, leaky bucket
//!   and GCRA, all state in integer microseconds.
//! - One Lua script for all algorithms, so a call carrying several limits
//!   (e.g. 1/min, 5/h and 10/day per phone) is one `EVALSHA`, decided
//!   all-or-nothing. `SCRIPT FLUSH`, restarts and fail-overs are survived:
//!   the script is loaded again on `NOSCRIPT`.
//! - The server's `TIME` by default, a client clock on request
//!   ([`RedisBackendBuilder::client_clock`]).
//! - Every key expires as soon as its state no longer matters; refused calls
//!   and peeks write nothing.
//! - Standalone Redis ([`RedisBackend::connect`], a reconnecting
//!   `ConnectionManager`), Redis Cluster ([`RedisBackend::connect_cluster`])
//!   and Redis Sentinel ([`RedisBackend::connect_sentinel`]: the master is
//!   found through the sentinels and looked up again after a failure, so
//!   fail-overs are followed by the same backend).
//! - Idempotent decisions ([`rl_core::Backend::acquire_once`]): a retry with
//!   the same request id after a lost reply returns the kept reply instead
//!   of charging again, decided and kept in the same script call.
//! - A per-call timeout ([`RedisBackendBuilder::timeout`], 1 s by default).
//! - A limits registry, `<prefix>:{limits}`: the limits of every name the
//!   limiter decides, for operators' tools ([`RedisBackend::registered_limits`]).
//!
//! # Storage
//! Per identity and limit, under `<key>:<algorithm>:<period_us>`:
//!
//! | algorithm | Redis type | `MEMORY USAGE`, T = 100, after 100 calls |
//! |---|---|---:|
//! | `fixed_window` | 16-byte string: two packed doubles (window index, count) | 120 B |
//! | `sliding_log` | sorted set (one entry per admitted unit) + sequence string | 1456 B |
//! | `sliding_window` | hash `{slot: count}`, at most `slots + 2` fields | 104 B |
//! | `token_bucket`, `leaky_bucket` | 24-byte string: three packed doubles (scaled level, updated, fresh at) | 120 B |
//! | `gcra` | string (the TAT) | 72 B |
//!
//! An allowed [`rl_core::Backend::acquire_once`] also keeps its reply, as a
//! comma-separated string, under `<first key>:req:<escaped id>` for the
//! longest period of the call.
//!
//! (Redis 7.0, measured by the `loadgen` example.)
//!
//! # Requirements
//! Redis 4.0 or later (5.0 or later for server time with replication), a
//! Tokio runtime with the time driver enabled.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod backend;
mod builder;
mod error;
mod registry;
mod script;
#[cfg(feature = "sentinel")]
mod sentinel;

pub use backend::RedisBackend;
pub use builder::{CallMode, RedisBackendBuilder};
pub use registry::RegisteredLimits;

/// Support for this crate's tools (the load generator). Not a public API.
#[doc(hidden)]
pub mod __private {
    use rl_core::Request;

    use crate::CallMode;
    use crate::script::{Op, Plan, Time, Via};

    /// The command line deciding `requests` (acquire) with the server's
    /// time, as `redis-benchmark` or `redis-cli` take it: `FCALL ...` in
    /// [`CallMode::Functions`], `EVALSHA ...` otherwise.
    pub fn acquire_command_line(requests: &[Request<'_>], mode: CallMode) -> Vec<String> {
        let via = if mode == CallMode::Functions {
            Via::Function
        } else {
            Via::ScriptSha
        };
        Plan::new(Op::Acquire, Time::Server, 0, 0, requests, None).command_line(via)
    }
}
