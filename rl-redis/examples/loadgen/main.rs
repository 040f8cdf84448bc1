//! Load generator: end-to-end decisions per second and latency of the Redis
//! backend, per algorithm and concurrency, against Redis' own ceiling for
//! the very same call measured by `redis-benchmark` in the same run, and
//! against a floor: a minimal hand-written script per algorithm
//! (`examples/loadgen/floor/*.lua`, same reply), run at saturation in the same run.
//!
//! ```text
//! cargo run --release -p ratewall-redis --example loadgen -- \
//!     --url redis://127.0.0.1:6379/ --secs 1 --out target/loadgen
//! ```
//!
//! Prints one table, and writes it as `loadgen.csv` and `loadgen.json`, with
//! a plot of throughput and p99 against concurrency (`loadgen.png`), under
//! `--out`. Per algorithm:
//! - decisions/s and p50/p99 at 1, 16, 64 and 256 concurrent callers, all
//!   sharing one backend (one multiplexed connection, as one app instance);
//! - server CPU per call (`INFO commandstats` read around each cell: the
//!   `usec` of the commands that run our code over their `calls`);
//! - Redis' saturation point for the same call (one limit, random
//!   identity): the best of `redis-benchmark -c 50` and `-c 50 -P 16`, and
//!   our throughput at 256 callers as a share of it;
//! - the floor: `--cpu-runs` alternating runs of `redis-benchmark -c 50 -P
//!   16` with our single-limit call and with the minimal script, each
//!   alone on the server, each line on keys of its own under a limit no
//!   run exhausts (every call admitted, so both take the same path),
//!   giving server CPU per call (medians) and the
//!   floor's saturation throughput; printed as ours ÷ floor (CPU) and our
//!   throughput at 256 callers ÷ the floor's saturation;
//! - our throughput and p99 at 64 callers against `redis-benchmark -c 64`'s
//!   (64 connections, no pipelining);
//! - a multi-limit call (three limits on the identity plus one per-IP
//!   limit: one `FCALL` on a standalone server) at 64 callers, and its
//!   cost relative to a single-limit call (decisions/s at 64 callers, where
//!   the server is saturated: server CPU per call); and at one caller, its
//!   p50 over a single-limit call's (the latency one call sees);
//! - `MEMORY USAGE` of one identity's keys (T = 100, after 100 calls).
//!
//! Then a flood: 64 callers hammering one blocked identity through
//! `Limiter::check` (what `#[rate_limit]` calls) for `--secs`, with the deny
//! cache on and off: calls refused per second and how many calls of our
//! code (`FCALL`, `FCALL_RO`, `EVALSHA`, `EVAL`) reached Redis (from `INFO
//! commandstats`).
//!
//! Keys are drawn from 10 000 identities (and 100 IPs) under a
//! 100-per-minute limit; the server's keys under the `lg:` prefix are left to
//! expire. Flags: `--url` (default `$REDIS_URL`, else
//! `redis://127.0.0.1:6379/`), `--secs` per cell (default 3; 1 gives a run
//! of about a minute), `--out` (default `target/loadgen`), `--algorithms
//! gcra,fixed_window`, `--concurrency 1,16,64,256`, `--redis-benchmark
//! PATH`, `--mode auto|functions|scripts` (the backend's call mode),
//! `--coalesce` (the backends coalesce concurrent callers' calls:
//! `RedisBackendBuilder::coalesce`; compare a run with it and one without,
//! e.g. at `--concurrency 1,16,64,256,1024`: with it, a "call" of
//! `INFO commandstats` may carry many decisions, so compare each cell's
//! `server_us_per_decision`), `--coalesce-max N` (at most `N` calls in
//! one, default 64), `--coalesce-in-flight N` (at most `N` coalescing
//! calls in flight, default 2), `--compare-coalesce` (only the comparison of calls
//! alone and coalesced, alternating `--cpu-runs` rounds per concurrency in
//! one run, see `compare.rs`; e.g. `--concurrency 1,16,64,256,1024`;
//! both sides in `--mode`'s call mode),
//! `--cpu-runs N` (default 3), `--cpu-only` (only the floor comparison,
//! printed as one line per algorithm), `--font PATH` (a TTF for the plot's text;
//! default: DejaVu Sans where Debian installs it). `--profile N` only runs `N` sequential
//! decisions (for `valgrind --tool=callgrind`) and prints their mean time.
//!
//! `--hot` only measures one hot identity (quota leasing): 4 limiter
//! instances, each with its own `RedisBackend`, 64 callers each, calling
//! `Limiter::call` for one identity for `--secs`, with the limit
//! `--hot-limit` (default `1000000/1m`, GCRA, or the first of
//! `--algorithms`) without leasing, then with `lease = --lease` (default
//! 10 000), alternating `--cpu-runs` times; prints decisions/s, admitted/s
//! and how many calls reached Redis, and the ratio with/without leasing of
//! each run.

mod compare;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plotters::prelude::*;
use ratewall::{
    Algorithm, Key, Limit, Limiter,
    backend::{Backend, Request},
};
use ratewall_redis::{CallMode, RedisBackend};
use serde::Serialize;

const IDENTITIES: u64 = 10_000;
const IPS: u64 = 100;
const SATURATION_CLIENTS: usize = 50;
const SATURATION_PIPELINE: usize = 16;
const LATENCY_CLIENTS: usize = 64;
/// The plots' line colours, one per algorithm.
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
const FONTS: [&str; 3] = [
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
];

/// The one limit of a single-limit call.
fn limit(algorithm: Algorithm) -> Limit {
    Limit::per_minute(100)
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

/// The limits of a multi-limit call: three on the identity, one per IP.
fn multi_limits(algorithm: Algorithm) -> [Limit; 4] {
    let with = |l: Result<Limit, _>| l.and_then(|l: Limit| l.with_algorithm(algorithm));
    [
        with(Limit::per_minute(100)),
        with(Limit::per_hour(1_000)),
        with(Limit::per_day(10_000)),
        with(Limit::per_minute(1_000)),
    ]
    .map(|l| l.expect("valid limit"))
}

struct Options {
    url: String,
    secs: f64,
    out: PathBuf,
    algorithms: Vec<Algorithm>,
    concurrency: Vec<usize>,
    bench: String,
    font: Option<PathBuf>,
    profile: Option<u64>,
    mode: CallMode,
    cpu_runs: usize,
    cpu_only: bool,
    hot: bool,
    hot_limit: String,
    lease: u64,
    coalesce: bool,
    coalesce_max: usize,
    coalesce_in_flight: usize,
    compare_coalesce: bool,
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "loadgen: {problem}\nflags: --url URL --secs SECONDS --out DIR --algorithms a,b \
         --concurrency 1,16,64,256 --redis-benchmark PATH --mode auto|functions|scripts \
         --coalesce --coalesce-max N --coalesce-in-flight N --compare-coalesce --cpu-runs N --cpu-only --font TTF --profile N --hot --hot-limit RATE --lease N"
    );
    std::process::exit(2)
}

