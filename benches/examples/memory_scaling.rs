//! Decisions per second with 1 and 2 threads, each thread on its own keys:
//! through an annotated fn on the global in-memory limiter (every layer,
//! the call API), and on the in-memory backend alone with the system clock
//! and with a manual clock (to show what reading the wall clock costs).
//!
//! `cargo run --release -p ratewall-benches --example memory_scaling`
use ratewall::{
    Algorithm, Key, Limit, Limiter, Rejection,
    backend::{MemoryBackend, Request},
    clock::{Clock, ManualClock, SystemClock},
    rate_limit,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../support/in_memory.rs"]
mod in_memory;
use in_memory::now;

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "scaling")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// Decisions per second of the annotated fn, `threads` threads each on its
/// own `keys_per_thread` identities.
fn run_annotated(threads: usize, keys_per_thread: u64) -> f64 {
    let n = 5_000_000u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads as u64 {
            s.spawn(move || {
                let first = t << 32;
                for i in 0..n {
                    let user = first + i % keys_per_thread;
                    std::hint::black_box(now(annotated(std::hint::black_box(user))).is_ok());
                }
            });
        }
    });
    (n * threads as u64) as f64 / start.elapsed().as_secs_f64()
}

fn run(backend: Arc<MemoryBackend>, threads: usize, keys_per_thread: usize) -> f64 {
    let limit = Limit::new(1_000_000, Duration::from_secs(1))
        .unwrap()
        .with_algorithm(Algorithm::Gcra)
        .unwrap();
    let n = 5_000_000u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let backend = backend.clone();
            s.spawn(move || {
                let keys: Vec<Key> = (0..keys_per_thread)
                    .map(|i| Key::new("rl", "p", &format!("{t}-{i}")))
                    .collect();
                for i in 0..n {
                    std::hint::black_box(backend.acquire_one(&Request::new(
                        &keys[i as usize % keys.len()],
                        &limit,
                        1,
                    )));
                }
            });
        }
    });
    (n * threads as u64) as f64 / start.elapsed().as_secs_f64()
}

/// Prints one line per path, clock and key count.
fn main() {
    Limiter::builder().memory().install().expect("install");
    for keys in [1, 8] {
        let one = run_annotated(1, keys);
        let two = run_annotated(2, keys);
        println!(
            "annotated fn, {keys} keys/thread: 1 thread {:.1} M/s, 2 threads {:.1} M/s, scaling {:.2}",
            one / 1e6,
            two / 1e6,
            two / one
        );
    }
    for (name, clock) in [
        ("system", Arc::new(SystemClock) as Arc<dyn Clock>),
        (
            "manual",
            Arc::new(ManualClock::new(1 << 50)) as Arc<dyn Clock>,
        ),
    ] {
        for keys in [1, 8] {
            let one = run(
                Arc::new(MemoryBackend::with_shared_clock(clock.clone())),
                1,
                keys,
            );
            let two = run(
                Arc::new(MemoryBackend::with_shared_clock(clock.clone())),
                2,
                keys,
            );
            println!(
                "store, {name} clock, {keys} keys/thread: 1 thread {:.1} M/s, 2 threads {:.1} M/s, scaling {:.2}",
                one / 1e6,
                two / 1e6,
                two / one
            );
        }
    }
}
