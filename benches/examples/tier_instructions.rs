//! Instructions per call of a `#[rate_limit]` function with and without
//! tiers (the functions of `benches/tiers.rs`), counted by callgrind:
//! exact, unlike timings on a busy machine. 1 024 keys are warmed up, then
//! N calls are measured over them.
//!
//! ```text
//! cargo build --release -p ratewall-benches --example tier_instructions
//! for v in plain tiered; do
//!   valgrind --tool=callgrind --callgrind-out-file=/dev/null \
//!     --toggle-collect='tier_instructions::measured' \
//!     target/release/examples/tier_instructions $v 100000 2>&1 | grep Collected
//! done   # divide by 102048: the 2 048 warm-up calls run through `measured` too
//! ```

use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use ratewall::{Limiter, Rejection, rate_limit};

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

/// The calls counted: `n` calls of `variant` over 1 024 keys.
#[inline(never)]
fn measured(tiers: bool, n: u64) -> u64 {
    let mut admitted = 0;
    for i in 0..n {
        let user = black_box(i % 1_024);
        let ok = if tiers {
            now(tiered(user, black_box("pro"))).is_ok()
        } else {
            now(plain(user)).is_ok()
        };
        admitted += u64::from(ok);
    }
    admitted
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(variant), Some(n)) = (args.next(), args.next().and_then(|n| n.parse().ok())) else {
        eprintln!("usage: tier_instructions plain|tiered N");
        std::process::exit(2);
    };
    let tiers = match variant.as_str() {
        "plain" => false,
        "tiered" => true,
        _ => {
            eprintln!("usage: tier_instructions plain|tiered N");
            std::process::exit(2);
        }
    };
    Limiter::builder().memory().install().unwrap();
    measured(tiers, 2_048);
    let started = std::time::Instant::now();
    let admitted = measured(tiers, n);
    let elapsed = started.elapsed();
    println!(
        "{variant}: {admitted} of {n} admitted, {:.1} ns per call",
        elapsed.as_nanos() as f64 / n as f64
    );
}
