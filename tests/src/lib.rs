//! Cross-crate integration tests and the Redis test harness.
//!
//! The [`harness`] module starts real `redis-server` processes (standalone,
//! cluster and sentinel); its main types are re-exported here.

// An unpublished crate: the harness is the tests' own code, not an API with
// `# Errors` sections (`missing_errors_doc` holds the published crates).
#![allow(clippy::missing_errors_doc)]

pub mod harness;
pub mod proxy;

pub use harness::{RedisCluster, RedisSentinel, RedisServer, ServerKind};
