//! Instructions per decision of an annotated fn on the in-memory limiter
//! and of `governor` (keyed, `u64` keys), counted by callgrind (exact,
//! unlike timings on a busy machine): the shapes of `benches/peer.rs`, one
//! hot key or 100 000 keys in a scattered order, every key warmed first,
//! then N measured decisions. `annotated_prometheus` is the annotated fn
//! with the Prometheus exporter installed as the global recorder (what a
//! service exporting metrics pays for the per-decision counter).
//!
//! ```text
//! cargo build --release -p ratewall --example peer_instructions
//! for v in governor annotated annotated_prometheus; do for k in 1 100000; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='peer_instructions::measured' \
//!     target/release/examples/peer_instructions $v $k 200000 2>&1 | grep Collected
//! done; done   # divide by 200000
//! ```

use std::future::Future;
use std::hint::black_box;
use std::num::NonZeroU32;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use governor::{Quota, RateLimiter};
use ratewall::{Limiter, Rejection, rate_limit};

#[rate_limit(period = 1, threshold = 1_000_000_000, key = user, name = "peer")]
async fn annotated(user: u64) -> Result<u64, Rejection> {
    Ok(user)
}

/// Polls a future that completes without suspending.
fn now<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("an in-memory decision suspended"),
    }
}

type Governor = governor::DefaultKeyedRateLimiter<u64>;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(keys), Some(n)) = (
        args.next(),
        args.next().and_then(|k| k.parse::<u64>().ok()),
        args.next().and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!("usage: peer_instructions governor|annotated|annotated_prometheus KEYS N");
        std::process::exit(2);
    };
    Limiter::builder().memory().install().unwrap();
    let governor: Governor = RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX));
    let rl = match variant.as_str() {
        "governor" => false,
        "annotated" => true,
        "annotated_prometheus" => {
            // No HTTP listener: only the recorder.
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("the first global recorder");
            true
        }
        other => {
            eprintln!("unknown variant `{other}`");
            std::process::exit(2);
        }
    };
    // A full cycle over 0..keys (7919 is prime to 100 000).
    let key_of = |i: u64| i.wrapping_mul(7_919) % keys.max(1);
    warm(rl, &governor, keys, &key_of);
    measured(rl, &governor, n, &key_of);
}

#[inline(never)]
fn warm(rl: bool, governor: &Governor, n: u64, key_of: &dyn Fn(u64) -> u64) {
    decisions(rl, governor, n, key_of)
}

#[inline(never)]
fn measured(rl: bool, governor: &Governor, n: u64, key_of: &dyn Fn(u64) -> u64) {
    // Not `warm`'s body, so the two are not merged into one symbol.
    decisions(rl, governor, black_box(n), key_of)
}

fn decisions(rl: bool, governor: &Governor, n: u64, key_of: &dyn Fn(u64) -> u64) {
    for i in 0..n {
        let key = key_of(black_box(i));
        let allowed = if rl {
            now(annotated(key)).is_ok()
        } else {
            governor.check_key(&key).is_ok()
        };
        assert!(allowed);
    }
}
