//! Cross-crate integration tests and the Redis test harness.
//!
//! The [`harness`] module starts real `redis-server` processes (standalone,
//! cluster and sentinel); its main types are re-exported here.

pub mod harness;
pub mod proxy;

pub use harness::{RedisCluster, RedisSentinel, RedisServer, ServerKind};
