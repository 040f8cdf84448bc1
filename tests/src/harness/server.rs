//! [`RedisServer`]: one real `redis-server` child process per value.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Mutex, MutexGuard};
use std::thread;
use std::time::Duration;

use redis::{AsyncConnectionConfig, FromRedisValue, RedisResult};

use super::binary::{KIND_CONFIG_FILE, ServerKind};
use super::port::PortReservation;
use super::process::{self, LOG_FILE, STOP_GRACE, StartError};
use super::tempdir::TempDir;

/// How many ports are tried before giving up when they turn out to be taken.
pub(crate) const MAX_START_ATTEMPTS: usize = 5;

/// Response timeout of the connections opened by [`RedisServer::cmd`].
const CMD_RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Timeout of the blocking connections used by [`RedisServer::blocking_cmd`].
const BLOCKING_TIMEOUT: Duration = Duration::from_secs(5);

/// A real `redis-server` process listening on `127.0.0.1`, with its own
/// temporary working directory (holding `redis.log`, its stdout and stderr).
/// The server is of the kind `RATEWALL_TEST_SERVER` selects
/// ([`ServerKind::selected`]): Redis by default, Valkey, or Redis without
/// `FUNCTION`.
///
/// Persistence is disabled (`--save "" --appendonly no`), so every start and
/// every [`restart`](Self::restart) begins with an empty dataset.
///
/// Dropping the value SIGKILLs the process if it is still running (also while
/// a failing test unwinds, in which case the log tail is printed to stderr)
/// and deletes the temporary directory. All methods take `&self`, so a
/// server can be shared between tasks behind an `Arc`.
#[derive(Debug)]
pub struct RedisServer {
    state: Mutex<State>,
    kind: ServerKind,
    binary: PathBuf,
    args: Vec<String>,
    port: PortReservation,
    cluster_bus_port: Option<PortReservation>,
    dir: TempDir,
}

#[derive(Debug)]
struct State {
    /// `None` once the process has been stopped or killed and reaped.
    child: Option<Child>,
    pid: u32,
}

/// What a process is for: decides its kind's configuration and its bus port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A standalone server or a replica.
    Server,
    /// A cluster node (gets a bus port).
    ClusterNode,
    /// A sentinel (its own configuration file; no data-node directives).
    Sentinel,
}

impl Role {
    fn label(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::ClusterNode => "cluster",
            Role::Sentinel => "sentinel",
        }
    }
}

/// Arguments used for every server, before the caller's own arguments.
fn base_args(port: u16, dir: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir.display().to_string(),
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
    ]
    .map(String::from)
    .to_vec()
}

/// Additional arguments of a cluster node.
fn cluster_args(bus_port: u16) -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "2000",
        "--cluster-port",
        &bus_port.to_string(),
        "--cluster-announce-ip",
        "127.0.0.1",
    ]
    .map(String::from)
    .to_vec()
}

impl RedisServer {
    /// Starts a standalone server on a free loopback port and waits until it
    /// answers.
    ///
    /// # Panics
    ///
    /// Panics if `redis-server` is not installed (see
    /// [`NOT_FOUND_MESSAGE`](super::NOT_FOUND_MESSAGE)), if it does not answer
    /// within 10 s (the message includes the log tail), or if five freshly
    /// picked ports in a row turn out to be in use.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments
    /// appended after the harness's own (so they can override them), e.g.
    /// `&["--maxmemory", "10mb"]`.
    ///
    /// # Panics
    ///
    /// See [`start`](Self::start); also panics if the arguments are rejected.
    pub fn start_with(args: &[&str]) -> Self {
        let extra: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        Self::launch(Role::Server, move |port, _, dir| {
            let mut all = base_args(port, dir);
            all.extend(extra.iter().cloned());
            all
        })
    }

    /// Starts a replica of `master` (`--replicaof 127.0.0.1 <port>`) and
    /// waits until it has synced (`master_link_status:up`).
    ///
    /// # Panics
    ///
    /// See [`start`](Self::start); also panics if the replica has not synced
    /// within 10 s (the message includes both log tails).
    pub fn start_replica_of(master: &RedisServer) -> Self {
        let port = master.port().to_string();
        let replica = Self::start_with(&["--replicaof", "127.0.0.1", &port]);
        replica.wait_for_sync(master, process::READY_TIMEOUT);
        replica
    }

