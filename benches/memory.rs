//! In-memory decisions on an existing key, per algorithm, and through the limiter.
//! Thread scaling: `cargo run --release -p ratewall-benches --example memory_scaling`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewall::{
    Algorithm, Key, Limit, Limiter,
    backend::{MemoryBackend, Request},
};

fn limit(algorithm: Algorithm) -> Limit {
    // A generous limit so most decisions are "allowed" and write state.
    Limit::new(1_000_000, Duration::from_secs(1))
        .unwrap()
        .with_algorithm(algorithm)
        .unwrap()
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_decision");
    group.throughput(Throughput::Elements(1));
    for algorithm in Algorithm::ALL {
        let limit = if algorithm == Algorithm::SlidingLog {
            Limit::new(10_000, Duration::from_millis(100))
                .unwrap()
                .with_algorithm(algorithm)
                .unwrap()
        } else {
            limit(algorithm)
        };
        let backend = MemoryBackend::new();
        let key = Key::new("rl", "bench", "user-42");
        let request = Request::new(&key, &limit, 1);
        backend.acquire_one(&request);
        group.bench_function(algorithm.name(), |b| {
            b.iter(|| black_box(backend.acquire_one(black_box(&request))))
        });
    }
    group.finish();
}

fn through_limiter(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let limiter = Limiter::builder().memory().build().unwrap();
    let limit = limit(Algorithm::Gcra);
    let mut group = c.benchmark_group("limiter");
    group.throughput(Throughput::Elements(1));
    // One block_on per sample, not per call: measures the limiter, not the runtime.
    group.bench_function("acquire_prebuilt_key", |b| {
        let key = limiter.key("bench", &42u64);
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(
                        limiter
                            .requests()
                            .acquire(black_box(&key), &limit, 1)
                            .await
                            .unwrap(),
                    );
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("acquire_with_key_formatting", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let key = limiter.key("bench", black_box(&42u64));
                    black_box(limiter.requests().acquire(&key, &limit, 1).await.unwrap());
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, single_thread, through_limiter);
criterion_main!(benches);
