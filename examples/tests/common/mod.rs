//! Runs a service binary on a free port, on the in-memory backend or on a
//! real `redis-server` started by the harness; builds the `ratewall` CLI of
//! `ratewall-redis` for the tests that run it.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
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

/// How to build the `ratewall` CLI by hand, from the workspace root.
const BUILD_CLI: &str = "cargo build -p ratewall-redis --features cli --bin ratewall";

/// The path of the `ratewall` binary (package `ratewall-redis`, feature
/// `cli`), built once per test process.
///
/// `env!("CARGO_BIN_EXE_...")` names only this package's binaries, so the
/// CLI is built here with the cargo running the tests (`$CARGO`), from the
/// workspace root, into the target directory and profile of this test
/// executable (`<target>/<profile>/deps/<test>`): the binary lands at
/// `<target>/<profile>/ratewall`. Already built and unchanged, this costs
/// cargo's check that it is fresh.
///
/// # Panics
///
/// Panics, saying how to build it by hand, if it cannot be built.
pub fn ratewall_cli() -> &'static str {
    static BUILT: OnceLock<Result<String, String>> = OnceLock::new();
    match BUILT.get_or_init(build_ratewall_cli) {
        Ok(path) => path,
        Err(why) => panic!("{why}"),
    }
}

fn build_ratewall_cli() -> Result<String, String> {
    let failed = |why: String| {
        format!(
            "cannot build the `ratewall` CLI for this test: {why}\nbuild it with `{BUILD_CLI}` from the workspace root"
        )
    };
    let test_exe =
        std::env::current_exe().map_err(|e| failed(format!("no test executable path: {e}")))?;
    // <target>/<profile>/deps/<test>
    let profile_dir = test_exe.parent().and_then(Path::parent).ok_or_else(|| {
        failed(format!(
            "{} is not in <target>/<profile>/deps/",
            test_exe.display()
        ))
    })?;
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| failed(format!("{} has no parent", profile_dir.display())))?;
    let profile = match profile_dir.file_name().and_then(|name| name.to_str()) {
        Some("debug") => "dev",
        Some(name) => name,
        None => {
            return Err(failed(format!(
                "{} names no profile",
                profile_dir.display()
            )));
        }
    };
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| failed("the examples crate has no parent directory".to_owned()))?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(&cargo)
        .current_dir(workspace)
        .args([
            "build",
            "--quiet",
            "-p",
            "ratewall-redis",
            "--features",
            "cli",
            "--bin",
            "ratewall",
        ])
        .arg("--profile")
        .arg(profile)
        .arg("--target-dir")
        .arg(target_dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| failed(format!("cannot run {}: {e}", Path::new(&cargo).display())))?;
    if !output.status.success() {
        return Err(failed(format!(
            "`{BUILD_CLI}` exited with {}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let binary: PathBuf = profile_dir.join(format!("ratewall{}", std::env::consts::EXE_SUFFIX));
    if !binary.is_file() {
        return Err(failed(format!("cargo built no {}", binary.display())));
    }
    binary
        .into_os_string()
        .into_string()
        .map_err(|path| failed(format!("{} is not UTF-8", PathBuf::from(path).display())))
}
