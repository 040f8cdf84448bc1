//! Runs the `upstream` showcase's trials and measures them: four worker
//! processes (the `upstream-worker` binary next to this one) sharing one
//! budget in a Redis of their own (a `redis-server` this starts on a free
//! port) call a strict mock upstream (see `ratewall_examples::upstream`) at
//! a demand far above its limits.
//!
//! `SCENARIO` (default `known`):
//! - `known`: the workers are told the upstream's limits (2 % under them);
//! - `halved`: told them, then the upstream halves its limits at
//!   `HALVE_AFTER` (default 30 s) without a word (no limit headers), and
//!   the workers find the new limit (`AUTO=1`);
//! - `auto4x`: told limits four times too high, no limit headers, `AUTO=1`.
//!
//! `STRICT=1`: a served answer says nothing (no remaining counts); only a
//! refusal does.
//!
//! `RUNS` runs (default 1) of `SECS` seconds each (default 60; for `halved`
//! `HALVE_AFTER` + 310: the five minutes after the halving). Prints one
//! JSON line per run (see [`Trial`]); with `OUT_DIR`, also writes each
//! run's second-by-second history there (`<scenario>-<run>.json`, what
//! `upstream-plot` draws).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ratewall_examples::StartupError;
use ratewall_examples::upstream::{MockUpstream, Second, Shape, WorkerReport, env_number};
use serde::Serialize;

/// The strict upstream's limits per window.
const REQUESTS: u64 = 1_000;
const TOKENS: u64 = 20_000;

/// What one run measured.
#[derive(Debug, Serialize)]
struct Trial {
    scenario: String,
    strict: bool,
    run: u64,
    secs: u64,
    /// Requests the workers sent, and of them refused by the upstream.
    sent: u64,
    refused: u64,
    /// `refused / sent`, in percent.
    refused_percent: f64,
    /// The share of the upstream's limit served over the measured seconds
    /// (from one window after the start, or 30 s after the halving, to the
    /// end), in percent: its binding dimension (requests or tokens).
    used_percent: f64,
    requests_percent: f64,
    tokens_percent: f64,
    /// `halved`: seconds from the halving to its last `429`, the longest
    /// `Retry-After` said in the window after it, and the `429`s after
    /// twice that.
    last_refusal_after_halving: Option<u64>,
    retry_after_at_halving: Option<u64>,
    refused_after_twice_retry_after: Option<u64>,
    /// What each worker's budget ended with (tokens per window).
    final_tokens: Vec<u64>,
    store_calls_per_request: Vec<f64>,
}

/// A `redis-server` on a free port, stopped when dropped.
struct Redis {
    child: Child,
    url: String,
}

impl Redis {
    fn start() -> Result<Self, StartupError> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| StartupError::new(format!("no free port: {e}")))?
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                StartupError::new(format!(
                    "cannot start redis-server ({e}): install it (apt-get install -y redis-server)"
                ))
            })?;
        let url = format!("redis://127.0.0.1:{port}/");
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(Self { child, url });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(StartupError::new("redis-server did not start".to_owned()))
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn worker_binary() -> Result<std::path::PathBuf, StartupError> {
    let me = std::env::current_exe()
        .map_err(|e| StartupError::new(format!("cannot find this program: {e}")))?;
    let worker = me.with_file_name("upstream-worker");
    if worker.exists() {
        Ok(worker)
    } else {
        Err(StartupError::new(format!(
            "{} is missing: cargo build -p ratewall-examples --bins",
            worker.display()
        )))
    }
}

/// Sums over the seconds of `history` in `[from, to)`.
fn totals(history: &[Second], from: u64, to: u64) -> (u64, u64, u64) {
    history
        .iter()
        .filter(|s| s.second >= from && s.second < to)
        .fold((0, 0, 0), |(r, t, x), s| {
            (r + s.requests, t + s.tokens, x + s.refused)
        })
}

