//! [`RedisSentinel`]: a real Redis Sentinel (`redis-server --sentinel`, or
//! `valkey-server --sentinel` when Valkey is selected) monitoring a master
//! started by the harness.

use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use redis::{FromRedisValue, RedisResult};

use super::process;
use super::server::{RedisServer, Role};

/// Master name used by [`RedisSentinel::start`].
pub const DEFAULT_MASTER_NAME: &str = "mymaster";

/// `sentinel down-after-milliseconds` of the generated configuration.
pub const DOWN_AFTER_MS: u32 = 1000;

/// `sentinel failover-timeout` of the generated configuration.
pub const FAILOVER_TIMEOUT_MS: u32 = 5000;

/// Name of the generated configuration file in the sentinel's temp dir
/// (Sentinel requires a writable config file, which it rewrites).
const CONFIG_FILE: &str = "sentinel.conf";

/// A sentinel process monitoring one master on `127.0.0.1`.
///
/// It is a [`RedisServer`] underneath (see [`server`](Self::server) for
/// stop/pause/restart); dropping it kills the process and removes its dir.
#[derive(Debug)]
pub struct RedisSentinel {
    server: RedisServer,
    master_name: String,
}

impl RedisSentinel {
    /// Starts a sentinel monitoring `master` as [`DEFAULT_MASTER_NAME`] with
    /// quorum 1.
    ///
    /// # Panics
    ///
    /// Panics like [`RedisServer::start`].
    pub fn start(master: &RedisServer) -> Self {
        Self::start_monitoring(DEFAULT_MASTER_NAME, master.port(), 1)
    }

    /// Starts a sentinel monitoring the master at `127.0.0.1:master_port`
    /// under `master_name`, with the given quorum,
    /// `down-after-milliseconds` [`DOWN_AFTER_MS`] and `failover-timeout`
    /// [`FAILOVER_TIMEOUT_MS`].
    ///
    /// # Panics
    ///
    /// Panics like [`RedisServer::start`], or if the config cannot be written.
    pub fn start_monitoring(master_name: &str, master_port: u16, quorum: u32) -> Self {
        Self::start_monitoring_with(
            master_name,
            master_port,
            quorum,
            DOWN_AFTER_MS,
            FAILOVER_TIMEOUT_MS,
        )
    }

    /// Like [`start_monitoring`](Self::start_monitoring) with the given
    /// `down-after-milliseconds` and `failover-timeout` (short values make
    /// fail-over tests fast: the master is declared down after
    /// `down_after_ms` without answers, and a replica promoted soon after).
    ///
    /// # Panics
    ///
    /// Panics like [`RedisServer::start`], or if the config cannot be written.
    pub fn start_monitoring_with(
        master_name: &str,
        master_port: u16,
        quorum: u32,
        down_after_ms: u32,
        failover_timeout_ms: u32,
    ) -> Self {
        Self::start_monitoring_with_config(
            master_name,
            master_port,
            quorum,
            down_after_ms,
            failover_timeout_ms,
            "",
        )
    }

    /// Like [`start_monitoring_with`](Self::start_monitoring_with), with
    /// `extra` appended to the generated configuration file (e.g. TLS
    /// directives: `tls-port`, `tls-replication yes`, ...). The harness
    /// keeps talking to the sentinel on its plain port.
    ///
    /// # Panics
    ///
    /// Panics like [`RedisServer::start`], or if the config cannot be written.
    pub fn start_monitoring_with_config(
        master_name: &str,
        master_port: u16,
        quorum: u32,
        down_after_ms: u32,
        failover_timeout_ms: u32,
        extra: &str,
    ) -> Self {
        let server = RedisServer::launch(Role::Sentinel, |port, _, dir| {
            let config = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 protected-mode no\n\
                 daemonize no\n\
                 dir {dir}\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {master_name} {down_after_ms}\n\
                 sentinel failover-timeout {master_name} {failover_timeout_ms}\n\
                 sentinel parallel-syncs {master_name} 1\n\
                 {extra}\n",
                dir = dir.display(),
            );
            let path = dir.join(CONFIG_FILE);
            fs::write(&path, config)
                .unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
            vec![path.display().to_string(), "--sentinel".to_string()]
        });
        Self {
            server,
            master_name: master_name.to_string(),
        }
    }

    /// The underlying process handle (stop, pause, restart, logs...).
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// The name under which the master is monitored.
    pub fn master_name(&self) -> &str {
        &self.master_name
    }

    /// The sentinel's TCP port.
    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// The sentinel's URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The sentinel's pid.
    pub fn pid(&self) -> u32 {
        self.server.pid()
    }

    /// A client connected to the sentinel itself.
    pub fn client(&self) -> redis::Client {
        self.server.client()
    }

    /// Runs a command on the sentinel, e.g. `&["SENTINEL", "MASTERS"]`.
    ///
    /// # Panics
    ///
    /// Panics like [`RedisServer::cmd`].
    pub async fn cmd<T: FromRedisValue>(&self, args: &[&str]) -> T {
        self.server.cmd(args).await
    }

    /// The master address the sentinel currently reports
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`), as `(host, port)`.
    pub fn master_addr(&self) -> RedisResult<(String, u16)> {
        self.server
            .blocking_cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.master_name])
    }

    /// Waits until the sentinel names a master other than
    /// `127.0.0.1:old_port` and that node answers `ROLE` as a master (the
    /// fail-over is done); returns the new master's port.
    ///
    /// # Panics
    ///
    /// Panics if that does not happen within `timeout` (the message includes
    /// the sentinel's log tail).
    pub fn wait_for_failover(&self, old_port: u16, timeout: Duration) -> u16 {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((_, port)) = self.master_addr()
                && port != old_port
                && process::query::<redis::Value>(port, &["ROLE"], Duration::from_millis(250))
                    .is_ok_and(|role| is_master_role(&role))
            {
                return port;
            }
            if Instant::now() >= deadline {
                panic!(
                    "sentinel on port {} did not promote a new master (old: {old_port}) within \
                     {timeout:?}\n--- log tail ---\n{}",
                    self.port(),
                    self.server.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Whether a `ROLE` reply says `master`.
fn is_master_role(role: &redis::Value) -> bool {
    match role {
        redis::Value::Array(items) => matches!(
            items.first(),
            Some(redis::Value::BulkString(name)) if name.as_slice() == b"master"
        ),
        _ => false,
    }
}
