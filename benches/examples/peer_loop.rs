//! The in-memory paths against `governor` (keyed, `u64` keys, GCRA) in a
//! plain loop: each side runs N decisions in one loop, round-robin over 1
//! or 100 000 keys, and the figure is the median of 5 runs of the loop.
//! Ours run inside one `block_on` of a current-thread tokio runtime (how a
//! service's task awaits them); `governor` is a plain call. The second
//! harness beside `benches/peer.rs` (criterion), which measures the same
//! paths one iteration at a time.
//!
//! ```text
//! cargo run --release -p ratewall-benches --example peer_loop -- 5000000
//! ```
//!
//! Paths, allowed (every key far below its limit) and refused (every key
//! spent for the hour, so every decision is a refusal):
//! - `governor`: `check_key(&u64)`;
//! - `annotated`: a `#[rate_limit(key = user)] async fn(user: u64)` on the
//!   global in-memory limiter;
//! - `acquire`: `limiter.requests().acquire(&key, &limit, 1)` with keys
//!   built once before the loop, on a limiter of its own (each path's
//!   store holds its own keys only, as `governor`'s does);
//! - `annotated_polled`: the annotated fn polled once with a no-op waker
//!   outside any runtime (the criterion bench's way), to show what the
//!   runtime adds.
//!
//! `peer_loop N PATH allowed|refused KEYS` runs one path once (for a
//! profiler).
//!
//! Each path's store holds its own keys only, as `governor`'s does: the
//! acquire path has a limiter of its own, and the refused shapes are built
//! after the allowed ones ran (their states idle by then, swept as the
//! installed store grows).
//!
//! The runs of every path are interleaved (path A run 1, path B run 1, …),
//! so a change in the machine's load falls on all of them alike.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use governor::{Quota, RateLimiter};
use ratewall::{Key, Limit, Limiter, Rejection, rate_limit};
use tokio::runtime::Runtime;

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "loop")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

#[rate_limit(period = 3600, threshold = 1, key = user, name = "loop_spent")]
async fn spent(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

type Governor = governor::DefaultKeyedRateLimiter<u64>;

/// Polls a future that completes without suspending.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory decision suspended"),
    }
}

/// Everything one shape (allowed or refused, 1 or 100 000 keys) needs.
struct Shape {
    allowed: bool,
    keys: u64,
    governor: Governor,
    limit: Limit,
    prebuilt: Vec<Key>,
}

const PATHS: [&str; 4] = ["governor", "annotated", "acquire", "annotated_polled"];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n: u64 = args
        .first()
        .and_then(|n| n.parse().ok())
        .unwrap_or(5_000_000);
    let runs = 5;
    // The annotated fns decide on the installed limiter; `acquire` on a
    // limiter of its own, so each path's store holds only its own keys, as
    // `governor`'s does (one store holding both paths' 100 000 keys would
    // put twice the entries in the tables the measured path walks).
    Limiter::builder().memory().install().unwrap();
    let own = Limiter::builder().memory().build().unwrap();
    let limiter = &own;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    if let [_, path, answer, keys] = &args[..] {
        // One path once, for a profiler: `peer_loop N PATH allowed|refused KEYS`.
        let keys = keys.parse().expect("KEYS is a number");
        let shape = Shape::new(answer == "allowed", keys, limiter, &runtime);
        let took = shape.run(path, n, limiter, &runtime);
        println!("{path}: {:.1} ns", took.as_nanos() as f64 / n as f64);
        return;
    }
    println!("N = {n} decisions per run, median of {runs} runs, ns per decision");
    println!(
        "{:<8} {:>7} {:>9} {:>10} {:>9} {:>17} | {:>9} {:>8} {:>9}",
        "shape",
        "keys",
        "governor",
        "annotated",
        "acquire",
        "annotated_polled",
        "annot/gov",
        "acq/gov",
        "polled/gov"
    );
    for allowed in [true, false] {
        for keys in [1, 100_000] {
            let shape = Shape::new(allowed, keys, limiter, &runtime);
            let mut times: Vec<Vec<f64>> = vec![Vec::new(); PATHS.len()];
            for _ in 0..runs {
                for (path, times) in PATHS.iter().zip(&mut times) {
                    let took = shape.run(path, n, limiter, &runtime);
                    times.push(took.as_nanos() as f64 / n as f64);
                }
            }
            let m: Vec<f64> = times.into_iter().map(median).collect();
            println!(
                "{:<8} {:>7} {:>9.1} {:>10.1} {:>9.1} {:>17.1} | {:>8.2}x {:>7.2}x {:>8.2}x",
                if allowed { "allowed" } else { "refused" },
                keys,
                m[0],
                m[1],
                m[2],
                m[3],
                m[1] / m[0],
                m[2] / m[0],
                m[3] / m[0]
            );
        }
    }
}

