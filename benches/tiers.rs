//! A tiered `#[rate_limit]` function against the same function without
//! tiers, side by side in one run: the global in-memory limiter, GCRA,
//! every call allowed, one hot key and 100 000 keys visited in a scattered
//! order. The tiered one is decided by its `pro` tier (`tier = plan`, a
//! `&str`), on the state of `peer@pro`.
//!
//! `cargo bench -p ratewall-benches --bench tiers`; for instruction
//! counts, which are repeatable where timings on a busy machine are not,
//! see `benches/examples/tier_instructions.rs`.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewall::{Limiter, Rejection, rate_limit};

const KEYS: u64 = 100_000;

fn scattered(i: u64) -> u64 {
    (i.wrapping_mul(7_919)) % KEYS
}

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "plain")]
async fn plain(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

#[rate_limit(
    key = user,
    name = "tiered",
    tier = plan,
    tiers(free = ["1000000/1s"], pro = ["1000000000/1s"]),
)]
async fn tiered(user: u64, plan: &str) -> Result<u64, Rejection> {
    Ok(user)
}

fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory decision suspended"),
    }
}

fn tiers(c: &mut Criterion) {
    Limiter::builder().memory().install().unwrap();
    for i in 0..KEYS {
        assert!(now(plain(i)).is_ok());
        assert!(now(tiered(i, "pro")).is_ok());
    }
    for (shape, key_of) in [
        ("one_key", (|_| 42) as fn(u64) -> u64),
        ("100k_keys", scattered),
    ] {
        let mut group = c.benchmark_group(format!("tiers/{shape}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("annotated_fn", |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                black_box(now(plain(key_of(black_box(i))))).is_ok()
            })
        });
        group.bench_function("annotated_fn_tiered", |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                black_box(now(tiered(key_of(black_box(i)), black_box("pro")))).is_ok()
            })
        });
        group.finish();
    }
}

criterion_group!(benches, tiers);
criterion_main!(benches);