/// A flag's value as a positive count, or the usage with why.
fn positive<T: std::str::FromStr + Default + PartialOrd>(flag: &str, value: &str) -> T {
    value
        .parse()
        .ok()
        .filter(|n| *n > T::default())
        .unwrap_or_else(|| usage(&format!("{flag} takes a positive count")))
}

fn options() -> Options {
    let mut options = Options {
        url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned()),
        secs: 3.0,
        out: PathBuf::from("target/loadgen"),
        algorithms: Algorithm::ALL.to_vec(),
        concurrency: vec![1, 16, 64, 256],
        bench: "redis-benchmark".to_owned(),
        font: None,
        profile: None,
        mode: CallMode::Auto,
        cpu_runs: 3,
        cpu_only: false,
        hot: false,
        hot_limit: "1000000/1m".to_owned(),
        lease: 10_000,
        coalesce: false,
        coalesce_max: 64,
        coalesce_in_flight: 2,
        compare_coalesce: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .unwrap_or_else(|| usage(&format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--url" => options.url = value(),
            "--secs" => {
                options.secs = value()
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0)
                    .unwrap_or_else(|| usage("--secs takes a positive number"));
            }
            "--out" => options.out = PathBuf::from(value()),
            "--algorithms" => {
                options.algorithms = value()
                    .split(',')
                    .map(|a| a.parse().unwrap_or_else(|e| usage(&format!("{e}"))))
                    .collect();
            }
            "--concurrency" => {
                options.concurrency = value()
                    .split(',')
                    .map(|c| {
                        c.parse()
                            .ok()
                            .filter(|&c: &usize| c > 0)
                            .unwrap_or_else(|| usage("--concurrency takes positive integers"))
                    })
                    .collect();
            }
            "--redis-benchmark" => options.bench = value(),
            "--font" => options.font = Some(PathBuf::from(value())),
            "--mode" => {
                options.mode = match value().as_str() {
                    "auto" => CallMode::Auto,
                    "functions" => CallMode::Functions,
                    "scripts" => CallMode::Scripts,
                    _ => usage("--mode takes auto, functions or scripts"),
                }
            }
            "--cpu-only" => options.cpu_only = true,
            "--coalesce" => options.coalesce = true,
            "--compare-coalesce" => options.compare_coalesce = true,
            "--coalesce-in-flight" => options.coalesce_in_flight = positive(&flag, &value()),
            "--coalesce-max" => options.coalesce_max = positive(&flag, &value()),
            "--hot" => options.hot = true,
            "--hot-limit" => options.hot_limit = value(),
            "--lease" => options.lease = positive(&flag, &value()),
            "--cpu-runs" => options.cpu_runs = positive(&flag, &value()),
            "--profile" => {
                options.profile = Some(
                    value()
                        .parse()
                        .unwrap_or_else(|_| usage("--profile takes a count")),
                );
            }
            "-h" | "--help" => usage("help"),
            other => usage(&format!("unknown flag {other:?}")),
        }
    }
    options
}

/// Decisions per second and latency percentiles at one concurrency.
#[derive(Debug, Clone, Copy, Serialize)]
struct Cell {
    concurrency: usize,
    decisions_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    /// Server CPU per call of our code during the cell (`INFO commandstats`).
    server_us_per_call: Option<f64>,
    /// Server CPU of our code per decision made during the cell (with
    /// `--coalesce`, one call may carry many decisions).
    server_us_per_decision: Option<f64>,
    /// The server process's CPU (user and system, `INFO cpu`) per decision
    /// made during the cell: all of its work, reading, parsing and
    /// answering commands included, which `INFO commandstats` leaves out.
    server_process_us_per_decision: Option<f64>,
}

/// The commands that run our code.
const CODE_COMMANDS: [&str; 4] = ["fcall", "fcall_ro", "evalsha", "eval"];

/// One section of the server's `INFO`, on a connection of its own.
async fn info(url: &str, section: &str) -> Option<String> {
    // A cluster's URLs (comma-separated): every node's, one after the other
    // (their counts are summed below).
    let mut all = String::new();
    for url in url.split(',') {
        let client = redis::Client::open(url.trim()).ok()?;
        let mut connection = client.get_multiplexed_async_connection().await.ok()?;
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query_async(&mut connection)
            .await
            .ok()?;
        all.push_str(&info);
        all.push('\n');
    }
    Some(all)
}

/// `(calls, usec)` per command, from `INFO commandstats`.
async fn command_stats(url: &str) -> Option<HashMap<String, (u64, u64)>> {
    let info = info(url, "commandstats").await?;
    let mut stats = HashMap::new();
    for line in info.lines() {
        let Some((name, fields)) = line
            .strip_prefix("cmdstat_")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key)?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        let counts = stats.entry(name.to_owned()).or_insert((0, 0));
        counts.0 += field("calls=");
        counts.1 += field("usec=");
    }
    Some(stats)
}

/// The server process's CPU seconds so far (user and system, from
/// `INFO cpu`).
async fn server_cpu(url: &str) -> Option<f64> {
    let info = info(url, "cpu").await?;
    // Summed over a cluster's nodes.
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .filter_map(|line| {
                line.strip_prefix(name)?
                    .strip_prefix(':')?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .reduce(|a, b| a + b)
    };
    Some(field("used_cpu_user")? + field("used_cpu_sys")?)
}

/// The server process's µs per decision, `decisions` made between two
/// readings of [`server_cpu`].
fn process_us_per_decision(before: Option<f64>, after: Option<f64>, decisions: u64) -> Option<f64> {
    let spent = after? - before?;
    (decisions > 0).then(|| spent * 1e6 / decisions as f64)
}

/// Server µs of our code per decision, `decisions` made between two
/// readings.
fn us_per_decision(
    before: &Option<HashMap<String, (u64, u64)>>,
    after: &Option<HashMap<String, (u64, u64)>>,
    decisions: u64,
) -> Option<f64> {
    let (_, usec) = code_delta(before.as_ref()?, after.as_ref()?);
    (decisions > 0).then(|| usec as f64 / decisions as f64)
}

/// Calls and server µs of our code between two readings.
fn code_delta(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
) -> (u64, u64) {
    CODE_COMMANDS.iter().fold((0, 0), |(calls, usec), name| {
        let (c0, u0) = before.get(*name).copied().unwrap_or((0, 0));
        let (c1, u1) = after.get(*name).copied().unwrap_or((0, 0));
        (calls + c1.saturating_sub(c0), usec + u1.saturating_sub(u0))
    })
}

/// Server µs per call of our code between two readings.
fn us_per_call(
    before: &Option<HashMap<String, (u64, u64)>>,
    after: &Option<HashMap<String, (u64, u64)>>,
) -> Option<f64> {
    let (calls, usec) = code_delta(before.as_ref()?, after.as_ref()?);
    (calls > 0).then(|| usec as f64 / calls as f64)
}

/// What a call asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Single,
    Multi,
}

fn next(state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    *state >> 33
}

