//! What a refusal costs through `Limiter::check`: remembered by the deny
//! cache, or decided by the backend (the in-memory one, directly or behind
//! the `Backend` trait as a remote backend would be, minus the network).

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewall::{Limit, Limiter, backend::Request};

#[path = "support/remote.rs"]
mod remote;

use remote::Remote;

fn refusals(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let limit = Limit::per_hour(1).unwrap();
    let generous = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    let mut group = c.benchmark_group("deny_cache");
    group.throughput(Throughput::Elements(1));
    let cases = [
        (
            "cached_refusal",
            Limiter::builder().backend(Remote::default()),
            &limit,
        ),
        (
            "remote_refusal_uncached",
            Limiter::builder()
                .backend(Remote::default())
                .deny_cache(false),
            &limit,
        ),
        ("memory_refusal", Limiter::builder().memory(), &limit),
        (
            "memory_refusal_cached",
            Limiter::builder().memory().deny_cache(true),
            &limit,
        ),
        (
            "remote_allowed_with_cache",
            Limiter::builder().backend(Remote::default()),
            &generous,
        ),
        (
            "remote_allowed_without_cache",
            Limiter::builder()
                .backend(Remote::default())
                .deny_cache(false),
            &generous,
        ),
    ];
    for (name, builder, limit) in cases {
        let limiter = builder.build().unwrap();
        let key = limiter.key("bench", &42u64);
        let call = [Request::new(&key, limit, 1)];
        runtime.block_on(async {
            // Use the quota up (and get the refusal remembered).
            let _ = limiter.requests().check("bench", &call, None).await;
            let _ = limiter.requests().check("bench", &call, None).await;
        });
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let _ = black_box(
                            limiter
                                .requests()
                                .check("bench", black_box(&call), None)
                                .await,
                        );
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, refusals);
criterion_main!(benches);
