//! What `#[rate_limit]` costs over writing the same decision by hand, on the
//! in-memory backend through the global limiter.

use std::future::Future;
use std::hint::black_box;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ratewall::{Limit, Limiter, Rejection, backend::Request, rate_limit};

/// A limit high enough that every call in the bench is allowed.
static LIMIT: LazyLock<Limit> =
    LazyLock::new(|| Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap());

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "bench_macro")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// The same work written by hand with the request API: build the key,
/// decide through `Limiter::check`, convert the refusal.
async fn by_hand(user: u64) -> Result<u64, Rejection> {
    let limiter = Limiter::global().map_err(|e| Rejection::unavailable("bench_hand", e))?;
    let key = limiter.key("bench_hand", &user);
    limiter
        .requests()
        .check("bench_hand", &[Request::new(&key, &LIMIT, 1)], None)
        .await?;
    Ok(user)
}

/// What the macro expands to, written by hand with the public call API.
async fn via_call_api(user: u64) -> Result<u64, Rejection> {
    use ratewall::{Algorithm, CallSpec, GroupSpec};
    static LIMITS: [Limit; 1] = [Limit::from_parts_const(
        1_000_000_000,
        1_000_000,
        Algorithm::Gcra,
        1_000_000_000,
        10,
    )];
    static GROUPS: [GroupSpec; 1] = [GroupSpec::new("bench_api", &LIMITS)];
    static SPEC: CallSpec = CallSpec::new("bench_api", &GROUPS);
    let limiter = Limiter::global().map_err(|e| Rejection::unavailable("bench_api", e))?;
    let _permit = limiter.call(&SPEC, &[&user]).await?;
    Ok(user)
}

/// Times `iters` calls inside one `block_on` (measures the call, not the runtime).
fn time_calls<F, Fut>(runtime: &tokio::runtime::Runtime, iters: u64, call: F) -> Duration
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Result<u64, Rejection>>,
{
    runtime.block_on(async {
        let start = Instant::now();
        for i in 0..iters {
            black_box(call(black_box(i % 64)).await.unwrap());
        }
        start.elapsed()
    })
}

fn overhead(c: &mut Criterion) {
    Limiter::builder().memory().install().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("macro_overhead");
    group.throughput(Throughput::Elements(1));
    group.bench_function("annotated_fn", |b| {
        b.iter_custom(|iters| time_calls(&runtime, iters, annotated))
    });
    group.bench_function("hand_written", |b| {
        b.iter_custom(|iters| time_calls(&runtime, iters, by_hand))
    });
    group.bench_function("call_api", |b| {
        b.iter_custom(|iters| time_calls(&runtime, iters, via_call_api))
    });
    group.finish();
}

criterion_group!(benches, overhead);
criterion_main!(benches);
