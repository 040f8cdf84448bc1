//! Instructions per `Limiter::check` refusal (and admission) in the cases of
//! `benches/deny_cache.rs`, counted by callgrind (exact, unlike timings on
//! a busy machine): the quota is used up (and the refusal remembered) first,
//! then N measured calls. The `call_*` cases decide the same through
//! `Limiter::call` on the remote store (as `#[rate_limit]` calls it): `call_static_*` with a static spec
//! (what `#[rate_limit]` makes), `call_owned_*` with an owned one (what the
//! tower layer makes).
//!
//! ```text
//! cargo build --release -p ratewall-benches --example deny_cache_instructions
//! for case in cached_refusal remote_refusal_uncached memory_refusal \
//!     memory_refusal_cached remote_allowed_with_cache remote_allowed_without_cache \
//!     call_static_refusal call_static_allowed call_owned_refusal call_owned_allowed; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='deny_cache_instructions::measured' \
//!     --toggle-collect='deny_cache_instructions::calls_measured' \
//!     target/release/examples/deny_cache_instructions $case 100000 2>&1 | grep Collected
//! done   # divide by 100000
//! ```
//!
//! The `call_*` cases are counted in `calls_measured`, the others in
//! `measured`; without the second `--toggle-collect` they read 0.

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use ratewall::{CallSpec, GroupSpec, Limit, Limiter, backend::Request, key::Part};

#[path = "../support/remote.rs"]
mod remote;

use remote::Remote;

/// Polls a future that completes without suspending.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the decision suspended"),
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(case), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: deny_cache_instructions CASE N");
        std::process::exit(2);
    };
    if let Some(shape) = case.strip_prefix("call_") {
        return calls(shape, n);
    }
    let limit = Limit::per_hour(1).unwrap();
    let generous = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    let (builder, limit) = match case.as_str() {
        "cached_refusal" => (Limiter::builder().backend(Remote::default()), &limit),
        "remote_refusal_uncached" => (
            Limiter::builder()
                .backend(Remote::default())
                .deny_cache(false),
            &limit,
        ),
        "memory_refusal" => (Limiter::builder().memory(), &limit),
        "memory_refusal_cached" => (Limiter::builder().memory().deny_cache(true), &limit),
        "remote_allowed_with_cache" => (Limiter::builder().backend(Remote::default()), &generous),
        "remote_allowed_without_cache" => (
            Limiter::builder()
                .backend(Remote::default())
                .deny_cache(false),
            &generous,
        ),
        other => {
            eprintln!("unknown case `{other}`");
            std::process::exit(2);
        }
    };
    let limiter = builder.build().unwrap();
    let key = limiter.key("bench", &42u64);
    let call = [Request::new(&key, limit, 1)];
    // Use the quota up (and get the refusal remembered), and warm up.
    warm(&limiter, &call, 1_000);
    measured(&limiter, &call, n);
}

/// The `call_*` cases: `Limiter::call` on the remote store (deny cache
/// off), refused (`*_refusal`) or allowed.
fn calls(shape: &str, n: u64) {
    let one = Limit::per_hour(1).unwrap();
    let many = Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap();
    // A static spec as `#[rate_limit]` makes it (its statics leaked here).
    let leaked = |limit: Limit| -> &'static [GroupSpec] {
        let limits: &'static [Limit] = Box::leak(Box::new([limit]));
        Box::leak(Box::new([GroupSpec::new("bench", limits)]))
    };
    let owned =
        |limit: Limit| CallSpec::owned("bench_call", vec![GroupSpec::owned("bench", vec![limit])]);
    let spec = match shape {
        "static_refusal" => CallSpec::new("bench_call", leaked(one)),
        "static_allowed" => CallSpec::new("bench_call", leaked(many)),
        "owned_refusal" => owned(one),
        "owned_allowed" => owned(many),
        other => {
            eprintln!("unknown case `call_{other}`");
            std::process::exit(2);
        }
    };
    let limiter = Limiter::builder()
        .backend(Remote::default())
        .deny_cache(false)
        .build()
        .unwrap();
    calls_warm(&limiter, &spec, 1_000);
    calls_measured(&limiter, &spec, n);
}

#[inline(never)]
fn calls_warm(limiter: &Limiter, spec: &CallSpec, n: u64) {
    call_decisions(limiter, spec, n)
}

#[inline(never)]
fn calls_measured(limiter: &Limiter, spec: &CallSpec, n: u64) {
    call_decisions(limiter, spec, black_box(n))
}

fn call_decisions(limiter: &Limiter, spec: &CallSpec, n: u64) {
    for _ in 0..n {
        // What `#[rate_limit]` expands to for a `u64` key.
        let parts = [Part::Unsigned(black_box(42))];
        let _ = black_box(now(ratewall::__private::call(spec, Ok(limiter), &parts)));
    }
}

#[inline(never)]
fn warm(limiter: &Limiter, call: &[Request<'_>], n: u64) {
    decisions(limiter, call, n)
}

#[inline(never)]
fn measured(limiter: &Limiter, call: &[Request<'_>], n: u64) {
    // Not `warm`'s body, so the two are not merged into one symbol.
    decisions(limiter, call, black_box(n))
}

fn decisions(limiter: &Limiter, call: &[Request<'_>], n: u64) {
    for _ in 0..n {
        let _ = black_box(now(limiter.requests().check(
            "bench",
            black_box(call),
            None,
        )));
    }
}
