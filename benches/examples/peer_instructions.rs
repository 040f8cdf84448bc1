//! Instructions per decision of an annotated fn on the in-memory limiter
//! and of `governor` (keyed, `u64` keys), counted by callgrind (exact,
//! unlike timings on a busy machine): the shapes of `benches/peer.rs`, one
//! hot key or 100 000 keys in a scattered order, every key warmed first,
//! then N measured decisions. `annotated_prometheus` is the annotated fn
//! with the Prometheus exporter installed as the global recorder (what a
//! service exporting metrics pays for the per-decision counter);
//! `acquire` and `acquire_prometheus` are the same for
//! `limiter.requests().acquire` with keys built before the loop.
//!
//! ```text
//! cargo build --release -p ratewall-benches --example peer_instructions
//! for v in governor annotated annotated_prometheus acquire acquire_prometheus; do for k in 1 100000; do
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
use std::time::Duration;

use governor::{Quota, RateLimiter};
use ratewall::{Key, Limit, Limiter, Rejection, rate_limit};

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

/// The path measured.
#[derive(Clone, Copy)]
enum Path {
    Governor,
    Annotated,
    Acquire,
}

/// What each path decides with.
struct Peers {
    governor: Governor,
    limiter: &'static Limiter,
    limit: Limit,
    keys: Vec<Key>,
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(keys), Some(n)) = (
        args.next(),
        args.next().and_then(|k| k.parse::<u64>().ok()),
        args.next().and_then(|n| n.parse::<u64>().ok()),
    ) else {
        eprintln!(
            "usage: peer_instructions governor|annotated|annotated_prometheus|acquire|acquire_prometheus KEYS N"
        );
        std::process::exit(2);
    };
    Limiter::builder().memory().install().unwrap();
    let path = match variant.as_str() {
        "governor" => Path::Governor,
        "annotated" => Path::Annotated,
        "acquire" => Path::Acquire,
        "annotated_prometheus" | "acquire_prometheus" => {
            // No HTTP listener: only the recorder.
            metrics_exporter_prometheus::PrometheusBuilder::new()
                .install_recorder()
                .expect("the first global recorder");
            match variant.as_str() {
                "annotated_prometheus" => Path::Annotated,
                _ => Path::Acquire,
            }
        }
        other => {
            eprintln!("unknown variant `{other}`");
            std::process::exit(2);
        }
    };
    let limiter = Limiter::global().expect("installed above");
    let peers = Peers {
        governor: RateLimiter::keyed(Quota::per_second(NonZeroU32::MAX)),
        limiter,
        limit: Limit::new(1_000_000_000, Duration::from_secs(1)).unwrap(),
        keys: match path {
            Path::Acquire => (0..keys.max(1)).map(|i| limiter.key("peer", &i)).collect(),
            _ => Vec::new(),
        },
    };
    // A full cycle over 0..keys (7919 is prime to 100 000).
    let key_of = |i: u64| i.wrapping_mul(7_919) % keys.max(1);
    warm(path, &peers, keys, &key_of);
    measured(path, &peers, n, &key_of);
}

#[inline(never)]
fn warm(path: Path, peers: &Peers, n: u64, key_of: &dyn Fn(u64) -> u64) {
    decisions(path, peers, n, key_of)
}

#[inline(never)]
fn measured(path: Path, peers: &Peers, n: u64, key_of: &dyn Fn(u64) -> u64) {
    // Not `warm`'s body, so the two are not merged into one symbol.
    decisions(path, peers, black_box(n), key_of)
}

fn decisions(path: Path, peers: &Peers, n: u64, key_of: &dyn Fn(u64) -> u64) {
    for i in 0..n {
        let key = key_of(black_box(i));
        let allowed = match path {
            Path::Governor => peers.governor.check_key(&key).is_ok(),
            Path::Annotated => now(annotated(key)).is_ok(),
            Path::Acquire => {
                now(peers
                    .limiter
                    .requests()
                    .acquire(&peers.keys[key as usize], &peers.limit, 1))
                .expect("in memory")
                .allowed()
            }
        };
        assert!(allowed);
    }
}
