//! The in-memory hot path against the Rust anchor, `governor` (keyed, `u64`
//! keys, its default quanta clock), measured side by side in one run:
//! single thread, GCRA; one hot key, and 100 000 keys visited in a
//! scattered order (so most lookups miss the CPU caches).
//!
//! `cargo bench -p ratewall-benches --bench peer`
//!
//! Each `rl` figure is a whole decision: `annotated_fn` is a
//! `#[rate_limit(key = user)] async fn(user: u64)` on the global in-memory
//! limiter, polled once in place, as an `.await` polls it (in memory it
//! completes without suspending); `acquire_prebuilt_key` is the public
//! `limiter.requests().acquire` with keys built before the run, polled
//! the same way; `memory_store` is the store alone with a prebuilt key.
//!
//! The `peer/*` groups admit every call; the `peer_refused/*` groups
//! refuse every call (every key spent for the hour beforehand, on both
//! sides): `governor` refusing against a refusal through the macro.
//!
//! Each path's store holds its own keys only, as each `governor` does:
//! `acquire` runs on a limiter of its own, and the keys the refused groups
//! spend are added after the admitting groups ran (the admitted states,
//! idle by then, are swept as the store grows), so no path walks a table
//! twice the size of `governor`'s.

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use criterion::{Bencher, Criterion, Throughput, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};
use ratewall::{
    Key, Limit, Limiter, Rejection,
    backend::{MemoryBackend, Request},
    rate_limit,
};

/// Keys of the "many keys" variant.
const KEYS: u64 = 100_000;

/// The i-th key of a scattered walk over `0..KEYS` (a full cycle: 7919 is
/// prime to 100 000).
fn scattered(i: u64) -> u64 {
    (i.wrapping_mul(7_919)) % KEYS
}

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "peer")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// One call per hour: spent for every key before the refused groups run.
#[rate_limit(period = 3600, threshold = 1, key = user, name = "peer_spent")]
async fn spent(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// Polls a future that completes without suspending, in place: inlined
/// into the caller, as an `.await` polls the future where it was built.
/// A call taking the future by value would copy it (and its output back)
/// with wide loads of what was just written in 8-byte pieces, which stalls
/// store forwarding: 19 % of `acquire`'s samples, 57 ns against 43–45.
#[inline(always)]
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory decision suspended"),
    }
}

/// Times `call` on one key per iteration: the `key_of` the iteration's
/// number (hidden from the optimizer, as the call's answer is). The answer
/// is shown to the optimizer by reference, where the call left it: passed
/// by value, `acquire`'s 72-byte `Result<Decision, Error>` was copied with
/// wide loads right after being written in 8-byte pieces (the stall
/// described at `now`; 42–45 → 39–40 ns), a copy `governor`'s answer,
/// returned in registers, never needed.
fn walk<T>(b: &mut Bencher<'_>, key_of: fn(u64) -> u64, mut call: impl FnMut(u64) -> T) {
    let mut i = 0u64;
    b.iter(|| {
        i += 1;
        let answer = call(key_of(black_box(i)));
        black_box(&answer);
    })
}

fn peer(c: &mut Criterion) {
    Limiter::builder().memory().install().unwrap();
    let limiter = Limiter::builder().memory().build().unwrap();
    let governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
    let limit = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    let store = MemoryBackend::new();
    let keys: Vec<Key> = (0..KEYS)
        .map(|i| Key::from_display("rl", "peer", &i))
        .collect();
    for i in 0..KEYS {
        assert!(governor.check_key(&i).is_ok());
        assert!(now(annotated(i)).is_ok());
        store.acquire_one(&Request::new(&keys[i as usize], &limit, 1));
        assert!(now(limiter.requests().acquire(&keys[i as usize], &limit, 1)).is_ok());
    }
    let shapes = [
        ("one_key", (|_| 42) as fn(u64) -> u64),
        ("100k_keys", scattered),
    ];
    for (shape, key_of) in shapes {
        let mut group = c.benchmark_group(format!("peer/{shape}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("governor_check_key", |b| {
            walk(b, key_of, |k| governor.check_key(&k))
        });
        group.bench_function("rl_annotated_fn", |b| {
            walk(b, key_of, |k| now(annotated(k)))
        });
        group.bench_function("rl_acquire_prebuilt_key", |b| {
            walk(b, key_of, |k| {
                now(limiter.requests().acquire(&keys[k as usize], &limit, 1))
            })
        });
        group.bench_function("rl_memory_store_prebuilt_key", |b| {
            walk(b, key_of, |k| {
                store.acquire_one(&Request::new(&keys[k as usize], &limit, 1))
            })
        });
        group.finish();
    }

    let governor_spent = RateLimiter::keyed(Quota::per_hour(NonZeroU32::MIN));
    for i in 0..KEYS {
        assert!(governor_spent.check_key(&i).is_ok());
        assert!(governor_spent.check_key(&i).is_err());
        assert!(now(spent(i)).is_ok());
        assert!(now(spent(i)).is_err());
    }
    for (shape, key_of) in shapes {
        let mut group = c.benchmark_group(format!("peer_refused/{shape}"));
        group.throughput(Throughput::Elements(1));
        group.bench_function("governor_check_key", |b| {
            walk(b, key_of, |k| governor_spent.check_key(&k))
        });
        group.bench_function("rl_annotated_fn", |b| walk(b, key_of, |k| now(spent(k))));
        group.finish();
    }
}

criterion_group!(benches, peer);
criterion_main!(benches);