/// The key after `key` in a round-robin over `0..keys` (no division, which
/// would cost as much as a hot-key decision).
#[inline(always)]
fn next(key: u64, keys: u64) -> u64 {
    if key + 1 == keys { 0 } else { key + 1 }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

impl Shape {
    /// Builds the shape's limiters and keys and warms every key: allowed
    /// shapes far below their limits, refused ones spent for the hour.
    fn new(allowed: bool, keys: u64, limiter: &Limiter, runtime: &Runtime) -> Self {
        let (quota, limit) = if allowed {
            (
                Quota::per_second(NonZeroU32::MAX),
                Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap(),
            )
        } else {
            (
                Quota::per_hour(NonZeroU32::MIN),
                Limit::per_hour(1).unwrap(),
            )
        };
        let scope = if allowed {
            "loop_acquire"
        } else {
            "loop_acquire_spent"
        };
        let shape = Shape {
            allowed,
            keys,
            governor: RateLimiter::keyed(quota),
            limit,
            prebuilt: (0..keys).map(|i| limiter.key(scope, &i)).collect(),
        };
        for i in 0..keys {
            let _ = shape.governor.check_key(&i);
            let _ = runtime.block_on(shape.acquire(limiter, i));
            let _ = runtime.block_on(shape.annotated(i));
        }
        // Every path now gives the shape's answer.
        for i in 0..keys {
            assert_eq!(shape.governor.check_key(&i).is_ok(), allowed);
            assert_eq!(runtime.block_on(shape.acquire(limiter, i)), allowed);
            assert_eq!(runtime.block_on(shape.annotated(i)), allowed);
        }
        shape
    }

    async fn annotated(&self, user: u64) -> bool {
        if self.allowed {
            annotated(user).await.is_ok()
        } else {
            spent(user).await.is_ok()
        }
    }

    async fn acquire(&self, limiter: &Limiter, i: u64) -> bool {
        let key = &self.prebuilt[i as usize];
        limiter
            .requests()
            .acquire(key, &self.limit, 1)
            .await
            .expect("in memory")
            .allowed()
    }

    /// One run of `path`: N decisions in one loop.
    fn run(&self, path: &str, n: u64, limiter: &Limiter, runtime: &Runtime) -> Duration {
        let keys = self.keys;
        let expected = self.allowed;
        let start = Instant::now();
        let matched = match path {
            "governor" => {
                let mut matched = 0u64;
                let mut key = 0;
                for _ in 0..n {
                    key = next(black_box(key), keys);
                    matched += u64::from(self.governor.check_key(&key).is_ok() == expected);
                }
                matched
            }
            // Each path awaits the public call itself in the loop, as a
            // handler would: no wrapper future of the harness's own.
            "annotated" if expected => runtime.block_on(async {
                let mut matched = 0u64;
                let mut key = 0;
                for _ in 0..n {
                    key = next(black_box(key), keys);
                    matched += u64::from(annotated(key).await.is_ok());
                }
                matched
            }),
            "annotated" => runtime.block_on(async {
                let mut matched = 0u64;
                let mut key = 0;
                for _ in 0..n {
                    key = next(black_box(key), keys);
                    matched += u64::from(spent(key).await.is_err());
                }
                matched
            }),
            "acquire" => runtime.block_on(async {
                let requests = limiter.requests();
                let mut matched = 0u64;
                let mut key = 0;
                for _ in 0..n {
                    key = next(black_box(key), keys);
                    let decision = requests
                        .acquire(&self.prebuilt[key as usize], &self.limit, 1)
                        .await
                        .expect("in memory");
                    matched += u64::from(decision.allowed() == expected);
                }
                matched
            }),
            "annotated_polled" if expected => {
                let mut matched = 0u64;
                let mut key = 0;
                for _ in 0..n {
                    key = next(black_box(key), keys);
                    matched += u64::from(now(annotated(key)).is_ok());
                }
                matched
            }
            "annotated_polled" => {
                let mut matched = 0u64;
                let mut key = 0;
                for _ in 0..n {
                    key = next(black_box(key), keys);
                    matched += u64::from(now(spent(key)).is_err());
                }
                matched
            }
            other => unreachable!("no path {other}"),
        };
        let took = start.elapsed();
        assert_eq!(
            matched, n,
            "{path}: every decision gives the shape's answer"
        );
        took
    }
}
