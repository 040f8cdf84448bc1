//! Load generator: end-to-end decisions per second and latency of the Redis
//! backend, per algorithm and concurrency, compared with `redis-benchmark`
//! sending the very same `EVALSHA`.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release -p rl-redis --example loadgen
//! ```
//!
//! Environment: `REDIS_URL` (default `redis://127.0.0.1:6379/`),
//! `LOADGEN_SECS` seconds per measurement (default 3), `LOADGEN_BENCH`
//! (`redis-benchmark` binary, default from `PATH`). One backend (one
//! multiplexed connection, as one app instance) serves all callers; keys are
//! drawn from 10 000 identities under a 100-per-minute limit. The server's
//! keys under the `lg:` prefix are left to expire.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rl_core::{Algorithm, Backend, Key, Limit, Request};
use rl_redis::RedisBackend;

const CONCURRENCY: [usize; 4] = [1, 16, 64, 256];
const IDENTITIES: u64 = 10_000;
const BENCH_CLIENTS: usize = 64;

fn limit(algorithm: Algorithm) -> Limit {
    Limit::per_minute(100)
        .and_then(|l| l.with_algorithm(algorithm))
        .expect("valid limit")
}

/// Decisions per second and latency percentiles (µs) at one concurrency.
struct Run {
    per_second: f64,
    p50_us: u64,
    p99_us: u64,
    errors: u64,
}

async fn run(
    backend: &Arc<RedisBackend>,
    algorithm: Algorithm,
    callers: usize,
    length: Duration,
) -> Run {
    let deadline = Instant::now() + length;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let backend = backend.clone();
        tasks.spawn(async move {
            let limit = limit(algorithm);
            let mut latencies = Vec::with_capacity(4_096);
            let mut errors = 0u64;
            let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ caller as u64;
            while Instant::now() < deadline {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let key = Key::from_display("lg", algorithm.name(), &((state >> 33) % IDENTITIES));
                let begun = Instant::now();
                match backend.acquire(&[Request::new(&key, &limit, 1)]).await {
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
    latencies.sort_unstable();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
    };
    Run {
        per_second: latencies.len() as f64 / elapsed,
        p50_us: at(0.50).copied().unwrap_or(0),
        p99_us: at(0.99).copied().unwrap_or(0),
        errors,
    }
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

/// `redis-benchmark` requests per second and p50/p99 (ms) for the same
/// script call, with a random identity per request.
fn redis_benchmark(url: &str, algorithm: Algorithm, requests: usize) -> Option<(f64, f64, f64)> {
    let limit = limit(algorithm);
    let key = Key::new("lg", algorithm.name(), "__rand_int__");
    let line = rl_redis::__private::acquire_command_line(&[Request::new(&key, &limit, 1)]);
    let (host, port) = host_port(url);
    let binary = std::env::var("LOADGEN_BENCH").unwrap_or_else(|_| "redis-benchmark".to_owned());
    let output = Command::new(binary)
        .args([
            "-h",
            &host,
            "-p",
            &port,
            "-c",
            &BENCH_CLIENTS.to_string(),
            "-n",
            &requests.to_string(),
        ])
        .args(["-r", &IDENTITIES.to_string(), "--csv"])
        .args(&line)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
    let row = text.lines().nth(1)?;
    let fields: Vec<f64> = row
        .split(',')
        .skip(1)
        .filter_map(|f| f.trim_matches('"').parse().ok())
        .collect();
    Some((*fields.first()?, *fields.get(3)?, *fields.get(5)?))
}

async fn memory_usage(url: &str) -> Vec<(Algorithm, u64)> {
    let backend = RedisBackend::connect(url).await.expect("connect");
    let client = redis::Client::open(url).expect("url");
    let mut connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let mut usage = Vec::new();
    for algorithm in Algorithm::ALL {
        let limit = limit(algorithm);
        let key = Key::new("lg", "memory", algorithm.name());
        backend
            .reset(&[Request::new(&key, &limit, 1)])
            .await
            .expect("reset");
        for _ in 0..100 {
            backend
                .acquire(&[Request::new(&key, &limit, 1)])
                .await
                .expect("acquire");
        }
        let base = format!("{key}:{}", limit.storage_suffix());
        let mut names = vec![base.clone()];
        if algorithm == Algorithm::SlidingLog {
            names.push(format!("{base}:seq"));
        }
        let mut bytes = 0;
        for name in names {
            let used: Option<u64> = redis::cmd("MEMORY")
                .arg("USAGE")
                .arg(&name)
                .query_async(&mut connection)
                .await
                .expect("MEMORY USAGE");
            bytes += used.unwrap_or(0);
        }
        usage.push((algorithm, bytes));
    }
    usage
}

#[tokio::main]
async fn main() {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_owned());
    let seconds: u64 = std::env::var("LOADGEN_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let length = Duration::from_secs(seconds);
    let backend = Arc::new(
        RedisBackend::builder(url.as_str())
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .unwrap_or_else(|error| panic!("cannot connect to {url}: {error}")),
    );
    println!(
        "rl-redis load generator: {url}, {seconds} s per cell, script {}",
        RedisBackend::script_sha()
    );
    println!();
    println!(
        "| algorithm | callers | decisions/s | p50 | p99 | errors | redis-benchmark, same EVALSHA, req/s (p50/p99) | ratio |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for algorithm in Algorithm::ALL {
        for callers in CONCURRENCY {
            let result = run(&backend, algorithm, callers, length).await;
            // redis-benchmark with as many connections as we have callers.
            let bench = (callers == BENCH_CLIENTS).then(|| {
                let requests = ((result.per_second * seconds as f64) as usize).max(10_000);
                redis_benchmark(&url, algorithm, requests)
            });
            let (bench_text, ratio) = match bench.flatten() {
                Some((rps, p50, p99)) => (
                    format!("{rps:.0} ({p50:.2}/{p99:.2} ms)"),
                    format!("{:.2}", result.per_second / rps),
                ),
                None => (String::new(), String::new()),
            };
            println!(
                "| {} | {callers} | {:.0} | {:.2} ms | {:.2} ms | {} | {bench_text} | {ratio} |",
                algorithm.name(),
                result.per_second,
                result.p50_us as f64 / 1_000.0,
                result.p99_us as f64 / 1_000.0,
                result.errors,
            );
        }
    }
    println!();
    println!("| algorithm | MEMORY USAGE of one identity, T=100, after 100 calls |");
    println!("|---|---:|");
    for (algorithm, bytes) in memory_usage(&url).await {
        println!("| {} | {bytes} B |", algorithm.name());
    }
}