async fn run(
    url: &str,
    backend: &Arc<RedisBackend>,
    algorithm: Algorithm,
    shape: Shape,
    callers: usize,
    length: Duration,
) -> Cell {
    let stats_before = command_stats(url).await;
    let cpu_before = server_cpu(url).await;
    let deadline = Instant::now() + length;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let backend = backend.clone();
        tasks.spawn(async move {
            let single = limit(algorithm);
            let multi = multi_limits(algorithm);
            let mut latencies = Vec::with_capacity(4_096);
            let mut errors = 0u64;
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ caller as u64;
            while Instant::now() < deadline {
                let id = next(&mut state) % IDENTITIES;
                let key = Key::from_display("lg", algorithm.name(), &id);
                let begun = Instant::now();
                let result = match shape {
                    Shape::Single => backend.acquire(&[Request::new(&key, &single, 1)]).await,
                    Shape::Multi => {
                        let ip = Key::from_display("lg", "ip", &(id % IPS));
                        let requests = [
                            Request::new(&key, &multi[0], 1),
                            Request::new(&key, &multi[1], 1),
                            Request::new(&key, &multi[2], 1),
                            Request::new(&ip, &multi[3], 1),
                        ];
                        backend.acquire(&requests).await
                    }
                };
                match result {
                    Ok(_) => latencies.push(begun.elapsed().as_micros() as u64),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        });
    }
    let mut latencies = Vec::new();
    let mut errors = 0;
    while let Some(done) = tasks.join_next().await {
        let (mut own, own_errors) = done.expect("caller task");
        latencies.append(&mut own);
        errors += own_errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = server_cpu(url).await;
    let stats_after = command_stats(url).await;
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .map_or(0.0, |&us| us as f64 / 1_000.0)
    };
    Cell {
        concurrency: callers,
        decisions_per_s: latencies.len() as f64 / elapsed,
        p50_ms: at(0.50),
        p99_ms: at(0.99),
        errors,
        server_us_per_call: us_per_call(&stats_before, &stats_after),
        server_us_per_decision: us_per_decision(
            &stats_before,
            &stats_after,
            latencies.len() as u64 + errors,
        ),
        server_process_us_per_decision: process_us_per_decision(
            cpu_before,
            cpu_after,
            latencies.len() as u64 + errors,
        ),
    }
}

/// One caller alternating a single-limit and a multi-limit call for
/// `length`: both kinds see the same machine at the same moments.
async fn alternate(
    backend: &Arc<RedisBackend>,
    algorithm: Algorithm,
    length: Duration,
) -> (Cell, Cell) {
    let single = limit(algorithm);
    let multi = multi_limits(algorithm);
    let (mut singles, mut multis) = (Vec::new(), Vec::new());
    let (mut single_errors, mut multi_errors) = (0, 0);
    let mut state = 0x5EED_u64;
    let started = Instant::now();
    while started.elapsed() < length {
        let id = next(&mut state) % IDENTITIES;
        let key = Key::from_display("lg", algorithm.name(), &id);
        let ip = Key::from_display("lg", "ip", &(id % IPS));
        let begun = Instant::now();
        match backend.acquire(&[Request::new(&key, &single, 1)]).await {
            Ok(_) => singles.push(begun.elapsed().as_micros() as u64),
            Err(_) => single_errors += 1,
        }
        let requests = [
            Request::new(&key, &multi[0], 1),
            Request::new(&key, &multi[1], 1),
            Request::new(&key, &multi[2], 1),
            Request::new(&ip, &multi[3], 1),
        ];
        let begun = Instant::now();
        match backend.acquire(&requests).await {
            Ok(_) => multis.push(begun.elapsed().as_micros() as u64),
            Err(_) => multi_errors += 1,
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cell = |mut latencies: Vec<u64>, errors| {
        latencies.sort_unstable();
        let at = |q: f64| {
            latencies
                .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
                .map_or(0.0, |&us| us as f64 / 1_000.0)
        };
        Cell {
            concurrency: 1,
            decisions_per_s: latencies.len() as f64 / elapsed,
            p50_ms: at(0.50),
            p99_ms: at(0.99),
            errors,
            server_us_per_call: None,
            server_us_per_decision: None,
            server_process_us_per_decision: None,
        }
    };
    (cell(singles, single_errors), cell(multis, multi_errors))
}

/// Host and port of a `redis://host:port/db` URL.
fn host_port(url: &str) -> (String, String) {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or(rest);
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    match authority.rsplit_once(':') {
        Some((host, port)) => (host.to_owned(), port.to_owned()),
        None => (authority.to_owned(), "6379".to_owned()),
    }
}

/// One `redis-benchmark` run of the single-limit script call.
#[derive(Debug, Clone, Copy, Serialize)]
struct BenchRun {
    clients: usize,
    pipeline: usize,
    requests: usize,
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
}

/// Our single-limit call's command line (a random identity per request
/// with `redis-benchmark -r`).
fn our_line(algorithm: Algorithm, mode: CallMode) -> Vec<String> {
    let limit = limit(algorithm);
    let key = Key::new("lg", algorithm.name(), "__rand_int__");
    ratewall_redis::__private::acquire_command_line(&[Request::new(&key, &limit, 1)], mode)
}

/// The limit of the floor comparison: every call of every run admitted
/// (at most a few hundred calls per identity and line), so that ours and
/// the floor always take the same (admitting) path.
fn cpu_limit(algorithm: Algorithm) -> Limit {
    // (The sliding log's cap: 10 000 entries.)
    Limit::per_minute(10_000)
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

/// A key scope of its own for one line of one floor comparison: no line
/// sees state another line (or an earlier comparison) left.
fn fresh_scope(line: &str) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{line}-{started:x}-{n}")
}

/// Our line in the floor comparison: the same call as [`our_line`] under
/// [`cpu_limit`], on keys of its own.
fn our_cpu_line(algorithm: Algorithm, mode: CallMode) -> Vec<String> {
    let limit = cpu_limit(algorithm);
    let key = Key::new("lg", &fresh_scope("cpu"), "__rand_int__");
    ratewall_redis::__private::acquire_command_line(&[Request::new(&key, &limit, 1)], mode)
}

/// The minimal hand-written script of `algorithm` (the floor).
fn floor_source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => include_str!("floor/fixed_window.lua"),
        Algorithm::SlidingLog => include_str!("floor/sliding_log.lua"),
        Algorithm::SlidingWindow => include_str!("floor/sliding_window.lua"),
        Algorithm::TokenBucket => include_str!("floor/token_bucket.lua"),
        Algorithm::LeakyBucket => include_str!("floor/leaky_bucket.lua"),
        _ => include_str!("floor/gcra.lua"),
    }
}

/// The floor scripts as one Functions library, each script's text the body
/// of a function `rl_floor_<algorithm>(KEYS, ARGV)`: the same code, called
/// the way ours is (`FCALL`), to tell the cost of the call path apart.
fn floor_library() -> String {
    let mut library = String::from("#!lua name=rl_floor\n");
    for algorithm in Algorithm::ALL {
        let _ = write!(
            library,
            "redis.register_function('rl_floor_{}', function(KEYS, ARGV)\n{}\nend)\n",
            algorithm.code(),
            floor_source(algorithm)
        );
    }
    library
}

/// The floor's line for the same limit and keys as [`our_line`]: `EVALSHA`
/// of the script, or `FCALL` of the same code in [`floor_library`].
fn floor_line(algorithm: Algorithm, as_function: bool) -> Vec<String> {
    let limit = cpu_limit(algorithm);
    let scope = fresh_scope(if as_function { "floor-fcall" } else { "floor" });
    let key = Key::new("lg", &scope, "__rand_int__");
    let base = format!("{key}:{}", limit.storage_suffix());
    let sha = redis::Script::new(floor_source(algorithm))
        .get_hash()
        .to_owned();
    let (t, p, b, s) = (
        limit.threshold().to_string(),
        limit.period_micros().to_string(),
        limit.burst().to_string(),
        limit.slots().to_string(),
    );
    let mut line = if as_function {
        vec!["FCALL".to_owned(), format!("rl_floor_{}", algorithm.code())]
    } else {
        vec!["EVALSHA".to_owned(), sha]
    };
    match algorithm {
        Algorithm::SlidingLog => line.extend(["2".to_owned(), base.clone(), format!("{base}:seq")]),
        _ => line.extend(["1".to_owned(), base]),
    }
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog => line.extend([t, p]),
        Algorithm::SlidingWindow => line.extend([t, p, s]),
        _ => line.extend([t, p, b]),
    }
    line.push("1".to_owned());
    line
}

