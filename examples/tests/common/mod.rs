//! Runs a service binary on a free port, on the in-memory backend or on a
//! real `redis-server` started by the harness.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ratewall_tests::harness::{RedisServer, TempDir};

/// Which backend the service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Redis,
}

pub const BACKENDS: [Backend; 2] = [Backend::Memory, Backend::Redis];

/// A running service process, killed on drop.
pub struct Service {
    child: Child,
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    redis: Option<RedisServer>,
    /// Holds `stderr.log` when the service's log is kept.
    log_dir: Option<TempDir>,
}

impl Service {
    /// Starts `binary` with `env`, on `backend`, and waits until it accepts connections.
    pub fn start(binary: &str, backend: Backend, env: &[(&str, &str)]) -> Self {
        let redis = (backend == Backend::Redis).then(RedisServer::start);
        Self::launch(binary, redis, env, false)
    }

    /// Starts `binary` with `env` on `redis` (its URL as `REDIS_URL` unless
    /// `env` gives one) or in memory, keeping its stderr for [`Self::log`]
    /// when `keep_log`.
    pub fn launch(
        binary: &str,
        redis: Option<RedisServer>,
        env: &[(&str, &str)],
        keep_log: bool,
    ) -> Self {
        let log_dir = keep_log.then(|| TempDir::new("service-log"));
        for attempt in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let mut command = Command::new(binary);
            command
                .env("BIND", addr.to_string())
                .env("RUST_LOG", "warn")
                .env_remove("REDIS_URL");
            if let Some(redis) = &redis {
                command.env("REDIS_URL", redis.url());
            }
            command.envs(env.iter().copied()).stdout(Stdio::null());
            match &log_dir {
                Some(dir) => {
                    let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
                    command.stderr(Stdio::from(log));
                }
                None => {
                    command.stderr(Stdio::inherit());
                }
            }
            let mut child = command
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if TcpStream::connect(addr).is_ok() {
                    let http = reqwest::Client::builder().no_proxy().build().unwrap();
                    return Self {
                        child,
                        addr,
                        http,
                        redis,
                        log_dir,
                    };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    eprintln!(
                        "{binary} exited with {status} (attempt {attempt}); retrying on another port"
                    );
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("{binary} did not start listening");
    }

    /// The Redis server the service runs on.
    pub fn redis(&self) -> &RedisServer {
        self.redis.as_ref().expect("the service runs on Redis")
    }

    /// What the service wrote to stderr so far (started with `keep_log`).
    pub fn log(&self) -> String {
        let dir = self.log_dir.as_ref().expect("started with keep_log");
        std::fs::read_to_string(dir.path().join("stderr.log")).unwrap()
    }

    /// The service's process id (e.g. to send it SIGHUP).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn post_json(&self, path: &str, body: serde_json::Value) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    pub async fn post_raw(&self, path: &str, body: &'static str) -> reqwest::Response {
        self.http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `binary` with `env` (no `REDIS_URL` unless given, logs at `warn`
/// unless `RUST_LOG` is given) until it exits,
/// at most `within`; its exit code (`None`: killed by a signal) and stderr.
///
/// # Panics
///
/// Panics if it is still running after `within` (it is then killed).
pub fn run_to_exit(binary: &str, env: &[(&str, &str)], within: Duration) -> (Option<i32>, String) {
    let mut child = Command::new(binary)
        .env("BIND", "127.0.0.1:0")
        .env("RUST_LOG", "warn")
        .env_remove("REDIS_URL")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{binary} still running after {within:?} with {env:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

/// The body of a response as JSON.
pub async fn json(response: reqwest::Response) -> serde_json::Value {
    response.json().await.unwrap()
}
