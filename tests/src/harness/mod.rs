//! Real `redis-server` processes for integration tests: no mocks.
//!
//! * [`RedisServer`]: one standalone server on a free loopback port, with
//!   stop / kill / restart / pause / resume, or a replica of another
//!   ([`RedisServer::start_replica_of`]).
//! * [`RedisCluster`]: three masters (optionally with replicas) joined with
//!   `CLUSTER MEET` and `CLUSTER ADDSLOTSRANGE`.
//! * [`RedisSentinel`]: a sentinel monitoring a harness master, with short
//!   timings on request and a wait for its fail-over
//!   ([`RedisSentinel::wait_for_failover`]).
//!
//! Every process runs in its own temporary directory, logs to `redis.log`
//! there, and is killed when its handle is dropped (also when a test
//! panics). Tests needing Redis panic with [`NOT_FOUND_MESSAGE`] when
//! `redis-server` is missing; they are never skipped silently.
//!
//! Ports are picked by binding `127.0.0.1:0`; a start that fails with
//! "Address already in use" is retried with a new port (5 attempts), and
//! ports handed out are reserved within the process until the handle is
//! dropped, so tests can run in parallel.
//!
//! ```no_run
//! # async fn demo() {
//! use ratewall_tests::harness::RedisServer;
//!
//! let server = RedisServer::start();
//! let pong: String = server.cmd(&["PING"]).await;
//! assert_eq!(pong, "PONG");
//! # }
//! ```

mod binary;
mod cluster;
mod port;
mod process;
mod sentinel;
mod server;
mod tempdir;

pub use binary::{NOT_FOUND_MESSAGE, find_redis_server, redis_server_path};
pub use cluster::{CREATE_TIMEOUT, MASTERS, RedisCluster, SLOTS};
pub use port::PortReservation;
pub use process::pid_is_alive;
pub use sentinel::{DEFAULT_MASTER_NAME, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, RedisSentinel};
pub use server::RedisServer;
pub use tempdir::TempDir;