async fn run_once(
    scenario: &str,
    run: u64,
    secs: u64,
    halve_after: u64,
) -> Result<Trial, StartupError> {
    let redis = Redis::start()?;
    let shape = Shape::default();
    let says_limits = scenario == "known";
    // STRICT=1: a served answer says nothing; only refusals say what is left.
    let says_left = env_number("STRICT", 0).unwrap_or(0) == 0;
    let upstream = MockUpstream::shaped(REQUESTS, TOKENS, shape)
        .saying_limits(says_limits)
        .saying_left(says_left);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| StartupError::new(format!("no free port: {e}")))?;
    let url = format!(
        "http://{}",
        listener
            .local_addr()
            .map_err(|e| StartupError::new(e.to_string()))?
    );
    tokio::spawn(upstream.clone().serve(listener));
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| StartupError::new(e.to_string()))?
        .as_secs();
    if scenario == "halved" {
        let halved = upstream.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(halve_after)).await;
            halved.set_limits(REQUESTS / 2, TOKENS / 2);
        });
    }
    let (stated_requests, stated_tokens, auto) = match scenario {
        "auto4x" => (4 * REQUESTS, 4 * TOKENS, "1"),
        "halved" => (REQUESTS * 98 / 100, TOKENS * 98 / 100, "1"),
        _ => (REQUESTS * 98 / 100, TOKENS * 98 / 100, "0"),
    };
    let worker = worker_binary()?;
    let children: Vec<Child> = (0..4)
        .map(|_| {
            Command::new(&worker)
                .env("REDIS_URL", &redis.url)
                .env("UPSTREAM", &url)
                .env("SECS", secs.to_string())
                .env("CONCURRENCY", "8")
                .env(
                    "MAX_TOKENS",
                    env_number("MAX_TOKENS", 40).unwrap_or(40).to_string(),
                )
                .env("REQUESTS", stated_requests.to_string())
                .env("TOKENS", stated_tokens.to_string())
                .env("AUTO", auto)
                .env(
                    "RUST_LOG",
                    std::env::var("WORKER_LOG").unwrap_or_else(|_| "warn".to_owned()),
                )
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| StartupError::new(format!("cannot start a worker: {e}")))
        })
        .collect::<Result<_, _>>()?;
    let reports: Vec<WorkerReport> = tokio::task::spawn_blocking(move || {
        children
            .into_iter()
            .map(|child| {
                let output = child.wait_with_output().map_err(|e| e.to_string())?;
                if !output.status.success() {
                    return Err(format!("a worker failed: {output:?}"));
                }
                let line = String::from_utf8_lossy(&output.stdout).into_owned();
                serde_json::from_str(line.trim()).map_err(|e| format!("{e}: {line}"))
            })
            .collect::<Result<Vec<_>, String>>()
    })
    .await
    .map_err(|e| StartupError::new(e.to_string()))?
    .map_err(StartupError::new)?;
    let history = upstream.history();
    let served = upstream.served();
    let sent = served.requests + served.refused;
    let end = started + secs;
    let window = shape.window.as_secs().max(1);
    let (from, limits) = match scenario {
        "halved" => (started + halve_after + 30, (REQUESTS / 2, TOKENS / 2)),
        _ => (started + window, (REQUESTS, TOKENS)),
    };
    let (requests, tokens, _) = totals(&history, from, end);
    let measured = end.saturating_sub(from).max(1) as f64;
    let per_window = |n: u64| n as f64 * measured / window as f64;
    let requests_percent = 100.0 * requests as f64 / per_window(limits.0);
    let tokens_percent = 100.0 * tokens as f64 / per_window(limits.1);
    let (mut last, mut retry_after, mut late) = (None, None, None);
    if scenario == "halved" {
        let halving = started + halve_after;
        last = history
            .iter()
            .filter(|s| s.second >= halving && s.refused > 0)
            .map(|s| s.second - halving)
            .max();
        let said = history
            .iter()
            .filter(|s| s.second >= halving && s.second < halving + window)
            .map(|s| s.retry_after)
            .max()
            .unwrap_or(0);
        retry_after = Some(said);
        let (_, _, refused) = totals(&history, halving + 2 * said.max(1) + 1, end + 1);
        late = Some(refused);
    }
    if let Ok(dir) = std::env::var("OUT_DIR") {
        let path = format!("{dir}/{scenario}-{run}.json");
        let text = serde_json::to_string(&history).map_err(|e| StartupError::new(e.to_string()))?;
        std::fs::write(&path, text).map_err(|e| StartupError::new(format!("{path}: {e}")))?;
    }
    Ok(Trial {
        scenario: scenario.to_owned(),
        strict: !says_left,
        run,
        secs,
        sent,
        refused: served.refused,
        refused_percent: 100.0 * served.refused as f64 / sent.max(1) as f64,
        used_percent: requests_percent.max(tokens_percent),
        requests_percent,
        tokens_percent,
        last_refusal_after_halving: last,
        retry_after_at_halving: retry_after,
        refused_after_twice_retry_after: late,
        final_tokens: reports.iter().map(|r| r.final_tpm).collect(),
        store_calls_per_request: reports.iter().map(|r| r.store_calls_per_request).collect(),
    })
}

async fn run() -> Result<(), StartupError> {
    let scenario = std::env::var("SCENARIO").unwrap_or_else(|_| "known".to_owned());
    if !["known", "halved", "auto4x"].contains(&scenario.as_str()) {
        return Err(StartupError::new(format!(
            "SCENARIO must be known, halved or auto4x, got {scenario:?}"
        )));
    }
    let halve_after = env_number("HALVE_AFTER", 30)?;
    let default_secs = if scenario == "halved" {
        halve_after + 310
    } else {
        60
    };
    let secs = env_number("SECS", default_secs)?;
    for run in 1..=env_number("RUNS", 1)? {
        let trial = run_once(&scenario, run, secs, halve_after).await?;
        let line = serde_json::to_string(&trial).map_err(|e| StartupError::new(e.to_string()))?;
        println!("{line}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    ratewall_examples::exit_code("upstream-trial", run().await)
}
