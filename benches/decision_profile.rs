//! A plain driver for profilers: runs `N` decisions of one kind in a loop
//! and prints the mean time per decision. Meant for instruction counts,
//! which are repeatable where wall-clock benches are not:
//!
//! ```text
//! cargo bench -p ratewall-benches --bench decision_profile --no-run
//! valgrind --tool=callgrind --callgrind-out-file=cg.out \
//!     target/release/deps/decision_profile-<hash> backend 200000
//! callgrind_annotate cg.out | head -40
//! ```
//!
//! Kinds: `backend` (`MemoryBackend::acquire_one`, GCRA), `limiter`
//! (`Limiter::acquire`, prebuilt key), `check` (`Limiter::check`, allowed,
//! what `#[rate_limit]` calls), `refused` (`Limiter::check` refused by the
//! memory backend), `cached` (`Limiter::check` refused by the deny cache in
//! front of a remote backend), `multi` (`Limiter::check` of three limits on
//! two keys, allowed), `annotated` (a `#[rate_limit]` function through the
//! global limiter, key from its argument) and `by_hand` (the same decision
//! written by hand, as in the `macro_overhead` bench). Without arguments (as
//! `cargo bench` runs it) every kind runs briefly.

use std::hint::black_box;
use std::time::{Duration, Instant};

use ratewall::{
    Key, Limit, Limiter, Rejection,
    backend::{MemoryBackend, Request},
    rate_limit,
};

#[path = "support/remote.rs"]
mod remote;

use remote::Remote;

const KINDS: [&str; 8] = [
    "backend",
    "limiter",
    "check",
    "refused",
    "cached",
    "multi",
    "annotated",
    "by_hand",
];

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "profile_macro")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// `annotated` written by hand: build the key, decide, convert the refusal.
async fn by_hand(user: u64) -> Result<u64, Rejection> {
    static LIMIT: std::sync::LazyLock<Limit> =
        std::sync::LazyLock::new(|| Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap());
    let limiter = Limiter::global().map_err(|e| Rejection::unavailable("profile_hand", e))?;
    let key = limiter.key("profile_hand", &user);
    limiter
        .requests()
        .check("profile_hand", &[Request::new(&key, &LIMIT, 1)], None)
        .await?;
    Ok(user)
}

fn run(kind: &str, n: u64) -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let generous = Limit::new(1_000_000_000, Duration::from_secs(1)).expect("limit");
    let tight = Limit::per_hour(1).expect("limit");
    match kind {
        "backend" => {
            let backend = MemoryBackend::new();
            let key = Key::new("rl", "profile", "user-42");
            let request = Request::new(&key, &generous, 1);
            backend.acquire_one(&request);
            let start = Instant::now();
            for _ in 0..n {
                black_box(backend.acquire_one(black_box(&request)));
            }
            start.elapsed()
        }
        "limiter" | "check" | "refused" | "cached" => {
            let limiter = if kind == "cached" {
                Limiter::builder().backend(Remote::default()).build()
            } else {
                Limiter::builder().memory().build()
            }
            .expect("limiter");
            let limit = if matches!(kind, "refused" | "cached") {
                tight
            } else {
                generous
            };
            let key = limiter.key("profile", &42u64);
            let requests = [Request::new(&key, &limit, 1)];
            runtime.block_on(async {
                // Use the quota up first, so that a refusal is what is measured.
                let _ = limiter.requests().check("profile", &requests, None).await;
                let _ = limiter.requests().check("profile", &requests, None).await;
                let start = Instant::now();
                for _ in 0..n {
                    if kind == "limiter" {
                        black_box(
                            limiter
                                .requests()
                                .acquire(black_box(&key), &limit, 1)
                                .await
                                .ok(),
                        );
                    } else {
                        let _ = black_box(
                            limiter
                                .requests()
                                .check("profile", black_box(&requests), None)
                                .await,
                        );
                    }
                }
                start.elapsed()
            })
        }
        "multi" => {
            let limiter = Limiter::builder().memory().build().expect("limiter");
            let per_hour = Limit::new(1_000_000, Duration::from_secs(3_600)).expect("limit");
            let user = limiter.key("profile", &42u64);
            let ip = limiter.key("ip", &"10.0.0.1");
            let requests = [
                Request::new(&user, &generous, 1),
                Request::new(&user, &per_hour, 1),
                Request::new(&ip, &generous, 1),
            ];
            runtime.block_on(async {
                let _ = limiter.requests().check("profile", &requests, None).await;
                let start = Instant::now();
                for _ in 0..n {
                    let _ = black_box(
                        limiter
                            .requests()
                            .check("profile", black_box(&requests), None)
                            .await,
                    );
                }
                start.elapsed()
            })
        }
        "annotated" | "by_hand" => {
            if Limiter::global().is_err() {
                Limiter::builder()
                    .memory()
                    .install()
                    .expect("install the global limiter");
            }
            runtime.block_on(async {
                let start = Instant::now();
                for i in 0..n {
                    let user = black_box(i % 64);
                    let result = if kind == "annotated" {
                        annotated(user).await
                    } else {
                        by_hand(user).await
                    };
                    black_box(result.expect("allowed"));
                }
                start.elapsed()
            })
        }
        other => panic!("unknown kind {other:?}; expected one of {KINDS:?}"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let (kinds, n): (Vec<&str>, u64) = match args.as_slice() {
        [] => (KINDS.to_vec(), 200_000),
        [kind] => (vec![kind.as_str()], 1_000_000),
        [kind, n, ..] => (vec![kind.as_str()], n.parse().expect("N is an integer")),
    };
    for kind in kinds {
        let took = run(kind, n);
        println!(
            "{kind:>8}: {n} decisions, {:.1} ns each",
            took.as_nanos() as f64 / n as f64
        );
    }
}
