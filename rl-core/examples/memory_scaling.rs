//! Decisions per second of the in-memory backend with 1 and 2 threads, each
//! thread on its own keys; with the system clock and with a manual clock (to
//! show what reading the wall clock costs).
//!
//! `cargo run --release -p rl-core --example memory_scaling`
use rl_core::{Algorithm, Clock, Key, Limit, ManualClock, MemoryBackend, Request, SystemClock};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

/// Prints one line per clock and key count.
fn main() {
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
                "{name} clock, {keys} keys/thread: 1 thread {:.1} M/s, 2 threads {:.1} M/s, scaling {:.2}",
                one / 1e6,
                two / 1e6,
                two / one
            );
        }
    }
}