    /// Waits until this replica reports `master_link_status:up`.
    fn wait_for_sync(&self, master: &RedisServer, timeout: Duration) {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let synced = self
                .blocking_cmd::<String>(&["INFO", "replication"])
                .is_ok_and(|info| info.lines().any(|l| l.trim() == "master_link_status:up"));
            if synced {
                return;
            }
            if std::time::Instant::now() >= deadline {
                panic!(
                    "replica on port {} did not sync with master {} within {timeout:?}\n\
                     --- replica log ---\n{}\n--- master log ---\n{}",
                    self.port(),
                    master.port(),
                    self.log_tail(),
                    master.log_tail()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts a cluster-enabled node (`--cluster-enabled yes`, bus port
    /// allocated like the client port) that knows no other node yet, with
    /// `extra` arguments appended (e.g. TLS settings).
    pub(crate) fn start_cluster_node_with(extra: &[String]) -> Self {
        Self::launch(Role::ClusterNode, |port, bus, dir| {
            let mut all = base_args(port, dir);
            all.extend(cluster_args(bus.expect("cluster nodes get a bus port")));
            all.extend(extra.iter().cloned());
            all
        })
    }

    /// Picks ports, builds the argument list with `make_args(port, bus_port,
    /// dir)` (which may also write files into `dir`) and starts a server of
    /// the selected kind, retrying with new ports while they turn out to be
    /// taken. A data node of a kind with its own directives gets them in
    /// a configuration file, given first.
    ///
    /// # Panics
    ///
    /// Panics if the selected kind's executable is missing (with how to
    /// install it), or as [`start`](Self::start) says.
    pub(crate) fn launch(
        role: Role,
        mut make_args: impl FnMut(u16, Option<u16>, &Path) -> Vec<String>,
    ) -> Self {
        let kind = ServerKind::selected();
        let binary = kind.binary();
        let dir = TempDir::new(&format!("{kind}-{}", role.label()));
        let kind_config = match role {
            Role::Server | Role::ClusterNode if !kind.config().is_empty() => {
                let path = dir.path().join(KIND_CONFIG_FILE);
                fs::write(&path, kind.config())
                    .unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
                Some(path.display().to_string())
            }
            _ => None,
        };
        let mut failures = Vec::new();
        for _ in 0..MAX_START_ATTEMPTS {
            let port = PortReservation::new();
            let bus = (role == Role::ClusterNode).then(PortReservation::new);
            let mut args: Vec<String> = kind_config.iter().cloned().collect();
            args.extend(make_args(
                port.port(),
                bus.as_ref().map(PortReservation::port),
                dir.path(),
            ));
            match process::spawn_and_wait(&binary, dir.path(), &args, port.port()) {
                Ok(child) => {
                    return Self {
                        state: Mutex::new(State {
                            pid: child.id(),
                            child: Some(child),
                        }),
                        kind,
                        binary,
                        args,
                        port,
                        cluster_bus_port: bus,
                        dir,
                    };
                }
                Err(StartError::AddressInUse(message)) => failures.push(message),
                Err(StartError::Fatal(message)) => panic!("{message}"),
            }
        }
        panic!(
            "could not start {}: {MAX_START_ATTEMPTS} ports in a row were already in use.\n{}",
            binary.display(),
            failures.join("\n\n")
        );
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock must not turn Drop into a second panic.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The kind of server this process is (see [`ServerKind::selected`]).
    pub fn kind(&self) -> ServerKind {
        self.kind
    }

    /// The executable this process runs.
    pub fn binary(&self) -> &Path {
        &self.binary
    }

    /// The TCP port the server listens on (stable across restarts).
    pub fn port(&self) -> u16 {
        self.port.port()
    }

    /// The cluster bus port of a cluster node, `None` for other servers.
    pub fn cluster_bus_port(&self) -> Option<u16> {
        self.cluster_bus_port.as_ref().map(PortReservation::port)
    }

    /// The connection URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        process::url(self.port())
    }

    /// The pid of the current process (after a stop: of the last one).
    pub fn pid(&self) -> u32 {
        self.state().pid
    }

    /// The server's temporary working directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The path of the server's log file (its stdout and stderr).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join(LOG_FILE)
    }

    /// The last lines the server logged since it was last started.
    pub fn log_tail(&self) -> String {
        process::log_tail(&self.log_path())
    }

    /// Whether the process is alive. A paused server counts as running.
    pub fn is_running(&self) -> bool {
        let mut state = self.state();
        match state.child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => true,
            Some(Ok(Some(_)) | Err(_)) => {
                state.child = None;
                false
            }
            None => false,
        }
    }

    /// Stops the server gracefully: SIGTERM (plus SIGCONT in case it is
    /// paused), SIGKILL if it is still alive after 2 s, then reaps it.
    /// A no-op if it is not running.
    pub fn stop(&self) {
        let mut state = self.state();
        if let Some(mut child) = state.child.take() {
            process::terminate(&mut child, STOP_GRACE);
        }
    }

    /// Kills the server abruptly with SIGKILL (simulating a crash) and reaps
    /// it. A no-op if it is not running.
    pub fn kill(&self) {
        let mut state = self.state();
        if let Some(mut child) = state.child.take() {
            process::kill_and_reap(&mut child);
        }
    }

    /// Stops the server (see [`stop`](Self::stop)) and starts a new process
    /// with the same arguments on the same port, in the same directory (so a
    /// cluster node keeps its `nodes.conf`), with an empty dataset. Works on a
    /// stopped or killed server too.
    ///
    /// # Panics
    ///
    /// Panics if the new process does not come up, e.g. because something
    /// else took the port in the meantime.
    pub fn restart(&self) {
        self.stop();
        for leftover in ["dump.rdb", "appendonly.aof", "appendonlydir"] {
            let path = self.dir.path().join(leftover);
            let _ = fs::remove_file(&path);
            let _ = fs::remove_dir_all(&path);
        }
        let mut failures = Vec::new();
        for attempt in 1..=MAX_START_ATTEMPTS {
            match process::spawn_and_wait(&self.binary, self.dir.path(), &self.args, self.port()) {
                Ok(child) => {
                    let mut state = self.state();
                    state.pid = child.id();
                    state.child = Some(child);
                    return;
                }
                Err(StartError::AddressInUse(message)) => {
                    failures.push(message);
                    thread::sleep(Duration::from_millis(200 * attempt as u64));
                }
                Err(StartError::Fatal(message)) => panic!("restart failed: {message}"),
            }
        }
        panic!(
            "restart failed: port {} stayed in use by another process.\n{}",
            self.port(),
            failures.join("\n\n")
        );
    }

    /// Freezes the process with SIGSTOP: connections stay open but nothing
    /// is answered until [`resume`](Self::resume).
    ///
    /// # Panics
    ///
    /// Panics if the server is not running or the signal cannot be sent.
    pub fn pause(&self) {
        self.signal_running("STOP");
    }

    /// Lets a paused process continue with SIGCONT.
    ///
    /// # Panics
    ///
    /// Panics if the server is not running or the signal cannot be sent.
    pub fn resume(&self) {
        self.signal_running("CONT");
    }

    fn signal_running(&self, signal: &str) {
        assert!(
            self.is_running(),
            "cannot send SIG{signal} to redis-server on port {}: it is not running",
            self.port()
        );
        if let Err(message) = process::send_signal(self.pid(), signal) {
            panic!("{message}");
        }
    }

    /// A client for this server (connections are opened lazily by the
    /// client's methods).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("the harness URL is valid")
    }

    /// Runs one command on a fresh multiplexed connection and converts the
    /// reply, e.g. `server.cmd::<String>(&["GET", "key"]).await`.
    ///
    /// # Panics
    ///
    /// Panics, naming the command, if it fails or the reply does not convert
    /// to `T`; use [`try_cmd`](Self::try_cmd) to inspect errors.
    pub async fn cmd<T: FromRedisValue>(&self, args: &[&str]) -> T {
        match self.try_cmd(args).await {
            Ok(value) => value,
            Err(err) => panic!("`{}` on {} failed: {err}", args.join(" "), self.url()),
        }
    }

    /// Like [`cmd`](Self::cmd) but returns the error instead of panicking
    /// (still panics if `args` is empty).
    pub async fn try_cmd<T: FromRedisValue>(&self, args: &[&str]) -> RedisResult<T> {
        let config = AsyncConnectionConfig::new().set_response_timeout(Some(CMD_RESPONSE_TIMEOUT));
        let mut con = self
            .client()
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        process::build_cmd(args).query_async(&mut con).await
    }

    /// Waits, if needed, so that at least a minute is left in the current
    /// fixed window of `period` by this server's clock (`TIME`): a test that
    /// reads back what it wrote in a fixed window must not see the window
    /// end in between.
    pub async fn away_from_window_end(&self, period: Duration) {
        let (seconds, micros) = self.cmd::<(u64, u64)>(&["TIME"]).await;
        let now = Duration::from_secs(seconds) + Duration::from_micros(micros);
        let left = period - Duration::from_micros((now.as_micros() % period.as_micros()) as u64);
        if left < Duration::from_secs(60) {
            tokio::time::sleep(left + Duration::from_secs(1)).await;
        }
    }

    /// Runs one command on a fresh blocking connection (5 s timeouts), for
    /// code outside an async runtime.
    pub fn blocking_cmd<T: FromRedisValue>(&self, args: &[&str]) -> RedisResult<T> {
        process::query(self.port(), args, BLOCKING_TIMEOUT)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let mut state = self.state();
        if let Some(mut child) = state.child.take() {
            if thread::panicking() {
                eprintln!(
                    "--- redis-server on port {} (pid {}) killed during a panic; log tail ---\n{}",
                    self.port(),
                    state.pid,
                    process::log_tail(&self.dir.path().join(LOG_FILE))
                );
            }
            process::kill_and_reap(&mut child);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, TcpListener};

    use super::*;

    #[test]
    fn a_taken_port_is_reported_as_retryable_address_in_use() {
        let taken = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let dir = TempDir::new("redis-test");
        let args = base_args(port, dir.path());
        let binary = ServerKind::selected().binary();
        match process::spawn_and_wait(&binary, dir.path(), &args, port) {
            Err(StartError::AddressInUse(message)) => {
                assert!(message.contains("Address already in use"), "{message}");
            }
            Err(StartError::Fatal(message)) => panic!("expected a retryable error: {message}"),
            Ok(mut child) => {
                process::kill_and_reap(&mut child);
                panic!("redis-server started on a port that was taken");
            }
        }
    }
}
