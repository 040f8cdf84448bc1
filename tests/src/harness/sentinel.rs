//! [`RedisSentinel`]: a real Redis Sentinel (`redis-server --sentinel`)
//! monitoring a master started by the harness.

use std::fs;

use redis::{FromRedisValue, RedisResult};

use super::server::RedisServer;

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
        let server = RedisServer::launch("redis-sentinel", false, |port, _, dir| {
            let config = format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 protected-mode no\n\
                 daemonize no\n\
                 dir {dir}\n\
                 sentinel monitor {master_name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {master_name} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {master_name} {FAILOVER_TIMEOUT_MS}\n\
                 sentinel parallel-syncs {master_name} 1\n",
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
}