/// `redis-benchmark` sending `line`, with a random identity per request.
fn redis_benchmark(
    options: &Options,
    line: &[String],
    clients: usize,
    pipeline: usize,
    requests: usize,
) -> Option<BenchRun> {
    let (host, port) = host_port(&options.url);
    let output = Command::new(&options.bench)
        .args(["-h", &host, "-p", &port])
        .args(["-c", &clients.to_string(), "-P", &pipeline.to_string()])
        .args(["-n", &requests.to_string()])
        .args(["-r", &IDENTITIES.to_string(), "--csv"])
        .args(line)
        .output()
        .map_err(|error| eprintln!("cannot run {}: {error}", options.bench))
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text.lines().nth(1)?;
    let fields: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|f| f.trim_matches('"').parse().ok())
        .collect();
    Some(BenchRun {
        clients,
        pipeline,
        requests,
        rps: *fields.first()?,
        p50_ms: *fields.get(3)?,
        p99_ms: *fields.get(5)?,
    })
}

async fn memory_usage(url: &str, algorithm: Algorithm) -> Option<u64> {
    let backend = RedisBackend::connect(url).await.ok()?;
    let client = redis::Client::open(url).ok()?;
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    let limit = limit(algorithm);
    let key = Key::new("lg", "memory", algorithm.name());
    let request = [Request::new(&key, &limit, 1)];
    backend.reset(&request).await.ok()?;
    for _ in 0..100 {
        backend.acquire(&request).await.ok()?;
    }
    let used: Option<u64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(format!("{key}:{}", limit.storage_suffix()))
        .query_async(&mut connection)
        .await
        .ok()?;
    Some(used.unwrap_or(0))
}

/// Everything measured for one algorithm.
#[derive(Debug, Serialize)]
struct Row {
    algorithm: &'static str,
    cells: Vec<Cell>,
    /// `redis-benchmark -c 50` and `-c 50 -P 16`.
    saturation_runs: Vec<BenchRun>,
    /// The better of the two.
    saturation_rps: Option<f64>,
    /// Our decisions/s at the highest concurrency over `saturation_rps`.
    ratio_top_to_saturation: Option<f64>,
    /// `redis-benchmark -c 64`.
    latency_run: Option<BenchRun>,
    /// Our p99 at 64 callers over `redis-benchmark -c 64`'s p99.
    p99_ratio_at_64: Option<f64>,
    /// Our decisions/s at 64 callers over `redis-benchmark -c 64`'s req/s.
    throughput_ratio_at_64: Option<f64>,
    /// Single- and multi-limit calls at 64 callers.
    single_at_64: Option<Cell>,
    multi_at_64: Option<Cell>,
    /// Time per multi-limit decision over time per single-limit decision.
    multi_cost_ratio: Option<f64>,
    /// A multi-limit call with one caller (the latency one call sees).
    multi_at_1: Option<Cell>,
    /// Multi-limit p50 over single-limit p50, both with one caller (medians
    /// of `--cpu-runs` alternating runs).
    multi_latency_ratio_at_1: Option<f64>,
    memory_usage_bytes: Option<u64>,
    /// The floor comparison (`--cpu-runs` alternating runs).
    floor: Option<Floor>,
}

/// Our single-limit call against the minimal hand-written script, each
/// run by `redis-benchmark -c 50 -P 16` alone on the server, alternating.
#[derive(Debug, Clone, Serialize)]
struct Floor {
    /// Server µs per call, ours, per run.
    ours_us: Vec<f64>,
    /// Server µs per call, the floor's, per run.
    floor_us: Vec<f64>,
    /// Server µs per call, the floor's code called with `FCALL`, per run.
    floor_fcall_us: Vec<f64>,
    /// Requests/s, ours and the floor's, per run.
    ours_rps: Vec<f64>,
    floor_rps: Vec<f64>,
    /// Medians.
    ours_us_median: f64,
    floor_us_median: f64,
    floor_fcall_us_median: f64,
    floor_rps_median: f64,
    /// `ours_us_median / floor_us_median`.
    cpu_ratio: f64,
    /// `ours_us_median / floor_fcall_us_median`.
    cpu_ratio_fcall: f64,
    /// Our decisions/s at the highest concurrency over `floor_rps_median`.
    ratio_top_to_floor: Option<f64>,
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// One `redis-benchmark -c 50 -P 16` run of `line`: its requests/s and the
/// server µs per call of the code it ran.
async fn cpu_run(options: &Options, line: &[String], requests: usize) -> Option<(f64, f64)> {
    let before = command_stats(&options.url).await;
    let run = redis_benchmark(
        options,
        line,
        SATURATION_CLIENTS,
        SATURATION_PIPELINE,
        requests,
    )?;
    let after = command_stats(&options.url).await;
    Some((us_per_call(&before, &after)?, run.rps))
}

/// Loads the floor script, then alternates runs of ours and the floor.
async fn floor(
    options: &Options,
    algorithm: Algorithm,
    mode: CallMode,
    requests: usize,
) -> Option<Floor> {
    let client = redis::Client::open(options.url.as_str()).ok()?;
    let mut connection = client.get_multiplexed_async_connection().await.ok()?;
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(floor_source(algorithm))
        .query_async(&mut connection)
        .await
        .map_err(|error| eprintln!("cannot load the floor script: {error}"))
        .ok()?;
    // Servers without functions (Redis < 7) get the EVALSHA floor only.
    let functions = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(floor_library())
        .query_async::<String>(&mut connection)
        .await
        .is_ok();
    let ours = our_cpu_line(algorithm, mode);
    let theirs = floor_line(algorithm, false);
    let theirs_fcall = floor_line(algorithm, true);
    let (mut ours_us, mut floor_us, mut floor_fcall_us, mut ours_rps, mut floor_rps) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..options.cpu_runs {
        let (us, rps) = cpu_run(options, &ours, requests).await?;
        ours_us.push(us);
        ours_rps.push(rps);
        let (us, rps) = cpu_run(options, &theirs, requests).await?;
        floor_us.push(us);
        floor_rps.push(rps);
        if functions {
            let (us, _) = cpu_run(options, &theirs_fcall, requests).await?;
            floor_fcall_us.push(us);
        }
    }
    let (ours_us_median, floor_us_median, floor_fcall_us_median) =
        (median(&ours_us), median(&floor_us), median(&floor_fcall_us));
    Some(Floor {
        cpu_ratio: ours_us_median / floor_us_median,
        cpu_ratio_fcall: ours_us_median / floor_fcall_us_median,
        ours_us_median,
        floor_us_median,
        floor_fcall_us_median,
        floor_rps_median: median(&floor_rps),
        ours_us,
        floor_us,
        floor_fcall_us,
        ours_rps,
        floor_rps,
        ratio_top_to_floor: None,
    })
}

/// A flood on one blocked identity through `Limiter::check`.
#[derive(Debug, Clone, Copy, Serialize)]
struct Flood {
    deny_cache: bool,
    callers: usize,
    calls: u64,
    calls_per_s: f64,
    /// Calls of our code (`FCALL`, `FCALL_RO`, `EVALSHA`, `EVAL`) Redis
    /// counted during the flood.
    evalsha: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    url: String,
    /// The call mode used (functions or scripts).
    mode: String,
    /// Whether the backend coalesced concurrent callers' calls.
    coalesce: bool,
    library: &'static str,
    script_sha: &'static str,
    secs_per_cell: f64,
    identities: u64,
    limit: &'static str,
    rows: Vec<Row>,
    flood: Vec<Flood>,
}

async fn measure(options: &Options, backend: &Arc<RedisBackend>, algorithm: Algorithm) -> Row {
    let length = Duration::from_secs_f64(options.secs);
    let mut cells = Vec::new();
    for &callers in &options.concurrency {
        eprintln!("  {algorithm} @ {callers}");
        cells.push(
            run(
                &options.url,
                backend,
                algorithm,
                Shape::Single,
                callers,
                length,
            )
            .await,
        );
    }
    // Enough requests for about `secs` at the best rate seen so far.
    let best = cells
        .iter()
        .map(|c| c.decisions_per_s)
        .fold(10_000.0, f64::max);
    let requests = |factor: f64| ((best * factor * options.secs) as usize).max(10_000);
    eprintln!("  {algorithm}: redis-benchmark");
    let ours = our_line(algorithm, backend.call_mode());
    let saturation_runs: Vec<BenchRun> = [(1, 1.5), (SATURATION_PIPELINE, 4.0)]
        .into_iter()
        .filter_map(|(pipeline, factor)| {
            redis_benchmark(
                options,
                &ours,
                SATURATION_CLIENTS,
                pipeline,
                requests(factor),
            )
        })
        .collect();
    let saturation_rps = saturation_runs.iter().map(|r| r.rps).reduce(f64::max);
    let latency_run = redis_benchmark(options, &ours, LATENCY_CLIENTS, 1, requests(1.5));
    eprintln!("  {algorithm}: against the floor");
    let mut floor = floor(options, algorithm, backend.call_mode(), requests(4.0)).await;
    let top = cells.iter().max_by_key(|c| c.concurrency);
    let at_64 = cells
        .iter()
        .find(|c| c.concurrency == LATENCY_CLIENTS)
        .copied();
    let single_at_64 = match at_64 {
        Some(cell) => Some(cell),
        None => Some(
            run(
                &options.url,
                backend,
                algorithm,
                Shape::Single,
                LATENCY_CLIENTS,
                length,
            )
            .await,
        ),
    };
    eprintln!("  {algorithm}: multi-limit @ {LATENCY_CLIENTS}");
    let multi_at_64 = Some(
        run(
            &options.url,
            backend,
            algorithm,
            Shape::Multi,
            LATENCY_CLIENTS,
            length,
        )
        .await,
    );
    let multi_cost_ratio = match (single_at_64, multi_at_64) {
        (Some(s), Some(m)) if m.decisions_per_s > 0.0 => {
            Some(s.decisions_per_s / m.decisions_per_s)
        }
        _ => None,
    };
    // Latency at one caller moves with the machine's load (wake-ups, other
    // processes), so one caller alternates single and multi-limit calls,
    // call by call, and the ratio is that of their p50s.
    eprintln!("  {algorithm}: single and multi-limit @ 1, alternating");
    let (single_at_1, multi_at_1) = alternate(backend, algorithm, length).await;
    let multi_latency_ratio_at_1 =
        (single_at_1.p50_ms > 0.0).then(|| multi_at_1.p50_ms / single_at_1.p50_ms);
    let multi_at_1 = Some(multi_at_1);
    if let (Some(floor), Some(top)) = (floor.as_mut(), top) {
        floor.ratio_top_to_floor =
            (floor.floor_rps_median > 0.0).then(|| top.decisions_per_s / floor.floor_rps_median);
    }
    Row {
        algorithm: algorithm.name(),
        ratio_top_to_saturation: top.zip(saturation_rps).map(|(c, s)| c.decisions_per_s / s),
        p99_ratio_at_64: at_64
            .zip(latency_run)
            .filter(|(_, r)| r.p99_ms > 0.0)
            .map(|(c, r)| c.p99_ms / r.p99_ms),
        throughput_ratio_at_64: at_64
            .zip(latency_run)
            .filter(|(_, r)| r.rps > 0.0)
            .map(|(c, r)| c.decisions_per_s / r.rps),
        cells,
        saturation_runs,
        saturation_rps,
        latency_run,
        single_at_64,
        multi_at_64,
        multi_cost_ratio,
        multi_at_1,
        multi_latency_ratio_at_1,
        memory_usage_bytes: memory_usage(&options.url, algorithm).await,
        floor,
    }
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The report as one Markdown table.
fn table(report: &Report) -> String {
    let concurrency: Vec<usize> = report.rows[0].cells.iter().map(|c| c.concurrency).collect();
    let top = concurrency.iter().max().copied().unwrap_or(0);
    let mut out = String::new();
    out.push_str("| algorithm |");
    for c in &concurrency {
        let _ = write!(out, " @{c}: decisions/s (p50 / p99 ms) |");
    }
    let _ = writeln!(
        out,
        " Redis saturation, req/s (best of -c 50, -c 50 -P 16) | ours@{top} / saturation | \
         @64 ours / redis-benchmark -c 64, decisions/s | \
         p99@64 ours / redis-benchmark -c 64 (ms) | ratio | multi-limit 3+1 @64, decisions/s | \
         multi / single cost | multi / single p50 @1 | MEMORY USAGE / identity | \
         server µs/call, ours / floor (medians) | CPU ours ÷ floor | \
         CPU ours ÷ floor as FCALL | floor saturation, req/s | ours@{top} ÷ floor saturation |"
    );
    out.push_str("|---|");
    for _ in &concurrency {
        out.push_str("---:|");
    }
    out.push_str("---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &report.rows {
        let _ = write!(out, "| {} |", row.algorithm);
        for cell in &row.cells {
            let errors = if cell.errors > 0 {
                format!(", {} errors", cell.errors)
            } else {
                String::new()
            };
            let _ = write!(
                out,
                " {:.0} ({:.2} / {:.2}{errors}) |",
                cell.decisions_per_s, cell.p50_ms, cell.p99_ms
            );
        }
        let saturation = match (row.saturation_rps, row.saturation_runs.as_slice()) {
            (Some(rps), runs) => {
                let best = runs
                    .iter()
                    .find(|r| r.rps == rps)
                    .map_or(String::new(), |r| {
                        if r.pipeline > 1 {
                            format!(" (-P {})", r.pipeline)
                        } else {
                            String::new()
                        }
                    });
                format!("{rps:.0}{best}")
            }
            _ => "–".to_owned(),
        };
        let (at_64, p99) = match (
            row.cells.iter().find(|c| c.concurrency == 64),
            row.latency_run,
        ) {
            (Some(c), Some(r)) => (
                format!(
                    "{:.0} / {:.0} = {}",
                    c.decisions_per_s,
                    r.rps,
                    opt(row.throughput_ratio_at_64, 2)
                ),
                format!("{:.2} / {:.2}", c.p99_ms, r.p99_ms),
            ),
            _ => ("–".to_owned(), "–".to_owned()),
        };
        let (cpu, cpu_ratio, cpu_ratio_fcall, floor_rps, top_ratio) = match &row.floor {
            Some(f) => (
                format!("{:.2} / {:.2}", f.ours_us_median, f.floor_us_median),
                format!("{:.2}", f.cpu_ratio),
                format!("{:.2}", f.cpu_ratio_fcall),
                format!("{:.0}", f.floor_rps_median),
                opt(f.ratio_top_to_floor, 2),
            ),
            None => ("–".into(), "–".into(), "–".into(), "–".into(), "–".into()),
        };
        let _ = writeln!(
            out,
            " {saturation} | {} | {at_64} | {p99} | {} | {} | {} | {} | {} | {cpu} | {cpu_ratio} | \
             {cpu_ratio_fcall} | {floor_rps} | {top_ratio} |",
            opt(row.ratio_top_to_saturation, 2),
            opt(row.p99_ratio_at_64, 2),
            opt(row.multi_at_64.map(|m| m.decisions_per_s), 0),
            opt(row.multi_cost_ratio, 2),
            opt(row.multi_latency_ratio_at_1, 2),
            row.memory_usage_bytes
                .map_or_else(|| "–".to_owned(), |b| format!("{b} B")),
        );
    }
    out
}

/// The report as CSV: one line per algorithm, the table's columns as numbers.
fn csv(report: &Report) -> String {
    let mut out = String::from("algorithm");
    for cell in &report.rows[0].cells {
        let c = cell.concurrency;
        let _ = write!(
            out,
            ",c{c}_decisions_per_s,c{c}_p50_ms,c{c}_p99_ms,c{c}_errors"
        );
    }
    out.push_str(
        ",saturation_rps,ratio_top_to_saturation,bench_c64_rps,throughput_ratio_at_64,\
         bench_c64_p99_ms,p99_ratio_at_64,\
         multi_at_64_decisions_per_s,multi_cost_ratio,multi_at_1_p50_ms,multi_latency_ratio_at_1,\
         memory_usage_bytes,server_us_per_call,floor_us_per_call,cpu_ratio_to_floor,\
         floor_saturation_rps,ratio_top_to_floor,floor_fcall_us_per_call,cpu_ratio_to_floor_fcall",
    );
    for cell in &report.rows[0].cells {
        let _ = write!(out, ",c{}_server_us_per_call", cell.concurrency);
    }
    out.push('\n');
    let num = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
    for row in &report.rows {
        out.push_str(row.algorithm);
        for cell in &row.cells {
            let _ = write!(
                out,
                ",{:.1},{:.3},{:.3},{}",
                cell.decisions_per_s, cell.p50_ms, cell.p99_ms, cell.errors
            );
        }
        let _ = write!(
            out,
            ",{},{},{},{},{},{},{},{},{},{},{}",
            num(row.saturation_rps),
            num(row.ratio_top_to_saturation),
            num(row.latency_run.map(|r| r.rps)),
            num(row.throughput_ratio_at_64),
            num(row.latency_run.map(|r| r.p99_ms)),
            num(row.p99_ratio_at_64),
            num(row.multi_at_64.map(|m| m.decisions_per_s)),
            num(row.multi_cost_ratio),
            num(row.multi_at_1.map(|m| m.p50_ms)),
            num(row.multi_latency_ratio_at_1),
            row.memory_usage_bytes
                .map_or_else(String::new, |b| b.to_string()),
        );
        let floor = row.floor.as_ref();
        let _ = write!(
            out,
            ",{},{},{},{},{},{},{}",
            num(floor.map(|f| f.ours_us_median)),
            num(floor.map(|f| f.floor_us_median)),
            num(floor.map(|f| f.cpu_ratio)),
            num(floor.map(|f| f.floor_rps_median)),
            num(floor.and_then(|f| f.ratio_top_to_floor)),
            num(floor.map(|f| f.floor_fcall_us_median)),
            num(floor.map(|f| f.cpu_ratio_fcall)),
        );
        for cell in &row.cells {
            let _ = write!(out, ",{}", num(cell.server_us_per_call));
        }
        out.push('\n');
    }
    out
}

/// Registers a TTF for the plot's text; `false` when none can be read.
fn load_font(options: &Options) -> bool {
    let candidates: Vec<PathBuf> = match &options.font {
        Some(path) => vec![path.clone()],
        None => FONTS.iter().map(PathBuf::from).collect(),
    };
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok() {
                return true;
            }
        }
    }
    false
}

/// Throughput and p99 against concurrency, one line per algorithm.
fn plot(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = BitMapBackend::new(path, (1400, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "ratewall-redis, one connection, {} s per point; dashed: Redis' saturation for the same call (redis-benchmark)",
            report.secs_per_cell
        ),
        ("sans-serif", 22),
    )?;
    let (left, right) = root.split_horizontally(700);
    let concurrency: Vec<f64> = report.rows[0]
        .cells
        .iter()
        .map(|c| c.concurrency as f64)
        .collect();
    let x_max = concurrency.iter().copied().fold(1.0, f64::max) * 1.5;
    let colors = COLORS;
    type Pick = fn(&Cell) -> f64;
    let panels: [(&DrawingArea<BitMapBackend, _>, &str, Pick, bool); 2] = [
        (&left, "decisions / s", |c: &Cell| c.decisions_per_s, true),
        (&right, "p99 latency (ms)", |c: &Cell| c.p99_ms, false),
    ];
    for (area, label, pick, saturation) in panels {
        let values = report.rows.iter().flat_map(|r| r.cells.iter().map(pick));
        let mut y_max = values.fold(0.0, f64::max);
        if saturation {
            y_max = report
                .rows
                .iter()
                .filter_map(|r| r.saturation_rps)
                .fold(y_max, f64::max);
        }
        let mut chart = ChartBuilder::on(area)
            .margin(20)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(
                (0.8f64..x_max)
                    .log_scale()
                    .with_key_points(concurrency.clone()),
                0f64..y_max * 1.1,
            )?;
        chart
            .configure_mesh()
            .x_desc("concurrent callers")
            .y_desc(label)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| {
                if saturation {
                    format!("{:.0}k", y / 1_000.0)
                } else {
                    format!("{y:.1}")
                }
            })
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .draw()?;
        for (i, row) in report.rows.iter().enumerate() {
            let color = colors[i % colors.len()];
            let points: Vec<(f64, f64)> = row
                .cells
                .iter()
                .map(|c| (c.concurrency as f64, pick(c)))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
                .label(row.algorithm)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            chart.draw_series(
                points
                    .iter()
                    .map(|&(x, y)| Circle::new((x, y), 4, color.filled())),
            )?;
        }
        if saturation {
            // Each algorithm's Redis saturation point, dashed, in its colour.
            let steps = 48;
            let ratio = (x_max / 0.8f64).powf(1.0 / f64::from(steps));
            for (i, row) in report.rows.iter().enumerate() {
                let Some(rps) = row.saturation_rps else {
                    continue;
                };
                let color = colors[i % colors.len()];
                chart.draw_series((0..steps).step_by(2).map(|k| {
                    let from = 0.8 * ratio.powi(k);
                    PathElement::new(
                        vec![(from, rps), (from * ratio, rps)],
                        color.stroke_width(1),
                    )
                }))?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 16))
            .position(if saturation {
                SeriesLabelPosition::LowerRight
            } else {
                SeriesLabelPosition::UpperLeft
            })
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Calls of our code the server has counted so far.
async fn evalsha_calls(url: &str) -> Option<u64> {
    let stats = command_stats(url).await?;
    Some(
        CODE_COMMANDS
            .iter()
            .filter_map(|name| stats.get(*name))
            .map(|(calls, _)| calls)
            .sum(),
    )
}

async fn flood(options: &Options, deny_cache: bool) -> Option<Flood> {
    let backend = RedisBackend::connect(options.url.as_str()).await.ok()?;
    let limiter = Arc::new(
        Limiter::builder()
            .backend(backend)
            .prefix("lg")
            .deny_cache(deny_cache)
            .build()
            .ok()?,
    );
    let limit = Limit::per_hour(1).ok()?;
    let identity = format!("flood-{deny_cache}-{}", std::process::id());
    let key = limiter.key("flood", &identity);
    // Use the quota up: the flood starts on a blocked identity.
    for _ in 0..2 {
        let _ = limiter
            .requests()
            .check("flood", &[Request::new(&key, &limit, 1)], None)
            .await;
    }
    let before = evalsha_calls(&options.url).await?;
    let callers = LATENCY_CLIENTS;
    let deadline = Instant::now() + Duration::from_secs_f64(options.secs);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..callers {
        let (limiter, key) = (limiter.clone(), key.clone());
        tasks.spawn(async move {
            let call = [Request::new(&key, &limit, 1)];
            let mut calls = 0u64;
            while Instant::now() < deadline {
                for _ in 0..64 {
                    let refused = limiter
                        .requests()
                        .check("flood", &call, None)
                        .await
                        .is_err();
                    assert!(refused, "a blocked identity was admitted");
                    calls += 1;
                }
                tokio::task::yield_now().await;
            }
            calls
        });
    }
    let mut calls = 0;
    while let Some(done) = tasks.join_next().await {
        calls += done.expect("flood task");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let after = evalsha_calls(&options.url).await?;
    Some(Flood {
        deny_cache,
        callers,
        calls,
        calls_per_s: calls as f64 / elapsed,
        // Our own INFO call runs no code of ours; nothing else runs meanwhile.
        evalsha: after.saturating_sub(before),
    })
}

/// One run of the hot-identity measurement.
#[derive(Debug, Clone, Copy)]
struct HotRun {
    decisions: u64,
    admitted: u64,
    secs: f64,
    /// Calls of our code that reached Redis (decisions, leases, returns).
    calls: u64,
}

/// Limiter instances in the hot-identity measurement.
const HOT_INSTANCES: usize = 4;
/// Callers per instance.
const HOT_CALLERS: usize = 64;

/// One hot identity on [`HOT_INSTANCES`] limiters for `--secs`, with
/// `limit` (leasing or not).
async fn hot_run(options: &Options, limit: Limit, run: usize) -> Option<HotRun> {
    let mut limiters = Vec::new();
    for _ in 0..HOT_INSTANCES {
        let backend = RedisBackend::builder(options.url.as_str())
            .call_mode(options.mode)
            .coalesce(options.coalesce)
            .coalesce_max(options.coalesce_max)
            .coalesce_in_flight(options.coalesce_in_flight)
            .connect()
            .await
            .ok()?;
        limiters.push(Arc::new(
            Limiter::builder()
                .backend(backend)
                .prefix("lg")
                .lists_refresh(Duration::from_secs(3_600))
                .build()
                .ok()?,
        ));
    }
    let spec = Arc::new(ratewall::CallSpec::owned(
        "hot",
        vec![ratewall::GroupSpec::owned("hot", vec![limit])],
    ));
    let identity = Arc::new(format!(
        "hot-{}-{run}-{}",
        std::process::id(),
        limit.lease().is_some()
    ));
    let before = evalsha_calls(&options.url).await?;
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(options.secs);
    let mut tasks = tokio::task::JoinSet::new();
    for limiter in &limiters {
        for _ in 0..HOT_CALLERS {
            let (limiter, spec, identity) = (limiter.clone(), spec.clone(), identity.clone());
            tasks.spawn(async move {
                let (mut decisions, mut admitted) = (0u64, 0u64);
                while Instant::now() < deadline {
                    for _ in 0..64 {
                        let call = limiter.call(&spec, &[&identity.as_str()]);
                        if call.await.is_ok() {
                            admitted += 1;
                        }
                        decisions += 1;
                    }
                    tokio::task::yield_now().await;
                }
                (decisions, admitted)
            });
        }
    }
    let (mut decisions, mut admitted) = (0, 0);
    while let Some(done) = tasks.join_next().await {
        let (d, a) = done.expect("hot caller");
        decisions += d;
        admitted += a;
    }
    let secs = started.elapsed().as_secs_f64();
    for limiter in &limiters {
        limiter.shutdown().await;
    }
    let after = evalsha_calls(&options.url).await?;
    Some(HotRun {
        decisions,
        admitted,
        secs,
        calls: after.saturating_sub(before),
    })
}

/// `--hot`: one hot identity without and with leasing, alternating.
async fn hot(options: &Options) {
    let algorithm = if options.algorithms.len() == Algorithm::ALL.len() {
        Algorithm::Gcra
    } else {
        options.algorithms[0]
    };
    let plain = options
        .hot_limit
        .parse::<Limit>()
        .and_then(|l| l.with_algorithm(algorithm))
        .unwrap_or_else(|error| usage(&format!("--hot-limit: {error}")));
    let leasing = plain
        .with_lease(options.lease)
        .unwrap_or_else(|error| usage(&format!("--lease: {error}")));
    println!(
        "One hot identity, {HOT_INSTANCES} limiter instances (one RedisBackend each), {HOT_CALLERS} callers each, \
         {plain}, {} s per run:\n",
        options.secs
    );
    println!(
        "| run | leasing | decisions/s | admitted/s | Redis calls | decisions per call | ratio (decisions/s) |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for run in 0..options.cpu_runs {
        let Some(without) = hot_run(options, plain, run).await else {
            println!("could not connect to {}", options.url);
            return;
        };
        let Some(with) = hot_run(options, leasing, run).await else {
            println!("could not connect to {}", options.url);
            return;
        };
        for (name, r) in [
            ("off", without),
            (&*format!("lease {}", options.lease), with),
        ] {
            println!(
                "| {} | {name} | {:.0} | {:.0} | {} | {:.0} | {} |",
                run + 1,
                r.decisions as f64 / r.secs,
                r.admitted as f64 / r.secs,
                r.calls,
                r.decisions as f64 / r.calls.max(1) as f64,
                if name == "off" {
                    "1.00".to_owned()
                } else {
                    format!(
                        "{:.2}",
                        (with.decisions as f64 / with.secs)
                            / (without.decisions as f64 / without.secs)
                    )
                }
            );
        }
    }
}

/// `N` sequential single-limit decisions (for a profiler).
async fn profile(backend: &RedisBackend, n: u64) {
    let limit = limit(Algorithm::Gcra);
    let started = Instant::now();
    let mut state = 1u64;
    for _ in 0..n {
        let key = Key::from_display("lg", "profile", &(next(&mut state) % IDENTITIES));
        backend
            .acquire(&[Request::new(&key, &limit, 1)])
            .await
            .expect("acquire");
    }
    let each = started.elapsed().as_secs_f64() / n as f64;
    println!("{n} sequential decisions, {:.1} µs each", each * 1e6);
}

/// A backend builder on `url`: a Redis Cluster when it lists several
/// URLs, comma-separated (only `--compare-coalesce` reads every node's
/// counts; the other modes read the first node's).
fn builder(url: &str) -> ratewall_redis::RedisBackendBuilder {
    #[cfg(feature = "cluster")]
    if url.contains(',') {
        return RedisBackend::cluster_builder(url.split(',').map(str::trim));
    }
    RedisBackend::builder(url)
}

#[tokio::main]
async fn main() {
    let options = options();
    let backend = Arc::new(
        builder(options.url.as_str())
            .timeout(Duration::from_secs(5))
            .call_mode(options.mode)
            .coalesce(options.coalesce)
            .coalesce_max(options.coalesce_max)
            .coalesce_in_flight(options.coalesce_in_flight)
            .connect()
            .await
            .unwrap_or_else(|error| panic!("cannot connect to {}: {error}", options.url)),
    );
    if let Some(n) = options.profile {
        profile(&backend, n).await;
        return;
    }
    if options.hot {
        hot(&options).await;
        return;
    }
    if options.compare_coalesce {
        compare::compare(&options).await;
        return;
    }
    if options.cpu_only {
        for &algorithm in &options.algorithms {
            let requests = (200_000.0 * options.secs) as usize;
            match floor(&options, algorithm, backend.call_mode(), requests).await {
                Some(f) => println!(
                    "{algorithm}: server µs/call ours {:.2} / floor {:.2} = {:.2}; \
                     floor as FCALL {:.2}, ours / that = {:.2} \
                     (runs: ours {:.2?}, floor {:.2?}, floor as FCALL {:.2?}); \
                     req/s ours {:.0}, floor {:.0}",
                    f.ours_us_median,
                    f.floor_us_median,
                    f.cpu_ratio,
                    f.floor_fcall_us_median,
                    f.cpu_ratio_fcall,
                    f.ours_us,
                    f.floor_us,
                    f.floor_fcall_us,
                    median(&f.ours_rps),
                    f.floor_rps_median
                ),
                None => println!("{algorithm}: could not run redis-benchmark"),
            }
        }
        return;
    }
    eprintln!(
        "ratewall-redis load generator: {}, {} s per cell, {:?} (library {}, batch script {})",
        options.url,
        options.secs,
        backend.call_mode(),
        RedisBackend::library_name(),
        RedisBackend::script_sha()
    );
    let mut rows = Vec::new();
    for &algorithm in &options.algorithms {
        rows.push(measure(&options, &backend, algorithm).await);
    }
    eprintln!("  flood on one blocked identity");
    let mut floods = Vec::new();
    for deny_cache in [true, false] {
        floods.extend(flood(&options, deny_cache).await);
    }
    let report = Report {
        url: ratewall_redis::redact_url(&options.url),
        mode: format!("{:?}", backend.call_mode()).to_lowercase(),
        coalesce: backend.coalesces(),
        library: RedisBackend::library_name(),
        script_sha: RedisBackend::script_sha(),
        secs_per_cell: options.secs,
        identities: IDENTITIES,
        limit: "100 per minute",
        rows,
        flood: floods,
    };
    if report.rows.is_empty() {
        usage("no algorithm to measure");
    }
    let mut table = table(&report);
    for f in &report.flood {
        let _ = writeln!(
            table,
            "\nFlood, {} callers on one blocked identity through `Limiter::check`, deny cache {}: \
             {:.0} refusals/s, {} of {} calls reached Redis.",
            f.callers,
            if f.deny_cache { "on" } else { "off" },
            f.calls_per_s,
            f.evalsha,
            f.calls
        );
    }
    println!("{table}");
    std::fs::create_dir_all(&options.out).expect("create --out dir");
    let write = |name: &str, text: &str| {
        let path = options.out.join(name);
        std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        println!("wrote {}", path.display());
    };
    write("loadgen.md", &table);
    write("loadgen.csv", &csv(&report));
    write(
        "loadgen.json",
        &serde_json::to_string_pretty(&report).expect("serialise"),
    );
    let png = options.out.join("loadgen.png");
    if load_font(&options) {
        match plot(&report, &png) {
            Ok(()) => println!("wrote {}", png.display()),
            Err(error) => eprintln!("could not draw {}: {error}", png.display()),
        }
    } else {
        eprintln!("no font for the plot (give one with --font PATH.ttf); skipped it");
    }
}
